/* The public raw collectives, barrier and split: thin wrappers that name the call, check the
 * arguments (a rank whose check fails still joins the call, so its peers fail at once with
 * HCOMM_ERR_PEER), then hand it to the algorithms layer. */
#include "algo/async.h"

#include <stdlib.h>
#include <string.h>

/* Runs body with the call named fn on comm (NULL: an error); a failed argument check joins the
 * peers' call. */
#define HCOMM__PUBLIC_CALL(comm, checks, body)                                                     \
    do {                                                                                           \
        HCOMM__CHECK_NULL(comm);                                                                   \
        hcomm__enter(comm, __func__);                                                              \
        hcomm_result_t chk_ = (checks);                                                            \
        hcomm_result_t res_ = chk_ != HCOMM_OK ? hcomm__coll_fail(comm, chk_) : (body);            \
        return hcomm__leave(comm, res_);                                                           \
    } while (0)

/* count_name: what the call names its element count ("count", "recvcount"). */
static hcomm_result_t check_reduce_args(const char *fn, const char *count_name, size_t count,
                                        hcomm_dtype_t dt, hcomm_op_t op, const void *sendbuf,
                                        const void *recvbuf) {
    if (!hcomm__dtype_valid(dt))
        return hcomm__err(HCOMM_ERR_DTYPE, fn, "dtype=%d is not a valid hcomm_dtype_t", (int)dt);
    if (!hcomm__op_valid(op))
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "op=%d is not a valid hcomm_op_t", (int)op);
    HCOMM__TRY(hcomm__span(fn, count_name, count, hcomm__dtype_size(dt), 1, NULL));
    if (count == 0)
        return HCOMM_OK;
    if (sendbuf == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'sendbuf' is NULL with %s=%zu", count_name,
                          count);
    if (recvbuf == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'recvbuf' is NULL with %s=%zu", count_name,
                          count);
    HCOMM__TRY(hcomm__check_aligned(fn, "sendbuf", sendbuf, dt));
    return hcomm__check_aligned(fn, "recvbuf", recvbuf, dt);
}

/* Input and output do not share a byte; remedy says what to pass instead. */
static hcomm_result_t check_disjoint(const char *fn, const void *in, size_t in_bytes,
                                     const void *out, size_t out_bytes, const char *remedy) {
    if (!hcomm__overlaps(in, in_bytes, out, out_bytes))
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                      "sendbuf=%p (%zu bytes) overlaps recvbuf=%p (%zu bytes); pass %s", in,
                      in_bytes, out, out_bytes, remedy);
}

/* Input and output are the same buffer (in place) or do not share a byte. */
static hcomm_result_t check_overlap(const char *fn, const void *in, size_t in_bytes,
                                    const void *out, size_t out_bytes, const void *in_place) {
    if (in == in_place)
        return HCOMM_OK;
    return check_disjoint(fn, in, in_bytes, out, out_bytes,
                          "the in-place form or separate buffers");
}

static hcomm_result_t all_reduce_checks(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                        size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    const char *fn = c->call_fn; /* hcomm_all_reduce or hcomm_iall_reduce */
    HCOMM__TRY(check_reduce_args(fn, "count", count, dt, op, sendbuf, recvbuf));
    size_t bytes = count * hcomm__dtype_size(dt);
    return check_overlap(fn, sendbuf, bytes, recvbuf, bytes, recvbuf);
}

hcomm_result_t hcomm_all_reduce(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                size_t count, hcomm_dtype_t dtype, hcomm_op_t op) {
    HCOMM__PUBLIC_CALL(comm, all_reduce_checks(comm, sendbuf, recvbuf, count, dtype, op),
                       hcomm__coll_all_reduce(comm, sendbuf, recvbuf, count, dtype, op));
}

