/* Collective calls: sequence numbers, signatures and their checks, the flight recorder, and
 * the choice between hcomm's own algorithms over p2p and the backend's native ones. */
#include "algo/coll.h"

#include "algo/a2a.h"
#include "algo/algos.h"
#include "algo/cost.h"
#include "algo/select.h"
#include "algo/tune.h"
#include "algo/variants.h"
#include "core/env.h"
#include "core/log.h"
#include "topo/topo.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pieces recursive doubling reduces at once (stack buffers); select.c picks it by default
 * for an all_reduce up to this size on a transport without shared-memory collectives. */
#define RD_MAX_BYTES 4096

typedef enum {
    CALL_FAILED = 0, /* a rank whose own checks failed */
    CALL_ALL_REDUCE,
    CALL_REDUCE_SCATTER,
    CALL_ALL_GATHER,
    CALL_BROADCAST,
    CALL_ALL_TO_ALLV,
    CALL_BARRIER,
    CALL_SPLIT,
    CALL_REDUCE,
    CALL_GATHER,
    CALL_SCATTER,
    CALL_ALL_GATHERV,
    CALL_REDUCE_SCATTERV,
    CALL_WORKER_SPLIT, /* a first nonblocking call, which splits off its worker's duplicate */
    CALL_KINDS
} call_kind_t;

static const char *const call_names[CALL_KINDS] = {"(failed call)",   "all_reduce",
                                                   "reduce_scatter",  "all_gather",
                                                   "broadcast",       "all_to_allv",
                                                   "barrier",         "split",
                                                   "reduce",          "gather",
                                                   "scatter",         "all_gatherv",
                                                   "reduce_scatterv", "a nonblocking collective"};
static const char *const count_names[CALL_KINDS] = {
    "count", "count", "recvcount", "bytes", "bytes",       "count",       "count",
    "count", "count", "bytes",     "bytes", "total bytes", "total count", "count"};
static const char *const op_names[HCOMM_OP_COUNT] = {"sum", "prod", "max", "min", "avg"};

enum { FLIGHT = 16, SEEN = 64 };

typedef struct flight {
    const char *fn;
    uint32_t seq;
    hcomm__sig_t sig;
    const char *state; /* "running", "done", or a result name */
    bool timed_out;    /* its wait ended by HCOMM_TIMEOUT (no clock is read per call: latency) */
} flight_t;

/* One answer of the one-node defaults and what it depended on that can change per call. */
#define CHOICE_WAYS 4
typedef struct choice {
    bool valid, deterministic;
    bool forced; /* made under hcomm_comm_set_algo's override, which allowed `allowed` */
    uint32_t allowed;
    int algo;
    size_t bytes;
} choice_t;

typedef struct algo {
    uint32_t seq;
    int depth;
    const char *outer_fn;
    flight_t flight[FLIGHT];
    unsigned nflight;
    uint64_t seen[SEEN]; /* HCOMM_CHECK=first: signatures already agreed on */
    int nseen;
    uint64_t extra;
    char extra_desc[200];
    hcomm__algo_set_t over; /* hcomm_comm_set_algo, when has_over */
    bool has_over;
    int last_algo;    /* 1 + the algorithm the last call chose; 0: none since last asked */
    bool last_probed; /* a call since last asked timed a candidate (tune.h) */
    /* the one-node choices made last (choose): CHOICE_WAYS per collective, the oldest
     * replaced first */
    choice_t last_choice[HCOMM__COLL_COUNT][CHOICE_WAYS];
    uint8_t choice_next[HCOMM__COLL_COUNT];
    uint64_t agreements; /* signature agreements run before native calls (hcomm__coll_counts) */
    bool nonblocking;    /* the comm issued nonblocking calls or is their worker's duplicate */
    hcomm__scratch_t scratch; /* hcomm__x_scratch */
    hcomm__scratch_t widened; /* run_widened's f32 copies */
    hcomm__tune_t tune;       /* choices timed near a switch (tune.h) */
} algo_t;

static void algo_free(void *p) {
    algo_t *a = p;
    free(a->scratch.p);
    free(a->widened.p);
    free(a);
}

static algo_t *algo_of(hcomm_comm_t *c) {
    if (!c->layer[HCOMM__LAYER_ALGO]) {
        c->layer[HCOMM__LAYER_ALGO] = hcomm__calloc_lines(1, sizeof(algo_t));
        c->layer_free[HCOMM__LAYER_ALGO] = algo_free;
    }
    return c->layer[HCOMM__LAYER_ALGO];
}

/* --- naming the public call --- */

void hcomm__enter(hcomm_comm_t *c, const char *fn) {
    algo_t *a = algo_of(c);
    if (a && a->depth++ == 0) {
        a->outer_fn = c->call_fn;
        c->call_fn = fn;
    }
}

static void dump_flight(hcomm_comm_t *c);

hcomm_result_t hcomm__leave(hcomm_comm_t *c, hcomm_result_t res) {
    algo_t *a = algo_of(c);
    if (!a || --a->depth > 0)
        return res;
    if (res == HCOMM_ERR_TIMEOUT)
        dump_flight(c);
    c->call_fn = a->outer_fn ? a->outer_fn : "hcomm";
    return res;
}

bool hcomm__coll_take_probed(hcomm_comm_t *c) {
    algo_t *a = algo_of(c);
    bool probed = a && a->last_probed;
    if (a)
        a->last_probed = false;
    return probed;
}

const char *hcomm__coll_take_algo(hcomm_comm_t *c) {
    algo_t *a = algo_of(c);
    int last = a ? a->last_algo : 0;
    if (a)
        a->last_algo = 0;
    return last > 0 ? hcomm__algo_name(last - 1) : NULL;
}

void hcomm__coll_set_extra(hcomm_comm_t *c, uint64_t digest, const char *desc) {
    algo_t *a = algo_of(c);
    if (!a)
        return;
    a->extra = digest;
    snprintf(a->extra_desc, sizeof a->extra_desc, "%s", desc);
}

void hcomm__coll_clear_extra(hcomm_comm_t *c) {
    algo_t *a = algo_of(c);
    if (a)
        a->extra = 0;
}

/* --- the flight recorder: each comm's last calls, printed when one times out --- */

static flight_t *flight_begin(algo_t *a, hcomm_comm_t *c, const hcomm__sig_t *sig) {
    flight_t *f = &a->flight[a->nflight++ % FLIGHT];
    *f = (flight_t){.fn = c->call_fn, .seq = a->seq, .sig = *sig, .state = "running"};
    return f;
}

static void flight_line(FILE *out, hcomm_comm_t *c, const flight_t *f) {
    const char *kind = f->sig.call < CALL_KINDS ? call_names[f->sig.call] : "?";
    fprintf(out,
            "hcomm flight recorder: world rank %d, comm rank %d/%d: seq %u %s (%s %s=%llu algo=%s) "
            "%s",
            c->world_ranks[c->rank], c->rank, c->size, (unsigned)f->seq, f->fn, kind,
            f->sig.call < CALL_KINDS ? count_names[f->sig.call] : "count",
            (unsigned long long)f->sig.count, hcomm__algo_name(f->sig.algo), f->state);
    if (f->timed_out)
        fprintf(out, " after %g s (HCOMM_TIMEOUT)", c->timeout_s);
    fprintf(out, "\n");
}

static void dump_flight(hcomm_comm_t *c) {
    algo_t *a = algo_of(c);
    const char *path = getenv("HCOMM_TRACE_FILE");
    FILE *trace = path && path[0] ? fopen(path, "a") : NULL;
    unsigned first = a->nflight > FLIGHT ? a->nflight - FLIGHT : 0;
    for (unsigned i = first; i < a->nflight; i++) {
        flight_line(stderr, c, &a->flight[i % FLIGHT]);
        if (trace)
            flight_line(trace, c, &a->flight[i % FLIGHT]);
    }
    if (trace)
        fclose(trace);
}

/* --- signatures --- */

/* What a v-call's per-rank array holds ("bytes", "counts"); NULL for other calls. */
static const char *vcall_unit(uint32_t call) {
    return call == CALL_ALL_GATHERV ? "bytes" : call == CALL_REDUCE_SCATTERV ? "counts" : NULL;
}

static void field_text(const hcomm__sig_t *s, int field, char *buf, size_t n, const char *extra) {
    const char *dname = "?";
    switch (field) {
    case 0:
        snprintf(buf, n, "%s", s->call < CALL_KINDS ? call_names[s->call] : "?");
        break;
    case 1:
        hcomm_dtype_name((hcomm_dtype_t)s->dtype, &dname);
        snprintf(buf, n, "dtype=%s", dname);
        break;
    case 2:
        snprintf(buf, n, "op=%s", s->op >= 0 && s->op < HCOMM_OP_COUNT ? op_names[s->op] : "?");
        break;
    case 3:
        snprintf(buf, n, "root=%d", s->root);
        break;
    case 4:
        snprintf(buf, n, "%s=%llu", s->call < CALL_KINDS ? count_names[s->call] : "count",
                 (unsigned long long)s->count);
        break;
    case 5:
        if (extra && extra[0])
            snprintf(buf, n, "%s", extra);
        else if (vcall_unit(s->call))
            snprintf(buf, n, "other per-rank %s with the same total", vcall_unit(s->call));
        else
            snprintf(buf, n, "a different tensor list");
        break;
    case 6:
        snprintf(buf, n, "algo=%s", hcomm__algo_name(s->algo));
        break;
    default:
        snprintf(buf, n, "deterministic=%d", (s->algo & HCOMM__ALGO_DET) != 0);
        break;
    }
}

static int first_difference(const hcomm__sig_t *a, const hcomm__sig_t *b) {
    if (a->call != b->call)
        return 0;
    if (a->dtype != b->dtype)
        return 1;
    if (a->op != b->op)
        return 2;
    if (a->root != b->root)
        return 3;
    if (a->count != b->count)
        return 4;
    if (a->extra != b->extra)
        return 5;
    if ((a->algo ^ b->algo) == HCOMM__ALGO_DET)
        return 7;
    if (a->algo != b->algo)
        return 6;
    return -1;
}

/* "hcomm_x: count=8 on rank 0 but count=5 on rank 1", lower rank first so both sides agree.
 * mine_desc describes this rank's extra field; the peer's is named only as different. */
static hcomm_result_t mismatch(hcomm_comm_t *c, const hcomm__sig_t *mine, int me,
                               const hcomm__sig_t *theirs, int peer, const char *mine_desc) {
    int f = first_difference(mine, theirs);
    char a[256], b[256];
    if (f == 5 && !(mine_desc && mine_desc[0])) { /* neither side's values known here */
        char what[64] = "the tensor lists";
        if (vcall_unit(mine->call))
            snprintf(what, sizeof what, "per-rank %s (same total)", vcall_unit(mine->call));
        return hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn, "%s differ between rank %d and rank %d",
                          what, me < peer ? me : peer, me < peer ? peer : me);
    }
    field_text(mine, f, a, sizeof a, mine_desc);
    field_text(theirs, f, b, sizeof b, NULL);
    if (f == 0)
        return me < peer ? hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn,
                                      "rank %d called %s but rank %d called %s", me, a, peer, b)
                         : hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn,
                                      "rank %d called %s but rank %d called %s", peer, b, me, a);
    if (me < peer)
        return hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn, "%s on rank %d but %s on rank %d", a, me,
                          b, peer);
    return hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn, "%s on rank %d but %s on rank %d", b, peer, a,
                      me);
}

/* --- call bookkeeping --- */

typedef struct call {
    hcomm_comm_t *c;
    algo_t *a;
    hcomm__sig_t sig;
    flight_t *f;
    uint32_t seq;
    const size_t *vcounts; /* the v-calls' per-rank counts, for a mismatch message */
    hcomm__probe_t probe;  /* this call times a candidate (tune.h) */
} call_t;

void *hcomm__x_scratch(const hcomm__xfer_t *x, size_t bytes) {
    return hcomm__scratch(&((call_t *)x->call)->a->scratch, bytes);
}

void hcomm__x_scratch_pair(const hcomm__xfer_t *x, size_t first_bytes, size_t second_bytes,
                           void **first, void **second) {
    *first =
        hcomm__scratch_two(&((call_t *)x->call)->a->scratch, first_bytes, second_bytes, second);
}

static hcomm_result_t call_begin(hcomm_comm_t *c, call_t *k, call_kind_t kind, hcomm_dtype_t dt,
                                 hcomm_op_t op, int root, uint64_t count) {
    k->c = c;
    if (atomic_load_explicit(&c->aborted, memory_order_relaxed))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "hcomm_comm_abort() was called on this communicator");
    k->a = algo_of(c);
    if (!k->a)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for collective state");
    k->sig = (hcomm__sig_t){.call = kind,
                            .dtype = dt,
                            .op = op,
                            .root = root,
                            .count = count,
                            .extra = kind == CALL_FAILED ? 0 : k->a->extra};
    k->seq = ++k->a->seq;
    c->call_seq = k->seq;
    k->f = flight_begin(k->a, c, &k->sig);
    return HCOMM_OK;
}

static hcomm__posted_sig_t posted_of(const hcomm__sig_t *s);

static hcomm__xfer_t xfer_of(call_t *k);

/* Blocking and nonblocking calls run on different communicators (the worker's duplicate):
 * ranks that mix the forms wait for each other in two places until the timeout. */
static hcomm_result_t timeout_hint(hcomm_result_t res) {
    char text[768];
    snprintf(text, sizeof text,
             "%s (a blocking call matches only a blocking call on the other ranks, and "
             "hcomm_iall_reduce etc. only the same nonblocking call)",
             hcomm_last_error());
    return hcomm__err_text(res, text);
}

static hcomm_result_t call_end(call_t *k, hcomm_result_t res) {
    k->a->last_probed |= k->probe.active;
    if (res == HCOMM_ERR_NOMEM) { /* peers may wait on this rank's messages: tell them */
        hcomm__xfer_t x = xfer_of(k);
        res = hcomm__x_tell_peers(&x, res);
    }
    if (k->probe.active && res == HCOMM_OK) {
        hcomm__posted_sig_t ps = posted_of(&k->sig);
        res = hcomm__tune_record(&k->a->tune, k->c, k->seq, &ps, &k->probe);
    }
    hcomm__coll_done(k->c, k->seq);
    k->f->state = res == HCOMM_OK ? "done" : hcomm_result_name(res);
    k->f->timed_out = res == HCOMM_ERR_TIMEOUT;
    if (res == HCOMM_ERR_TIMEOUT && k->a->nonblocking)
        res = timeout_hint(res);
    if (res != HCOMM_OK)
        HCOMM__LOG(HCOMM__LOG_INFO, HCOMM__SUB_ALGO, "%s", hcomm_last_error());
    return res;
}

