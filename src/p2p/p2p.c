/* hcomm's point-to-point layer: matching, protocols and requests over any transport (see
 * p2p.h for the rules it keeps). */
#include "p2p/p2p.h"

#include "core/env.h"
#include "core/log.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { REQ_POSTED, REQ_PULLING, REQ_RESCUED, REQ_DONE, REQ_GROUPED } req_state_t;

/* A message that arrived before its receive. */
typedef struct uxm {
    struct uxm *next;
    int src;
    hcomm__env_t env;
    void *data;     /* eager copy, or the rescue buffer of a pulled rendezvous message */
    bool rndv;      /* the payload is still at the sender (unless pulled) */
    bool pulled;    /* rescue: a pull into data was started */
    bool arrived;   /* rescue pull finished */
    size_t charged; /* bytes counted against the unexpected budget */
    hcomm__rndv_t rv;
    hcomm__treq_t rx;
} uxm_t;

struct hcomm__req {
    hcomm_comm_t *c;
    struct hcomm__req *next; /* posted queue, group list or free list */
    req_state_t state;
    bool is_recv, rndv;
    hcomm__recv_mode_t mode;
    int peer, channel, tag;
    void *buf;
    size_t cap;
    uxm_t *rescued; /* REQ_RESCUED: the unexpected message whose pull is still running */
    bool expect;    /* the sender's dtype and shape must equal expected's */
    bool abandoned; /* given up while the transport may still touch it: never reused */
    hcomm_result_t res;
    /* Not cleared per request (a latency-bound exchange pays for every byte it touches): */
    hcomm__env_t env; /* sent, or matched; set before use */
    hcomm__env_t expected;
    char msg[256]; /* valid when res != HCOMM_OK */
    hcomm__treq_t tr;
};

typedef struct peer_err {
    uint32_t seq;
    int src;
    hcomm_result_t why;
    char text[256];
} peer_err_t;

typedef struct p2p {
    hcomm__req_t *posted_head, *posted_tail;
    uxm_t *ux_head, *ux_tail;
    size_t ux_bytes;
    uxm_t *draining;         /* stale or refused rendezvous messages being pulled into scratch */
    hcomm__req_t *detached;  /* sends nobody waits for (peer-failure notices) */
    int32_t *next_id;        /* [size] number of the next message to each peer */
    unsigned long delivered; /* frames the transport handed over so far */
    bool abort_told;         /* peers were told of this rank's hcomm_comm_abort() */
    hcomm__req_t *free_reqs;
    int free_count;
    hcomm__req_t *group_head, *group_tail;
    bool in_group;
    int rescue;          /* > 0 while a blocking send waits */
    bool rescue_blocked; /* an unexpected rendezvous message did not fit the budget: */
    int rb_src, rb_tag, rb_channel;
    size_t rb_bytes;
    bool full; /* a message could not be kept: the budget is spent */
    int full_src, full_tag, full_channel;
    size_t full_bytes;
    bool coll_started;
    uint32_t coll_done; /* last finished collective seq on this rank */
    peer_err_t *errs;   /* one per failed call this rank has not finished yet */
    int nerrs, errs_cap;
} p2p_t;

static const char *const channel_names[HCOMM__CH_COUNT] = {"user", "collective", "control"};

static void p2p_free(void *p);

/* comm.idle: a failure here shows again on the rank's next p2p wait. */
static void idle_progress(hcomm_comm_t *c) {
    (void)hcomm__progress(c);
}

