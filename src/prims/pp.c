/* Pipeline-parallel point-to-point over hcomm's p2p layer: one message per tensor on the
 * user channel, whose envelope carries the dtype and shape, so a receiver that states a tensor
 * has it checked before any byte lands, a receiver that does not gets what arrived, and user
 * tags never meet collective traffic. Requests wrap p2p requests; a group records transfers
 * and posts them together (receives first). The pipeline helpers follow Megatron-LM's
 * p2p_communication (send_forward, recv_backward, their combined forms). */
#include "hcomm/pp.h"
#include "prims/prims.h"

#include <stdio.h>
#include <string.h>

struct hcomm_pp_req {
    hcomm_comm_t *g;
    hcomm__req_t *r;
    hcomm_tensor_t *any_out;   /* receive by envelope: where the tensor goes */
    struct hcomm_pp_req *next; /* the open group's list */
};

/* Per-group state of the PP layer: the transfers of an open group. */
typedef struct pp_state {
    hcomm_pp_req_t *head, *tail;
    bool open;
} pp_state_t;

static void pp_state_free(void *p) {
    pp_state_t *s = p;
    while (s->head) {
        hcomm_pp_req_t *n = s->head->next;
        free(s->head);
        s->head = n;
    }
    free(s);
}

static pp_state_t *state_of(hcomm_comm_t *g) {
    return hcomm__layer_state(&g->layer[HCOMM__LAYER_PRIMS], &g->layer_free[HCOMM__LAYER_PRIMS],
                              sizeof(pp_state_t), calloc, pp_state_free);
}

static hcomm__env_t desc_of(const hcomm_tensor_t *t) {
    hcomm__env_t d = {.has_desc = 1, .dtype = (int32_t)t->dtype, .ndim = (uint8_t)t->ndim};
    for (int i = 0; i < t->ndim; i++)
        d.shape[i] = t->shape[i];
    return d;
}

/* The tensor an envelope describes (data NULL); false when it carries none. */
static bool env_tensor(const hcomm__env_t *e, hcomm_tensor_t *t) {
    if (!e->has_desc || !hcomm__dtype_valid((hcomm_dtype_t)e->dtype) || e->ndim > HCOMM_MAX_DIMS)
        return false;
    *t = (hcomm_tensor_t){.dtype = (hcomm_dtype_t)e->dtype, .ndim = e->ndim};
    for (int i = 0; i < e->ndim; i++)
        t->shape[i] = e->shape[i];
    return true;
}

/* --- argument checks --- */

static hcomm_result_t check_peer(const char *fn, const char *name, const hcomm_comm_t *g,
                                 int peer) {
    if (peer < 0 || peer >= g->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s=%d outside 0..%d", name, peer,
                          g->size - 1);
    if (peer == g->rank)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s=%d is this rank (no send to self)", name,
                          peer);
    return HCOMM_OK;
}

static hcomm_result_t check_tag(const char *fn, const char *name, int tag) {
    if (tag < 0 || tag > HCOMM_PP_TAG_MAX)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s=%d outside 0..%d", name, tag,
                          HCOMM_PP_TAG_MAX);
    return HCOMM_OK;
}

static hcomm_result_t check_side(const char *fn, const char *tname, const hcomm_tensor_t *t,
                                 const char *pname, const hcomm_comm_t *g, int peer) {
    HCOMM__TRY(hcomm__tensor_check(fn, tname, t, NULL));
    return check_peer(fn, pname, g, peer);
}

/* --- requests --- */

static hcomm_result_t req_wrap(hcomm_comm_t *g, hcomm__req_t *r, hcomm_tensor_t *any_out,
                               hcomm_pp_req_t **out) {
    hcomm_pp_req_t *q = calloc(1, sizeof *q);
    if (!q) {
        hcomm__wait(r, NULL, NULL); /* nobody could wait on it otherwise */
        return hcomm__err(HCOMM_ERR_NOMEM, g->call_fn, "out of memory for a request");
    }
    *q = (hcomm_pp_req_t){.g = g, .r = r, .any_out = any_out};
    pp_state_t *s = state_of(g);
    if (s && s->open) { /* the group completes it */
        if (s->tail)
            s->tail->next = q;
        else
            s->head = q;
        s->tail = q;
        q = NULL;
    }
    if (out)
        *out = q;
    return HCOMM_OK;
}