static hcomm_result_t broadcast_checks(hcomm_comm_t *c, void *buf, size_t bytes, int root) {
    const char *fn = c->call_fn; /* hcomm_broadcast or hcomm_ibroadcast */
    if (root < 0 || root >= c->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "root=%d outside 0..%d", root, c->size - 1);
    if (bytes > 0 && buf == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'buf' is NULL with bytes=%zu", bytes);
    return hcomm__span(fn, "bytes", bytes, 1, 1, NULL);
}

hcomm_result_t hcomm_broadcast(hcomm_comm_t *comm, void *buf, size_t bytes, int root) {
    HCOMM__PUBLIC_CALL(comm, broadcast_checks(comm, buf, bytes, root),
                       hcomm__coll_broadcast(comm, buf, bytes, root));
}

static hcomm_result_t all_gather_checks(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                        size_t bytes) {
    const char *fn = c->call_fn; /* hcomm_all_gather or hcomm_iall_gather */
    if (bytes > 0 && (sendbuf == NULL || recvbuf == NULL))
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument '%s' is NULL with bytes=%zu",
                          sendbuf ? "recvbuf" : "sendbuf", bytes);
    HCOMM__TRY(hcomm__span(fn, "bytes", bytes, 1, (size_t)c->size, NULL));
    const char *mine = (const char *)recvbuf + (size_t)c->rank * bytes;
    return check_overlap(fn, sendbuf, bytes, recvbuf, bytes * (size_t)c->size, mine);
}

hcomm_result_t hcomm_all_gather(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                size_t bytes) {
    HCOMM__PUBLIC_CALL(comm, all_gather_checks(comm, sendbuf, recvbuf, bytes),
                       hcomm__coll_all_gather(comm, sendbuf, recvbuf, bytes));
}

static hcomm_result_t reduce_scatter_checks(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                            size_t recvcount, hcomm_dtype_t dt, hcomm_op_t op) {
    const char *fn = c->call_fn; /* hcomm_reduce_scatter or hcomm_ireduce_scatter */
    HCOMM__TRY(check_reduce_args(fn, "recvcount", recvcount, dt, op, sendbuf, recvbuf));
    HCOMM__TRY(
        hcomm__span(fn, "recvcount", recvcount, hcomm__dtype_size(dt), (size_t)c->size, NULL));
    size_t bytes = recvcount * hcomm__dtype_size(dt);
    if (sendbuf == recvbuf)
        return HCOMM_OK;
    const char *mine = (const char *)sendbuf + (size_t)c->rank * bytes;
    if ((const void *)mine == recvbuf)
        return HCOMM_OK;
    return check_overlap(fn, sendbuf, bytes * (size_t)c->size, recvbuf, bytes, NULL);
}

hcomm_result_t hcomm_reduce_scatter(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                    size_t recvcount, hcomm_dtype_t dtype, hcomm_op_t op) {
    HCOMM__PUBLIC_CALL(comm, reduce_scatter_checks(comm, sendbuf, recvbuf, recvcount, dtype, op),
                       hcomm__coll_reduce_scatter(comm, sendbuf, recvbuf, recvcount, dtype, op));
}

/* Bytes spanned by counts/displs, the highest end of any nonempty block. */
static size_t extent(int n, const size_t *counts, const size_t *displs) {
    size_t end = 0;
    for (int p = 0; p < n; p++)
        if (counts[p] > 0 && counts[p] + displs[p] > end)
            end = counts[p] + displs[p];
    return end;
}