static p2p_t *p2p_of(hcomm_comm_t *c) {
    p2p_t *p = c->layer[HCOMM__LAYER_P2P];
    if (p)
        return p;
    p = hcomm__calloc_lines(1, sizeof *p);
    if (p) {
        c->layer[HCOMM__LAYER_P2P] = p;
        c->layer_free[HCOMM__LAYER_P2P] = p2p_free;
        c->idle = idle_progress;
    }
    return p;
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

/* Seq a is before b, modulo 2^32. */
static bool seq_before(uint32_t a, uint32_t b) {
    return (int32_t)(a - b) < 0;
}

/* --- requests --- */

static hcomm_result_t req_new(hcomm_comm_t *c, hcomm__req_t **out) {
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

/* Keeps a few requests for reuse, so steady traffic does not call malloc. */
static void req_release(hcomm__req_t *r) {
    p2p_t *p = p2p_of(r->c);
    if (p && p->free_count < 64) {
        r->next = p->free_reqs;
        p->free_reqs = r;
        p->free_count++;
        return;
    }
    free(r);
}

static void req_finish(hcomm__req_t *r, hcomm_result_t res) {
    r->state = REQ_DONE;
    if (r->res == HCOMM_OK)
        r->res = res;
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

/* --- rendezvous pulls that nobody keeps (stale or refused messages) --- */

static void drain_rndv(hcomm_comm_t *c, int src, const hcomm__env_t *env, const hcomm__rndv_t *rv) {
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

/* --- matching --- */

static bool key_matches(int peer, int channel, int tag, int src, const hcomm__env_t *env) {
    return peer == src && channel == env->channel && tag == env->tag;
}

/* Checks the incoming size against the receive; on a mismatch the request fails. */
static bool size_ok(hcomm__req_t *r, size_t bytes) {
    if (r->mode == HCOMM__RECV_ALLOC || (r->mode == HCOMM__RECV_UPTO && bytes <= r->cap) ||
        bytes == r->cap)
        return true;
    req_fail(r, HCOMM_ERR_MISMATCH,
             "message from rank %d (%s tag %d) has %llu bytes, the receive expects %s%zu", r->peer,
             channel_names[r->channel], r->tag, (unsigned long long)bytes,
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

/* A receive that stated a tensor: the sender's dtype and shape must be the same, checked
 * before any byte lands ("peer 0 sent f32 [4, 8], expected f32 [4, 9]"). */
static bool desc_ok(hcomm__req_t *r, const hcomm__env_t *env) {
    if (!r->expect)
        return true;
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

/* Gives a matched eager payload or rendezvous handle to receive r. */
static void land(hcomm_comm_t *c, hcomm__req_t *r, int src, const hcomm__env_t *env,
                 const void *payload, const hcomm__rndv_t *rv) {
    r->env = *env;
    size_t bytes = (size_t)env->bytes;
    if (!desc_ok(r, env) || !size_ok(r, bytes) || !ensure_alloc(r, bytes)) {
        if (rv)
            drain_rndv(c, src, env, rv);
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
        req_fail(r, res, "%s", last_error_text(r->c));
    else
        r->state = REQ_PULLING;
}

/* Unlinks r, which follows prev (NULL: r is the head), from the posted-receive queue. */
static void posted_unlink(p2p_t *p, hcomm__req_t *prev, hcomm__req_t *r) {
    if (prev)
        prev->next = r->next;
    else
        p->posted_head = r->next;
    if (p->posted_tail == r)
        p->posted_tail = prev;
    r->next = NULL;
}

/* Unlinks u, which follows prev (NULL: u is the head), from the unexpected-message queue. */
static void ux_unlink(p2p_t *p, uxm_t *prev, uxm_t *u) {
    if (prev)
        prev->next = u->next;
    else
        p->ux_head = u->next;
    if (p->ux_tail == u)
        p->ux_tail = prev;
    u->next = NULL;
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

static void record_peer_error(p2p_t *p, int src, const hcomm__env_t *env, const void *text) {
    uint32_t seq = (uint32_t)env->tag;
    HCOMM__LOG(HCOMM__LOG_DEBUG, HCOMM__SUB_P2P, "notice from rank %d for seq %u (done %u)", src,
               (unsigned)seq, (unsigned)p->coll_done);
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

static bool stale(const p2p_t *p, const hcomm__env_t *env) {
    return env->channel == HCOMM__CH_COLL && p->coll_started &&
           !seq_before(p->coll_done, (uint32_t)env->tag);
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
    if (p->ux_tail)
        p->ux_tail->next = u;
    else
        p->ux_head = u;
    p->ux_tail = u;
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
        record_peer_error(p, src, &env, payload);
        return true;
    }
    if (env.kind == HCOMM__ENV_WITHDRAW) {
        forget_withdrawn(p, src, &env);
        return true;
    }
    if (stale(p, &env)) {
        if (rv)
            drain_rndv(c, src, &env, rv);
        return true;
    }
    hcomm__req_t *r = take_posted(p, src, &env);
    if (r) {
        land(c, r, src, &env, payload, rv);
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

static void advance_detached(hcomm_comm_t *c);

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

static bool advance(hcomm__req_t *r);

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

/* --- posting --- */

static hcomm_result_t check_peer(hcomm_comm_t *c, int peer, int channel) {
    if (atomic_load_explicit(&c->aborted, memory_order_relaxed))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "hcomm_comm_abort() was called on this communicator");
    if (peer < 0 || peer >= c->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, c->call_fn, "peer=%d outside 0..%d", peer,
                          c->size - 1);
    if (channel < 0 || channel >= HCOMM__CH_COUNT)
        return hcomm__err(HCOMM_ERR_INTERNAL, c->call_fn, "channel=%d is not a channel", channel);
    return HCOMM_OK;
}

static hcomm_result_t start_send(hcomm__req_t *r) {
    hcomm_comm_t *c = r->c;
    r->rndv = r->env.bytes > c->eager_limit;
    r->state = REQ_POSTED;
    hcomm_result_t res =
        c->tr->send_frame(c, r->peer, &r->env, r->buf, (size_t)r->env.bytes, r->rndv, &r->tr);
    if (res != HCOMM_OK)
        req_fail(r, res, "%s", last_error_text(r->c));
    return HCOMM_OK;
}

static hcomm_result_t start_recv(hcomm__req_t *r);

static int32_t next_message_id(p2p_t *p, hcomm_comm_t *c, int peer) {
    if (!p->next_id)
        p->next_id = calloc((size_t)c->size, sizeof *p->next_id);
    return p->next_id ? ++p->next_id[peer] : 0;
}

static void group_add(p2p_t *p, hcomm__req_t *r) {
    r->state = REQ_GROUPED;
    r->next = NULL;
    if (p->group_tail)
        p->group_tail->next = r;
    else
        p->group_head = r;
    p->group_tail = r;
}

hcomm_result_t hcomm__isend(hcomm_comm_t *c, int channel, int tag, int peer, const void *buf,
                            size_t bytes, const hcomm__env_t *desc, hcomm__req_t **req) {
    HCOMM__TRY(check_peer(c, peer, channel));
    hcomm__req_t *r;
    HCOMM__TRY(req_new(c, &r));
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

/* Copies a rescued message once its pull finished; frees the unexpected entry. */
static void finish_rescued(hcomm__req_t *r) {
    uxm_t *u = r->rescued;
    p2p_t *p = p2p_of(r->c);
    if (r->res == HCOMM_OK && u->env.bytes)
        memcpy(r->buf, u->data, (size_t)u->env.bytes);
    p->ux_bytes -= u->charged;
    free(u->data);
    free(u);
    r->rescued = NULL;
    req_finish(r, HCOMM_OK);
}

static void land_unexpected(hcomm__req_t *r, uxm_t *u) {
    p2p_t *p = p2p_of(r->c);
    if (u->rndv && !u->pulled) {
        land(r->c, r, u->src, &u->env, NULL, &u->rv);
        free(u);
        return;
    }
    if (u->rndv) { /* rescued: its data is (or will be) in u->data */
        r->env = u->env;
        if (desc_ok(r, &u->env) && size_ok(r, (size_t)u->env.bytes) &&
            ensure_alloc(r, (size_t)u->env.bytes)) {
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
    land(r->c, r, u->src, &u->env, u->data, NULL);
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
    if (p->posted_tail)
        p->posted_tail->next = r;
    else
        p->posted_head = r;
    p->posted_tail = r;
    return HCOMM_OK;
}

hcomm_result_t hcomm__irecv(hcomm_comm_t *c, int channel, int tag, int peer, void *buf, size_t cap,
                            hcomm__recv_mode_t mode, hcomm__req_t **req) {
    HCOMM__TRY(check_peer(c, peer, channel));
    hcomm__req_t *r;
    HCOMM__TRY(req_new(c, &r));
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
    HCOMM__TRY(req_new(c, &r));
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

/* --- completion --- */

/* Advances r without polling the transport; true once it is done. */
static bool advance(hcomm__req_t *r) {
    hcomm_comm_t *c = r->c;
    hcomm_result_t res = HCOMM_OK;
    switch (r->state) {
    case REQ_POSTED:
        if (!r->is_recv && c->tr->test_tx(c, &r->tr, &res))
            req_finish(r, res);
        break;
    case REQ_PULLING:
        if (c->tr->test_rx(c, &r->tr, &res))
            req_finish(r, res);
        break;
    case REQ_RESCUED:
        if (!r->rescued->arrived && c->tr->test_rx(c, &r->rescued->rx, &res))
            r->rescued->arrived = true;
        if (r->rescued->arrived)
            finish_rescued(r);
        break;
    default:
        break;
    }
    return r->state == REQ_DONE;
}

hcomm_result_t hcomm__test(hcomm__req_t *r, bool *done) {
    HCOMM__TRY(hcomm__progress(r->c));
    *done = advance(r);
    return HCOMM_OK;
}

static void unpost(p2p_t *p, hcomm__req_t *r) {
    hcomm__req_t *prev = NULL;
    for (hcomm__req_t *q = p->posted_head; q; prev = q, q = q->next)
        if (q == r) {
            posted_unlink(p, prev, q);
            return;
        }
}

/* Gives up r after a timeout or abort; the transport never touches its buffer afterwards. */
/* Tells the receiver to drop rendezvous message r if it has not pulled it yet (eager, so the
 * notice never waits; it comes after the message itself, frames of one source stay in order). */
static void withdraw(hcomm__req_t *r) {
    hcomm__req_t *n;
    if (req_new(r->c, &n) != HCOMM_OK)
        return;
    n->env = r->env;
    n->env.kind = HCOMM__ENV_WITHDRAW;
    n->env.bytes = 0;
    n->peer = r->peer;
    n->channel = r->channel;
    n->state = REQ_POSTED;
    if (r->c->tr->send_frame(r->c, r->peer, &n->env, NULL, 0, false, &n->tr) != HCOMM_OK) {
        req_release(n);
        return;
    }
    p2p_t *p = p2p_of(r->c);
    n->next = p->detached;
    p->detached = n;
}

/* The transport may still write into a request it could not cancel (a rendezvous send whose
 * receiver copies later sets its done flag), so such a request is never reused. */
static void cancel(hcomm__req_t *r) {
    hcomm_comm_t *c = r->c;
    if (r->state == REQ_POSTED && r->is_recv) {
        unpost(p2p_of(c), r);
    } else if (r->state == REQ_POSTED && !r->is_recv && r->rndv) {
        withdraw(r);
        c->tr->cancel(c, &r->tr, true);
        r->abandoned = true; /* the receiver may still look at its flag */
    } else if ((r->state == REQ_POSTED || r->state == REQ_PULLING) &&
               !c->tr->cancel(c, &r->tr, !r->is_recv)) {
        r->abandoned = true;
    } else if (r->state == REQ_RESCUED) {
        r->rescued = NULL; /* its entry stays reachable from nowhere: leaked, never written */
    }
}

static const char *what_awaited(const hcomm__req_t *r, char *buf, size_t cap) {
    if (r->is_recv)
        snprintf(buf, cap, "a message from rank %d (%s channel, tag %d)", r->peer,
                 channel_names[r->channel], r->tag);
    else
        snprintf(buf, cap, "rank %d to receive a %llu-byte message (%s channel, tag %d)", r->peer,
                 (unsigned long long)r->env.bytes, channel_names[r->channel], r->tag);
    return buf;
}

/* After hcomm_comm_abort(): peers waiting in this collective (coll: seq is one) learn it now
 * instead of at their timeout. */
static hcomm_result_t aborted_in(hcomm_comm_t *c, bool coll, uint32_t seq) {
    p2p_t *p = p2p_of(c);
    if (coll && !p->abort_told) {
        char note[160];
        snprintf(note, sizeof note, "rank %d called hcomm_comm_abort() on this communicator",
                 c->rank);
        p->abort_told = true;
        hcomm__notify_error(c, seq, HCOMM_ERR_PEER, note);
    }
    return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                      "hcomm_comm_abort() was called on this communicator");
}

/* A peer's failure notice for call seq as this rank's result (HCOMM_OK: none arrived). */
static hcomm_result_t peer_verdict(hcomm_comm_t *c, uint32_t seq) {
    int src;
    hcomm_result_t why;
    char text[256];
    if (!hcomm__peer_error(c, seq, &src, &why, text, sizeof text))
        return HCOMM_OK;
    return hcomm__err(why == HCOMM_ERR_MISMATCH ? why : HCOMM_ERR_PEER, c->call_fn, "%s", text);
}

/* Why a wait on r must end now (HCOMM_OK: keep waiting). */
static hcomm_result_t wait_verdict(hcomm__req_t *r, double waited) {
    hcomm_comm_t *c = r->c;
    p2p_t *p = p2p_of(c);
    char what[160];
    /* A send of a failed call still completes: its receiver drops the message as stale on
     * arrival (pulling a rendezvous payload into scratch), so only receives end early here. */
    if (r->channel == HCOMM__CH_COLL && r->is_recv)
        HCOMM__TRY(peer_verdict(c, (uint32_t)r->tag));
    if (c->tr->world_aborted(c))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "another rank failed while this rank waited for %s",
                          what_awaited(r, what, sizeof what));
    if (atomic_load_explicit(&c->aborted, memory_order_relaxed))
        return aborted_in(c, r->channel == HCOMM__CH_COLL, (uint32_t)r->tag);
    if (p->full && r->is_recv)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn,
                          "cannot keep a %zu-byte message from rank %d (%s channel, tag %d) that "
                          "no receive has matched: %zu bytes of unexpected messages are held, "
                          "HCOMM_UNEXPECTED_BYTES=%zu",
                          p->full_bytes, p->full_src, channel_names[p->full_channel], p->full_tag,
                          p->ux_bytes, c->unexpected_cap);
    /* Both ranks wait in a send and the peer's message does not fit the budget: neither can
     * finish. A second's grace lets an unrelated peer's message be received first. */
    if (p->rescue_blocked && p->rescue > 0 && waited > 1.0)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn,
                          "cannot take a %zu-byte message from rank %d (%s channel, tag %d) into "
                          "the unexpected-message buffer while this rank waits for %s: %zu bytes "
                          "held, HCOMM_UNEXPECTED_BYTES=%zu",
                          p->rb_bytes, p->rb_src, channel_names[p->rb_channel], p->rb_tag,
                          what_awaited(r, what, sizeof what), p->ux_bytes, c->unexpected_cap);
    if (waited > c->timeout_s)
        return hcomm__err(HCOMM_ERR_TIMEOUT, c->call_fn,
                          "waited %g s for %s (seq %u, HCOMM_TIMEOUT%s)", c->timeout_s,
                          what_awaited(r, what, sizeof what), (unsigned)c->call_seq,
                          hcomm__check_hint(c->tr->posted_only != NULL));
    return HCOMM_OK;
}

static hcomm_result_t report(hcomm__req_t *r) {
    if (r->res == HCOMM_OK)
        return HCOMM_OK;
    return hcomm__err(r->res, r->c->call_fn, "%s", r->msg[0] ? r->msg : hcomm_strerror(r->res));
}

/* How long a receive whose payload is already being pulled may take to finish once its call
 * failed elsewhere: its sender is alive, and a pull cancelled under way (MPI_Cancel of the
 * payload's receive) would leave that sender waiting out HCOMM_TIMEOUT. */
#define PULL_DRAIN_S 0.5

/* Whether r completed, given a little time (PULL_DRAIN_S, at most HCOMM_TIMEOUT) where its
 * payload is being pulled. */
static bool finish_pull(hcomm__req_t *r) {
    hcomm_comm_t *c = r->c;
    double limit = c->timeout_s < PULL_DRAIN_S ? c->timeout_s : PULL_DRAIN_S;
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    do {
        if (hcomm__progress(c) == HCOMM_OK && advance(r))
            return true;
    } while (r->is_recv && r->state == REQ_PULLING && hcomm__backoff(&b) <= limit);
    return false;
}

/* Blocks until r is done or must be given up. A blocking send pulls unexpected rendezvous
 * messages into the unexpected budget at once (so two ranks that send to each other, then
 * receive, complete); any other wait does so once it has lasted 2 ms, so code that assumes
 * buffered sends (a receive of tag 6 while the peer blocks sending tag 5) completes within the
 * budget, while traffic received in order keeps its single copy. */
static hcomm_result_t complete(hcomm__req_t *r) {
    hcomm_comm_t *c = r->c;
    p2p_t *p = p2p_of(c);
    bool blocking_send = !r->is_recv;
    if (blocking_send)
        p->rescue++;
    hcomm_result_t res = HCOMM_OK;
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    bool rescuing = blocking_send;
    for (;;) {
        res = hcomm__progress(c);
        if (res != HCOMM_OK || advance(r))
            break;
        double waited = hcomm__backoff(&b);
        if (!rescuing && b.napping) { /* see start_rescue */
            rescuing = true;
            p->rescue++;
        }
        if ((b.iter & 63) == 0 && (res = wait_verdict(r, waited)) != HCOMM_OK) {
            char keep[512];
            snprintf(keep, sizeof keep, "%s", hcomm_last_error());
            if (finish_pull(r)) { /* it completed meanwhile */
                res = HCOMM_OK;
                break;
            }
            hcomm__err_text(res, keep);
            cancel(r);
            break;
        }
    }
    if (rescuing)
        p->rescue--;
    return res;
}

hcomm_result_t hcomm__wait(hcomm__req_t *r, hcomm__env_t *env, void **data) {
    hcomm_result_t res = complete(r);
    if (res == HCOMM_OK)
        res = report(r);
    if (env)
        *env = r->env;
    if (data)
        *data = res == HCOMM_OK && r->mode == HCOMM__RECV_ALLOC ? r->buf : NULL;
    if (res != HCOMM_OK && r->mode == HCOMM__RECV_ALLOC && r->state == REQ_DONE)
        hcomm_mem_free(r->buf);
    if (!r->abandoned)
        req_release(r);
    return res;
}

hcomm_result_t hcomm__wait_all(hcomm__req_t **reqs, int n) {
    hcomm_result_t first = HCOMM_OK;
    char msg[512] = "";
    for (int i = 0; i < n; i++) {
        if (!reqs[i])
            continue;
        hcomm_result_t r = hcomm__wait(reqs[i], NULL, NULL);
        reqs[i] = NULL;
        if (r != HCOMM_OK && first == HCOMM_OK) {
            first = r;
            snprintf(msg, sizeof msg, "%s", hcomm_last_error());
        }
    }
    if (first != HCOMM_OK) /* later failures must not overwrite the first one's message */
        hcomm__err_text(first, msg);
    return first;
}

/* --- the lane (transport.lane_post) --- */

typedef struct lane_hdr {
    uint32_t seq, bytes;
    hcomm__sig_t sig;
} lane_hdr_t;

_Static_assert(sizeof(lane_hdr_t) <= HCOMM__LANE_HDR, "the lane header fits its room");

size_t hcomm__lane_payload(const hcomm_comm_t *c) {
    return c->tr->lane_post ? HCOMM__LANE_MAX - HCOMM__LANE_HDR : 0;
}

typedef struct lane_step {
    hcomm_comm_t *c;
    uint32_t seq;
    int to, from;
    bool sent, received;
    void *rbuf;
    size_t rcap;
    hcomm__treq_t tx, rx;
} lane_step_t;

static hcomm_result_t lane_post_recv(lane_step_t *s) {
    return s->c->tr->lane_post(s->c, s->from, s->seq, s->rbuf, HCOMM__LANE_HDR + s->rcap, false,
                               &s->rx);
}

/* Advances s: true once both halves are done (or *res failed). A message of an older call
 * with the same lane key (its receiver had failed) is dropped and the receive posted again. */
static bool lane_advance(lane_step_t *s, hcomm_result_t *res) {
    size_t got = 0;
    if (!s->sent && s->c->tr->lane_test(s->c, &s->tx, res, &got))
        s->sent = true;
    if (*res == HCOMM_OK && !s->received && s->c->tr->lane_test(s->c, &s->rx, res, &got)) {
        lane_hdr_t h;
        memcpy(&h, s->rbuf, sizeof h);
        s->received = *res != HCOMM_OK || (got >= sizeof h && h.seq == s->seq);
        if (!s->received)
            *res = lane_post_recv(s);
    }
    return *res != HCOMM_OK || (s->sent && s->received);
}

hcomm_result_t hcomm__coll_wait_verdict(hcomm_comm_t *c, uint32_t seq, const char *what,
                                        double waited) {
    HCOMM__TRY(hcomm__progress(c)); /* notices arrive as frames */
    HCOMM__TRY(peer_verdict(c, seq));
    if (c->tr->world_aborted(c))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "another rank failed while this rank waited for %s", what);
    if (atomic_load_explicit(&c->aborted, memory_order_relaxed))
        return aborted_in(c, true, seq);
    if (waited > c->timeout_s)
        return hcomm__err(HCOMM_ERR_TIMEOUT, c->call_fn,
                          "waited %g s for %s (seq %u, HCOMM_TIMEOUT%s)", c->timeout_s, what,
                          (unsigned)c->call_seq, hcomm__check_hint(c->tr->posted_only != NULL));
    return HCOMM_OK;
}

/* Why a lane wait must end now (HCOMM_OK: keep waiting). */
static hcomm_result_t lane_verdict(lane_step_t *s, double waited) {
    char what[96];
    snprintf(what, sizeof what, "a message from rank %d (collective channel, tag %u)",
             s->received ? s->to : s->from, (unsigned)s->seq);
    return hcomm__coll_wait_verdict(s->c, s->seq, what, waited);
}

/* How long a lane send may take to complete after a peer's notice ended its step. */
#define LANE_DRAIN_S 0.5

/* Ends s after `why`. A send still in flight is one eager message: after a peer's notice
 * (the peer is alive and progresses in its next call) it completes within milliseconds, so
 * it is waited for (at most LANE_DRAIN_S, bounded by HCOMM_TIMEOUT: a backend that sends it
 * by rendezvous never completes it) instead of cancelled at once: a send MPI cannot cancel
 * leaves the communicator unusable, and the next call would fail on every rank. */
static void lane_give_up(lane_step_t *s, hcomm_result_t why) {
    if (!s->received)
        s->c->tr->cancel(s->c, &s->rx, false);
    if (!s->sent && (why == HCOMM_ERR_PEER || why == HCOMM_ERR_MISMATCH)) {
        hcomm__backoff_t b;
        hcomm__backoff_init(&b);
        hcomm_result_t res = HCOMM_OK;
        size_t got;
        double limit = s->c->timeout_s < LANE_DRAIN_S ? s->c->timeout_s : LANE_DRAIN_S;
        while (!s->sent && hcomm__backoff(&b) <= limit)
            s->sent = s->c->tr->lane_test(s->c, &s->tx, &res, &got) && res == HCOMM_OK;
    }
    if (!s->sent)
        s->c->tr->cancel(s->c, &s->tx, true);
}

hcomm_result_t hcomm__lane_step(hcomm_comm_t *c, uint32_t seq, const hcomm__sig_t *sig, int to,
                                void *sbuf, size_t sbytes, int from, void *rbuf, size_t rcap,
                                hcomm__sig_t *got_sig, size_t *got) {
    lane_step_t s; /* field by field: zeroing the two transport requests costs a tenth of it */
    s.c = c;
    s.seq = seq;
    s.to = to;
    s.from = from;
    s.sent = to < 0;
    s.received = true; /* no receive posted yet, none to cancel */
    s.rbuf = rbuf;
    s.rcap = rcap;
    /* The send goes first: the peer waits for it. The receive posted right after it usually
     * precedes the peer's message; when it does not, MPI holds the message as unexpected and
     * matches it in order (messages of one peer and key stay in order either way). */
    if (to >= 0) {
        lane_hdr_t h = {seq, (uint32_t)sbytes, *sig};
        memcpy(sbuf, &h, sizeof h);
        hcomm_result_t res =
            c->tr->lane_post(c, to, seq, sbuf, HCOMM__LANE_HDR + sbytes, true, &s.tx);
        if (res != HCOMM_OK) {
            lane_give_up(&s, res);
            return res;
        }
    }
    if (from >= 0) {
        hcomm_result_t res = lane_post_recv(&s);
        if (res != HCOMM_OK) {
            lane_give_up(&s, res);
            return res;
        }
        s.received = false;
    }
    hcomm_result_t res = HCOMM_OK;
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    while (!lane_advance(&s, &res)) {
        double waited = hcomm__backoff(&b);
        if ((b.iter & 63) == 0 && (res = lane_verdict(&s, waited)) != HCOMM_OK) {
            lane_give_up(&s, res);
            return res;
        }
    }
    if (res != HCOMM_OK) {
        lane_give_up(&s, res);
        return res;
    }
    if (from >= 0) {
        lane_hdr_t h;
        memcpy(&h, rbuf, sizeof h);
        *got_sig = h.sig;
        *got = h.bytes;
    }
    return HCOMM_OK;
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

hcomm_result_t hcomm__probe(hcomm_comm_t *c, int channel, int tag, int peer, hcomm__env_t *env) {
    HCOMM__TRY(check_peer(c, peer, channel));
    hcomm__req_t probe = {.c = c, .is_recv = true, .peer = peer, .channel = channel, .tag = tag};
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    p2p_t *p = p2p_of(c);
    hcomm_result_t res = HCOMM_OK;
    bool rescuing = false, found = false;
    while (res == HCOMM_OK && !found) {
        res = hcomm__progress(c);
        for (uxm_t *u = p->ux_head; res == HCOMM_OK && u && !found; u = u->next)
            if (key_matches(peer, channel, tag, u->src, &u->env)) {
                *env = u->env;
                found = true;
            }
        if (found || res != HCOMM_OK)
            break;
        double waited = hcomm__backoff(&b);
        if (!rescuing && b.napping) { /* as in complete() */
            rescuing = true;
            p->rescue++;
        }
        if ((b.iter & 63) == 0)
            res = wait_verdict(&probe, waited);
    }
    if (rescuing)
        p->rescue--;
    return res;
}

/* --- groups --- */

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

/* --- collective bookkeeping --- */

hcomm_result_t hcomm__notify_error(hcomm_comm_t *c, uint32_t seq, hcomm_result_t why,
                                   const char *text) {
    p2p_t *p = p2p_of(c);
    size_t n = strlen(text);
    if (n > 255)
        n = 255;
    HCOMM__LOG(HCOMM__LOG_DEBUG, HCOMM__SUB_P2P, "rank %d tells its peers seq %u failed: %s",
               c->rank, (unsigned)seq, text);
    for (int peer = 0; p && peer < c->size; peer++) {
        if (peer == c->rank)
            continue;
        hcomm__req_t *r;
        HCOMM__TRY(req_new(c, &r));
        /* The text lives in the request: the transport may read it after this returns. */
        r->env = (hcomm__env_t){.kind = HCOMM__ENV_ERROR,
                                .channel = HCOMM__CH_CTRL,
                                .tag = (int32_t)seq,
                                .result = (int32_t)why,
                                .bytes = n};
        memcpy(r->msg, text, n);
        r->peer = peer;
        r->channel = HCOMM__CH_CTRL;
        r->state = REQ_POSTED;
        /* Eager whatever the limit: a notice must never wait for its receiver. */
        hcomm_result_t res = c->tr->send_frame(c, peer, &r->env, r->msg, n, false, &r->tr);
        if (res != HCOMM_OK) {
            req_release(r);
            return res;
        }
        r->next = p->detached;
        p->detached = r;
    }
    return HCOMM_OK;
}

bool hcomm__peer_error(hcomm_comm_t *c, uint32_t seq, int *src, hcomm_result_t *why, char *text,
                       size_t cap) {
    p2p_t *p = p2p_of(c);
    for (int i = 0; p && i < p->nerrs; i++)
        if (p->errs[i].seq == seq) {
            *src = p->errs[i].src;
            *why = p->errs[i].why;
            snprintf(text, cap, "%s", p->errs[i].text);
            return true;
        }
    return false;
}

/* Drops what is left of finished calls: their unexpected messages and notices. */
void hcomm__coll_done(hcomm_comm_t *c, uint32_t seq) {
    p2p_t *p = p2p_of(c);
    if (!p)
        return;
    p->coll_started = true;
    p->coll_done = seq;
    int k = 0;
    for (int i = 0; i < p->nerrs; i++)
        if (seq_before(seq, p->errs[i].seq))
            p->errs[k++] = p->errs[i];
    p->nerrs = k;
    uxm_t *prev = NULL;
    for (uxm_t *u = p->ux_head; u;) {
        uxm_t *next = u->next;
        if (!stale(p, &u->env) || (u->pulled && !u->arrived)) {
            prev = u;
            u = next;
            continue;
        }
        ux_unlink(p, prev, u);
        if (u->rndv && !u->pulled)
            drain_rndv(c, u->src, &u->env, &u->rv);
        p->ux_bytes -= u->charged;
        free(u->data);
        free(u);
        u = next;
    }
    if (p->full && p->ux_bytes < c->unexpected_cap)
        p->full = false;
}

size_t hcomm__unexpected_bytes(hcomm_comm_t *c) {
    p2p_t *p = p2p_of(c);
    return p ? p->ux_bytes : 0;
}
