/* The one entry path of every collective (coll.h). Each collective is described once
 * (coll_desc_t: its call kind and what selection knows it as, the size it is selected by, the
 * shared-memory transport's native form, its meeting form and its runner), and run_call runs
 * any of them:
 *
 *   call_begin ─ choose ─┬─ native on a shared-memory transport, signature posted ──┐
 *                        ├─ meeting form (shm, direct on a board), checked there ────┤
 *                        └─ agreement (as the algorithm needs) ─ runner ─────────────┴─ call_end
 *
 * all_to_allv, whose choice waits for the sizes its agreement carries, has its own
 * (alltoallv.c); barrier and split meet and act. */
#include "algo/coll.h"

#include "algo/agree.h"
#include "algo/choose.h"
#include "algo/run.h"
#include "algo/sig.h"

#include <stdio.h>
#include <string.h>

typedef struct coll_desc {
    hcomm__call_kind_t kind;
    int coll;      /* hcomm__coll_t */
    bool per_rank; /* selection weighs `in` times the ranks (`in` is per rank); else `in` alone */
    hcomm__posted_fn_t posted; /* the shared-memory transport's native call; NULL: none */
    bool (*meets)(hcomm_comm_t *c, int algo); /* the meeting form runs algo */
    hcomm__runner_t meeting, run;
} coll_desc_t;

/* --- the sizes selection keys on --- */

/* A reduction is weighed with f16/bf16 sums as f32 of the same count: the algorithms that move
 * partial sums move them widened, and twoshot and direct, which read halves, convert every
 * element they read, so a half costs about what an f32 element costs (docs/tuning.md:
 * select.half-size). */
static size_t reduction_bytes(size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    return count * (hcomm__sums_in_f32(dt, op) ? sizeof(float) : hcomm__dtype_size(dt));
}

/* --- the shared-memory transports' native calls, which reduce AVG and halves in one pass --- */

static hcomm_result_t posted_all_reduce(hcomm_comm_t *c, const void *arg) {
    const hcomm__args_t *a = arg;
    return c->tr->native->all_reduce(c, a->send, a->recv, a->in, a->dt, a->op);
}

static hcomm_result_t posted_reduce_scatter(hcomm_comm_t *c, const void *arg) {
    const hcomm__args_t *a = arg;
    return c->tr->native->reduce_scatter(c, a->send, a->recv, a->out, a->dt, a->op);
}

static hcomm_result_t posted_reduce_scatterv(hcomm_comm_t *c, const void *arg) {
    const hcomm__args_t *a = arg;
    return c->tr->native->reduce_scatterv(c, a->send, a->recv, a->counts, a->dt, a->op);
}

static hcomm_result_t posted_all_gather(hcomm_comm_t *c, const void *arg) {
    const hcomm__args_t *a = arg;
    return c->tr->native->all_gather(c, a->send, a->recv, a->in);
}

static hcomm_result_t posted_all_gatherv(hcomm_comm_t *c, const void *arg) {
    const hcomm__args_t *a = arg;
    return c->tr->native->all_gatherv(c, a->send, a->recv, a->counts);
}

static hcomm_result_t posted_broadcast(hcomm_comm_t *c, const void *arg) {
    const hcomm__args_t *a = arg;
    return c->tr->native->broadcast(c, a->recv, a->in, a->root);
}

/* --- which algorithms check the call in meetings of their own --- */

static bool meets_shm(hcomm_comm_t *c, int algo) {
    (void)c;
    return algo == HCOMM__ALGO_SHM;
}

static bool meets_broadcast(hcomm_comm_t *c, int algo) {
    return algo == HCOMM__ALGO_SHM || (algo == HCOMM__ALGO_DIRECT && hcomm__on_board(c));
}

static bool meets_rooted(hcomm_comm_t *c, int algo) {
    return algo == HCOMM__ALGO_SHM ||
           (algo == HCOMM__ALGO_DIRECT && hcomm__on_board(c) && hcomm__peer_reads(c));
}

/* --- the collectives --- */

static const coll_desc_t all_reduce = {
    HCOMM__CALL_ALL_REDUCE, HCOMM__COLL_ALLREDUCE, false, posted_all_reduce, meets_shm,
    hcomm__meet_all_reduce, hcomm__run_all_reduce};