/* --- shared-memory transports: the signature rides in the posted slot --- */

static hcomm__posted_sig_t posted_of(const hcomm__sig_t *s) {
    hcomm__posted_sig_t p = {.words = {s->call | (uint64_t)(uint32_t)s->algo << 32,
                                       (uint32_t)s->dtype | (uint64_t)(uint32_t)s->op << 32,
                                       (uint64_t)(int64_t)s->root, s->count, s->extra}};
    return p;
}

static hcomm__sig_t sig_of_posted(const hcomm__posted_sig_t *p) {
    return (hcomm__sig_t){.call = (uint32_t)p->words[0],
                          .dtype = (int32_t)(uint32_t)p->words[1],
                          .op = (int32_t)(p->words[1] >> 32),
                          .root = (int32_t)p->words[2],
                          .count = p->words[3],
                          .extra = p->words[4],
                          .algo = (int32_t)(p->words[0] >> 32)};
}

/* "counts=[3, 4, 5]" (a v-call's per-rank array of p entries) into buf (n bytes). */
static const char *vcounts_text(const call_t *k, const size_t *v, char *buf, size_t n) {
    size_t len = (size_t)snprintf(buf, n, "%s=[", vcall_unit(k->sig.call));
    for (int r = 0; r < k->c->size && len < n - 24; r++)
        len += (size_t)snprintf(buf + len, n - len, "%s%zu", r ? ", " : "", v[r]);
    snprintf(buf + len, n - len, "%s]", len >= n - 24 ? ", ..." : "");
    return buf;
}

/* This rank's side of a differing extra field: a v-call's per-rank counts, formatted into buf
 * (n bytes) only on this error path, else what the primitive described. */
static const char *extra_text(const call_t *k, char *buf, size_t n) {
    return k->vcounts ? vcounts_text(k, k->vcounts, buf, n) : k->a->extra_desc;
}

/* A v-call whose per-rank arrays differ between rank 0 and rank r (the signature holds only
 * their total and digest): ranks 0 and r send theirs to every rank, so that every rank names
 * both arrays alike. Runs only on this error path, where every rank reached the
 * same verdict from the same posts; if the exchange fails, the caller words it without. */
static hcomm_result_t vcounts_mismatch(call_t *k, int r) {
    hcomm_comm_t *c = k->c;
    size_t bytes = sizeof(size_t) * (size_t)c->size;
    size_t *theirs[2] = {malloc(bytes), malloc(bytes)};
    int from[2] = {0, r};
    hcomm_result_t res = theirs[0] && theirs[1] ? hcomm__group_start(c) : HCOMM_ERR_NOMEM;
    bool started = res == HCOMM_OK;
    for (int i = 0; res == HCOMM_OK && i < 2; i++) {
        hcomm__req_t *req; /* completed and freed by group_end */
        if (c->rank != from[i]) {
            res = hcomm__irecv(c, HCOMM__CH_CTRL, (int)k->seq, from[i], theirs[i], bytes,
                               HCOMM__RECV_EXACT, &req);
            continue;
        }
        memcpy(theirs[i], k->vcounts, bytes);
        for (int q = 0; res == HCOMM_OK && q < c->size; q++)
            if (q != c->rank)
                res =
                    hcomm__isend(c, HCOMM__CH_CTRL, (int)k->seq, q, k->vcounts, bytes, NULL, &req);
    }
    hcomm_result_t end = started ? hcomm__group_end(c) : res;
    if (res == HCOMM_OK && end == HCOMM_OK) {
        char a[200], b[200];
        res = hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn, "%s on rank 0 but %s on rank %d",
                         vcounts_text(k, theirs[0], a, sizeof a),
                         vcounts_text(k, theirs[1], b, sizeof b), r);
    } else {
        res = HCOMM_ERR_INTERNAL;
    }
    free(theirs[0]);
    free(theirs[1]);
    return res;
}

static bool on_one_node(hcomm_comm_t *c) {
    hcomm__topo_t *t;
    return c->one_node || (hcomm__topo_get(c, &t) == HCOMM_OK && c->one_node);
}

/* Calls on c meet on its board where it has one, unless a declared topology simulates several
 * nodes (whose links the board would bypass); the same answer on every rank. */
static bool board_on(hcomm_comm_t *c) {
    hcomm__topo_t *t;
    return hcomm__board_on(c) &&
           (c->one_node || (hcomm__topo_get(c, &t) == HCOMM_OK && t->nnodes < 2));
}

/* Every rank's posted signature, from the shared-memory transport's slots or the board. */
typedef const hcomm__posted_sig_t *(*posts_t)(hcomm_comm_t *c, int r, hcomm__posted_sig_t *tmp);

static const hcomm__posted_sig_t *slot_post(hcomm_comm_t *c, int r, hcomm__posted_sig_t *tmp) {
    (void)tmp;
    return c->tr->posted_sig(c, r);
}

static const hcomm__posted_sig_t *board_post(hcomm_comm_t *c, int r, hcomm__posted_sig_t *tmp) {
    hcomm__board_peer(c, r, tmp, NULL);
    return tmp;
}

/* The verdict on a meeting every rank reads alike: the first rank that failed its own checks
 * or posted another signature than rank 0's. */
static hcomm_result_t verdict_of(call_t *k, const hcomm__posted_sig_t *mine, posts_t get) {
    hcomm_comm_t *c = k->c;
    hcomm__posted_sig_t t0, tr;
    const hcomm__posted_sig_t *first = get(c, 0, &t0);
    hcomm_result_t res = HCOMM_OK;
    for (int r = 0; r < c->size && res == HCOMM_OK; r++) {
        const hcomm__posted_sig_t *p = get(c, r, &tr);
        if (p->failed != HCOMM_OK)
            res = r == c->rank ? mine->failed
                               : hcomm__err(HCOMM_ERR_PEER, c->call_fn,
                                            "rank %d failed its own checks in this call, nothing "
                                            "moved: %s",
                                            r, p->failed_text ? p->failed_text : "");
        else if (memcmp(p->words, first->words, sizeof p->words) != 0) {
            hcomm__sig_t a = sig_of_posted(first), b = sig_of_posted(p);
            int f = first_difference(&a, &b); /* 4: the totals, 5: the arrays' digests */
            if (k->vcounts && (f == 4 || f == 5) && vcounts_mismatch(k, r) == HCOMM_ERR_MISMATCH)
                return HCOMM_ERR_MISMATCH;
            char desc[200];
            const char *mine_desc = extra_text(k, desc, sizeof desc);
            res = c->rank == r ? mismatch(c, &b, r, &a, 0, mine_desc)
                               : mismatch(c, &a, 0, &b, r, c->rank == 0 ? mine_desc : NULL);
        }
    }
    return res;
}

/* After a posted check failed on every rank: the same verdict, worded from the slots. */
static hcomm_result_t posted_verdict(call_t *k, const hcomm__posted_sig_t *mine) {
    hcomm_result_t res = verdict_of(k, mine, slot_post);
    hcomm_result_t rel = k->c->tr->posted_release(k->c);
    return res != HCOMM_OK ? res : rel;
}

/* Meeting `step` of the call on the board (payload written at hcomm__board_space before),
 * checked on every rank; on HCOMM_OK the caller reads its peers' payloads, then leaves. */
static hcomm_result_t board_checked(call_t *k, uint32_t step) {
    hcomm__posted_sig_t ps = posted_of(&k->sig);
    HCOMM__TRY(hcomm__board_meet(k->c, k->seq, step, &ps, HCOMM__MEET_ALL));
    hcomm_result_t res = verdict_of(k, &ps, board_post);
    if (res != HCOMM_OK)
        hcomm__board_leave(k->c);
    return res;
}

/* all[0..n) = the sum over ranks of mine[0..n), with the signature agreement: one meeting. */
static hcomm_result_t board_sum(call_t *k, const int64_t *mine, int64_t *all, int n) {
    hcomm_comm_t *c = k->c;
    void *space;
    HCOMM__TRY(hcomm__board_space(c, k->seq, sizeof *mine * (size_t)n, &space));
    memcpy(space, mine, sizeof *mine * (size_t)n);
    HCOMM__TRY(board_checked(k, 0));
    memset(all, 0, sizeof *all * (size_t)n);
    for (int r = 0; r < c->size; r++) {
        const void *theirs;
        hcomm__board_peer(c, r, NULL, &theirs);
        for (int i = 0; i < n; i++)
            all[i] = (int64_t)((uint64_t)all[i] + (uint64_t)((const int64_t *)theirs)[i]);
    }
    hcomm__board_leave(c);
    return HCOMM_OK;
}

/* The signature agreement on the board: one meeting without payload. */
static hcomm_result_t board_agree(call_t *k) {
    HCOMM__TRY(board_checked(k, 0));
    hcomm__board_leave(k->c);
    return HCOMM_OK;
}

/* Runs a native collective of a shared-memory transport with the signature posted. The
 * failed rank's own message is the thread's last error already. */
#define RUN_POSTED(k, call)                                                                        \
    do {                                                                                           \
        hcomm__posted_sig_t ps_ = posted_of(&(k)->sig);                                            \
        (k)->c->posted = &ps_;                                                                     \
        hcomm_result_t r_ = (call);                                                                \
        (k)->c->posted = NULL;                                                                     \
        if (r_ == HCOMM_ERR_MISMATCH && (k)->c->posted_held)                                       \
            r_ = posted_verdict(k, &ps_);                                                          \
        return call_end(k, r_);                                                                    \
    } while (0)

static bool shm_coll(const hcomm_comm_t *c) {
    return c->tr->posted_only != NULL;
}

bool hcomm__coll_bypasses_links(hcomm_comm_t *c, const char *coll, int algo) {
    hcomm__topo_t *t;
    int k = hcomm__coll_find(coll);
    if (k < 0 || hcomm__topo_get(c, &t) != HCOMM_OK || !t->simulated || t->nnodes < 2)
        return false;
    /* on a simulated machine only those algorithms lack an estimate, whatever the size */
    return !isfinite(hcomm__cost_estimate(c, k, algo & ~HCOMM__ALGO_DET, 0, shm_coll(c)));
}

/* --- recursive doubling over p2p (Thakur, Rabenseifner & Gropp 2005, section 4), with the
 * extra ranks of a non-power-of-two group folded into their neighbours first. Each message
 * carries the call's signature, so the check is part of the data exchange: a rank that sees a
 * different signature reports it to every peer and stops. The result is identical on every
 * rank since each step combines two vectors with a commutative op. --- */

typedef struct rd {
    call_t *k;
    void *acc;          /* the running result, count elements */
    unsigned char *tmp; /* RD_MAX_BYTES: what the partner sent */
    size_t count, bytes;
    hcomm_dtype_t dt;
    hcomm_op_t op;
    bool lane; /* messages take the transport's lane: acc and tmp have HCOMM__LANE_HDR before */
    /* nblocks > 0: a union instead of a reduction (rd_union): nblocks blocks of `block` bytes,
     * then one byte per block saying whether this vector holds it */
    int nblocks;
    size_t block;
} rd_t;

/* acc op= what the partner sent: a reduction, or the union of the blocks both hold. */
static void rd_merge(rd_t *d) {
    if (d->nblocks == 0) {
        hcomm__reduce(d->acc, d->tmp, d->count, d->dt, d->op);
        return;
    }
    unsigned char *acc = d->acc, *has = acc + d->block * (size_t)d->nblocks,
                  *got = d->tmp + d->block * (size_t)d->nblocks;
    for (int q = 0; q < d->nblocks; q++)
        if (got[q] && !has[q]) {
            memcpy(acc + d->block * (size_t)q, d->tmp + d->block * (size_t)q, d->block);
            has[q] = 1;
        }
}

/* Compares a partner's signature with this call; a difference is reported to every peer. */
static hcomm_result_t check_sig(rd_t *d, int peer, const hcomm__sig_t *sig) {
    call_t *k = d->k;
    if (first_difference(&k->sig, sig) < 0)
        return HCOMM_OK;
    char desc[200];
    hcomm_result_t res =
        mismatch(k->c, &k->sig, k->c->rank, sig, peer, extra_text(k, desc, sizeof desc));
    char text[512];
    snprintf(text, sizeof text, "%s", hcomm__err_detail(k->c->call_fn));
    hcomm__notify_error(k->c, k->seq, res, text);
    return hcomm__err(res, k->c->call_fn, "%s", text);
}

/* One step on the lane: acc to `to` (-1: none), the partner's vector from `from` (-1: none)
 * into tmp, checked. */
static hcomm_result_t rd_lane(rd_t *d, int to, int from) {
    hcomm__sig_t sig;
    size_t got;
    HCOMM__TRY(hcomm__lane_step(d->k->c, d->k->seq, &d->k->sig, to,
                                (unsigned char *)d->acc - HCOMM__LANE_HDR, d->bytes, from,
                                d->tmp - HCOMM__LANE_HDR, RD_MAX_BYTES, &sig, &got));
    return from < 0 ? HCOMM_OK : check_sig(d, from, &sig);
}

static hcomm_result_t rd_send(rd_t *d, int peer) {
    if (d->lane)
        return rd_lane(d, peer, -1);
    hcomm__env_t desc = {.sig = d->k->sig};
    return hcomm__send(d->k->c, HCOMM__CH_COLL, (int)d->k->seq, peer, d->acc, d->bytes, &desc);
}

/* Receives the partner's vector into tmp and checks its signature. */
static hcomm_result_t rd_recv(rd_t *d, int peer) {
    if (d->lane)
        return rd_lane(d, -1, peer);
    hcomm__env_t env;
    HCOMM__TRY(hcomm__recv(d->k->c, HCOMM__CH_COLL, (int)d->k->seq, peer, d->tmp, RD_MAX_BYTES,
                           HCOMM__RECV_UPTO, &env));
    return check_sig(d, peer, &env.sig);
}

/* Sends acc to peer and receives the peer's into tmp at once. */
static hcomm_result_t rd_swap(rd_t *d, int peer) {
    if (d->lane)
        return rd_lane(d, peer, peer);
    hcomm__env_t desc = {.sig = d->k->sig};
    hcomm__req_t *s = NULL;
    HCOMM__TRY(
        hcomm__isend(d->k->c, HCOMM__CH_COLL, (int)d->k->seq, peer, d->acc, d->bytes, &desc, &s));
    hcomm_result_t res = rd_recv(d, peer);
    hcomm_result_t sres = hcomm__wait(s, NULL, NULL);
    HCOMM__TRY(res);
    return sres;
}