/* The p2p request of a send or receive of t (checked). */
static hcomm_result_t send_req(hcomm_comm_t *g, const hcomm_tensor_t *t, int peer, int tag,
                               hcomm__req_t **r) {
    hcomm__env_t d = desc_of(t);
    return hcomm__isend(g, HCOMM__CH_USER, tag, peer, t->data, hcomm__tensor_bytes(t), &d, r);
}

static hcomm_result_t recv_req(hcomm_comm_t *g, hcomm_tensor_t *t, int peer, int tag,
                               hcomm__req_t **r) {
    hcomm__env_t d = desc_of(t);
    return hcomm__irecv_tensor(g, HCOMM__CH_USER, tag, peer, t->data, hcomm__tensor_bytes(t), &d,
                               r);
}

/* A receive by envelope: out gets the tensor that arrives (its data allocated on completion). */
static hcomm_result_t recv_any_req(hcomm_comm_t *g, int peer, int tag, hcomm_tensor_t *out,
                                   hcomm__req_t **r) {
    out->data = NULL;
    return hcomm__irecv(g, HCOMM__CH_USER, tag, peer, NULL, 0, HCOMM__RECV_ALLOC, r);
}

static hcomm_result_t post_send(hcomm_comm_t *g, const hcomm_tensor_t *t, int peer, int tag,
                                hcomm_pp_req_t **req) {
    hcomm__req_t *r = NULL;
    HCOMM__TRY(send_req(g, t, peer, tag, &r));
    return req_wrap(g, r, NULL, req);
}

static hcomm_result_t post_recv(hcomm_comm_t *g, hcomm_tensor_t *t, int peer, int tag,
                                hcomm_pp_req_t **req) {
    hcomm__req_t *r = NULL;
    HCOMM__TRY(recv_req(g, t, peer, tag, &r));
    return req_wrap(g, r, NULL, req);
}

static hcomm_result_t post_recv_any(hcomm_comm_t *g, int peer, int tag, hcomm_tensor_t *out,
                                    hcomm_pp_req_t **req) {
    hcomm__req_t *r = NULL;
    HCOMM__TRY(recv_any_req(g, peer, tag, out, &r));
    return req_wrap(g, r, out, req);
}

/* Completes r: a receive by envelope (any_out) fills its tensor. */
static hcomm_result_t complete(hcomm_comm_t *g, hcomm__req_t *r, hcomm_tensor_t *any_out) {
    hcomm__env_t env;
    void *data = NULL;
    hcomm_result_t res = hcomm__wait(r, &env, any_out ? &data : NULL);
    if (res == HCOMM_OK && any_out) {
        if (!env_tensor(&env, any_out)) {
            hcomm_mem_free(data);
            data = NULL;
            res = hcomm__err(HCOMM_ERR_MISMATCH, g->call_fn, "a message of tag %d is not a tensor",
                             env.tag);
        }
        any_out->data = data;
    }
    return res;
}

/* Completes q (and frees it). */
static hcomm_result_t finish(hcomm_pp_req_t *q) {
    hcomm_result_t res = complete(q->g, q->r, q->any_out);
    free(q);
    return res;
}

/* Keeps r and its message in *first and msg (512 bytes) if it is the first failure. */
static void keep_first(hcomm_result_t *first, char *msg, hcomm_result_t r) {
    if (r != HCOMM_OK && *first == HCOMM_OK) {
        *first = r;
        snprintf(msg, 512, "%s", hcomm_last_error());
    }
}

/* Completes every request; the first failure's message is the one kept. */
static hcomm_result_t finish_all(hcomm_pp_req_t **qs, int n) {
    hcomm_result_t first = HCOMM_OK;
    char msg[512] = "";
    for (int i = 0; i < n; i++) {
        if (!qs[i])
            continue;
        keep_first(&first, msg, finish(qs[i]));
        qs[i] = NULL;
    }
    return first == HCOMM_OK ? first : hcomm__err_text(first, msg);
}

/* --- public calls --- */

/* Names the call on group for messages, runs body, restores the name. */
#define PP_CALL(group, body)                                                                       \
    do {                                                                                           \
        HCOMM__CHECK_NULL(group);                                                                  \
        hcomm__enter(group, __func__);                                                             \
        return hcomm__leave(group, (body));                                                        \
    } while (0)