static hcomm_result_t all_to_allv_checks(hcomm_comm_t *c, const void *sendbuf,
                                         const size_t *sendcounts, const size_t *sdispls,
                                         void *recvbuf, const size_t *recvcounts,
                                         const size_t *rdispls) {
    const char *fn = c->call_fn; /* hcomm_all_to_allv or hcomm_iall_to_allv */
    if (!sendcounts || !sdispls || !recvcounts || !rdispls)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument '%s' is NULL",
                          !sendcounts   ? "sendcounts"
                          : !sdispls    ? "sdispls"
                          : !recvcounts ? "recvcounts"
                                        : "rdispls");
    for (int p = 0; p < c->size; p++)
        for (int k = 0; k < 2; k++) { /* an empty block's displacement is never used */
            size_t n = k ? recvcounts[p] : sendcounts[p], d = k ? rdispls[p] : sdispls[p];
            if (n > 0 && (d > HCOMM__MAX_BUFFER_BYTES || n > HCOMM__MAX_BUFFER_BYTES - d))
                return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                                  "%scounts[%d]=%zu + %sdispls[%d]=%zu is beyond any buffer",
                                  k ? "recv" : "send", p, n, k ? "r" : "s", p, d);
        }
    size_t out = extent(c->size, sendcounts, sdispls), in = extent(c->size, recvcounts, rdispls);
    if (out > 0 && sendbuf == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'sendbuf' is NULL with data to send");
    if (in > 0 && recvbuf == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'recvbuf' is NULL with data to receive");
    return check_disjoint(fn, sendbuf, out, recvbuf, in,
                          "separate buffers (all_to_allv has no "
                          "in-place form)");
}

hcomm_result_t hcomm_all_to_allv(hcomm_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                                 const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                 const size_t *rdispls) {
    HCOMM__PUBLIC_CALL(
        comm, all_to_allv_checks(comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls),
        hcomm__coll_all_to_allv(comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls,
                                false));
}

hcomm_result_t hcomm_barrier(hcomm_comm_t *comm) {
    HCOMM__PUBLIC_CALL(comm, HCOMM_OK, hcomm__coll_barrier(comm));
}

hcomm_result_t hcomm_comm_split(hcomm_comm_t *comm, int color, int key, hcomm_comm_t **out) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(out);
    *out = NULL;
    HCOMM__PUBLIC_CALL(comm, HCOMM_OK, hcomm__coll_split(comm, color, key, out));
}

/* --- nonblocking forms: the same checks; a failing rank issues its part of the call --- */

/* A nonblocking call without a place for its request still joins its peers' operation, as a
 * failed check does, and waits for it: a rank that returned early would leave them waiting. */
static hcomm_result_t no_request(hcomm_comm_t *c, const char *fn) {
    return hcomm__icoll_fail_now(c, hcomm__err(HCOMM_ERR_NULL, fn, "argument 'req' is NULL"));
}

#define HCOMM__ISSUE(comm, req, checks, body)                                                      \
    do {                                                                                           \
        HCOMM__CHECK_NULL(comm);                                                                   \
        hcomm__enter(comm, __func__);                                                              \
        if (!(req))                                                                                \
            return hcomm__leave(comm, no_request(comm, __func__));                                 \
        *(req) = NULL;                                                                             \
        hcomm_result_t chk_ = (checks);                                                            \
        hcomm_result_t res_ = chk_ != HCOMM_OK ? hcomm__icoll_fail(comm, chk_, req) : (body);      \
        return hcomm__leave(comm, res_);                                                           \
    } while (0)

hcomm_result_t hcomm_iall_reduce(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                 size_t count, hcomm_dtype_t dtype, hcomm_op_t op,
                                 hcomm_request_t **req) {
    HCOMM__ISSUE(comm, req, all_reduce_checks(comm, sendbuf, recvbuf, count, dtype, op),
                 hcomm__icoll(comm, HCOMM__IALL_REDUCE, sendbuf, recvbuf, count, dtype, op, req));
}

hcomm_result_t hcomm_iall_gather(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                 size_t bytes, hcomm_request_t **req) {
    HCOMM__ISSUE(
        comm, req, all_gather_checks(comm, sendbuf, recvbuf, bytes),
        hcomm__icoll(comm, HCOMM__IALL_GATHER, sendbuf, recvbuf, bytes, HCOMM_U8, HCOMM_SUM, req));
}