static hcomm_result_t rd_run(rd_t *d) {
    hcomm_comm_t *c = d->k->c;
    int p = c->size, rank = c->rank, pof2 = 1;
    while (pof2 * 2 <= p)
        pof2 *= 2;
    int rem = p - pof2, newrank;
    if (rank < 2 * rem && rank % 2 == 0) { /* folded: hand the vector over, get the result */
        HCOMM__TRY(rd_send(d, rank + 1));
        HCOMM__TRY(rd_recv(d, rank + 1));
        if (d->bytes)
            memcpy(d->acc, d->tmp, d->bytes);
        return HCOMM_OK;
    }
    if (rank < 2 * rem) {
        HCOMM__TRY(rd_recv(d, rank - 1));
        rd_merge(d);
        newrank = rank / 2;
    } else {
        newrank = rank - rem;
    }
    for (int mask = 1; mask < pof2; mask <<= 1) {
        int np = newrank ^ mask;
        HCOMM__TRY(rd_swap(d, np < rem ? np * 2 + 1 : np + rem));
        rd_merge(d);
    }
    if (rank < 2 * rem)
        HCOMM__TRY(rd_send(d, rank - 1));
    return HCOMM_OK;
}

/* all_reduce by recursive doubling, in pieces of RD_MAX_BYTES (a forced rd on a large
 * vector), or (count 0) a pure signature agreement. On a transport with a lane every message
 * takes it, in pieces the lane carries (HCOMM__LANE_HDR of room before acc and tmp). */
static hcomm_result_t rd_all_reduce(call_t *k, const void *sendbuf, void *recvbuf, size_t count,
                                    hcomm_dtype_t dt, hcomm_op_t op) {
    _Alignas(16) unsigned char tmp[HCOMM__LANE_HDR + RD_MAX_BYTES],
        acc[HCOMM__LANE_HDR + RD_MAX_BYTES];
    size_t lane = hcomm__lane_payload(k->c), es = hcomm__dtype_size(dt), done = 0;
    size_t room = lane && lane < RD_MAX_BYTES ? lane : RD_MAX_BYTES;
    size_t piece = count * es <= room ? count : room / es; /* one piece: no division */
    do {
        size_t n = count - done < piece ? count - done : piece, bytes = n * es;
        rd_t d = {k,
                  acc + HCOMM__LANE_HDR,
                  tmp + HCOMM__LANE_HDR,
                  n,
                  bytes,
                  dt,
                  op == HCOMM_AVG ? HCOMM_SUM : op,
                  lane > 0};
        if (bytes)
            memcpy(d.acc, (const char *)sendbuf + done * es, bytes);
        if (k->c->size > 1)
            HCOMM__TRY(rd_run(&d));
        if (bytes)
            memcpy((char *)recvbuf + done * es, d.acc, bytes);
        done += n;
    } while (done < count);
    return HCOMM_OK;
}

/* The most bytes of one vector that rd sends whole: one lane message, or RD_MAX_BYTES. */
static size_t rd_room(const hcomm_comm_t *c) {
    size_t lane = hcomm__lane_payload(c);
    return lane && lane < RD_MAX_BYTES ? lane : RD_MAX_BYTES;
}

/* all_gather (nblocks = p blocks, own = this rank) or a broadcast piece (one block, own = 0 on
 * the root, -1 elsewhere) by recursive doubling over the whole vector, which partners merge by
 * union: log2 p steps in which every rank sends and receives, each message with the signature.
 * block * nblocks + nblocks <= rd_room. out gets every block. */
static hcomm_result_t rd_union(call_t *k, const void *mine, size_t block, int nblocks, int own,
                               void *out) {
    _Alignas(16) unsigned char tmp[HCOMM__LANE_HDR + RD_MAX_BYTES],
        acc[HCOMM__LANE_HDR + RD_MAX_BYTES];
    size_t data = block * (size_t)nblocks;
    rd_t d = {k,         acc + HCOMM__LANE_HDR,         tmp + HCOMM__LANE_HDR,
              0,         data + (size_t)nblocks,        HCOMM_U8,
              HCOMM_SUM, hcomm__lane_payload(k->c) > 0, nblocks,
              block};
    unsigned char *v = d.acc;
    memset(v + data, 0, (size_t)nblocks);
    if (own >= 0) {
        if (block)
            memcpy(v + block * (size_t)own, mine, block);
        v[data + (size_t)own] = 1;
    }
    if (k->c->size > 1)
        HCOMM__TRY(rd_run(&d));
    if (data)
        memcpy(out, v, data);
    return HCOMM_OK;
}

/* broadcast by rd_union, a piece of up to rd_room - 1 bytes at a time. */
static hcomm_result_t rd_broadcast(call_t *k, void *buf, size_t bytes, int root) {
    size_t room = rd_room(k->c) - 1, done = 0;
    bool mine = k->c->rank == root;
    do {
        size_t n = bytes - done < room ? bytes - done : room;
        char *at = (char *)buf + done;
        HCOMM__TRY(rd_union(k, at, n, 1, mine ? 0 : -1, at));
        done += n;
    } while (done < bytes);
    return HCOMM_OK;
}

/* reduce_scatter by rd all_reduce of the whole vector, keeping this rank's block: for small
 * vectors, where log2 p exchanges of all of it cost less than more steps of less. */
static hcomm_result_t rd_reduce_scatter(call_t *k, const void *send, void *recv, size_t count,
                                        hcomm_dtype_t dt, hcomm_op_t op) {
    size_t es = hcomm__dtype_size(dt), total = count * (size_t)k->c->size;
    _Alignas(16) unsigned char small[RD_MAX_BYTES];
    /* the communicator's scratch above that: malloc maps 32 MiB and more anew each call (ring.c) */
    unsigned char *all =
        total * es <= sizeof small ? small : hcomm__scratch(&k->a->scratch, total * es);
    if (!all)
        return hcomm__err(HCOMM_ERR_NOMEM, k->c->call_fn, "cannot allocate %zu bytes", total * es);
    hcomm_result_t res = rd_all_reduce(k, send, all, total, dt, op);
    if (res == HCOMM_OK && count)
        memcpy(recv, all + (size_t)k->c->rank * count * es, count * es);
    return res;
}

/* Every rank of the call meets and compares signatures (a barrier): in a board meeting, else in
 * an empty recursive doubling over p2p. */
static hcomm_result_t meet_all(call_t *k) {
    return board_on(k->c) ? board_agree(k) : rd_all_reduce(k, NULL, NULL, 0, HCOMM_U8, HCOMM_SUM);
}

/* Before a collective on a transport without posted checks: every rank agrees on the
 * signature; before a native one as HCOMM_CHECK says (mode: always, first use per comm, off). */
static hcomm_result_t agree_as(call_t *k, int mode) {
    if (mode == HCOMM__CHECK_OFF || k->c->size == 1)
        return HCOMM_OK;
    uint64_t h = ((uint64_t)k->sig.call << 56) ^ ((uint64_t)k->sig.dtype << 48) ^
                 ((uint64_t)k->sig.op << 40) ^ ((uint64_t)(uint32_t)k->sig.root << 8) ^
                 (k->sig.count * 0x9E3779B97F4A7C15ull) ^ k->sig.extra ^
                 ((uint64_t)(uint32_t)k->sig.algo << 32);
    if (mode == HCOMM__CHECK_FIRST)
        for (int i = 0; i < k->a->nseen; i++)
            if (k->a->seen[i] == h)
                return HCOMM_OK;
    k->a->agreements++;
    HCOMM__TRY(meet_all(k));
    if (mode == HCOMM__CHECK_FIRST)
        k->a->seen[k->a->nseen < SEEN ? k->a->nseen++ : SEEN - 1] = h;
    return HCOMM_OK;
}

static hcomm_result_t agree(call_t *k) {
    return agree_as(k, hcomm__check_mode());
}

/* --- choosing and running an algorithm --- */

static bool is_reduction(int coll) {
    return coll == HCOMM__COLL_ALLREDUCE || coll == HCOMM__COLL_REDUCESCATTER ||
           coll == HCOMM__COLL_REDUCE || coll == HCOMM__COLL_REDUCESCATTERV;
}

/* From this size up, an all_reduce among processes that can read each other's memory runs
 * twoshot by default (one copy per byte and phase; its address exchange and barriers take
 * p - 1 and 2 log p messages). Measured with scripts/regret-sweep.sh (medians of 3 interleaved
 * runs on 2 cores): on mpi faster than Open MPI's native all_reduce from 8 KiB with 2 processes
 * (native: 30-35 us from 6 to 16 KiB, twoshot 7-13), and from 8 KiB ahead of rd on the lane too
 * since it loads hcomm_mem_alloc buffers in place (select.c: 8 KiB rd 6.0-6.8 us, twoshot
 * 3.3-4.1, at par on malloc's buffers, which it copies), and with 4 (oversubscribed) from
 * 16 KiB, since its addresses and barriers travel on the lane without an agreement. There the
 * buffers' origin decides (every rank must choose alike before it knows its peers' buffers, so
 * the threshold splits the difference; 4 processes, 2 runs of 40 calls): on hcomm_mem_alloc
 * buffers twoshot 29 us against native 36 at 8 KiB, 32-35 against 42-52 at 16 KiB, 39-43
 * against 81-96 at 64 KiB; on malloc's 44-49 against 32-35 at 8 KiB, 46-51 against 37-39 at 16
 * KiB, at par at 32 KiB, 67-71 against 89 at 64 KiB (1.3-2.7x faster at 2-128 MiB). On a
 * shared-memory transport (local), against the native all_reduce (every rank reduces its chunk
 * of all inputs into its scratch, then copies every chunk out; 2 copies per byte to twoshot's
 * one read and one reduction), twoshot wins from 256 KiB with 2 ranks (native and twoshot
 * alternating, 2 runs: 128 KiB 18-21 against 16-18 us, 256 KiB 34-35 against 28-31, 2 MiB
 * 216-233 against 138-176, 8 MiB 2.3-2.8 against 1.1-2.0 ms; the all-algorithm sweep had
 * native ahead at 128 KiB), from 32 MiB with 3-4 (4 ranks: native ahead up to 1 MiB, even at
 * 4 MiB, twoshot 1.1x at 16 MiB), and only at 128 MiB with 8 (native still ahead at 32 MiB).
 * Since twoshot loads peers' inputs in place and reduces in one pass per step (no copy into
 * scratch first), it leads much earlier (scripts/regret-sweep.sh, medians of 2 runs, native /
 * twoshot time): 2 ranks 1.10 at 32 KiB, 1.44 at 128 KiB, 1.6-2.3 above; 4 ranks 0.73 at 128
 * KiB, 1.01 at 512 KiB, 1.19-1.59 from 2 MiB; 8 ranks 0.68 at 512 KiB, 1.11-1.47 from 2 MiB.
 * Since local's twoshot writes its block into the peers' outputs (twoshot.c, push_piece), one
 * hcomm-bench --algo all run (30 calls, out of place / in place): 2 ranks 32 KiB 5.4 / 5.0
 * against native 7.0 / 8.0, 8 KiB 4.0 / 3.9 against 3.0 / 3.5; 4 ranks 512 KiB 123 / 97 against
 * 150 / 130, 128 KiB 50 / 46 against 38 / 44; 8 ranks 2 MiB 1.54 / 1.17 ms against 1.69 / 1.40,
 * 512 KiB 361 / 355 against 300 / 297. Once local's native all_reduce reduced each chunk
 * into its owner's output and pushed it into the peers' (local.c: two barriers, no scratch), it
 * led twoshot, whose addresses and barriers travel as messages, up to 256 KiB at every size
 * (one run of 20 calls, out of place / in place: 2 ranks 16 KiB 1.2 / 1.2 us against 2.4 / 2.4,
 * 256 KiB 11.1 / 9.6 against 12.3 / 10.4; 4 ranks 256 KiB 32 / 34 against 52 / 52; 8 ranks 1 MiB
 * 687 / 283 against 725 / 354), ran at par at 1 MiB with 2 and 4 ranks (46 / 39 against 48 / 37;
 * 158 / 120 against 134 / 129) and behind from 4 MiB, most at 64 MiB (twoshot's streaming
 * stores: 2 ranks 9.8 / 6.3 ms against 8.2 / 4.6). A sweep of 2 repetitions then had 8 ranks
 * lose 1.17 / 1.36 with twoshot at 2 MiB in both, and twoshot at par from 8 MiB: with more than
 * 4 ranks twoshot from 4 MiB (native 3.8 / 2.6 ms against 3.6 / 2.4 there). Before that change a
 * sweep had lost 1.30 / 1.72 with native at 8 KiB (2 ranks) and 1.42 in place at 128 KiB (4).
 * Once native reduced in 256 KiB pieces (core's hcomm__reduce_many), it led at 1 MiB too (3
 * runs of 20 calls, out of place: 4 ranks 96-164 us against twoshot's 110-190, 3 ranks 90
 * against 101, 2 ranks 39-41 against 39-43), and ran at par at 2 MiB (4 ranks 261-286 against
 * 260-311; 3 ranks 289 against 271): native below 2 MiB with up to 4 ranks. */
static size_t twoshot_min_bytes(int p, bool shm) {
    if (shm)
        return p <= 4 ? (size_t)2 << 20 : (size_t)4 << 20;
    return p <= 2 ? (size_t)4 << 10 : (size_t)16 << 10;
}

static bool peer_reads(hcomm_comm_t *c) {
    return c->tr->peer_read_ok && c->tr->peer_read_ok(c);
}

/* twoshot where it can and should run (every rank decides alike: the inputs are shared), and
 * the other algorithms that read peers' memory only where they can. */
static int with_twoshot(call_t *k, int coll, size_t bytes, int algo, const char **why) {
    const hcomm__algo_set_t *over = k->a->has_over ? &k->a->over : NULL;
    if (algo == HCOMM__ALGO_TWOSHOT && !peer_reads(k->c)) {
        *why = "twoshot needs every rank on one node with cross-memory reads";
        return HCOMM__ALGO_RING;
    }
    if (algo == HCOMM__ALGO_DIRECT && !peer_reads(k->c) &&
        (coll == HCOMM__COLL_ALLGATHER || coll == HCOMM__COLL_ALLGATHERV ||
         coll == HCOMM__COLL_REDUCESCATTER || coll == HCOMM__COLL_REDUCESCATTERV ||
         coll == HCOMM__COLL_BROADCAST || coll == HCOMM__COLL_REDUCE)) {
        bool dflt = strcmp(*why, "default") == 0; /* else forced: as twoshot, ring */
        *why = "direct needs every rank on one node with cross-memory reads";
        return coll == HCOMM__COLL_REDUCE      ? HCOMM__ALGO_TREE
               : coll == HCOMM__COLL_BROADCAST ? (dflt ? HCOMM__ALGO_NATIVE : HCOMM__ALGO_TREE)
               : !dflt                         ? HCOMM__ALGO_RING
               : coll == HCOMM__COLL_REDUCESCATTER && k->c->size == 2
                   ? HCOMM__ALGO_RHD /* the default below 32 KiB */
                   : HCOMM__ALGO_NATIVE;
    }
    if (coll == HCOMM__COLL_ALLREDUCE && bytes >= twoshot_min_bytes(k->c->size, shm_coll(k->c)) &&
        strcmp(*why, "default") == 0 && peer_reads(k->c) &&
        hcomm__algo_allowed(over, coll, HCOMM__ALGO_TWOSHOT))
        return HCOMM__ALGO_TWOSHOT;
    return algo;
}