static const coll_desc_t reduce_scatter = {
    HCOMM__CALL_REDUCE_SCATTER, HCOMM__COLL_REDUCESCATTER, false, posted_reduce_scatter, meets_shm,
    hcomm__meet_reduce_scatter, hcomm__run_reduce_scatter};
static const coll_desc_t reduce_scatterv = {HCOMM__CALL_REDUCE_SCATTERV,
                                            HCOMM__COLL_REDUCESCATTERV,
                                            false,
                                            posted_reduce_scatterv,
                                            meets_shm,
                                            hcomm__meet_reduce_scatter,
                                            hcomm__run_reduce_scatter};
static const coll_desc_t reduce = {HCOMM__CALL_REDUCE, HCOMM__COLL_REDUCE, false, NULL, meets_shm,
                                   hcomm__meet_reduce, hcomm__run_reduce};
static const coll_desc_t all_gather = {
    HCOMM__CALL_ALL_GATHER, HCOMM__COLL_ALLGATHER, true, posted_all_gather, meets_shm,
    hcomm__meet_all_gather, hcomm__run_all_gather};
static const coll_desc_t all_gatherv = {
    HCOMM__CALL_ALL_GATHERV, HCOMM__COLL_ALLGATHERV, false, posted_all_gatherv, meets_shm,
    hcomm__meet_all_gatherv, hcomm__run_all_gatherv};
static const coll_desc_t broadcast = {
    HCOMM__CALL_BROADCAST, HCOMM__COLL_BROADCAST, false, posted_broadcast, meets_broadcast,
    hcomm__meet_broadcast, hcomm__run_broadcast};
static const coll_desc_t gather = {HCOMM__CALL_GATHER, HCOMM__COLL_GATHER, true, NULL, meets_rooted,
                                   hcomm__meet_gather, hcomm__run_gather};
static const coll_desc_t scatter = {
    HCOMM__CALL_SCATTER, HCOMM__COLL_SCATTER, true, NULL, meets_rooted,
    hcomm__meet_scatter, hcomm__run_scatter};

/* The entry path: count is what the signature names; a v-call's total (summed with its
 * signature) becomes a->in. */
static hcomm_result_t run_call(hcomm_comm_t *c, const coll_desc_t *d, hcomm__args_t *a,
                               uint64_t count) {
    hcomm__call_t k = {0};
    HCOMM__TRY(hcomm__call_begin(c, &k, d->kind, a->dt, a->op, a->root, count));
    if (a->counts)
        a->in = hcomm__sig_counts(&k, a->counts);
    size_t bytes = reduction_bytes(a->in, a->dt, a->op) * (d->per_rank ? (size_t)c->size : 1);
    int algo = hcomm__choose(&k, d->coll, bytes);
    hcomm_result_t res;
    if (d->posted && algo == HCOMM__ALGO_NATIVE && hcomm__posted_transport(c))
        res = hcomm__run_posted(&k, d->posted, a);
    else if (d->meets(c, algo))
        res = d->meeting(&k, algo, a);
    else if ((res = hcomm__agree_p2p(&k, algo)) == HCOMM_OK)
        res = d->run(&k, algo, a);
    return hcomm__call_end(&k, res);
}

hcomm_result_t hcomm__coll_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    hcomm__args_t a = {sendbuf, recvbuf, count, count, NULL, dt, op, 0};
    return run_call(c, &all_reduce, &a, count);
}

hcomm_result_t hcomm__coll_reduce_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                          size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    hcomm__args_t a = {sendbuf, recvbuf, count * (size_t)c->size, count, NULL, dt, op, 0};
    return run_call(c, &reduce_scatter, &a, count);
}

hcomm_result_t hcomm__coll_reduce_scatterv(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                           const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op) {
    hcomm__args_t a = {sendbuf, recvbuf, 0, counts[c->rank], counts, dt, op, 0};
    return run_call(c, &reduce_scatterv, &a, 0);
}

hcomm_result_t hcomm__coll_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                  hcomm_dtype_t dt, hcomm_op_t op, int root) {
    hcomm__args_t a = {sendbuf, recvbuf, count, c->rank == root ? count : 0, NULL, dt, op, root};
    return run_call(c, &reduce, &a, count);
}

hcomm_result_t hcomm__coll_all_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t bytes_per_rank) {
    hcomm__args_t a = {sendbuf, recvbuf, bytes_per_rank, 0, NULL, HCOMM_U8, HCOMM_SUM, 0};
    return run_call(c, &all_gather, &a, bytes_per_rank);
}