hcomm_result_t hcomm_ireduce_scatter(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                     size_t recvcount, hcomm_dtype_t dtype, hcomm_op_t op,
                                     hcomm_request_t **req) {
    HCOMM__ISSUE(
        comm, req, reduce_scatter_checks(comm, sendbuf, recvbuf, recvcount, dtype, op),
        hcomm__icoll(comm, HCOMM__IREDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, req));
}

hcomm_result_t hcomm_wait(hcomm_request_t *req) {
    HCOMM__CHECK_NULL(req);
    return hcomm__request_wait(req);
}

hcomm_result_t hcomm_test(hcomm_request_t *req, int *done) {
    HCOMM__CHECK_NULL(req);
    HCOMM__CHECK_NULL(done);
    bool d = false;
    hcomm__request_done(req, &d);
    *done = d;
    return d ? hcomm__request_wait(req) : HCOMM_OK;
}

/* Nonblocking broadcast and reduce: the blocking bodies, queued on the worker with their
 * arguments (the buffers must stay untouched until the request completes). */
typedef struct {
    const void *send;
    void *recv;
    size_t count;
    hcomm_dtype_t dt;
    hcomm_op_t op;
    int root;
} rooted_args_t;

static hcomm_result_t run_ibroadcast(hcomm_comm_t *c, void *p) {
    rooted_args_t *a = p;
    return hcomm__coll_broadcast(c, a->recv, a->count, a->root);
}

hcomm_result_t hcomm_ibroadcast(hcomm_comm_t *comm, void *buf, size_t bytes, int root,
                                hcomm_request_t **req) {
    rooted_args_t a = {.recv = buf, .count = bytes, .root = root};
    HCOMM__ISSUE(comm, req, broadcast_checks(comm, buf, bytes, root),
                 hcomm__icall(comm, run_ibroadcast, &a, sizeof a, req));
}

static hcomm_result_t run_ireduce(hcomm_comm_t *c, void *p) {
    rooted_args_t *a = p;
    return hcomm__coll_reduce(c, a->send, a->recv, a->count, a->dt, a->op, a->root);
}

static hcomm_result_t reduce_checks(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                    size_t count, hcomm_dtype_t dt, hcomm_op_t op, int root);

hcomm_result_t hcomm_ireduce(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             hcomm_dtype_t dtype, hcomm_op_t op, int root, hcomm_request_t **req) {
    rooted_args_t a = {sendbuf, recvbuf, count, dtype, op, root};
    HCOMM__ISSUE(comm, req, reduce_checks(comm, sendbuf, recvbuf, count, dtype, op, root),
                 hcomm__icall(comm, run_ireduce, &a, sizeof a, req));
}

/* Nonblocking all_to_allv: the four count arrays are copied into one allocation that the
 * queued body frees once it ran (the worker runs every queued operation, also after an abort). */
typedef struct {
    const void *send;
    void *recv;
    size_t *counts; /* sendcounts, sdispls, recvcounts, rdispls: size entries each */
} a2av_args_t;

static hcomm_result_t run_iall_to_allv(hcomm_comm_t *c, void *p) {
    a2av_args_t *a = p;
    size_t n = (size_t)c->size, *k = a->counts;
    hcomm_result_t r =
        hcomm__coll_all_to_allv(c, a->send, k, k + n, a->recv, k + 2 * n, k + 3 * n, false);
    free(a->counts);
    return r;
}

