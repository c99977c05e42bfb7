/* Posting on the point-to-point layer (p2p.h): isend, irecv and their blocking forms, and
 * batches. A new receive is matched against the unexpected queue first (in arrival order), then
 * waits in the posted queue for progress.c to match what arrives. */
#include "p2p/progress.h"
#include "p2p/notice.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static hcomm_result_t start_send(hcomm__req_t *r) {
    hcomm_comm_t *c = r->c;
    r->rndv = r->env.bytes > c->eager_limit;
    r->state = REQ_POSTED;
    hcomm_result_t res =
        c->tr->send_frame(c, r->peer, &r->env, r->buf, (size_t)r->env.bytes, r->rndv, &r->tr);
    if (res != HCOMM_OK)
        hcomm__p2p_req_failed(r, res);
    return HCOMM_OK;
}

static int32_t next_message_id(p2p_t *p, hcomm_comm_t *c, int peer) {
    if (!p->next_id)
        p->next_id = calloc((size_t)c->size, sizeof *p->next_id);
    return p->next_id ? ++p->next_id[peer] : 0;
}

static void group_add(p2p_t *p, hcomm__req_t *r) {
    r->state = REQ_GROUPED;
    r->next = NULL;
    QUEUE_APPEND(p->group_head, p->group_tail, r);
}

hcomm_result_t hcomm__isend(hcomm_comm_t *c, int channel, int tag, int peer, const void *buf,
                            size_t bytes, const hcomm__env_t *desc, hcomm__req_t **req) {
    HCOMM__TRY(check_peer(c, peer, channel));
    hcomm__req_t *r;
    HCOMM__TRY(hcomm__p2p_req_new(c, &r));
    if (desc)
        r->env = *desc;
    else
        memset(&r->env, 0, sizeof r->env);
    r->env.kind = HCOMM__ENV_DATA;
    r->env.result = next_message_id(p2p_of(c), c, peer);
    r->env.channel = (uint8_t)channel;
    r->env.tag = tag;
    r->env.bytes = bytes;
    r->peer = peer;
    r->channel = channel;
    r->tag = tag;
    r->buf = (void *)(uintptr_t)buf; /* sends only read it */
    *req = r;
    if (p2p_of(c)->in_group) {
        group_add(p2p_of(c), r);
        return HCOMM_OK;
    }
    return start_send(r);
}

/* Takes the first unexpected message of r's key, if any. */
static uxm_t *take_unexpected(p2p_t *p, const hcomm__req_t *r) {
    uxm_t *prev = NULL;
    for (uxm_t *u = p->ux_head; u; prev = u, u = u->next)
        if (key_matches(r->peer, r->channel, r->tag, u->src, &u->env)) {
            ux_unlink(p, prev, u);
            return u;
        }
    return NULL;
}

/* Returns u to the front of the unexpected queue (it was the first of its key). */
static void put_back_unexpected(p2p_t *p, uxm_t *u) {
    u->next = p->ux_head;
    p->ux_head = u;
    if (!p->ux_tail)
        p->ux_tail = u;
}

/* Gives r the unexpected message u of its key. */
static void land_unexpected(hcomm__req_t *r, uxm_t *u) {
    p2p_t *p = p2p_of(r->c);
    if (u->rndv && !u->pulled) {
        hcomm__p2p_land(r->c, r, u->src, &u->env, NULL, &u->rv);
        free(u);
        return;
    }
    if (u->rndv) { /* rescued: its data is (or will be) in u->data */
        r->env = u->env;
        if (hcomm__p2p_accepts(r, &u->env)) {
            r->rescued = u;
            r->state = REQ_RESCUED;
            return;
        }
        p->ux_bytes -= u->charged; /* r failed; the pull may still be writing u->data */
        u->charged = 0;
        u->next = p->draining;
        p->draining = u;
        return;
    }
    hcomm__p2p_land(r->c, r, u->src, &u->env, u->data, NULL);
    p->ux_bytes -= u->charged;
    free(u->data);
    free(u);
}

/* Takes every frame that has arrived, so a sender's withdrawal of a rendezvous message is seen
 * before that message is pulled (the transport may hand over one frame per poll). */
static void drain_arrived(hcomm_comm_t *c) {
    p2p_t *p = p2p_of(c);
    for (int i = 0; i < 1024; i++) {
        unsigned long before = p->delivered;
        if (hcomm__progress(c) != HCOMM_OK || p->delivered == before)
            return;
    }
}

static hcomm_result_t start_recv(hcomm__req_t *r) {
    p2p_t *p = p2p_of(r->c);
    r->state = REQ_POSTED;
    uxm_t *u = take_unexpected(p, r);
    if (u && u->rndv && !u->pulled) { /* look again once every arrived frame is in */
        put_back_unexpected(p, u);
        drain_arrived(r->c);
        u = take_unexpected(p, r);
    }
    if (u) {
        land_unexpected(r, u);
        return HCOMM_OK;
    }
    QUEUE_APPEND(p->posted_head, p->posted_tail, r);
    return HCOMM_OK;
}