hcomm_result_t hcomm__coll_all_gatherv(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                       const size_t *bytes) {
    hcomm__args_t a = {sendbuf, recvbuf, 0, 0, bytes, HCOMM_U8, HCOMM_SUM, 0};
    return run_call(c, &all_gatherv, &a, 0);
}

hcomm_result_t hcomm__coll_broadcast(hcomm_comm_t *c, void *buf, size_t bytes, int root) {
    hcomm__args_t a = {buf, buf, bytes, 0, NULL, HCOMM_U8, HCOMM_SUM, root};
    return run_call(c, &broadcast, &a, bytes);
}

hcomm_result_t hcomm__coll_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes,
                                  int root) {
    hcomm__args_t a = {sendbuf, recvbuf, bytes, 0, NULL, HCOMM_U8, HCOMM_SUM, root};
    return run_call(c, &gather, &a, bytes);
}

hcomm_result_t hcomm__coll_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                   size_t bytes, int root) {
    hcomm__args_t a = {sendbuf, recvbuf, bytes, 0, NULL, HCOMM_U8, HCOMM_SUM, root};
    return run_call(c, &scatter, &a, bytes);
}

/* --- barrier, split, and a rank whose own checks failed --- */

hcomm_result_t hcomm__coll_barrier(hcomm_comm_t *c) {
    hcomm__call_t k = {0};
    HCOMM__TRY(hcomm__call_begin(c, &k, HCOMM__CALL_BARRIER, HCOMM_U8, HCOMM_SUM, 0, 0));
    if (hcomm__posted_transport(c))
        return hcomm__call_end(&k, hcomm__run_posted(&k, hcomm__posted_barrier, NULL));
    return hcomm__call_end(&k, hcomm__agree_all(&k));
}

typedef struct split_args {
    int color, key;
    hcomm_comm_t **out;
} split_args_t;

static hcomm_result_t posted_split(hcomm_comm_t *c, const void *arg) {
    const split_args_t *s = arg;
    return c->tr->split(c, s->color, s->key, s->out);
}

static hcomm_result_t split_as(hcomm_comm_t *c, hcomm__call_kind_t kind, int color, int key,
                               hcomm_comm_t **out) {
    hcomm__call_t k = {0};
    HCOMM__TRY(hcomm__call_begin(c, &k, kind, HCOMM_U8, HCOMM_SUM, 0, 0));
    split_args_t s = {color, key, out};
    if (hcomm__posted_transport(c))
        return hcomm__call_end(&k, hcomm__run_posted(&k, posted_split, &s));
    /* Once every rank has arrived the backend's blocking split cannot hang, unless a rank that
     * arrived leaves on its own abort while its peers pass: it stays to the end. */
    c->abort_deferred = true;
    hcomm_result_t res = hcomm__agree_all(&k);
    /* A duplicate polls where the backend can (a rank lost meanwhile ends it, where a
     * blocking split would wait for it forever), with this rank's abort still deferred. */
    bool dup = kind == HCOMM__CALL_WORKER_SPLIT && c->tr->dup;
    if (res == HCOMM_OK && dup)
        res = c->tr->dup(c, out);
    c->abort_deferred = false;
    if (res == HCOMM_OK && !dup)
        res = c->tr->split(c, color, key, out);
    return hcomm__call_end(&k, res);
}

hcomm_result_t hcomm__coll_split(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out) {
    return split_as(c, HCOMM__CALL_SPLIT, color, key, out);
}

hcomm_result_t hcomm__coll_worker_dup(hcomm_comm_t *c, hcomm_comm_t **out) {
    algo_state_t *a = hcomm__algo_state(c);
    if (a)
        a->nonblocking = true;
    HCOMM__TRY(split_as(c, HCOMM__CALL_WORKER_SPLIT, 0, c->rank, out));
    algo_state_t *d = hcomm__algo_state(*out);
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
    hcomm__call_t k = {0};
    if (hcomm__call_begin(c, &k, HCOMM__CALL_FAILED, HCOMM_U8, HCOMM_SUM, 0, 0) != HCOMM_OK)
        return hcomm__err_text(res, text);
    hcomm__agree_failed(&k, res, text);
    hcomm__call_end(&k, res);
    return hcomm__err_text(res, text);
}
