/* The point-to-point layer's base (progress.h): its state and requests, and one progress round.
 * Each frame the transport hands over is matched against the posted receives (in posting
 * order), kept as unexpected within the budget, dropped as stale (its call finished here), or
 * taken as a peer's failure notice or a sender's withdrawal; rendezvous pulls nobody keeps,
 * rescue pulls and detached sends advance. */
#include "p2p/progress.h"

#include "core/log.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const hcomm__p2p_channel_names[HCOMM__CH_COUNT] = {"user", "collective", "control"};

/* comm.idle: a failure here shows again on the rank's next p2p wait. */
static void idle_progress(hcomm_comm_t *c) {
    (void)hcomm__progress(c);
}

static void free_uxm_list(uxm_t *u) {
    while (u) {
        uxm_t *n = u->next;
        free(u->data);
        free(u);
        u = n;
    }
}

static void p2p_free(void *ptr) {
    p2p_t *p = ptr;
    free_uxm_list(p->ux_head);
    free_uxm_list(p->draining);
    free(p->errs);
    free(p->next_id);
    while (p->detached) {
        hcomm__req_t *n = p->detached->next;
        free(p->detached);
        p->detached = n;
    }
    while (p->free_reqs) {
        hcomm__req_t *n = p->free_reqs->next;
        free(p->free_reqs);
        p->free_reqs = n;
    }
    free(p);
}

p2p_t *hcomm__p2p_create(hcomm_comm_t *c) {
    p2p_t *p = hcomm__layer_state(&c->layer[HCOMM__LAYER_P2P], &c->layer_free[HCOMM__LAYER_P2P],
                                  sizeof *p, hcomm__calloc_lines, p2p_free);
    if (p)
        c->idle = idle_progress;
    return p;
}

/* --- requests --- */

hcomm_result_t hcomm__p2p_req_new(hcomm_comm_t *c, hcomm__req_t **out) {
    p2p_t *p = p2p_of(c);
    if (!p)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for point-to-point state");
    hcomm__req_t *r = p->free_reqs;
    if (r) {
        p->free_reqs = r->next;
        p->free_count--;
    } else if ((r = malloc(sizeof *r)) == NULL) {
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for a request");
    }
    memset(r, 0, offsetof(hcomm__req_t, env));
    r->c = c;
    *out = r;
    return HCOMM_OK;
}

/* Completes r with an error whose text is kept in the request (reported by whoever waits). */
static void req_fail(hcomm__req_t *r, hcomm_result_t res, const char *fmt, ...) HCOMM__PRINTF(3, 4);
static void req_fail(hcomm__req_t *r, hcomm_result_t res, const char *fmt, ...) {
    if (r->res == HCOMM_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg, sizeof r->msg, fmt, ap);
        va_end(ap);
    }
    req_finish(r, res);
}

/* The thread's last error without the "call: " prefix that report() puts back. */
static const char *last_error_text(const hcomm_comm_t *c) {
    const char *e = hcomm_last_error();
    size_t n = strlen(c->call_fn);
    if (strncmp(e, c->call_fn, n) == 0 && e[n] == ':' && e[n + 1] == ' ')
        return e + n + 2;
    return e;
}

void hcomm__p2p_req_failed(hcomm__req_t *r, hcomm_result_t res) {
    req_fail(r, res, "%s", last_error_text(r->c));
}

/* --- rendezvous pulls that nobody keeps (stale or refused messages) --- */

void hcomm__p2p_drain_rndv(hcomm_comm_t *c, int src, const hcomm__env_t *env,
                           const hcomm__rndv_t *rv) {
    p2p_t *p = p2p_of(c);
    uxm_t *u = calloc(1, sizeof *u);
    void *sink = u && !c->tr->pull_discards ? malloc(env->bytes ? env->bytes : 1) : NULL;
    if (!u || (!sink && !c->tr->pull_discards)) {
        free(u);
        HCOMM__LOG(HCOMM__LOG_WARN, HCOMM__SUB_P2P,
                   "out of memory draining a %llu-byte message from rank %d",
                   (unsigned long long)env->bytes, src);
        return;
    }
    *u = (uxm_t){.src = src, .env = *env, .data = sink, .rndv = true, .rv = *rv};
    if (c->tr->pull(c, src, rv, sink, env->bytes, &u->rx) != HCOMM_OK) {
        free(sink);
        free(u);
        return;
    }
    u->next = p->draining;
    p->draining = u;
}