static hcomm_result_t check_call(hcomm_comm_t *g, const hcomm_tensor_t *t, int peer, int tag) {
    HCOMM__TRY(check_side(g->call_fn, "t", t, "peer", g, peer));
    return check_tag(g->call_fn, "tag", tag);
}

static hcomm_result_t pp_isend(hcomm_comm_t *g, const hcomm_tensor_t *t, int peer, int tag,
                               hcomm_pp_req_t **req) {
    HCOMM__TRY(check_call(g, t, peer, tag));
    return post_send(g, t, peer, tag, req);
}

static hcomm_result_t pp_irecv(hcomm_comm_t *g, hcomm_tensor_t *t, int peer, int tag,
                               hcomm_pp_req_t **req) {
    HCOMM__TRY(check_call(g, t, peer, tag));
    return post_recv(g, t, peer, tag, req);
}

static hcomm_result_t pp_irecv_any(hcomm_comm_t *g, int peer, int tag, hcomm_tensor_t *out,
                                   hcomm_pp_req_t **req) {
    if (out == NULL)
        return hcomm__err(HCOMM_ERR_NULL, g->call_fn, "argument 'out' is NULL");
    out->data = NULL; /* as documented, also when an argument check below fails */
    HCOMM__TRY(check_peer(g->call_fn, "peer", g, peer));
    HCOMM__TRY(check_tag(g->call_fn, "tag", tag));
    return post_recv_any(g, peer, tag, out, req);
}

/* A blocking call: post, then complete (not inside a group, whose end completes it). */
static hcomm_result_t complete_now(hcomm_result_t posted, hcomm_pp_req_t **q) {
    if (posted != HCOMM_OK || *q == NULL)
        return posted;
    return finish(*q);
}

static bool group_open(hcomm_comm_t *g) {
    pp_state_t *s = g->layer[HCOMM__LAYER_PRIMS];
    return s && s->open;
}

/* A blocking send or receive outside a group completes its p2p request here, without a PP
 * request around it (docs/tuning.md: pp.blocking-no-request). */
static hcomm_result_t pp_send_now(hcomm_comm_t *g, const hcomm_tensor_t *t, int peer, int tag) {
    hcomm_pp_req_t *q = NULL;
    if (group_open(g))
        return complete_now(pp_isend(g, t, peer, tag, &q), &q);
    hcomm__req_t *r = NULL;
    HCOMM__TRY(check_call(g, t, peer, tag));
    HCOMM__TRY(send_req(g, t, peer, tag, &r));
    return hcomm__wait(r, NULL, NULL);
}

static hcomm_result_t pp_recv_now(hcomm_comm_t *g, hcomm_tensor_t *t, int peer, int tag) {
    hcomm_pp_req_t *q = NULL;
    if (group_open(g))
        return complete_now(pp_irecv(g, t, peer, tag, &q), &q);
    hcomm__req_t *r = NULL;
    HCOMM__TRY(check_call(g, t, peer, tag));
    HCOMM__TRY(recv_req(g, t, peer, tag, &r));
    return hcomm__wait(r, NULL, NULL);
}

hcomm_result_t hcomm_pp_send(hcomm_comm_t *group, const hcomm_tensor_t *t, int peer, int tag) {
    PP_CALL(group, pp_send_now(group, t, peer, tag));
}

hcomm_result_t hcomm_pp_recv(hcomm_comm_t *group, hcomm_tensor_t *t, int peer, int tag) {
    PP_CALL(group, pp_recv_now(group, t, peer, tag));
}

hcomm_result_t hcomm_pp_recv_any(hcomm_comm_t *group, int peer, int tag, hcomm_tensor_t *out) {
    hcomm_pp_req_t *q = NULL;
    PP_CALL(group, complete_now(pp_irecv_any(group, peer, tag, out, &q), &q));
}

hcomm_result_t hcomm_pp_isend(hcomm_comm_t *group, const hcomm_tensor_t *t, int peer, int tag,
                              hcomm_pp_req_t **req) {
    HCOMM__CHECK_NULL(req);
    *req = NULL;
    PP_CALL(group, pp_isend(group, t, peer, tag, req));
}