/* Up to this many bytes (the collective's total) shm runs by default where the comm has a
 * board. Measured with hcomm-bench --algo all on mpi (median of 100-300 calls, f32, buffers
 * from hcomm_mem_alloc; 2 processes on their own cores, 4 sharing 2): shm leads everything
 * below these sizes, and the backend's own collectives (raw MPI) at every size measured up to
 * them but 8 B broadcasts (0.84 against 0.74 us with 2 processes, 7.3 against 6.8 with 4: raw
 * MPI_Bcast does not wait for the receivers). 2 processes, shm against the next best: all_reduce
 * 16 KiB 5.2 us against twoshot 5.3, 32 KiB 9.6 against 6.5, and in a later session (2 runs of
 * 300 calls each way) 16 KiB 5.5-5.8 against 4.3-5.3 out of place and 5.7-5.8 against 5.2-6.1
 * in place, unchecked 6.0-6.3 against 4.3-4.6 and 5.0-5.5, 8 KiB 3.5-3.9 against 3.2-4.5: shm up
 * to 8 KiB; then (scripts/regret-sweep.sh, 2 repetitions, after the lane barriers) 8 KiB
 * unchecked 3.8 against twoshot's 3.0-3.1 in both, checked 3.6-3.7 against 3.5-3.6: up to 4 KiB;
 * broadcast (against direct on the board, which reads an hcomm_mem_alloc root buffer once; on
 * malloc's buffers shm's copies lead a little longer: 8 KiB 2.3 against 2.8) 4 KiB 1.45
 * against 1.37, 8 KiB 2.2 against 1.5; with 4 processes 32 KiB 11.9 against 13.4, 64 KiB at par,
 * 128 KiB 29 against 23 (on malloc's buffers, where direct runs shm's pieces after its address
 * meeting, 29 against 33); all_gather 16 KiB 2.5 against direct 3.3, 32 KiB 4.7 against 4.6;
 * reduce_scatter 16 KiB 3.1 against 3.6, 32 KiB 5.2 against 4.1. 4 processes: all_reduce 32 KiB 35
 * against twoshot 43, 64 KiB 59 against 50; all_gather 256 KiB 51 against direct 55, 1 MiB 219
 * against 198; reduce_scatter 64 KiB 23 against direct 30, 128 KiB 54 against 41. The rooted calls
 * (4 processes / 2): reduce 32 KiB 17 against direct 30, 128 KiB 58 against 49 / 8 KiB 2.4
 * against 3.2, 32 KiB 6.9 against 4.6; gather 512 KiB 44 against direct 66 / 32 KiB 3.3
 * against 4.1, 128 KiB 9.1 against 6.5 (direct then by messages). Gather and scatter above these
 * sizes run direct on the board (hcomm__gather_board_direct: each block copied once through the
 * views or with cross-memory attach), measured (40 calls, shared / malloc'd buffers) against shm: 2
 * processes, gather 8 KiB 1.2 / 2.0 us against 1.7 / 1.6, 32 KiB 1.5 / 2.7 against 4.4 / 4.5, 8 MiB
 * 618 / 761 against 715 / 715; scatter 8 KiB 1.7 / 2.6 against 1.8 / 1.6, 32 KiB 2.2 / 3.5
 * against 2.9 / 3.7; 4 processes, gather 32 KiB 8.2 / 10.3 against 6.9 / 8.3, 128 KiB 9.4 / 16.5
 * against 15.8 / 17.9; scatter 32 KiB 9.2 against 5.9, 128 KiB 10.9 / 17.8 (the backend's
 * scatter: 18.6) against 12.0 / 13.3, 512 KiB 22 / 36 against 46 / 60. scripts/regret-sweep.sh (2
 * repetitions, shared buffers) then had direct ahead at 8 KiB in place with 2 processes (gather and
 * scatter 1.16) and scatter's at 128 KiB with 4 (1.26-1.8): shm up to 4 KiB and 64 KiB there.
 * Once waits spun (core/wait.c), 2 processes' checked gather of 4 KiB ran direct 1.0-1.1 us
 * against shm's 1.2-1.3 (300 calls; 2 KiB 1.10 against 0.97), unchecked shm 0.35 against
 * 0.46: checked, shm up to 2 KiB. all_reduce of 8 KiB, checked, in a sweep of 2 repetitions
 * once auto no longer ran right after its twin (hcomm-bench): shm 1.9 us against twoshot's 2.8
 * in both; 100 calls, 2 runs: 2.9/3.1 and 2.7/2.8 against 3.2/2.8 and 3.4/3.3 (out of place /
 * in place); unchecked at par (2.8-2.9 against 2.5-2.9): checked, shm up to 8 KiB. Unchecked
 * scatter with 4 processes at 128 KiB flips with the machine's modes: one sweep and 2 runs of
 * 100 calls had shm ahead (13.3-15.8 us against 16.5-17.9), the next sweep and 4 runs of 200
 * calls direct (9.6-14.3 against 14.0-15.7): it stays direct. reduce with 4 processes at 64 KiB
 * (f32, 100 calls, 2 runs checked and 2 unchecked): shm 22.0-28.1 us against direct's 27.9-33.3,
 * at 128 KiB 36.6-51.3 against 32.7-48.7: shm up to 64 KiB (bf16, sized as f32 of its count,
 * then up to 32 KiB, where shm ran 20-24 against direct's 28-47). On a later machine (AVX-512,
 * memcpy 14-20 GB/s per rank with both copying, against 7-8.5) 2 processes' all_reduce, 300
 * calls, 2 runs each: unchecked shm 1.22-1.29 us against twoshot's 1.83-1.92 at 8 KiB, 1.92-1.97
 * against 2.07-2.10 at 16 KiB, 3.25-3.31 against 2.57-2.67 at 32 KiB (checked alike: 1.34-1.40
 * against 2.08-2.12, 1.97-2.05 against 2.26-2.33, 3.23-3.35 against 2.73-2.86), and a sweep lost
 * 1.17 with twoshot at 8 KiB in place unchecked in both repetitions: shm up to 8 KiB whether
 * checked or not (16 KiB stays twoshot: within 1.08 here, and 1.4x ahead on the first machine).
 * all_gather there at 32 KiB, checked: shm 1.21-1.28x ahead of direct in both repetitions of a
 * sweep, and 2.42-2.57 us against 2.59-2.83 in 2 runs of 200 calls in the machine's other mode
 * (the first machine had them at par: 4.7 against 4.6); unchecked direct leads (2.16-2.39
 * against 2.44-2.65): checked, shm up to 32 KiB. Once hcomm-bench timed each row's calls back
 * to back (turns of 5: a call no longer finds the buffers as another algorithm left them), 2
 * processes' all_reduce at 8 KiB ran twoshot 1.06-1.17 us against shm's 1.15-1.49 unchecked and
 * 1.25-1.35 against 1.27-1.54 checked (2 runs of 100 calls each; 4 KiB shm 0.81-0.97 against
 * 1.01-1.22), and a sweep lost 1.17-1.20 with shm there in both of two runs: shm up to 4 KiB.
 * Once board meetings loaded two of the peer's lines instead of four (board.c), a sweep of 2
 * repetitions had checked 8 KiB in place lose 1.18-1.22 with twoshot in both (shm 2.17-2.38 us
 * against 2.65-2.82; out of place at par), unchecked mixed (shm 1.19x ahead in one, twoshot
 * 1.17x in the other): checked, shm up to 8 KiB again; unchecked up to 4 KiB.
 * reduce_scatter with 4 processes, timed so, lost 1.23-1.29 at 128 KiB with direct in both
 * repetitions of a sweep; 2 runs of 40 calls, checked and unchecked: shm 41.2-49.3 us against
 * direct's 45.1-64.7 there, 20-22 against 44-57 at 64 KiB, 84-97 against 53-70 at 256 KiB:
 * shm up to 128 KiB.
 * The rooted and v-calls, swept once the transports' waits and meetings had been made cheaper
 * (scripts/regret-sweep.sh, then 2 runs of 100 calls each, checked and unchecked, 2 processes):
 * direct led shm at 8 KiB reduce (1.35-1.48 us against 1.50-1.91 checked; unchecked 1.17 against
 * 1.52 in one run, 1.95 against 1.70 in the other), at 4 KiB gather and scatter (0.44-0.65
 * against 0.53-0.77 in all 8; at 2 KiB at par), and from 16 KiB all_gatherv checked (1.37 against
 * 1.64; at 8 KiB shm 0.91 against 1.23), from 8 KiB unchecked (2.73 against 3.73 in the machine's
 * slow mode, at par in its fast one; 4 KiB shm): reduce up to 4 KiB, gather and scatter 2 KiB,
 * all_gatherv 8 / 4 KiB. Three more sweeps then lost 1.10-1.27 with shm at 2 KiB gather and
 * scatter, checked and not: up to 1 KiB. 4 processes (40 calls, 2 runs each way): all_gatherv at
 * 256 KiB direct 33-48 us against shm 35-109, at 128 KiB mixed (direct 1.4x ahead and 1.45x
 * behind): up to 128 KiB. reduce_scatterv had no direct form and ran shm at every size: from 512
 * KiB 1.1-1.7x behind ring and rhd and 1.15-1.47x behind raw MPI_Reduce_scatter (2 processes);
 * hcomm__rsv_direct (reduce_scatter's direct over per-rank counts) then ran 2 processes' 128 KiB
 * in 3.3 us against shm's 18.7, 32 MiB in 2.9 ms against 18.6 and raw's 41: as reduce_scatter, shm
 * up to 16 KiB, and with 4 up to 64 KiB (128 KiB direct 28-35 us against shm 37-106 in 4 runs; 64
 * KiB shm 23-27 against 26-38 in 3 of 4). */
static size_t shm_max_bytes(int coll, int p) {
    bool two = p == 2, off = hcomm__check_mode() == HCOMM__CHECK_OFF;
    switch (coll) {
    case HCOMM__COLL_ALLREDUCE:
        return (size_t)(two ? (off ? 4 : 8) : 32) << 10;
    case HCOMM__COLL_BROADCAST: /* above: direct on the board (hcomm__bc_board_direct) */
        return (size_t)(two ? 4 : 64) << 10;
    case HCOMM__COLL_ALLGATHER:
        return (size_t)(two ? (off ? 16 : 32) : 256) << 10;
    case HCOMM__COLL_REDUCESCATTER:
        return (size_t)(two ? 16 : 128) << 10;
    case HCOMM__COLL_REDUCESCATTERV: /* above: direct (hcomm__rsv_direct) */
        return (size_t)(two ? 16 : 64) << 10;
    case HCOMM__COLL_REDUCE:
        return (size_t)(two ? 4 : 64) << 10;
    case HCOMM__COLL_GATHER: /* above: direct on the board (hcomm__gather_board_direct) */
        return (size_t)(two ? 1 : 32) << 10;
    case HCOMM__COLL_SCATTER:
        return (size_t)(two ? 1 : 64) << 10;
    case HCOMM__COLL_ALLGATHERV: /* above: direct (hcomm__agv_direct) */
        return (size_t)(two ? (off ? 4 : 8) : 128) << 10;
    default:
        return 0;
    }
}

static bool shm_default(int coll, size_t bytes, int p) {
    return bytes <= shm_max_bytes(coll, p);
}

static bool shm_runs(hcomm_comm_t *c) {
    return board_on(c) && hcomm__shm_fits(c);
}

/* shm where the comm has a board and the call is small (every rank decides alike); a forced
 * shm elsewhere runs what the transport does best without one. */
static int board_pick(call_t *k, int coll, size_t bytes, int algo, const char **why, bool small) {
    const hcomm__algo_set_t *over = k->a->has_over ? &k->a->over : NULL;
    if (algo == HCOMM__ALGO_SHM && !shm_runs(k->c)) {
        *why = "shm needs a board: every rank of the mpi backend on one node";
        if (coll == HCOMM__COLL_REDUCE)
            return HCOMM__ALGO_TREE;
        if (coll == HCOMM__COLL_GATHER || coll == HCOMM__COLL_SCATTER)
            return HCOMM__ALGO_DIRECT;
        if (coll == HCOMM__COLL_ALLGATHERV || coll == HCOMM__COLL_REDUCESCATTERV)
            return shm_coll(k->c) ? HCOMM__ALGO_NATIVE : HCOMM__ALGO_RING;
        return shm_coll(k->c)                                   ? HCOMM__ALGO_NATIVE
               : coll == HCOMM__COLL_BROADCAST                  ? HCOMM__ALGO_TREE
               : coll == HCOMM__COLL_ALLREDUCE && bytes <= 4096 ? HCOMM__ALGO_RD
                                                                : HCOMM__ALGO_RING;
    }
    if (strcmp(*why, "default") == 0 && small && shm_runs(k->c) &&
        hcomm__algo_allowed(over, coll, HCOMM__ALGO_SHM)) {
        *why = "default: small, on a board";
        return HCOMM__ALGO_SHM;
    }
    bool reads_after_shm = coll == HCOMM__COLL_BROADCAST || coll == HCOMM__COLL_GATHER ||
                           coll == HCOMM__COLL_SCATTER || coll == HCOMM__COLL_ALLGATHERV ||
                           coll == HCOMM__COLL_REDUCESCATTERV;
    if (strcmp(*why, "default") == 0 && reads_after_shm && peer_reads(k->c) && board_on(k->c) &&
        hcomm__algo_allowed(over, coll, HCOMM__ALGO_DIRECT)) {
        *why = "default: on a board, above shm's sizes";
        return HCOMM__ALGO_DIRECT;
    }
    return algo;
}

static int with_board(call_t *k, int coll, size_t bytes, int algo, const char **why) {
    return board_pick(k, coll, bytes, algo, why, shm_default(coll, bytes, k->c->size));
}

/* Within a factor of TUNED_BAND of shm's switch the default choice is timed against the one
 * on the other side of it (tune.h): on a board, where nothing forced either. The band spans
 * the sizes where the two were seen to trade places with the host's placement of the
 * processes (2 processes' all_reduce: shm ahead to 16 KiB in one, twoshot from 8 KiB in the
 * other). */