static void advance_drains(hcomm_comm_t *c) {
    p2p_t *p = p2p_of(c);
    for (uxm_t **pu = &p->draining; *pu;) {
        hcomm_result_t res;
        if (c->tr->test_rx(c, &(*pu)->rx, &res)) {
            uxm_t *u = *pu;
            *pu = u->next;
            free(u->data);
            free(u);
        } else {
            pu = &(*pu)->next;
        }
    }
}

/* --- matching what arrives --- */

/* Checks the incoming size against the receive; on a mismatch the request fails. */
static bool size_ok(hcomm__req_t *r, size_t bytes) {
    if (r->mode == HCOMM__RECV_ALLOC || (r->mode == HCOMM__RECV_UPTO && bytes <= r->cap) ||
        bytes == r->cap)
        return true;
    req_fail(r, HCOMM_ERR_MISMATCH,
             "message from rank %d (%s tag %d) has %llu bytes, the receive expects %s%zu", r->peer,
             hcomm__p2p_channel_names[r->channel], r->tag, (unsigned long long)bytes,
             r->mode == HCOMM__RECV_UPTO ? "at most " : "", r->cap);
    return false;
}

static hcomm_tensor_t tensor_of(const hcomm__env_t *e) {
    hcomm_tensor_t t = {.dtype = (hcomm_dtype_t)e->dtype, .ndim = e->ndim};
    for (int i = 0; i < e->ndim && i < HCOMM_MAX_DIMS; i++)
        t.shape[i] = e->shape[i];
    return t;
}

static const char *dtype_text(int32_t dt) {
    const char *name = "?";
    if (hcomm__dtype_valid((hcomm_dtype_t)dt))
        hcomm_dtype_name((hcomm_dtype_t)dt, &name);
    return name;
}

/* A receive that stated a tensor (r->expect): the sender's dtype and shape must be the same,
 * checked before any byte lands ("peer 0 sent f32 [4, 8], expected f32 [4, 9]"). */
static bool desc_ok(hcomm__req_t *r, const hcomm__env_t *env) {
    const hcomm__env_t *x = &r->expected;
    bool same = env->has_desc && env->dtype == x->dtype && env->ndim == x->ndim;
    for (int i = 0; same && i < x->ndim && i < HCOMM_MAX_DIMS; i++)
        same = env->shape[i] == x->shape[i];
    if (same)
        return true;
    if (!env->has_desc) {
        req_fail(r, HCOMM_ERR_MISMATCH, "peer %d sent a message that is not a tensor (tag %d)",
                 r->peer, r->tag);
        return false;
    }
    hcomm_tensor_t got = tensor_of(env), want = tensor_of(x);
    char gs[160], ws[160];
    req_fail(r, HCOMM_ERR_MISMATCH, "peer %d sent %s %s, expected %s %s", r->peer,
             dtype_text(env->dtype), hcomm__shape_str(&got, gs, sizeof gs), dtype_text(x->dtype),
             hcomm__shape_str(&want, ws, sizeof ws));
    return false;
}

static bool ensure_alloc(hcomm__req_t *r, size_t bytes) {
    if (r->mode != HCOMM__RECV_ALLOC)
        return true;
    if (hcomm__mem_alloc_private(bytes, &r->buf) == HCOMM_OK) /* the user frees it with */
        return true;                                          /* hcomm_mem_free() */
    req_fail(r, HCOMM_ERR_NOMEM, "out of memory receiving %zu bytes from rank %d", bytes, r->peer);
    return false;
}

bool hcomm__p2p_accepts(hcomm__req_t *r, const hcomm__env_t *env) {
    return (!r->expect || desc_ok(r, env)) && size_ok(r, (size_t)env->bytes) &&
           ensure_alloc(r, (size_t)env->bytes);
}