hcomm_result_t hcomm__irecv(hcomm_comm_t *c, int channel, int tag, int peer, void *buf, size_t cap,
                            hcomm__recv_mode_t mode, hcomm__req_t **req) {
    HCOMM__TRY(check_peer(c, peer, channel));
    hcomm__req_t *r;
    HCOMM__TRY(hcomm__p2p_req_new(c, &r));
    r->is_recv = true;
    memset(&r->env, 0, sizeof r->env); /* what hcomm__wait reports if nothing matches */
    r->mode = mode;
    r->peer = peer;
    r->channel = channel;
    r->tag = tag;
    r->buf = mode == HCOMM__RECV_ALLOC ? NULL : buf;
    r->cap = cap;
    *req = r;
    if (p2p_of(c)->in_group) {
        group_add(p2p_of(c), r);
        return HCOMM_OK;
    }
    return start_recv(r);
}

hcomm_result_t hcomm__irecv_tensor(hcomm_comm_t *c, int channel, int tag, int peer, void *buf,
                                   size_t cap, const hcomm__env_t *expected, hcomm__req_t **req) {
    HCOMM__TRY(check_peer(c, peer, channel));
    hcomm__req_t *r;
    HCOMM__TRY(hcomm__p2p_req_new(c, &r));
    r->is_recv = true;
    memset(&r->env, 0, sizeof r->env);
    r->mode = HCOMM__RECV_EXACT;
    r->peer = peer;
    r->channel = channel;
    r->tag = tag;
    r->buf = buf;
    r->cap = cap;
    r->expect = true;
    r->expected = *expected;
    *req = r;
    if (p2p_of(c)->in_group) {
        group_add(p2p_of(c), r);
        return HCOMM_OK;
    }
    return start_recv(r);
}

hcomm_result_t hcomm__send(hcomm_comm_t *c, int channel, int tag, int peer, const void *buf,
                           size_t bytes, const hcomm__env_t *desc) {
    hcomm__req_t *r;
    HCOMM__TRY(hcomm__isend(c, channel, tag, peer, buf, bytes, desc, &r));
    return hcomm__wait(r, NULL, NULL);
}

hcomm_result_t hcomm__recv(hcomm_comm_t *c, int channel, int tag, int peer, void *buf, size_t cap,
                           hcomm__recv_mode_t mode, hcomm__env_t *env) {
    hcomm__req_t *r;
    HCOMM__TRY(hcomm__irecv(c, channel, tag, peer, buf, cap, mode, &r));
    return hcomm__wait(r, env, NULL);
}

/* --- batches --- */

hcomm_result_t hcomm__group_start(hcomm_comm_t *c) {
    p2p_t *p = p2p_of(c);
    if (!p)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for point-to-point state");
    if (p->in_group)
        return hcomm__err(HCOMM_ERR_STATE, c->call_fn, "a batch is already open on this comm");
    p->in_group = true;
    return HCOMM_OK;
}

/* Posts the batch's receives, then its sends; *all (may be NULL) gets the requests. */
static hcomm_result_t post_group(hcomm_comm_t *c, hcomm__req_t ***all, int *n) {
    p2p_t *p = p2p_of(c);
    if (!p || !p->in_group)
        return hcomm__err(HCOMM_ERR_STATE, c->call_fn, "no batch is open on this comm");
    p->in_group = false;
    hcomm__req_t *list = p->group_head;
    p->group_head = p->group_tail = NULL;
    *n = 0;
    for (hcomm__req_t *r = list; r; r = r->next)
        (*n)++;
    hcomm__req_t **v = malloc(sizeof *v * (size_t)(*n ? *n : 1));
    if (!v)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for a batch of %d", *n);
    int k = 0;
    for (hcomm__req_t *r = list; r; r = r->next)
        v[k++] = r;
    for (int i = 0; i < *n; i++) /* receives first: a peer's matching send then finds them */
        if (v[i]->is_recv) {
            v[i]->next = NULL;
            start_recv(v[i]);
        }
    for (int i = 0; i < *n; i++)
        if (!v[i]->is_recv) {
            v[i]->next = NULL;
            start_send(v[i]);
        }
    *all = v;
    return HCOMM_OK;
}

hcomm_result_t hcomm__group_post(hcomm_comm_t *c) {
    hcomm__req_t **all = NULL;
    int n = 0;
    HCOMM__TRY(post_group(c, &all, &n));
    free(all);
    return HCOMM_OK;
}

hcomm_result_t hcomm__group_end(hcomm_comm_t *c) {
    hcomm__req_t **all = NULL;
    int n = 0;
    HCOMM__TRY(post_group(c, &all, &n));
    hcomm_result_t res = hcomm__wait_all(all, n);
    free(all);
    return res;
}

bool hcomm__group_open(hcomm_comm_t *c) {
    p2p_t *p = c->layer[HCOMM__LAYER_P2P];
    return p && p->in_group;
}