hcomm_result_t hcomm_pp_irecv(hcomm_comm_t *group, hcomm_tensor_t *t, int peer, int tag,
                              hcomm_pp_req_t **req) {
    HCOMM__CHECK_NULL(req);
    *req = NULL;
    PP_CALL(group, pp_irecv(group, t, peer, tag, req));
}

hcomm_result_t hcomm_pp_irecv_any(hcomm_comm_t *group, int peer, int tag, hcomm_tensor_t *out,
                                  hcomm_pp_req_t **req) {
    HCOMM__CHECK_NULL(req);
    *req = NULL;
    PP_CALL(group, pp_irecv_any(group, peer, tag, out, req));
}

hcomm_result_t hcomm_pp_wait(hcomm_pp_req_t *req) {
    HCOMM__CHECK_NULL(req);
    hcomm_comm_t *g = req->g;
    hcomm__enter(g, __func__);
    return hcomm__leave(g, finish(req));
}

hcomm_result_t hcomm_pp_test(hcomm_pp_req_t *req, int *done) {
    HCOMM__CHECK_NULL(req);
    HCOMM__CHECK_NULL(done);
    bool d = false;
    hcomm_comm_t *g = req->g;
    hcomm__enter(g, __func__);
    hcomm_result_t res = hcomm__test(req->r, &d);
    *done = d;
    if (res == HCOMM_OK && d)
        res = finish(req);
    return hcomm__leave(g, res);
}

hcomm_result_t hcomm_pp_wait_all(hcomm_pp_req_t **reqs, int n) {
    if (n < 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "n=%d is negative", n);
    if (n > 0)
        HCOMM__CHECK_NULL(reqs);
    return finish_all(reqs, n);
}

static hcomm_result_t pp_probe(hcomm_comm_t *g, int peer, int tag, hcomm_tensor_t *desc) {
    if (desc == NULL)
        return hcomm__err(HCOMM_ERR_NULL, g->call_fn, "argument 'desc' is NULL");
    HCOMM__TRY(check_peer(g->call_fn, "peer", g, peer));
    HCOMM__TRY(check_tag(g->call_fn, "tag", tag));
    hcomm__env_t env;
    HCOMM__TRY(hcomm__probe(g, HCOMM__CH_USER, tag, peer, &env));
    if (!env_tensor(&env, desc))
        return hcomm__err(HCOMM_ERR_MISMATCH, g->call_fn,
                          "peer %d sent a message that is not a tensor (tag %d)", peer, tag);
    return HCOMM_OK;
}

hcomm_result_t hcomm_pp_probe(hcomm_comm_t *group, int peer, int tag, hcomm_tensor_t *desc) {
    PP_CALL(group, pp_probe(group, peer, tag, desc));
}

/* --- groups --- */

static hcomm_result_t pp_group_start(hcomm_comm_t *g) {
    pp_state_t *s = state_of(g);
    if (!s)
        return hcomm__err(HCOMM_ERR_NOMEM, g->call_fn, "out of memory for PP state");
    if (s->open)
        return hcomm__err(HCOMM_ERR_STATE, g->call_fn, "a group is already open on this comm");
    HCOMM__TRY(hcomm__group_start(g));
    s->open = true;
    return HCOMM_OK;
}

static hcomm_result_t pp_group_end(hcomm_comm_t *g) {
    pp_state_t *s = state_of(g);
    if (!s || !s->open)
        return hcomm__err(HCOMM_ERR_STATE, g->call_fn, "no group is open on this comm");
    s->open = false;
    hcomm_result_t res = hcomm__group_post(g);
    hcomm_pp_req_t *q = s->head;
    s->head = s->tail = NULL;
    hcomm_result_t first = HCOMM_OK;
    char msg[512] = "";
    keep_first(&first, msg, res);
    while (q) { /* every transfer completes, even after a failure, so nothing stays posted */
        hcomm_pp_req_t *next = q->next;
        keep_first(&first, msg, finish(q));
        q = next;
    }
    return first == HCOMM_OK ? first : hcomm__err_text(first, msg);
}

hcomm_result_t hcomm_pp_group_start(hcomm_comm_t *group) {
    PP_CALL(group, pp_group_start(group));
}

hcomm_result_t hcomm_pp_group_end(hcomm_comm_t *group) {
    PP_CALL(group, pp_group_end(group));
}