void hcomm__p2p_land(hcomm_comm_t *c, hcomm__req_t *r, int src, const hcomm__env_t *env,
                     const void *payload, const hcomm__rndv_t *rv) {
    r->env = *env;
    size_t bytes = (size_t)env->bytes;
    if (!hcomm__p2p_accepts(r, env)) {
        if (rv)
            hcomm__p2p_drain_rndv(c, src, env, rv);
        return;
    }
    if (!rv) {
        if (bytes)
            memcpy(r->buf, payload, bytes);
        req_finish(r, HCOMM_OK);
        return;
    }
    hcomm_result_t res = c->tr->pull(c, src, rv, r->buf, bytes, &r->tr);
    if (res != HCOMM_OK)
        hcomm__p2p_req_failed(r, res);
    else
        r->state = REQ_PULLING;
}

static hcomm__req_t *take_posted(p2p_t *p, int src, const hcomm__env_t *env) {
    hcomm__req_t *prev = NULL;
    for (hcomm__req_t *r = p->posted_head; r; prev = r, r = r->next)
        if (key_matches(r->peer, r->channel, r->tag, src, env)) {
            posted_unlink(p, prev, r);
            return r;
        }
    return NULL;
}

/* Keeps a peer's failure notice (sent by hcomm__notify_error, read by hcomm__peer_error, dropped
 * by hcomm__coll_done: notice.c) as it arrives. */
static void record_peer_error(hcomm_comm_t *c, p2p_t *p, int src, const hcomm__env_t *env,
                              const void *text) {
    uint32_t seq = (uint32_t)env->tag;
    HCOMM__LOG(HCOMM__LOG_DEBUG, HCOMM__SUB_P2P, "notice from rank %d for seq %u (done %u)", src,
               (unsigned)seq, (unsigned)p->coll_done);
    if (env->result == HCOMM_ERR_REVOKED) { /* revoked here too; this rank tells its peers on */
        for (hcomm_comm_t *d = c; d; d = atomic_load(&d->abort_with)) {
            int none = 0;
            atomic_compare_exchange_strong(&d->aborted, &none, HCOMM__REVOKE_CALLED);
        }
        return;
    }
    if (env->result == HCOMM_ERR_ABORTED) { /* whatever call this rank is in or makes later */
        if (!p->aborted_by)
            p->aborted_by = src + 1;
        return;
    }
    if (p->coll_started && !seq_before(p->coll_done, seq))
        return; /* a call this rank already finished */
    for (int i = 0; i < p->nerrs; i++)
        if (p->errs[i].seq == seq)
            return; /* the first notice of a call is the one reported */
    if (p->nerrs == p->errs_cap) {
        int cap = p->errs_cap ? 2 * p->errs_cap : 8;
        peer_err_t *grown = realloc(p->errs, sizeof *grown * (size_t)cap);
        if (!grown)
            return; /* the call then ends by its timeout, not by the notice */
        p->errs = grown;
        p->errs_cap = cap;
    }
    peer_err_t *e = &p->errs[p->nerrs++];
    size_t n = env->bytes < sizeof e->text - 1 ? (size_t)env->bytes : sizeof e->text - 1;
    *e = (peer_err_t){.seq = seq, .src = src, .why = (hcomm_result_t)env->result};
    if (text)
        memcpy(e->text, text, n);
    e->text[n] = '\0';
}

/* Keeps an unmatched message; false (and the budget marked full) when it does not fit. */
static bool keep_unexpected(p2p_t *p, hcomm_comm_t *c, int src, const hcomm__env_t *env,
                            const void *payload, const hcomm__rndv_t *rv) {
    size_t bytes = rv ? 0 : (size_t)env->bytes;
    if (p->ux_bytes + bytes > c->unexpected_cap) {
        p->full = true;
        p->full_src = src;
        p->full_tag = env->tag;
        p->full_channel = env->channel;
        p->full_bytes = (size_t)env->bytes;
        return false;
    }
    uxm_t *u = calloc(1, sizeof *u);
    void *data = bytes ? malloc(bytes) : NULL;
    if (!u || (bytes && !data)) {
        free(u);
        free(data);
        return false; /* offered again later */
    }
    *u = (uxm_t){.src = src, .env = *env, .data = data, .rndv = rv != NULL, .charged = bytes};
    if (rv)
        u->rv = *rv;
    if (bytes)
        memcpy(data, payload, bytes);
    p->ux_bytes += bytes;
    QUEUE_APPEND(p->ux_head, p->ux_tail, u);
    return true;
}