static hcomm_result_t issue_all_to_allv(hcomm_comm_t *c, const void *sendbuf,
                                        const size_t *sendcounts, const size_t *sdispls,
                                        void *recvbuf, const size_t *recvcounts,
                                        const size_t *rdispls, hcomm_request_t **req) {
    size_t n = (size_t)c->size;
    a2av_args_t a = {sendbuf, recvbuf, malloc(4 * n * sizeof(size_t))};
    if (!a.counts)
        return hcomm__icoll_fail(
            c, hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for the counts"), req);
    const size_t *src[4] = {sendcounts, sdispls, recvcounts, rdispls};
    for (int i = 0; i < 4; i++)
        memcpy(a.counts + (size_t)i * n, src[i], n * sizeof(size_t));
    hcomm_result_t r = hcomm__icall(c, run_iall_to_allv, &a, sizeof a, req);
    if (r != HCOMM_OK)
        free(a.counts);
    return r;
}

hcomm_result_t hcomm_iall_to_allv(hcomm_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                                  const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                  const size_t *rdispls, hcomm_request_t **req) {
    HCOMM__ISSUE(
        comm, req,
        all_to_allv_checks(comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls),
        issue_all_to_allv(comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, req));
}

static hcomm_result_t check_root(const char *fn, const hcomm_comm_t *c, int root) {
    if (root < 0 || root >= c->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "root=%d outside 0..%d", root, c->size - 1);
    return HCOMM_OK;
}

static hcomm_result_t reduce_checks(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                    size_t count, hcomm_dtype_t dt, hcomm_op_t op, int root) {
    const char *fn = c->call_fn; /* hcomm_reduce or hcomm_ireduce */
    HCOMM__TRY(check_root(fn, c, root));
    bool is_root = c->rank == root;
    HCOMM__TRY(check_reduce_args(fn, "count", count, dt, op, sendbuf, is_root ? recvbuf : sendbuf));
    size_t bytes = count * hcomm__dtype_size(dt);
    return is_root ? check_overlap(fn, sendbuf, bytes, recvbuf, bytes, recvbuf) : HCOMM_OK;
}

hcomm_result_t hcomm_reduce(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                            hcomm_dtype_t dtype, hcomm_op_t op, int root) {
    HCOMM__PUBLIC_CALL(comm, reduce_checks(comm, sendbuf, recvbuf, count, dtype, op, root),
                       hcomm__coll_reduce(comm, sendbuf, recvbuf, count, dtype, op, root));
}

/* gather (the root receives size blocks) or scatter (the root sends them). */
static hcomm_result_t rooted_checks(const char *fn, hcomm_comm_t *c, const void *sendbuf,
                                    void *recvbuf, size_t bytes, int root, bool gather) {
    HCOMM__TRY(check_root(fn, c, root));
    bool is_root = c->rank == root;
    if (bytes > 0 && (sendbuf == NULL || recvbuf == NULL) &&
        (is_root || (gather ? sendbuf == NULL : recvbuf == NULL)))
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument '%s' is NULL with bytes=%zu",
                          is_root  ? (sendbuf ? "recvbuf" : "sendbuf")
                          : gather ? "sendbuf"
                                   : "recvbuf",
                          bytes);
    HCOMM__TRY(hcomm__span(fn, "bytes", bytes, 1, (size_t)c->size, NULL));
    if (!is_root)
        return HCOMM_OK;
    size_t all = bytes * (size_t)c->size;
    if (gather)
        return check_overlap(fn, sendbuf, bytes, recvbuf, all,
                             (const char *)recvbuf + (size_t)root * bytes);
    const char *mine = (const char *)sendbuf + (size_t)root * bytes;
    return (const void *)mine == recvbuf ? HCOMM_OK
                                         : check_overlap(fn, sendbuf, all, recvbuf, bytes, NULL);
}

hcomm_result_t hcomm_gather(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf, size_t bytes,
                            int root) {
    HCOMM__PUBLIC_CALL(comm,
                       rooted_checks("hcomm_gather", comm, sendbuf, recvbuf, bytes, root, true),
                       hcomm__coll_gather(comm, sendbuf, recvbuf, bytes, root));
}

hcomm_result_t hcomm_scatter(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf, size_t bytes,
                             int root) {
    HCOMM__PUBLIC_CALL(comm,
                       rooted_checks("hcomm_scatter", comm, sendbuf, recvbuf, bytes, root, false),
                       hcomm__coll_scatter(comm, sendbuf, recvbuf, bytes, root));
}