/* --- send_recv and the pipeline helpers: both sides posted as one group --- */

typedef struct side {
    const hcomm_tensor_t *send;
    int send_peer, send_tag;
    hcomm_tensor_t *recv;
    int recv_peer, recv_tag;
    bool any; /* the receive takes any shape */
} side_t;

static hcomm_result_t check_pair(hcomm_comm_t *g, const side_t *s) {
    const char *fn = g->call_fn;
    if (s->send) {
        HCOMM__TRY(check_side(fn, "send", s->send, "send_peer", g, s->send_peer));
        HCOMM__TRY(check_tag(fn, "send_tag", s->send_tag));
    }
    if (s->recv && s->any)
        HCOMM__TRY(check_peer(fn, "recv_peer", g, s->recv_peer));
    else if (s->recv)
        HCOMM__TRY(check_side(fn, "recv", s->recv, "recv_peer", g, s->recv_peer));
    if (s->recv)
        HCOMM__TRY(check_tag(fn, "recv_tag", s->recv_tag));
    return HCOMM_OK;
}

/* Posts the receive, then the send, as p2p requests: whatever order the peers call in,
 * neither waits for the other's completion to post. */
static hcomm_result_t post_pair(hcomm_comm_t *g, const side_t *s, hcomm__req_t *r[2]) {
    hcomm_result_t res = HCOMM_OK;
    if (s->recv && s->any)
        res = recv_any_req(g, s->recv_peer, s->recv_tag, s->recv, &r[0]);
    else if (s->recv)
        res = recv_req(g, s->recv, s->recv_peer, s->recv_tag, &r[0]);
    if (res == HCOMM_OK && s->send)
        res = send_req(g, s->send, s->send_peer, s->send_tag, &r[1]);
    return res;
}

/* Completes both (posting's failure res first, else the first failure's message). */
static hcomm_result_t complete_pair(hcomm_comm_t *g, const side_t *s, hcomm__req_t *r[2],
                                    hcomm_result_t res) {
    hcomm_result_t first = HCOMM_OK;
    char msg[512] = "";
    if (r[0])
        keep_first(&first, msg, complete(g, r[0], s->any ? s->recv : NULL));
    if (r[1])
        keep_first(&first, msg, complete(g, r[1], NULL));
    if (res != HCOMM_OK)
        return res;
    return first == HCOMM_OK ? first : hcomm__err_text(first, msg);
}

/* Inside an open group the group completes the pair; outside it completes here, with no PP
 * request around the p2p ones (docs/tuning.md: pp.blocking-no-request). */
static hcomm_result_t exchange(hcomm_comm_t *g, const side_t *s) {
    HCOMM__TRY(check_pair(g, s));
    hcomm__req_t *r[2] = {NULL, NULL};
    hcomm_result_t res = post_pair(g, s, r);
    pp_state_t *st = g->layer[HCOMM__LAYER_PRIMS];
    if (!st || !st->open)
        return complete_pair(g, s, r, res);
    for (int i = 0; i < 2; i++)
        if (r[i]) {
            hcomm_result_t w = req_wrap(g, r[i], i == 0 && s->any ? s->recv : NULL, NULL);
            res = res == HCOMM_OK ? w : res;
        }
    return res;
}

hcomm_result_t hcomm_pp_send_recv(hcomm_comm_t *group, const hcomm_tensor_t *send, int send_peer,
                                  int send_tag, hcomm_tensor_t *recv, int recv_peer, int recv_tag) {
    side_t s = {.send = send_peer == -1 ? NULL : send,
                .send_peer = send_peer,
                .send_tag = send_tag,
                .recv = recv_peer == -1 ? NULL : recv,
                .recv_peer = recv_peer,
                .recv_tag = recv_tag};
    PP_CALL(group, exchange(group, &s));
}

/* The previous and next stage, -1 where the pipeline ends (no HCOMM_PP_RING). */
static int prev_stage(const hcomm_comm_t *pp, int flags) {
    if (pp->rank > 0)
        return pp->rank - 1;
    return (flags & HCOMM_PP_RING) && pp->size > 1 ? pp->size - 1 : -1;
}

static int next_stage(const hcomm_comm_t *pp, int flags) {
    if (pp->rank + 1 < pp->size)
        return pp->rank + 1;
    return (flags & HCOMM_PP_RING) && pp->size > 1 ? 0 : -1;
}