#define TUNED_BAND 2

static int with_timing(call_t *k, int coll, size_t bytes, int pre, const char *pre_why, int algo,
                       const char **why) {
    size_t max = shm_max_bytes(coll, k->c->size);
    if (strcmp(pre_why, "default") != 0 || max == 0 || bytes < max / TUNED_BAND ||
        bytes > max * TUNED_BAND || !shm_runs(k->c))
        return algo;
    const char *w = pre_why;
    int shm = board_pick(k, coll, bytes, pre, &w, true);
    w = pre_why;
    int other = board_pick(k, coll, bytes, pre, &w, false);
    if (shm != HCOMM__ALGO_SHM || other == HCOMM__ALGO_SHM)
        return algo; /* excluded by HCOMM_ALGO or hcomm_comm_set_algo */
    return hcomm__tune_pick(&k->a->tune, coll, bytes, k->c->deterministic, algo,
                            algo == shm ? other : shm, &k->probe, why);
}

/* The rooted calls' native algorithm where the transport offers it; elsewhere what its default
 * would be there (local: tree for reduce, direct for gather and scatter). */
static int with_native(call_t *k, int coll, int algo, const char **why) {
    const hcomm__native_ops_t *n = k->c->tr->native;
    bool missing = (coll == HCOMM__COLL_REDUCE && !n->reduce) ||
                   (coll == HCOMM__COLL_GATHER && !n->gather) ||
                   (coll == HCOMM__COLL_SCATTER && !n->scatter) ||
                   (coll == HCOMM__COLL_ALLGATHERV && !n->all_gatherv) ||
                   (coll == HCOMM__COLL_REDUCESCATTERV && !n->reduce_scatterv);
    if (algo != HCOMM__ALGO_NATIVE || !missing)
        return algo;
    *why = "the transport has no native call for it";
    return coll == HCOMM__COLL_REDUCE ? HCOMM__ALGO_TREE
           : coll == HCOMM__COLL_ALLGATHERV || coll == HCOMM__COLL_REDUCESCATTERV
               ? HCOMM__ALGO_RING
               : HCOMM__ALGO_DIRECT;
}

/* The one-node choices made last, where one answers this call: a loop of calls of one size
 * (the 8-byte all_reduce spent a sixth of hcomm's own instructions selecting). Kept per
 * collective, for CHOICE_WAYS (size, override) pairs of each, so that other calls in between
 * keep them (a training step's large and small all_reduce; hcomm-bench's 8-byte broadcast
 * before every timed call, and its rows, which set and clear an override around every call).
 * An override (hcomm_comm_set_algo) enters the choice of a collective only through the set it
 * allows for that collective, which is part of the key. With one entry for all, auto's row paid
 * the whole selection every call: 2 processes, 4 KiB all_reduce 1.04-1.08x the same algorithm's
 * own row, 2-8 KiB broadcast 1.1-1.25x; with overrides left out, the named rows paid it
 * (2 processes, 8 B-2 KiB: auto 0.81-0.95x its own algorithm's row). Debug logging skips the
 * cache, so that every choice is logged. */
static bool cached_choice(call_t *k, int coll, size_t bytes, int *algo) {
    const algo_t *a = k->a;
    if (!k->c->one_node || hcomm__log_on(HCOMM__LOG_DEBUG, HCOMM__SUB_ALGO))
        return false;
    for (int w = 0; w < CHOICE_WAYS; w++) {
        const choice_t *e = &a->last_choice[coll][w];
        if (e->valid && e->bytes == bytes && e->deterministic == k->c->deterministic &&
            e->forced == a->has_over && (!e->forced || e->allowed == a->over.allowed[coll])) {
            *algo = e->algo;
            return true;
        }
    }
    return false;
}

static void keep_choice(call_t *k, int coll, size_t bytes, int algo) {
    algo_t *a = k->a;
    int w = a->choice_next[coll];
    a->choice_next[coll] = (uint8_t)((w + 1) % CHOICE_WAYS);
    a->last_choice[coll][w] = (choice_t){.valid = true,
                                         .deterministic = k->c->deterministic,
                                         .forced = a->has_over,
                                         .allowed = a->has_over ? a->over.allowed[coll] : 0,
                                         .algo = algo,
                                         .bytes = bytes};
}

/* The signature names deterministic mode even where the algorithm runs unchanged in it (a
 * rank-ordered one), so that ranks that differ in the mode fail with HCOMM_ERR_MISMATCH. */
static int chosen(call_t *k, int coll, int algo) {
    int sig = algo | (k->c->deterministic && is_reduction(coll) ? HCOMM__ALGO_DET : 0);
    k->sig.algo = sig;
    k->f->sig.algo = sig;
    k->a->last_algo = algo + 1;
    return algo;
}

/* Algorithms that reduce every element's inputs in rank order already, which deterministic
 * mode runs as they are: the shared-memory native collectives, twoshot, shm, and direct
 * reduce_scatter and reduce. */
static bool rank_ordered(hcomm_comm_t *c, int coll, int algo) {
    if (algo == HCOMM__ALGO_TWOSHOT || algo == HCOMM__ALGO_SHM)
        return true;
    if (algo == HCOMM__ALGO_NATIVE)
        return shm_coll(c);
    return algo == HCOMM__ALGO_DIRECT &&
           (coll == HCOMM__COLL_REDUCESCATTER || coll == HCOMM__COLL_REDUCESCATTERV ||
            coll == HCOMM__COLL_REDUCE);
}

/* The cost model decides where the topology is known (cost.h); elsewhere the defaults. */
static int choose(call_t *k, int coll, size_t bytes) {
    const char *why = "cost model";
    algo_t *a = k->a;
    int algo;
    if (cached_choice(k, coll, bytes, &algo))
        return chosen(k, coll, algo);
    const hcomm__algo_set_t *over = a->has_over ? &a->over : NULL;
    double est = -1.0;
    algo = k->c->one_node ? -1
                          : hcomm__cost_choose(k->c, over ? over : hcomm__algo_env(), coll, bytes,
                                               shm_coll(k->c), &est);
    if (algo < 0)
        algo = hcomm__algo_choose(over, coll, bytes, k->c->size, shm_coll(k->c), &why);
    algo = with_twoshot(k, coll, bytes, algo, &why);
    int pre = algo;
    const char *pre_why = why;
    algo = with_board(k, coll, bytes, algo, &why);
    algo = with_timing(k, coll, bytes, pre, pre_why, algo, &why);
    algo = with_native(k, coll, algo, &why);
    if (k->c->deterministic && is_reduction(coll) && !rank_ordered(k->c, coll, algo))
        algo |= HCOMM__ALGO_DET;
    if (k->c->one_node && !k->probe.active) /* not while a probe alternates */
        keep_choice(k, coll, bytes, algo);
    if (hcomm__log_on(HCOMM__LOG_DEBUG, HCOMM__SUB_ALGO)) {
        char est_text[48] = "no cost estimate: measured tables";
        if (est >= 0)
            snprintf(est_text, sizeof est_text, "estimate %.4g us", est * 1e6);
        hcomm__log(HCOMM__LOG_DEBUG, HCOMM__SUB_ALGO,
                   "%s seq %u: %s of %zu bytes on %d ranks: %s (%s, %s)", k->c->call_fn,
                   (unsigned)k->seq, hcomm__coll_name(coll), bytes, k->c->size,
                   hcomm__algo_name(algo), why, est_text);
    }
    return chosen(k, coll, algo);
}

static hcomm_result_t xfer_check(const hcomm__xfer_t *x, int peer, const hcomm__env_t *env) {
    rd_t d = {.k = x->call};
    return check_sig(&d, peer, &env->sig);
}

/* A checked call's meetings wait for every rank and compare the signatures. An unchecked one
 * waits only where the shape needs it: a root whose payload the others read posts and goes on
 * (as MPI_Bcast's root does), and ranks that only feed a root leave at once. hcomm-bench
 * --algo all with HCOMM_CHECK=off, 4 processes sharing 2 cores, 300 calls, 2 runs each: shm
 * scatter of 16 B 4.7-4.8 us against 5.5-5.6 waiting for all (raw MPI_Scatter 5.0-5.9), 16 KiB
 * 1.2-3.8 against 6.4-9.0 (raw 14-20); broadcast 4 KiB 4.1 against 5.7 (raw 10.7-11.7). */
static hcomm_result_t xfer_meet(const hcomm__xfer_t *x, uint32_t step, int from, int to) {
    call_t *k = x->call;
    if ((from < 0 && to < 0) || hcomm__check_mode() != HCOMM__CHECK_OFF)
        return board_checked(k, step);
    int me = k->c->rank;
    int wait_for = (to >= 0 && to != me) ? HCOMM__MEET_NONE : from;
    hcomm__posted_sig_t ps = posted_of(&k->sig);
    return hcomm__board_meet(k->c, k->seq, step, &ps, wait_for);
}

static hcomm__xfer_t xfer_of(call_t *k) {
    return (hcomm__xfer_t){.c = k->c,
                           .tag = (int)k->seq,
                           .desc = {.sig = k->sig},
                           .check = xfer_check,
                           .meet = xfer_meet,
                           .call = k};
}

/* Messages of this call may take the transport's lane (and the shared-memory transport's
 * posted checks do not apply). */
static bool on_lane(const hcomm_comm_t *c) {
    return !shm_coll(c) && hcomm__lane_payload(c) > 0;
}

/* Two ranks on a lane run the one-exchange algorithms (rd all_gather, rhd reduce_scatter, tree
 * broadcast) as pair.c's exchange, which checks the signature in its messages. */
static bool on_pair_lane(const call_t *k, int algo) {
    int want = k->sig.call == CALL_ALL_GATHER       ? HCOMM__ALGO_RD
               : k->sig.call == CALL_REDUCE_SCATTER ? HCOMM__ALGO_RHD
               : k->sig.call == CALL_BROADCAST      ? HCOMM__ALGO_TREE
                                                    : -1;
    return k->c->size == 2 && (algo & ~HCOMM__ALGO_DET) == want && on_lane(k->c);
}

/* all_gather's rd among more than two ranks sends the whole vector on a lane where it fits
 * one message (rd_union). */
static bool ag_rd_whole(const call_t *k, int algo) {
    hcomm_comm_t *c = k->c;
    size_t p = (size_t)c->size, room = rd_room(c);
    return algo == HCOMM__ALGO_RD && p > 2 && p < room && on_lane(c) &&
           k->sig.count <= (room - p) / p;
}

/* The calls whose every message takes the lane and carries the signature, every rank sending
 * and receiving in every step, so that ranks that disagree meet and see it: no agreement first.
 * (All_reduce's rd, on any transport without posted checks: p2p_agree.) */
static bool checks_in_messages(const call_t *k, int algo) {
    bool lane = on_lane(k->c); /* twoshot.c's messages take it too (algos.h) */
    switch (k->sig.call) {
    case CALL_ALL_REDUCE:
        return algo == HCOMM__ALGO_RD || (lane && algo == HCOMM__ALGO_TWOSHOT);
    case CALL_REDUCE_SCATTER:
        return (lane && (algo == HCOMM__ALGO_RD || algo == HCOMM__ALGO_DIRECT)) ||
               on_pair_lane(k, algo);
    case CALL_BROADCAST:
        return (lane && algo == HCOMM__ALGO_RD) || on_pair_lane(k, algo);
    case CALL_REDUCE: /* direct: addresses from every rank to every rank first, as twoshot */
        return lane && algo == HCOMM__ALGO_DIRECT;
    case CALL_ALL_GATHER:
        return on_pair_lane(k, algo) || ag_rd_whole(k, algo) ||
               (lane && algo == HCOMM__ALGO_DIRECT);
    default:
        return false;
    }
}

/* Before an algorithm over p2p the ranks agree on the signature, as before a native call:
 * the envelopes alone would not tell a rank that only sends (a broadcast root, a gather leaf)
 * that its peers disagree, and a mismatch found midway would leave recvbuf half written. On a
 * shared-memory transport they meet in the posted slots (free there, and where a rank that
 * failed its own checks or runs the native path shows), on a board in a meeting; elsewhere as
 * HCOMM_CHECK says. Off a board rd all_reduce needs neither: it checks in its first exchange
 * (on the lane, where every rank of the call meets, barriers included). Its deterministic form
 * (Bruck over p2p) agrees first, like the others, and so does the rd of all_gather: it runs over
 * p2p, where a peer in a barrier (on the lane) would never see its message and both would wait
 * until the timeout. */
static hcomm_result_t p2p_agree(call_t *k, int algo) {
    hcomm_comm_t *c = k->c;
    /* HCOMM_CHECK=first is always for hcomm's own algorithms: their envelopes check every
     * message, so only a skipped agreement could hang, and under first only the ranks that saw
     * a signature before skip it: their peers would wait in the agreement until the timeout
     * instead of failing with the mismatch (off: every rank skips it alike) */
    if (!shm_coll(c)) {
        /* on a board every checked call meets there: a rank waiting on the board would never
         * see a message that a peer in another call checks its signature with */
        if (checks_in_messages(k, algo) && !board_on(c))
            return HCOMM_OK;
        int mode = hcomm__check_mode();
        return agree_as(
            k, algo == HCOMM__ALGO_NATIVE || mode == HCOMM__CHECK_OFF ? mode : HCOMM__CHECK_ALWAYS);
    }
    hcomm__posted_sig_t ps = posted_of(&k->sig);
    c->posted = &ps;
    hcomm_result_t res = c->tr->posted_only(c);
    c->posted = NULL;
    if (res == HCOMM_ERR_MISMATCH && c->posted_held)
        return posted_verdict(k, &ps);
    HCOMM__TRY(res);
    return c->tr->posted_release(c);
}

/* --- reductions: AVG and half precision around every algorithm --- */

/* One reduction call as the algorithms see it: op is AVG only for f16/bf16 on the algorithms
 * that reduce those in f32 themselves (reduces_half). */
typedef struct red {
    call_t *k;
    int algo, root;
    const void *send;
    void *recv;
    size_t in, out;       /* elements this rank passes in and gets out */
    const size_t *counts; /* reduce_scatterv: per-rank counts */
    hcomm_dtype_t dt;
    hcomm_op_t op;
} red_t;

typedef hcomm_result_t (*red_run_t)(red_t *r);

static hcomm_result_t run_all_reduce(red_t *r);
static hcomm_result_t run_reduce_scatter(red_t *r);
static hcomm_result_t run_reduce(red_t *r);