/* Sums counts (size entries) into *total and this rank's block offset into *mine. */
static hcomm_result_t sum_counts(const char *fn, const hcomm_comm_t *c, const size_t *counts,
                                 size_t es, size_t *total, size_t *mine) {
    *total = 0;
    for (int r = 0; r < c->size; r++) {
        if (counts[r] > HCOMM__MAX_BUFFER_BYTES / es - *total)
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "the counts overflow at counts[%d]=%zu", r,
                              counts[r]);
        if (r == c->rank)
            *mine = *total;
        *total += counts[r];
    }
    return HCOMM_OK;
}

static hcomm_result_t all_gatherv_checks(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                         const size_t *bytes) {
    const char *fn = "hcomm_all_gatherv";
    size_t total = 0, off = 0;
    if (!bytes)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'bytes' is NULL");
    HCOMM__TRY(sum_counts(fn, c, bytes, 1, &total, &off));
    if (bytes[c->rank] > 0 && sendbuf == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'sendbuf' is NULL with bytes[%d]=%zu",
                          c->rank, bytes[c->rank]);
    if (total > 0 && recvbuf == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'recvbuf' is NULL with %zu bytes in all",
                          total);
    return check_overlap(fn, sendbuf, bytes[c->rank], recvbuf, total, (char *)recvbuf + off);
}

hcomm_result_t hcomm_all_gatherv(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                 const size_t *bytes) {
    HCOMM__PUBLIC_CALL(comm, all_gatherv_checks(comm, sendbuf, recvbuf, bytes),
                       hcomm__coll_all_gatherv(comm, sendbuf, recvbuf, bytes));
}

static hcomm_result_t reduce_scatterv_checks(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                             const size_t *counts, hcomm_dtype_t dt,
                                             hcomm_op_t op) {
    const char *fn = "hcomm_reduce_scatterv";
    size_t total = 0, off = 0;
    if (!counts)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'counts' is NULL");
    HCOMM__TRY(check_reduce_args(fn, "count", 0, dt, op, sendbuf, recvbuf));
    size_t es = hcomm__dtype_size(dt);
    HCOMM__TRY(sum_counts(fn, c, counts, es, &total, &off));
    if (total > 0 && sendbuf == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'sendbuf' is NULL with %zu elements",
                          total);
    if (counts[c->rank] > 0 && recvbuf == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'recvbuf' is NULL with counts[%d]=%zu",
                          c->rank, counts[c->rank]);
    if (total > 0)
        HCOMM__TRY(hcomm__check_aligned(fn, "sendbuf", sendbuf, dt));
    if (counts[c->rank] > 0)
        HCOMM__TRY(hcomm__check_aligned(fn, "recvbuf", recvbuf, dt));
    if (sendbuf == recvbuf || (const char *)sendbuf + off * es == (const char *)recvbuf)
        return HCOMM_OK;
    return check_overlap(fn, sendbuf, total * es, recvbuf, counts[c->rank] * es, NULL);
}

hcomm_result_t hcomm_reduce_scatterv(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                     const size_t *counts, hcomm_dtype_t dtype, hcomm_op_t op) {
    HCOMM__PUBLIC_CALL(comm, reduce_scatterv_checks(comm, sendbuf, recvbuf, counts, dtype, op),
                       hcomm__coll_reduce_scatterv(comm, sendbuf, recvbuf, counts, dtype, op));
}

hcomm_result_t hcomm_comm_set_algo(hcomm_comm_t *comm, const char *spec) {
    HCOMM__CHECK_NULL(comm);
    const char *saved = comm->call_fn;
    comm->call_fn = __func__;
    hcomm_result_t res = hcomm__coll_set_algo(comm, spec);
    comm->call_fn = saved;
    return res;
}