static hcomm_result_t check_flags(const hcomm_comm_t *pp, int flags) {
    if (flags & ~(HCOMM_PP_RING | HCOMM_PP_ANY_SHAPE))
        return hcomm__err(HCOMM_ERR_INVALID_ARG, pp->call_fn,
                          "flags=%d has bits other than HCOMM_PP_RING and HCOMM_PP_ANY_SHAPE",
                          flags);
    return HCOMM_OK;
}

/* One helper step: send toward send_dir (+1 next, -1 previous, 0 none) with its tag, receive
 * from recv_dir likewise; missing neighbours make that side a no-op. */
static hcomm_result_t helper(hcomm_comm_t *pp, const hcomm_tensor_t *send, int send_dir,
                             hcomm_tensor_t *recv, int recv_dir, int flags) {
    HCOMM__TRY(check_flags(pp, flags));
    int sp = send_dir > 0 ? next_stage(pp, flags) : prev_stage(pp, flags);
    int rp = recv_dir > 0 ? next_stage(pp, flags) : prev_stage(pp, flags);
    /* Forward traffic goes to the next stage; what comes from the previous one is forward. */
    side_t s = {.send = send_dir && sp >= 0 ? send : NULL,
                .send_peer = sp,
                .send_tag = send_dir > 0 ? HCOMM_PP_TAG_FORWARD : HCOMM_PP_TAG_BACKWARD,
                .recv = recv_dir && rp >= 0 ? recv : NULL,
                .recv_peer = rp,
                .recv_tag = recv_dir < 0 ? HCOMM_PP_TAG_FORWARD : HCOMM_PP_TAG_BACKWARD,
                .any = (flags & HCOMM_PP_ANY_SHAPE) != 0};
    if (s.send == NULL && send_dir && sp >= 0)
        return hcomm__err(HCOMM_ERR_NULL, pp->call_fn, "the tensor to send is NULL");
    if (s.recv == NULL && recv_dir && rp >= 0)
        return hcomm__err(HCOMM_ERR_NULL, pp->call_fn, "the tensor to receive into is NULL");
    return exchange(pp, &s);
}

hcomm_result_t hcomm_pp_send_forward(hcomm_comm_t *pp, const hcomm_tensor_t *out, int flags) {
    PP_CALL(pp, helper(pp, out, +1, NULL, 0, flags));
}

hcomm_result_t hcomm_pp_recv_forward(hcomm_comm_t *pp, hcomm_tensor_t *in, int flags) {
    PP_CALL(pp, helper(pp, NULL, 0, in, -1, flags));
}

hcomm_result_t hcomm_pp_send_backward(hcomm_comm_t *pp, const hcomm_tensor_t *grad_in, int flags) {
    PP_CALL(pp, helper(pp, grad_in, -1, NULL, 0, flags));
}

hcomm_result_t hcomm_pp_recv_backward(hcomm_comm_t *pp, hcomm_tensor_t *grad_out, int flags) {
    PP_CALL(pp, helper(pp, NULL, 0, grad_out, +1, flags));
}

hcomm_result_t hcomm_pp_send_forward_recv_backward(hcomm_comm_t *pp, const hcomm_tensor_t *out,
                                                   hcomm_tensor_t *grad_out, int flags) {
    PP_CALL(pp, helper(pp, out, +1, grad_out, +1, flags));
}

hcomm_result_t hcomm_pp_send_backward_recv_forward(hcomm_comm_t *pp, const hcomm_tensor_t *grad_in,
                                                   hcomm_tensor_t *in, int flags) {
    PP_CALL(pp, helper(pp, grad_in, -1, in, -1, flags));
}

hcomm_result_t hcomm_pp_send_forward_recv_forward(hcomm_comm_t *pp, const hcomm_tensor_t *out,
                                                  hcomm_tensor_t *in, int flags) {
    PP_CALL(pp, helper(pp, out, +1, in, -1, flags));
}

hcomm_result_t hcomm_pp_send_backward_recv_backward(hcomm_comm_t *pp, const hcomm_tensor_t *grad_in,
                                                    hcomm_tensor_t *grad_out, int flags) {
    PP_CALL(pp, helper(pp, grad_in, -1, grad_out, +1, flags));
}