/* A sender gave up a rendezvous message (its send timed out or was aborted): if it still waits
 * here unpulled, it is dropped without ever reading the sender's buffer. */
static void forget_withdrawn(p2p_t *p, int src, const hcomm__env_t *w) {
    uxm_t *prev = NULL;
    for (uxm_t *u = p->ux_head; u; prev = u, u = u->next) {
        if (u->src != src || !u->rndv || u->pulled || u->env.result != w->result ||
            u->env.channel != w->channel || u->env.tag != w->tag)
            continue;
        ux_unlink(p, prev, u);
        free(u);
        return;
    }
}

/* The transport's delivery callback. */
static bool deliver(hcomm_comm_t *c, int src, const void *hdr, const void *payload, size_t bytes,
                    const hcomm__rndv_t *rv) {
    p2p_t *p = p2p_of(c);
    hcomm__env_t env;
    memcpy(&env, hdr, sizeof env);
    (void)bytes;
    p->delivered++;
    if (env.kind == HCOMM__ENV_ERROR) {
        record_peer_error(c, p, src, &env, payload);
        return true;
    }
    if (env.kind == HCOMM__ENV_WITHDRAW) {
        forget_withdrawn(p, src, &env);
        return true;
    }
    if (stale(p, &env)) {
        if (rv)
            hcomm__p2p_drain_rndv(c, src, &env, rv);
        return true;
    }
    hcomm__req_t *r = take_posted(p, src, &env);
    if (r) {
        hcomm__p2p_land(c, r, src, &env, payload, rv);
        return true;
    }
    return keep_unexpected(p, c, src, &env, payload, rv);
}

/* While a blocking send waits, unexpected rendezvous messages are pulled into the budget so the
 * peer's send completes too (two ranks that send to each other, then receive). */
static void rescue_unexpected(hcomm_comm_t *c) {
    p2p_t *p = p2p_of(c);
    for (uxm_t *u = p->ux_head; u; u = u->next) {
        size_t bytes = (size_t)u->env.bytes;
        if (!u->rndv || u->pulled)
            continue;
        if (p->ux_bytes + bytes > c->unexpected_cap) {
            p->rescue_blocked = true;
            p->rb_src = u->src;
            p->rb_tag = u->env.tag;
            p->rb_channel = u->env.channel;
            p->rb_bytes = bytes;
            continue;
        }
        u->data = malloc(bytes ? bytes : 1);
        if (!u->data)
            return;
        if (c->tr->pull(c, u->src, &u->rv, u->data, bytes, &u->rx) != HCOMM_OK) {
            free(u->data);
            u->data = NULL;
            return;
        }
        u->pulled = true;
        u->charged = bytes;
        p->ux_bytes += bytes;
    }
}

static void advance_rescues(hcomm_comm_t *c) {
    p2p_t *p = p2p_of(c);
    for (uxm_t *u = p->ux_head; u; u = u->next) {
        hcomm_result_t res;
        if (u->pulled && !u->arrived && c->tr->test_rx(c, &u->rx, &res))
            u->arrived = true;
    }
}

/* Frees detached sends once the transport is done with them. */
static void advance_detached(hcomm_comm_t *c) {
    p2p_t *p = p2p_of(c);
    for (hcomm__req_t **pr = &p->detached; *pr;) {
        hcomm__req_t *r = *pr;
        if (advance(r)) {
            *pr = r->next;
            req_release(r);
        } else {
            pr = &r->next;
        }
    }
}

hcomm_result_t hcomm__progress(hcomm_comm_t *c) {
    p2p_t *p = p2p_of(c);
    if (!p)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for point-to-point state");
    p->full = false; /* set again if a message still does not fit */
    HCOMM__TRY(c->tr->poll(c, deliver));
    if (p->draining)
        advance_drains(c);
    if (p->detached)
        advance_detached(c);
    if (p->rescue > 0) {
        p->rescue_blocked = false; /* set again if a message still does not fit */
        rescue_unexpected(c);
        advance_rescues(c);
    }
    return HCOMM_OK;
}

size_t hcomm__unexpected_bytes(hcomm_comm_t *c) {
    p2p_t *p = p2p_of(c);
    return p ? p->ux_bytes : 0;
}