/* f16/bf16 sums and products accumulate in f32 and are rounded once at the end, so no partial
 * result rounds or overflows (MAX and MIN are exact in any width). Where partial results travel
 * between ranks, the algorithm runs on a widened f32 copy (run_widened); twoshot and direct,
 * which read every input where it lies, accumulate each piece in f32 themselves (twoshot.c):
 * widening first doubled the bytes every peer reads and cost a pass over each vector, so bf16
 * ran 10-20x slower than f32 of the same bytes (2 processes, twoshot all_reduce: 64 KiB 55 us
 * against 5.3, 32 MiB 84 ms against 4.0). */
static bool reduces_half(const red_t *r, red_run_t run) {
    if (r->algo == HCOMM__ALGO_TWOSHOT)
        return run == run_all_reduce;
    return r->algo == HCOMM__ALGO_DIRECT && (run == run_reduce_scatter || run == run_reduce);
}

/* The widened copies kept between calls: up to this much stays (a fresh malloc of 32 MiB or
 * more faults every page each call); a larger call, which only reduce_scatter and reduce make
 * (all_reduce widens a segment at a time), frees its copies after it, so a 1 GiB bf16 bucket
 * does not pin 6 GiB of f32 for the communicator's life. */
#define WIDEN_KEEP_BYTES ((size_t)64 << 20)

/* Widens one reduction: f16/bf16 in -> f32, run, (AVG: divide), round once into recv. The f32
 * copies live in the communicator's scratch for widening: the algorithm's own scratch may move
 * while it runs. */
static hcomm_result_t run_widened(red_t *r, red_run_t run, hcomm_op_t op) {
    hcomm_dtype_t dt = r->dt;
    void *recv = r->recv;
    void *at_out;
    float *win = hcomm__scratch_two(&r->k->a->widened, r->in * 4, r->out * 4, &at_out),
          *wout = at_out;
    hcomm_result_t res = HCOMM_OK;
    if (!win)
        res = hcomm__err(HCOMM_ERR_NOMEM, r->k->c->call_fn, "cannot allocate %zu bytes",
                         (r->in + r->out) * 4);
    if (res == HCOMM_OK) {
        hcomm__widen(win, r->send, r->in, dt);
        red_t w = {r->k, r->algo, r->root, win, wout, r->in, r->out, r->counts, HCOMM_F32, r->op};
        res = run(&w);
    }
    if (res == HCOMM_OK && op == HCOMM_AVG) /* divide before rounding: the mean fits */
        hcomm__scale_div(wout, r->out, HCOMM_F32, r->k->c->size);
    if (res == HCOMM_OK)
        hcomm__narrow(recv, wout, r->out, dt);
    hcomm__scratch_trim(&r->k->a->widened, WIDEN_KEEP_BYTES);
    return res;
}

/* An all_reduce is elementwise, so its widened copy is made a segment at a time: the scratch
 * stays 2 x WIDEN_SEGMENT f32 however large the tensor (a 1 GiB bf16 gradient would otherwise
 * need 4 GiB more). A zero count still runs once: rd checks the signature in its exchange. */
#define WIDEN_SEGMENT ((size_t)1 << 20)

static hcomm_result_t run_widened_segments(red_t *r, red_run_t run, hcomm_op_t op) {
    size_t es = hcomm__dtype_size(r->dt), done = 0;
    hcomm_result_t res;
    do {
        size_t n = r->in - done < WIDEN_SEGMENT ? r->in - done : WIDEN_SEGMENT;
        red_t seg = *r;
        seg.send = (const char *)r->send + done * es;
        seg.recv = (char *)r->recv + done * es;
        seg.in = seg.out = n;
        res = run_widened(&seg, run, op);
        done += n;
    } while (res == HCOMM_OK && done < r->in);
    return res;
}

static hcomm_result_t run_reduction(red_t *r, red_run_t run) {
    hcomm_op_t op = r->op;
    if (hcomm__sums_in_f32(r->dt, op) && reduces_half(r, run))
        return run(r); /* AVG too: it divides before rounding */
    r->op = op == HCOMM_AVG ? HCOMM_SUM : op;
    if (hcomm__sums_in_f32(r->dt, op))
        return run == run_all_reduce ? run_widened_segments(r, run, op) : run_widened(r, run, op);
    HCOMM__TRY(run(r));
    if (op == HCOMM_AVG)
        hcomm__scale_div(r->recv, r->out, r->dt, r->k->c->size);
    return HCOMM_OK;
}

static hcomm_result_t run_all_reduce(red_t *r) {
    hcomm_comm_t *c = r->k->c;
    size_t bytes = r->in * hcomm__dtype_size(r->dt);
    if (r->algo & HCOMM__ALGO_DET) {
        if (r->send != r->recv && bytes)
            memcpy(r->recv, r->send, bytes);
        hcomm__xfer_t x = xfer_of(r->k);
        return hcomm__ar_det(&x, r->algo, r->recv, r->in, r->dt, r->op);
    }
    if (r->algo == HCOMM__ALGO_NATIVE) /* agreed already */
        return c->tr->native->all_reduce(c, r->send, r->recv, r->in, r->dt, r->op);
    if (r->algo == HCOMM__ALGO_RD)
        return rd_all_reduce(r->k, r->send, r->recv, r->in, r->dt, r->op);
    hcomm__xfer_t x = xfer_of(r->k);
    if (r->algo == HCOMM__ALGO_TWOSHOT)
        return hcomm__ar_twoshot(&x, r->send, r->recv, r->in, r->dt, r->op);
    if (r->algo == HCOMM__ALGO_HIER)
        return hcomm__ar_hier(&x, r->send, r->recv, r->in, r->dt, r->op);
    if (r->send != r->recv && bytes)
        memcpy(r->recv, r->send, bytes);
    if (r->algo == HCOMM__ALGO_RING)
        return hcomm__ar_ring(&x, r->recv, r->in, r->dt, r->op);
    if (r->algo == HCOMM__ALGO_RHD)
        return hcomm__ar_rhd(&x, r->recv, r->in, r->dt, r->op);
    return hcomm__ar_naive(&x, r->recv, r->in, r->dt, r->op);
}

/* counts: size entries of n each (freed by the caller), or NULL without memory. */
static size_t *equal_counts(int size, size_t n) {
    size_t *counts = malloc(sizeof(size_t) * (size_t)size);
    for (int i = 0; counts && i < size; i++)
        counts[i] = n;
    return counts;
}

static hcomm_result_t nomem(call_t *k) {
    return hcomm__err(HCOMM_ERR_NOMEM, k->c->call_fn, "out of memory");
}

static hcomm_result_t run_reduce_scatter(red_t *r) {
    hcomm_comm_t *c = r->k->c;
    if (r->algo == HCOMM__ALGO_NATIVE) /* agreed already */
        return c->tr->native->reduce_scatter(c, r->send, r->recv, r->out, r->dt, r->op);
    hcomm__xfer_t x = xfer_of(r->k);
    if (r->counts && r->algo == HCOMM__ALGO_DIRECT)
        return hcomm__rsv_direct(&x, r->send, r->recv, r->counts, r->dt, r->op);
    if (r->counts)
        return hcomm__rsv_run(&x, r->algo, r->send, r->recv, r->counts, r->dt, r->op);
    if (on_pair_lane(r->k, r->algo))
        return hcomm__pair_reduce_scatter(&x, r->send, r->recv, r->out, r->dt, r->op);
    if (r->algo == HCOMM__ALGO_RD) /* not deterministic: that flag runs below */
        return rd_reduce_scatter(r->k, r->send, r->recv, r->out, r->dt, r->op);
    if (r->algo == HCOMM__ALGO_DIRECT)
        return hcomm__rs_direct(&x, r->send, r->recv, r->out, r->dt, r->op);
    if (r->algo == HCOMM__ALGO_HIER)
        return hcomm__rs_hier(&x, r->send, r->recv, r->out, r->dt, r->op);
    size_t *counts = equal_counts(c->size, r->out);
    if (!counts)
        return nomem(r->k);
    hcomm_result_t res = hcomm__rsv_run(&x, r->algo, r->send, r->recv, counts, r->dt, r->op);
    free(counts);
    return res;
}

/* The tree reduces in place: on the root in recv, elsewhere in a copy of send; the copy and
 * the receive space live in the communicator's scratch, kept between calls (a fresh 32 MiB+
 * malloc faults). */
static hcomm_result_t run_reduce(red_t *r) {
    hcomm_comm_t *c = r->k->c;
    size_t bytes = r->in * hcomm__dtype_size(r->dt);
    bool root = c->rank == r->root;
    hcomm__xfer_t x = xfer_of(r->k);
    if (r->algo & HCOMM__ALGO_DET)
        return hcomm__reduce_det(&x, r->send, r->recv, r->in, r->dt, r->op, r->root);
    if (r->algo == HCOMM__ALGO_NATIVE) /* agreed already */
        return c->tr->native->reduce(c, r->send, r->recv, r->in, r->dt, r->op, r->root);
    if (r->algo == HCOMM__ALGO_RHD)
        return hcomm__reduce_rhd(&x, r->send, r->recv, r->in, r->dt, r->op, r->root);
    if (r->algo == HCOMM__ALGO_DIRECT)
        return hcomm__reduce_direct(&x, r->send, r->recv, r->in, r->dt, r->op, r->root);
    void *tmp, *buf = r->recv;
    if (root)
        tmp = hcomm__x_scratch(&x, bytes);
    else
        hcomm__x_scratch_pair(&x, bytes, bytes, &tmp, &buf);
    if (!tmp)
        return nomem(r->k);
    if (buf != r->send && bytes)
        memcpy(buf, r->send, bytes);
    return hcomm__reduce_tree(&x, buf, tmp, r->in, r->dt, r->op, r->root);
}

/* --- the collectives --- */

/* The size selection weighs a reduction by: f16/bf16 sums as f32 of the same count. The
 * algorithms that move partial sums move them widened, and twoshot and direct, which read
 * halves, convert every element they read, so a half costs about what an f32 element costs,
 * not half of it. A bf16 sweep (scripts/regret-sweep.sh, 2 repetitions, selection by the
 * bytes themselves) lost in both at 8 KiB all_reduce on 2 processes (shm, 1.15-1.18 behind
 * twoshot) and 32 KiB on 4 unchecked (shm, 1.12-1.21 behind twoshot). */
static size_t reduction_bytes(size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    return count * (hcomm__sums_in_f32(dt, op) ? sizeof(float) : hcomm__dtype_size(dt));
}

hcomm_result_t hcomm__coll_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    call_t k = {0};
    HCOMM__TRY(call_begin(c, &k, CALL_ALL_REDUCE, dt, op, 0, count));
    int algo = choose(&k, HCOMM__COLL_ALLREDUCE, reduction_bytes(count, dt, op));
    if (shm_coll(c) && algo == HCOMM__ALGO_NATIVE) /* reduces AVG and halves in one pass */
        RUN_POSTED(&k, c->tr->native->all_reduce(c, sendbuf, recvbuf, count, dt, op));
    if (algo == HCOMM__ALGO_SHM) { /* checks in its meetings; AVG and halves in one pass too */
        hcomm__xfer_t x = xfer_of(&k);
        return call_end(&k, hcomm__ar_shm(&x, sendbuf, recvbuf, count, dt, op));
    }
    hcomm_result_t res = p2p_agree(&k, algo);
    red_t r = {&k, algo, 0, sendbuf, recvbuf, count, count, NULL, dt, op};
    if (res == HCOMM_OK)
        res = run_reduction(&r, run_all_reduce);
    return call_end(&k, res);
}

/* Direct all_gather lets its peers load this rank's block from send, which the rank's own copy
 * into recv then does not delay (and which stays in the readers' caches while the caller leaves
 * it unchanged), unless only recv lies in memory the peers map (the transport's mem_kind: every
 * buffer of local's threads, hcomm_mem_alloc's on mpi). 2 processes, shared buffers, out of
 * place, from recv: 32 KiB 5.3 us against shm's 4.3, 128 KiB 10.3 against raw MPI_Allgather's
 * 9.5 (in place 2.8 and 4.3). */
static bool ag_reads_send(hcomm_comm_t *c, const void *send, const char *mine) {
    return c->tr->mem_kind(c, send) == HCOMM__MEM_SHARED ||
           c->tr->mem_kind(c, mine) != HCOMM__MEM_SHARED;
}

hcomm_result_t hcomm__coll_all_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t bytes_per_rank) {
    call_t k = {0};
    HCOMM__TRY(call_begin(c, &k, CALL_ALL_GATHER, HCOMM_U8, HCOMM_SUM, 0, bytes_per_rank));
    int algo = choose(&k, HCOMM__COLL_ALLGATHER, bytes_per_rank * (size_t)c->size);
    if (shm_coll(c) && algo == HCOMM__ALGO_NATIVE)
        RUN_POSTED(&k, c->tr->native->all_gather(c, sendbuf, recvbuf, bytes_per_rank));
    if (algo == HCOMM__ALGO_SHM) {
        hcomm__xfer_t x = xfer_of(&k);
        return call_end(&k, hcomm__ag_shm(&x, sendbuf, recvbuf, bytes_per_rank));
    }
    hcomm_result_t res = p2p_agree(&k, algo); /* native: as before; no-op where checked below */
    if (res == HCOMM_OK && on_pair_lane(&k, algo)) {
        hcomm__xfer_t x = xfer_of(&k);
        return call_end(&k, hcomm__pair_all_gather(&x, sendbuf, recvbuf, bytes_per_rank));
    }
    if (res == HCOMM_OK && ag_rd_whole(&k, algo))
        return call_end(&k, rd_union(&k, sendbuf, bytes_per_rank, c->size, c->rank, recvbuf));
    if (res != HCOMM_OK || algo == HCOMM__ALGO_NATIVE)
        return call_end(&k, res == HCOMM_OK
                                ? c->tr->native->all_gather(c, sendbuf, recvbuf, bytes_per_rank)
                                : res);
    char *mine = (char *)recvbuf + (size_t)c->rank * bytes_per_rank;
    hcomm__xfer_t x = xfer_of(&k);
    if (algo == HCOMM__ALGO_DIRECT && ag_reads_send(c, sendbuf, mine))
        return call_end(&k, hcomm__ag_direct(&x, sendbuf, recvbuf, bytes_per_rank));
    if (mine != sendbuf && bytes_per_rank)
        memcpy(mine, sendbuf, bytes_per_rank);
    if (algo == HCOMM__ALGO_DIRECT)
        return call_end(&k, hcomm__ag_direct(&x, mine, recvbuf, bytes_per_rank));
    if (algo == HCOMM__ALGO_HIER)
        return call_end(&k, hcomm__ag_hier(&x, recvbuf, bytes_per_rank));
    size_t *bytes = equal_counts(c->size, bytes_per_rank);
    res = bytes ? hcomm__agv_run(&x, algo, recvbuf, bytes) : nomem(&k);
    free(bytes);
    return call_end(&k, res);
}

hcomm_result_t hcomm__coll_reduce_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                          size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    call_t k = {0};
    HCOMM__TRY(call_begin(c, &k, CALL_REDUCE_SCATTER, dt, op, 0, count));
    int algo =
        choose(&k, HCOMM__COLL_REDUCESCATTER, reduction_bytes(count, dt, op) * (size_t)c->size);
    if (shm_coll(c) && algo == HCOMM__ALGO_NATIVE)
        RUN_POSTED(&k, c->tr->native->reduce_scatter(c, sendbuf, recvbuf, count, dt, op));
    if (algo == HCOMM__ALGO_SHM) {
        hcomm__xfer_t x = xfer_of(&k);
        return call_end(&k, hcomm__rs_shm(&x, sendbuf, recvbuf, count, dt, op));
    }
    hcomm_result_t res = p2p_agree(&k, algo);
    red_t r = {&k, algo, 0, sendbuf, recvbuf, count * (size_t)c->size, count, NULL, dt, op};
    if (res == HCOMM_OK)
        res = run_reduction(&r, run_reduce_scatter);
    return call_end(&k, res);
}

hcomm_result_t hcomm__coll_broadcast(hcomm_comm_t *c, void *buf, size_t bytes, int root) {
    call_t k = {0};
    HCOMM__TRY(call_begin(c, &k, CALL_BROADCAST, HCOMM_U8, HCOMM_SUM, root, bytes));
    int algo = choose(&k, HCOMM__COLL_BROADCAST, bytes);
    if (shm_coll(c) && algo == HCOMM__ALGO_NATIVE)
        RUN_POSTED(&k, c->tr->native->broadcast(c, buf, bytes, root));
    if (algo == HCOMM__ALGO_SHM || (algo == HCOMM__ALGO_DIRECT && board_on(c))) {
        hcomm__xfer_t x = xfer_of(&k); /* both check in their meetings */
        return call_end(&k, algo == HCOMM__ALGO_SHM ? hcomm__bc_shm(&x, buf, bytes, root)
                                                    : hcomm__bc_board_direct(&x, buf, bytes, root));
    }
    if (algo == HCOMM__ALGO_NATIVE) {
        hcomm_result_t res = agree(&k);
        return call_end(&k, res == HCOMM_OK ? c->tr->native->broadcast(c, buf, bytes, root) : res);
    }
    hcomm__xfer_t x = xfer_of(&k);
    hcomm_result_t res = p2p_agree(&k, algo); /* no-op where the pair checks */
    if (res == HCOMM_OK && on_pair_lane(&k, algo))
        return call_end(&k, hcomm__pair_broadcast(&x, buf, bytes, root,
                                                  hcomm__check_mode() != HCOMM__CHECK_OFF));
    if (res == HCOMM_OK)
        res = algo == HCOMM__ALGO_RD ? rd_broadcast(&k, buf, bytes, root)
                                     : hcomm__bc_run(&x, algo, buf, bytes, root);
    return call_end(&k, res);
}

hcomm_result_t hcomm__coll_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                  hcomm_dtype_t dt, hcomm_op_t op, int root) {
    call_t k = {0};
    HCOMM__TRY(call_begin(c, &k, CALL_REDUCE, dt, op, root, count));
    int algo = choose(&k, HCOMM__COLL_REDUCE, reduction_bytes(count, dt, op));
    if (algo == HCOMM__ALGO_SHM) { /* checks in its meetings; AVG and halves in one pass too */
        hcomm__xfer_t x = xfer_of(&k);
        return call_end(&k, hcomm__reduce_shm(&x, sendbuf, recvbuf, count, dt, op, root));
    }
    hcomm_result_t res = p2p_agree(&k, algo);
    size_t out = c->rank == root ? count : 0;
    red_t r = {&k, algo, root, sendbuf, recvbuf, count, out, NULL, dt, op};
    if (res == HCOMM_OK)
        res = run_reduction(&r, run_reduce);
    return call_end(&k, res);
}

/* Gather (to_root) or scatter of bytes per rank; the root's own block is a local copy. */
static hcomm_result_t rooted_move(hcomm_comm_t *c, call_kind_t kind, const void *sendbuf,
                                  void *recvbuf, size_t bytes, int root) {
    call_t k = {0};
    bool gather = kind == CALL_GATHER;
    HCOMM__TRY(call_begin(c, &k, kind, HCOMM_U8, HCOMM_SUM, root, bytes));
    int algo =
        choose(&k, gather ? HCOMM__COLL_GATHER : HCOMM__COLL_SCATTER, bytes * (size_t)c->size);
    hcomm__xfer_t x = xfer_of(&k);
    /* both check in their meetings, before anything moves */
    bool shm = algo == HCOMM__ALGO_SHM,
         reads = algo == HCOMM__ALGO_DIRECT && board_on(c) && peer_reads(c);
    hcomm_result_t res = HCOMM_OK;
    if (shm)
        res = gather ? hcomm__gather_shm(&x, sendbuf, recvbuf, bytes, root)
                     : hcomm__scatter_shm(&x, sendbuf, recvbuf, bytes, root);
    else if (reads)
        res = gather ? hcomm__gather_board_direct(&x, sendbuf, recvbuf, bytes, root)
                     : hcomm__scatter_board_direct(&x, sendbuf, recvbuf, bytes, root);
    else
        res = p2p_agree(&k, algo);
    if (res != HCOMM_OK)
        return call_end(&k, res);
    if (algo == HCOMM__ALGO_NATIVE) /* agreed already; moves the root's block too */
        return call_end(&k, gather ? c->tr->native->gather(c, sendbuf, recvbuf, bytes, root)
                                   : c->tr->native->scatter(c, sendbuf, recvbuf, bytes, root));
    if (c->rank == root && bytes) {
        char *dst = gather ? (char *)recvbuf + (size_t)root * bytes : recvbuf;
        const char *src = gather ? sendbuf : (const char *)sendbuf + (size_t)root * bytes;
        if (dst != src)
            memcpy(dst, src, bytes);
    }
    if (shm || reads)
        return call_end(&k, HCOMM_OK);
    if (algo == HCOMM__ALGO_TREE)
        res = gather ? hcomm__gather_tree(&x, sendbuf, recvbuf, bytes, root)
                     : hcomm__scatter_tree(&x, sendbuf, recvbuf, bytes, root);
    else
        res = gather ? hcomm__gather_direct(&x, sendbuf, recvbuf, bytes, root)
                     : hcomm__scatter_direct(&x, sendbuf, recvbuf, bytes, root);
    return call_end(&k, res);
}

hcomm_result_t hcomm__coll_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes,
                                  int root) {
    return rooted_move(c, CALL_GATHER, sendbuf, recvbuf, bytes, root);
}

hcomm_result_t hcomm__coll_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                   size_t bytes, int root) {
    return rooted_move(c, CALL_SCATTER, sendbuf, recvbuf, bytes, root);
}

/* The v-calls' signature: total in count, a digest of the per-rank counts in extra. */
static void counts_sig(call_t *k, const size_t *counts, int n) {
    uint64_t h = 0xcbf29ce484222325ull, total = 0;
    for (int i = 0; i < n; i++) {
        h = (h ^ counts[i]) * 0x100000001b3ull;
        total += counts[i];
    }
    k->sig.count = total;
    k->sig.extra = h;
    k->f->sig = k->sig;
    k->vcounts = counts;
}

hcomm_result_t hcomm__coll_all_gatherv(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                       const size_t *bytes) {
    call_t k = {0};
    HCOMM__TRY(call_begin(c, &k, CALL_ALL_GATHERV, HCOMM_U8, HCOMM_SUM, 0, 0));
    counts_sig(&k, bytes, c->size);
    int algo = choose(&k, HCOMM__COLL_ALLGATHERV, k.sig.count);
    if (shm_coll(c) && algo == HCOMM__ALGO_NATIVE)
        RUN_POSTED(&k, c->tr->native->all_gatherv(c, sendbuf, recvbuf, bytes));
    if (algo == HCOMM__ALGO_SHM) { /* checks in its meetings */
        hcomm__xfer_t x = xfer_of(&k);
        return call_end(&k, hcomm__agv_shm(&x, sendbuf, recvbuf, bytes));
    }
    hcomm_result_t res = p2p_agree(&k, algo);
    if (res != HCOMM_OK || algo == HCOMM__ALGO_DIRECT) {
        hcomm__xfer_t x = xfer_of(&k);
        return call_end(&k, res == HCOMM_OK ? hcomm__agv_direct(&x, sendbuf, recvbuf, bytes) : res);
    }
    size_t off = 0;
    for (int r = 0; r < c->rank; r++)
        off += bytes[r];
    if ((char *)recvbuf + off != sendbuf && bytes[c->rank])
        memcpy((char *)recvbuf + off, sendbuf, bytes[c->rank]);
    hcomm__xfer_t x = xfer_of(&k);
    return call_end(&k, hcomm__agv_run(&x, algo, recvbuf, bytes));
}

hcomm_result_t hcomm__coll_reduce_scatterv(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                           const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op) {
    call_t k = {0};
    HCOMM__TRY(call_begin(c, &k, CALL_REDUCE_SCATTERV, dt, op, 0, 0));
    counts_sig(&k, counts, c->size);
    int algo = choose(&k, HCOMM__COLL_REDUCESCATTERV, reduction_bytes(k.sig.count, dt, op));
    if (shm_coll(c) && algo == HCOMM__ALGO_NATIVE) /* reduces AVG and halves in one pass */
        RUN_POSTED(&k, c->tr->native->reduce_scatterv(c, sendbuf, recvbuf, counts, dt, op));
    if (algo == HCOMM__ALGO_SHM) { /* checks in its meetings; AVG and halves in one pass too */
        hcomm__xfer_t x = xfer_of(&k);
        return call_end(&k, hcomm__rsv_shm(&x, sendbuf, recvbuf, counts, dt, op));
    }
    hcomm_result_t res = p2p_agree(&k, algo);
    red_t r = {&k, algo, 0, sendbuf, recvbuf, k.sig.count, counts[c->rank], counts, dt, op};
    if (res == HCOMM_OK)
        res = run_reduction(&r, run_reduce_scatter);
    return call_end(&k, res);
}

hcomm_result_t hcomm__coll_set_algo(hcomm_comm_t *c, const char *spec) {
    algo_t *a = algo_of(c);
    if (!a)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for collective state");
    if (!spec || !spec[0]) {
        a->has_over = false;
        return HCOMM_OK;
    }
    hcomm__algo_set_t set;
    HCOMM__TRY(hcomm__algo_parse(c->call_fn, "algorithm spec", spec, &set));
    a->over = set;
    a->has_over = true;
    return HCOMM_OK;
}

/* --- all_to_allv --- */

static int a2a_set(call_t *k, int algo, const char *why, size_t bytes) {
    k->sig.algo = algo;
    k->f->sig.algo = algo;
    k->a->last_algo = algo + 1;
    if (algo < HCOMM__ALGO_COUNT) /* else choose() logs the choice once the sizes are agreed */
        HCOMM__LOG(HCOMM__LOG_DEBUG, HCOMM__SUB_ALGO,
                   "%s seq %u: alltoallv with blocks up to %zu bytes on %d ranks: %s (%s)",
                   k->c->call_fn, (unsigned)k->seq, bytes, k->c->size, hcomm__algo_name(algo), why);
    return algo;
}

/* The algorithm when the choice cannot depend on the block sizes, else -1: native where the
 * defaults pick it at every size (shared-memory transports on one node), the only one allowed,
 * shm on a board (its meeting agrees on everything, checked or not), or native where no
 * agreement runs to share the sizes (HCOMM_CHECK=off; but two ranks on a lane agree in the
 * message that carries small blocks, a2a_pair, which also spares the native call its count
 * check). */
static int a2a_fixed(call_t *k) {
    uint32_t allowed = hcomm__algo_mask(k->a->has_over ? &k->a->over : NULL, HCOMM__COLL_ALLTOALLV);
    bool pair = k->c->size == 2 && hcomm__lane_payload(k->c) > 0 && !board_on(k->c); /* a2a_pair */
    bool native = allowed & (1u << HCOMM__ALGO_NATIVE);
    if (native && shm_coll(k->c) && on_one_node(k->c))
        return HCOMM__ALGO_NATIVE; /* first: this is every call on the local backend */
    if ((allowed & (allowed - 1)) == 0) {
        int a = 0;
        while (!(allowed & (1u << a)))
            a++;
        return a;
    }
    if ((allowed & (1u << HCOMM__ALGO_SHM)) && shm_runs(k->c))
        return HCOMM__ALGO_SHM; /* its meeting agrees on everything: checked or not */
    if (native && hcomm__check_mode() == HCOMM__CHECK_OFF && !pair)
        return HCOMM__ALGO_NATIVE;
    return -1;
}

/* What runs where the chosen all_to_allv algorithm cannot: the native call where allowed,
 * else pairwise. */
static int a2a_fallback(const call_t *k) {
    const hcomm__algo_set_t *over = k->a->has_over ? &k->a->over : NULL;
    return hcomm__algo_allowed(over, HCOMM__COLL_ALLTOALLV, HCOMM__ALGO_NATIVE)
               ? HCOMM__ALGO_NATIVE
               : HCOMM__ALGO_PAIRWISE;
}

/* direct needs cross-memory reads on every rank and shm a board (the same answers on all of
 * them); without, the native call runs where allowed, else pairwise. */
static int a2a_runnable(call_t *k, int algo, size_t bytes) {
    const char *why = algo == HCOMM__ALGO_SHM && !shm_runs(k->c)
                          ? "shm needs a board: every rank of the mpi backend on one node"
                      : algo == HCOMM__ALGO_DIRECT && !peer_reads(k->c)
                          ? "direct needs cross-memory reads"
                          : NULL;
    return why ? a2a_set(k, a2a_fallback(k), why, bytes) : algo;
}

/* A rank with a block whose count or displacement exceeds INT_MAX (every rank knows it from
 * the agreement) rules out the mpi transport's native call, whose arguments are ints: pairwise
 * runs instead, or, where only native is allowed, every rank fails alike. */
static hcomm_result_t a2a_narrow(call_t *k, bool wide_any, int *algo, size_t most) {
    if (!wide_any || *algo != HCOMM__ALGO_NATIVE || shm_coll(k->c))
        return HCOMM_OK;
    const hcomm__algo_set_t *over = k->a->has_over ? &k->a->over : NULL;
    if (!hcomm__algo_allowed(over, HCOMM__COLL_ALLTOALLV, HCOMM__ALGO_PAIRWISE))
        return hcomm__err(HCOMM_ERR_UNSUPPORTED, k->c->call_fn,
                          "a rank's count or displacement exceeds INT_MAX, the most an MPI call "
                          "takes, and only the native algorithm is allowed (allow pairwise)");
    *algo = a2a_set(k, HCOMM__ALGO_PAIRWISE, "counts beyond MPI's int", most);
    return HCOMM_OK;
}

/* After the agreement found a mismatch: every rank tells each peer what it sends it, and
 * two reductions find the lowest (receiver, sender) pair that differs, so every rank names
 * the same pair, as the transports' own check does. Runs only on this error path. */
static hcomm_result_t a2a_diagnose(call_t *k, const hcomm__a2a_t *v) {
    int p = k->c->size, me = k->c->rank;
    hcomm__xfer_t x = xfer_of(k);
    int64_t key = INT64_MAX, lowest = 0, vals[2] = {0, 0}, got[2];
    for (int s = 1; s < p; s++) {
        int to = (me + s) % p, from = (me - s + p) % p;
        uint64_t out = v->scounts[to], in = 0;
        HCOMM__TRY(hcomm__x_sendrecv(&x, to, &out, sizeof out, from, &in, sizeof in));
        if (in != v->rcounts[from] && (int64_t)me * p + from < key)
            key = (int64_t)me * p + from, vals[0] = (int64_t)in,
            vals[1] = (int64_t)v->rcounts[from];
    }
    if (v->scounts[me] != v->rcounts[me] && (int64_t)me * p + me < key)
        key = (int64_t)me * p + me, vals[0] = (int64_t)v->scounts[me],
        vals[1] = (int64_t)v->rcounts[me];
    HCOMM__TRY(rd_all_reduce(k, &key, &lowest, 1, HCOMM_I64, HCOMM_MIN));
    if (lowest != key)
        vals[0] = vals[1] = 0;
    HCOMM__TRY(rd_all_reduce(k, vals, got, 2, HCOMM_I64, HCOMM_MAX));
    int receiver = (int)(lowest / p), sender = (int)(lowest % p);
    return hcomm__err(HCOMM_ERR_MISMATCH, k->c->call_fn,
                      "sendcounts[%d]=%lld on rank %d but recvcounts[%d]=%lld on rank %d; no data "
                      "was moved",
                      receiver, (long long)got[0], sender, sender, (long long)got[1], receiver);
}

/* all_to_allv's choice depends on the largest block of any pair, which no rank knows alone,
 * and its counts must agree pair by pair: the signature agreement every non-native call runs
 * first carries both (a recursive doubling of hcomm__a2a_terms' sums instead of an empty one), so
 * every rank chooses from the same size, and a mismatch fails on every rank before any data
 * moves, without an extra exchange. On a shared-memory transport the posted meeting comes
 * first (where a rank that failed its own checks shows). *algo: the fixed algorithm, or -1
 * to choose one here. */
static hcomm_result_t a2a_agree(call_t *k, hcomm__a2a_t *v, int *algo) {
    int64_t mine[HCOMM__A2A_AGREE], all[HCOMM__A2A_AGREE];
    hcomm__a2a_terms(v, k->c->size, k->c->rank, mine);
    if (*algo < 0)
        a2a_set(k, HCOMM__ALGO_COUNT, "undecided until the sizes are agreed", 0);
    if (shm_coll(k->c))
        HCOMM__TRY(p2p_agree(k, *algo < 0 ? HCOMM__ALGO_COUNT : *algo));
    k->a->agreements++;
    HCOMM__TRY(board_on(k->c)
                   ? board_sum(k, mine, all, HCOMM__A2A_AGREE)
                   : rd_all_reduce(k, mine, all, HCOMM__A2A_AGREE, HCOMM_I64, HCOMM_SUM));
    if (all[0] != 0)
        return a2a_diagnose(k, v);
    size_t most = hcomm__a2a_largest(all); /* every block is below 2 * most */
    if (*algo < 0)
        *algo = a2a_runnable(k, choose(k, HCOMM__COLL_ALLTOALLV, most), most);
    HCOMM__TRY(a2a_narrow(k, all[HCOMM__A2A_WIDE] != 0, algo, most));
    v->lane = hcomm__lane_payload(k->c) > 0 && 2 * most <= HCOMM__A2A_LANE_BLOCK(k->c);
    return HCOMM_OK;
}

/* a2a_agree for two ranks on a lane (hcomm__a2a_pair): one message each way agrees and, for
 * blocks that fit, moves the data (*done), where the agreement and pairwise took two. */
static hcomm_result_t a2a_pair(call_t *k, hcomm__a2a_t *v, int *algo, bool *done) {
    size_t most = 0;
    if (*algo < 0)
        a2a_set(k, HCOMM__ALGO_COUNT, "undecided until the sizes are agreed", 0);
    k->a->agreements++;
    hcomm__xfer_t x = xfer_of(k);
    bool wide_any = false;
    HCOMM__TRY(hcomm__a2a_pair(&x, v, &most, &wide_any, done));
    if (*done)
        *algo = a2a_set(k, HCOMM__ALGO_PAIRWISE, "two ranks, both blocks in the agreement", most);
    else if (*algo < 0)
        *algo = a2a_runnable(k, choose(k, HCOMM__COLL_ALLTOALLV, most), most);
    return *done ? HCOMM_OK : a2a_narrow(k, wide_any, algo, most);
}

static hcomm_result_t a2a_native(call_t *k, const hcomm__a2a_t *v, bool agreed) {
    hcomm_comm_t *c = k->c;
    c->counts_agreed = agreed;
    hcomm_result_t res = c->tr->native->all_to_allv(c, v->send, v->scounts, v->sdispls, v->recv,
                                                    v->rcounts, v->rdispls);
    c->counts_agreed = false;
    return res;
}

/* shm on the board; where its blocks cannot move well there, what it names runs, the counts
 * agreed in its meeting. */
static hcomm_result_t a2a_board(call_t *k, hcomm__a2a_t *v) {
    hcomm__xfer_t x = xfer_of(k);
    int fallback = -1;
    k->a->agreements++;
    HCOMM__TRY(hcomm__a2a_shm(&x, v, &fallback));
    if (fallback < 0)
        return HCOMM_OK;
    if (fallback == HCOMM__ALGO_NATIVE && a2a_fallback(k) == HCOMM__ALGO_NATIVE)
        return a2a_native(k, v, true);
    return hcomm__a2a_run(&x, HCOMM__ALGO_PAIRWISE, v); /* it checks the counts in its messages */
}

/* agreed: the caller's own exchange already checked the call and the counts on every rank,
 * so the native path runs without the signature agreement and the transport's count check
 * (MoE's dispatch; it has no size every rank shares, so it stays native). */
static hcomm_result_t all_to_allv(hcomm_comm_t *c, hcomm__a2a_t *v, bool agreed) {
    call_t k = {0};
    HCOMM__TRY(call_begin(c, &k, CALL_ALL_TO_ALLV, HCOMM_U8, HCOMM_SUM, 0, 0));
    int algo = agreed ? HCOMM__ALGO_NATIVE : a2a_fixed(&k);
    if (algo >= 0 && !agreed)
        algo = a2a_runnable(&k, a2a_set(&k, algo, "fixed", 0), 0);
    if (shm_coll(c) && algo == HCOMM__ALGO_NATIVE)
        RUN_POSTED(&k, c->tr->native->all_to_allv(c, v->send, v->scounts, v->sdispls, v->recv,
                                                  v->rcounts, v->rdispls));
    if (algo == HCOMM__ALGO_SHM)
        return call_end(&k, a2a_board(&k, v));
    hcomm_result_t res = HCOMM_OK;
    if (algo == HCOMM__ALGO_NATIVE)
        res = agreed ? HCOMM_OK : agree(&k);
    else if (algo >= 0 && hcomm__check_mode() == HCOMM__CHECK_OFF)
        res = p2p_agree(&k, algo); /* the counts are checked with the data only */
    else if (c->size == 2 && hcomm__lane_payload(c) > 0 && !board_on(c) &&
             (algo < 0 || algo == HCOMM__ALGO_PAIRWISE)) {
        bool done = false;
        res = a2a_pair(&k, v, &algo, &done), agreed = true;
        if (res == HCOMM_OK && done)
            return call_end(&k, HCOMM_OK);
    } else
        res = a2a_agree(&k, v, &algo), agreed = true;
    if (res != HCOMM_OK)
        return call_end(&k, res);
    if (algo == HCOMM__ALGO_NATIVE && shm_coll(c))
        RUN_POSTED(&k, a2a_native(&k, v, true));
    if (algo == HCOMM__ALGO_NATIVE)
        return call_end(&k, a2a_native(&k, v, agreed));
    hcomm__xfer_t x = xfer_of(&k);
    return call_end(&k, hcomm__a2a_run(&x, algo, v));
}

hcomm_result_t hcomm__coll_all_to_allv(hcomm_comm_t *c, const void *sendbuf,
                                       const size_t *sendcounts, const size_t *sdispls,
                                       void *recvbuf, const size_t *recvcounts,
                                       const size_t *rdispls) {
    hcomm__a2a_t v = {sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, false};
    return all_to_allv(c, &v, false);
}

/* Pairwise exchange (a2a.c) of equal blocks, the signature in every envelope. */
static hcomm_result_t pairwise_all_to_all(call_t *k, const char *send, char *recv, size_t bytes) {
    size_t p = (size_t)k->c->size, *v = malloc(2 * p * sizeof *v);
    if (v == NULL)
        return nomem(k);
    for (size_t i = 0; i < p; i++) {
        v[i] = bytes;
        v[p + i] = i * bytes;
    }
    hcomm__xfer_t x = xfer_of(k);
    hcomm__a2a_t a = {send, v, v + p, recv, v, v + p, false};
    hcomm_result_t res = hcomm__a2a_pairwise(&x, &a);
    free(v);
    return res;
}

hcomm_result_t hcomm__coll_all_to_all_checked(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                              size_t bytes) {
    call_t k = {0};
    HCOMM__TRY(call_begin(c, &k, CALL_ALL_TO_ALLV, HCOMM_U8, HCOMM_SUM, 0, bytes));
    if (!shm_coll(c)) {
        hcomm_result_t res = board_on(c) ? board_agree(&k) : HCOMM_OK;
        return call_end(&k,
                        res == HCOMM_OK ? pairwise_all_to_all(&k, sendbuf, recvbuf, bytes) : res);
    }
    size_t p = (size_t)c->size, *v = malloc(2 * p * sizeof *v);
    if (v == NULL)
        return call_end(&k, nomem(&k));
    for (size_t i = 0; i < p; i++) {
        v[i] = bytes;
        v[p + i] = i * bytes;
    }
    hcomm__posted_sig_t ps = posted_of(&k.sig);
    c->posted = &ps;
    hcomm_result_t res = c->tr->native->all_to_allv(c, sendbuf, v, v + p, recvbuf, v, v + p);
    c->posted = NULL;
    if (res == HCOMM_ERR_MISMATCH && c->posted_held)
        res = posted_verdict(&k, &ps);
    free(v);
    return call_end(&k, res);
}

hcomm_result_t hcomm__coll_all_to_allv_agreed(hcomm_comm_t *c, const void *sendbuf,
                                              const size_t *sendcounts, const size_t *sdispls,
                                              void *recvbuf, const size_t *recvcounts,
                                              const size_t *rdispls) {
    hcomm__a2a_t v = {sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, false};
    return all_to_allv(c, &v, true);
}

void hcomm__coll_counts(hcomm_comm_t *c, uint64_t *calls, uint64_t *agreements) {
    algo_t *a = algo_of(c);
    *calls = a ? a->seq : 0;
    *agreements = a ? a->agreements : 0;
}

static hcomm_result_t posted_barrier(hcomm_comm_t *c) {
    HCOMM__TRY(c->tr->posted_only(c));
    return c->tr->posted_release(c);
}

hcomm_result_t hcomm__coll_barrier(hcomm_comm_t *c) {
    call_t k = {0};
    HCOMM__TRY(call_begin(c, &k, CALL_BARRIER, HCOMM_U8, HCOMM_SUM, 0, 0));
    if (shm_coll(c))
        RUN_POSTED(&k, posted_barrier(c));
    return call_end(&k, meet_all(&k));
}

static hcomm_result_t split_as(hcomm_comm_t *c, call_kind_t kind, int color, int key,
                               hcomm_comm_t **out) {
    call_t k = {0};
    HCOMM__TRY(call_begin(c, &k, kind, HCOMM_U8, HCOMM_SUM, 0, 0));
    if (shm_coll(c))
        RUN_POSTED(&k, c->tr->split(c, color, key, out));
    hcomm_result_t res = meet_all(&k);
    if (res == HCOMM_OK) /* every rank has arrived: the backend's blocking split cannot hang */
        res = c->tr->split(c, color, key, out);
    return call_end(&k, res);
}

hcomm_result_t hcomm__coll_split(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out) {
    return split_as(c, CALL_SPLIT, color, key, out);
}

hcomm_result_t hcomm__coll_worker_dup(hcomm_comm_t *c, hcomm_comm_t **out) {
    algo_t *a = algo_of(c);
    if (a)
        a->nonblocking = true;
    HCOMM__TRY(split_as(c, CALL_WORKER_SPLIT, 0, c->rank, out));
    algo_t *d = algo_of(*out);
    if (!d) {
        hcomm__comm_free(*out);
        *out = NULL;
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for collective state");
    }
    d->nonblocking = true;
    return HCOMM_OK;
}

hcomm_result_t hcomm__coll_fail(hcomm_comm_t *c, hcomm_result_t res) {
    char text[512];
    snprintf(text, sizeof text, "%s", hcomm_last_error());
    call_t k = {0};
    if (call_begin(c, &k, CALL_FAILED, HCOMM_U8, HCOMM_SUM, 0, 0) != HCOMM_OK)
        return hcomm__err_text(res, text);
    if (shm_coll(c)) {
        hcomm__posted_sig_t ps = posted_of(&k.sig);
        ps.failed = res;
        ps.failed_text = text;
        c->posted = &ps;
        if (c->tr->posted_only(c) == HCOMM_ERR_MISMATCH && c->posted_held)
            c->tr->posted_release(c);
        c->posted = NULL;
    } else if (c->size > 1) {
        if (board_on(c)) { /* peers that meet there see it at once */
            hcomm__posted_sig_t ps = posted_of(&k.sig);
            ps.failed = res;
            ps.failed_text = text;
            hcomm__board_meet(c, k.seq, 0, &ps, HCOMM__MEET_NONE);
        }
        char note[600];
        snprintf(note, sizeof note, "rank %d failed its own checks in this call, nothing moved: %s",
                 c->rank, text);
        hcomm__notify_error(c, k.seq, HCOMM_ERR_PEER, note);
    }
    call_end(&k, res);
    return hcomm__err_text(res, text);
}
