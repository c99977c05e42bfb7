/* The mpi transport's native collectives (mpi_base.h): Open MPI's nonblocking collectives,
 * each posted and then polled to completion (mpi_base.c), on the comm's own MPI communicator.
 *
 * Reductions use user-defined MPI_Ops that call hcomm__reduce for every dtype, so each
 * pairwise step rounds (f16/bf16) and wraps (integers) as the local backend does. The order
 * of the steps is Open MPI's, not rank order: floating-point results can differ from the
 * local backend's (f32 SUM of 1e8, 1, -1e8, 1 over 4 ranks: 1 on local, 0 on mpi). Within
 * one job every rank gets the same bits: the algorithms Open MPI 4.1's libnbc picks for
 * MPI_Iallreduce (binomial tree then broadcast, ring, or reduce-scatter then allgather)
 * reduce each element on one rank and copy the result to the others.
 *
 * all_to_allv checks its counts itself before any data moves (agree_on_counts), unless an
 * earlier exchange of the caller proved them (counts_proved). */
#include "transport/mpi_base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* MPI objects created once per MPI session; freed when MPI is finalized. Launch and wrap
 * run on the thread that initialized MPI, before any rank function, so no lock is needed. */
static struct {
    bool ready;
    MPI_Datatype f16, bf16; /* 2-byte contiguous types, distinct so the ops can tell them apart */
    MPI_Op ops[HCOMM_AVG];  /* SUM, PROD, MAX, MIN */
    MPI_Datatype a2a_bad;   /* an a2a_mismatch_t */
    MPI_Op a2a_first;       /* keeps the first a2a_mismatch_t (see below), sums the pair counts */
} mpi_objs;

/* --- datatypes and reduction ops --- */

static MPI_Datatype mpi_dtype(hcomm_dtype_t dt) {
    switch (dt) {
    case HCOMM_F32:
        return MPI_FLOAT;
    case HCOMM_F64:
        return MPI_DOUBLE;
    case HCOMM_F16:
        return mpi_objs.f16;
    case HCOMM_BF16:
        return mpi_objs.bf16;
    case HCOMM_I8:
        return MPI_INT8_T;
    case HCOMM_U8:
        return MPI_UINT8_T;
    case HCOMM_I32:
        return MPI_INT32_T;
    case HCOMM_I64:
        return MPI_INT64_T;
    default:
        return MPI_DATATYPE_NULL;
    }
}

static hcomm_dtype_t dtype_of_mpi(MPI_Datatype t) {
    for (int d = 0; d < HCOMM_DTYPE_COUNT; d++)
        if (mpi_dtype((hcomm_dtype_t)d) == t)
            return (hcomm_dtype_t)d;
    return HCOMM_DTYPE_COUNT; /* hcomm__reduce ignores it */
}

/* MPI_User_function: inout[i] = in[i] op inout[i] (the ops are commutative). */
#define DEFINE_OP_FN(name, op)                                                                     \
    static void name(void *in, void *inout, int *len, MPI_Datatype *t) {                           \
        hcomm__reduce(inout, in, (size_t)*len, dtype_of_mpi(*t), op);                              \
    }
DEFINE_OP_FN(op_sum, HCOMM_SUM)
DEFINE_OP_FN(op_prod, HCOMM_PROD)
DEFINE_OP_FN(op_max, HCOMM_MAX)
DEFINE_OP_FN(op_min, HCOMM_MIN)

/* A send count of all_to_allv that differs from the receiver's recvcount, as every rank
 * learns it: the pair with the lowest (receiver, sender), and how many pairs differ. */
typedef struct {
    int64_t receiver, sender, sent, expected, pairs; /* receiver INT64_MAX: none differs */
} a2a_mismatch_t;

static bool a2a_before(const a2a_mismatch_t *a, const a2a_mismatch_t *b) {
    return a->receiver != b->receiver ? a->receiver < b->receiver : a->sender < b->sender;
}

/* MPI_User_function over a2a_mismatch_t; commutative, so every rank reports the same pair. */
static void op_a2a_first(void *in, void *inout, int *len, MPI_Datatype *t) {
    (void)t;
    a2a_mismatch_t *a = in, *b = inout;
    for (int i = 0; i < *len; i++) {
        int64_t pairs = a[i].pairs + b[i].pairs;
        if (a2a_before(&a[i], &b[i]))
            b[i] = a[i];
        b[i].pairs = pairs;
    }
}

/* Attribute delete callback on MPI_COMM_SELF: MPI_Finalize runs it first, while MPI calls
 * are still allowed, whoever finalizes MPI. */
static int free_objects_at_finalize(MPI_Comm comm, int keyval, void *attr, void *extra) {
    (void)comm, (void)keyval, (void)attr, (void)extra;
    for (int o = 0; o < HCOMM_AVG; o++)
        MPI_Op_free(&mpi_objs.ops[o]);
    MPI_Op_free(&mpi_objs.a2a_first);
    MPI_Type_free(&mpi_objs.f16);
    MPI_Type_free(&mpi_objs.bf16);
    MPI_Type_free(&mpi_objs.a2a_bad);
    mpi_objs.ready = false;
    return MPI_SUCCESS;
}

hcomm_result_t hcomm__mpi_objects_create(const char *fn) {
    static MPI_User_function *const fns[HCOMM_AVG] = {op_sum, op_prod, op_max, op_min};
    if (mpi_objs.ready)
        return HCOMM_OK;
    MPI_TRY(fn, MPI_Type_contiguous(2, MPI_BYTE, &mpi_objs.f16));
    MPI_TRY(fn, MPI_Type_commit(&mpi_objs.f16));
    MPI_TRY(fn, MPI_Type_contiguous(2, MPI_BYTE, &mpi_objs.bf16));
    MPI_TRY(fn, MPI_Type_commit(&mpi_objs.bf16));
    for (int o = 0; o < HCOMM_AVG; o++)
        MPI_TRY(fn, MPI_Op_create(fns[o], 1, &mpi_objs.ops[o]));
    MPI_TRY(fn, MPI_Type_contiguous(5, MPI_INT64_T, &mpi_objs.a2a_bad));
    MPI_TRY(fn, MPI_Type_commit(&mpi_objs.a2a_bad));
    MPI_TRY(fn, MPI_Op_create(op_a2a_first, 1, &mpi_objs.a2a_first));
    int key = MPI_KEYVAL_INVALID;
    MPI_TRY(fn,
            MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_objects_at_finalize, &key, NULL));
    MPI_TRY(fn, MPI_Comm_set_attr(MPI_COMM_SELF, key, NULL));
    MPI_TRY(fn, MPI_Comm_free_keyval(&key));
    mpi_objs.ready = true;
    return HCOMM_OK;
}

/* --- collectives --- */

/* MPI forbids aliased send and receive buffers: an overlapping send range is copied first. */
static hcomm_result_t detach_send(const char *fn, const void **send, size_t sn, const void *recv,
                                  size_t rn, void **tmp) {
    *tmp = NULL;
    if (!hcomm__overlaps(*send, sn, recv, rn))
        return HCOMM_OK;
    *tmp = malloc(sn);
    if (!*tmp)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory copying %zu overlapping bytes", sn);
    memcpy(*tmp, *send, sn);
    *send = *tmp;
    return HCOMM_OK;
}

/* A reduction's arguments as MPI takes them: a usable comm, a valid dtype, an op of MPI's (not
 * AVG), and count as *n. */
static hcomm_result_t reduction_args(const hcomm_comm_t *c, size_t count, hcomm_dtype_t dt,
                                     hcomm_op_t op, int *n) {
    const char *fn = c->call_fn;
    HCOMM__TRY(check_usable(fn, c));
    if (!hcomm__dtype_valid(dt))
        return hcomm__err(HCOMM_ERR_DTYPE, fn, "dtype=%d is not a valid hcomm_dtype_t", (int)dt);
    if (!hcomm__op_valid(op) || op == HCOMM_AVG)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "op=%d is not SUM, PROD, MAX or MIN", (int)op);
    return to_int(fn, "count", count, n);
}

/* Completes a collective just posted (as await_posted) whose input may be tmp, a copy
 * detach_send made: tmp is freed unless the request stays pending, which may still read it. */
static hcomm_result_t await_detached(hcomm_comm_t *c, const char *what, int rc, MPI_Request *req,
                                     void *tmp) {
    hcomm_result_t r = await_posted(c, c->call_fn, what, rc, req);
    if (r == HCOMM_OK || *req == MPI_REQUEST_NULL)
        free(tmp);
    return r;
}

/* all_reduce (all), or reduce to root: the input in place where the public call says so. */
static hcomm_result_t reduce_to(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                hcomm_dtype_t dt, hcomm_op_t op, bool all, int root) {
    int n = 0;
    HCOMM__TRY(reduction_args(c, count, dt, op, &n));
    bool gets = all || c->rank == root; /* this rank's recvbuf gets the result */
    size_t bytes = count * hcomm__dtype_size(dt);
    void *tmp = NULL;
    const void *src = gets && sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
    if (gets && src != MPI_IN_PLACE)
        HCOMM__TRY(detach_send(c->call_fn, &src, bytes, recvbuf, bytes, &tmp));
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Datatype type = mpi_dtype(dt);
    int rc = all ? MPI_Iallreduce(src, recvbuf, n, type, mpi_objs.ops[op], mcomm(c), &req)
                 : MPI_Ireduce(src, recvbuf, n, type, mpi_objs.ops[op], root, mcomm(c), &req);
    return await_detached(c, all ? "MPI_Iallreduce" : "MPI_Ireduce", rc, &req, tmp);
}

static hcomm_result_t mpi_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                     size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    return reduce_to(c, sendbuf, recvbuf, count, dt, op, true, 0);
}

static hcomm_result_t mpi_all_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                     size_t bytes_per_rank) {
    int n = 0;
    HCOMM__TRY(check_usable(c->call_fn, c));
    HCOMM__TRY(to_int(c->call_fn, "bytes_per_rank", bytes_per_rank, &n));
    size_t total = bytes_per_rank * (size_t)c->size;
    void *tmp = NULL;
    const void *src = sendbuf;
    if (sendbuf == (const char *)recvbuf + bytes_per_rank * (size_t)c->rank)
        src = MPI_IN_PLACE;
    else
        HCOMM__TRY(detach_send(c->call_fn, &src, bytes_per_rank, recvbuf, total, &tmp));
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(src, n, MPI_BYTE, recvbuf, n, MPI_BYTE, mcomm(c), &req);
    return await_detached(c, "MPI_Iallgather", rc, &req, tmp);
}

static hcomm_result_t mpi_reduce_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                         size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    int n = 0;
    HCOMM__TRY(reduction_args(c, count, dt, op, &n));
    size_t es = hcomm__dtype_size(dt);
    void *tmp = NULL;
    const void *src = sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
    if (src != MPI_IN_PLACE)
        HCOMM__TRY(
            detach_send(c->call_fn, &src, count * es * (size_t)c->size, recvbuf, count * es, &tmp));
    MPI_Request req = MPI_REQUEST_NULL;
    int rc =
        MPI_Ireduce_scatter_block(src, recvbuf, n, mpi_dtype(dt), mpi_objs.ops[op], mcomm(c), &req);
    return await_detached(c, "MPI_Ireduce_scatter_block", rc, &req, tmp);
}

static hcomm_result_t mpi_broadcast(hcomm_comm_t *c, void *buf, size_t bytes, int root) {
    int n = 0;
    HCOMM__TRY(check_usable(c->call_fn, c));
    if (root < 0 || root >= c->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, c->call_fn, "root=%d outside 0..%d", root,
                          c->size - 1);
    HCOMM__TRY(to_int(c->call_fn, "bytes", bytes, &n));
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Ibcast(buf, n, MPI_BYTE, root, mcomm(c), &req);
    return await_posted(c, c->call_fn, "MPI_Ibcast", rc, &req);
}

/* The rooted calls: the root's input in place where the public call says so. */
static hcomm_result_t mpi_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root) {
    return reduce_to(c, sendbuf, recvbuf, count, dt, op, false, root);
}

/* gather (to the root) or scatter of bytes per rank; the root's own block in place when the
 * public call says so. */
static hcomm_result_t rooted_move(hcomm_comm_t *c, bool gather, const void *sendbuf, void *recvbuf,
                                  size_t bytes, int root) {
    int n = 0;
    HCOMM__TRY(check_usable(c->call_fn, c));
    HCOMM__TRY(to_int(c->call_fn, "bytes", bytes, &n));
    HCOMM__TRY(to_int(c->call_fn, "size*bytes", bytes * (size_t)c->size, &(int){0}));
    const char *whole = gather ? recvbuf : sendbuf, *mine = gather ? sendbuf : recvbuf;
    bool in_place = c->rank == root && mine == whole + bytes * (size_t)root;
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = gather ? MPI_Igather(in_place ? MPI_IN_PLACE : sendbuf, n, MPI_BYTE, recvbuf, n,
                                  MPI_BYTE, root, mcomm(c), &req)
                    : MPI_Iscatter(sendbuf, n, MPI_BYTE, in_place ? MPI_IN_PLACE : recvbuf, n,
                                   MPI_BYTE, root, mcomm(c), &req);
    return await_posted(c, c->call_fn, gather ? "MPI_Igather" : "MPI_Iscatter", rc, &req);
}

static hcomm_result_t mpi_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes,
                                 int root) {
    return rooted_move(c, true, sendbuf, recvbuf, bytes, root);
}

static hcomm_result_t mpi_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes,
                                  int root) {
    return rooted_move(c, false, sendbuf, recvbuf, bytes, root);
}

/* Converts size_t counts and displacements to MPI's ints; *extent gets the bytes spanned. */
static hcomm_result_t counts_to_int(const char *fn, const char *what, int size,
                                    const size_t *counts, const size_t *displs, int *icounts,
                                    int *idispls, size_t *extent) {
    *extent = 0;
    for (int p = 0; p < size; p++) {
        char name[64];
        snprintf(name, sizeof name, "%scounts[%d]", what, p);
        HCOMM__TRY(to_int(fn, name, counts[p], &icounts[p]));
        snprintf(name, sizeof name, "%sdispls[%d]", what, p);
        /* an empty block's displacement is never used: any value is valid */
        HCOMM__TRY(to_int(fn, name, counts[p] ? displs[p] : 0, &idispls[p]));
        if (counts[p] > 0 && counts[p] + displs[p] > *extent)
            *extent = counts[p] + displs[p];
    }
    return HCOMM_OK;
}

/* Every rank learns what each peer sends it and compares that with its recvcounts; one
 * allreduce then tells every rank about any pair that differs (the lowest receiver, sender),
 * so all ranks fail together before any data moves, as MPI_Alltoallv would otherwise truncate
 * a longer message or silently leave a shorter one partly received. */
static hcomm_result_t agree_on_counts(hcomm_comm_t *c, const char *fn, const size_t *sendcounts,
                                      const size_t *recvcounts) {
    int p = c->size;
    /* [0, p): what this rank sends to each peer; [p, 2p): what each peer sends to it. */
    uint64_t *sent = malloc(sizeof(uint64_t) * 2 * (size_t)p);
    a2a_mismatch_t *bad = malloc(sizeof *bad);
    if (!sent || !bad) {
        free(sent);
        free(bad);
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %d send counts", 2 * p);
    }
    for (int q = 0; q < p; q++)
        sent[q] = sendcounts[q];
    MPI_Request req = MPI_REQUEST_NULL;
    const char *what = "MPI_Ialltoall of the send counts";
    int rc = MPI_Ialltoall(sent, 1, MPI_UINT64_T, sent + p, 1, MPI_UINT64_T, mcomm(c), &req);
    hcomm_result_t r = await_posted(c, fn, what, rc, &req);
    if (r != HCOMM_OK) {
        if (req == MPI_REQUEST_NULL) /* else MPI may still write it */
            free(sent);
        free(bad);
        return r;
    }
    *bad = (a2a_mismatch_t){.receiver = INT64_MAX};
    for (int q = 0; q < p; q++) {
        if (sent[p + q] == recvcounts[q])
            continue;
        if (bad->pairs++ == 0)
            *bad = (a2a_mismatch_t){c->rank, q, (int64_t)sent[p + q], (int64_t)recvcounts[q], 1};
    }
    free(sent);
    what = "MPI_Iallreduce of the count mismatches";
    rc = MPI_Iallreduce(MPI_IN_PLACE, bad, 1, mpi_objs.a2a_bad, mpi_objs.a2a_first, mcomm(c), &req);
    r = await_posted(c, fn, what, rc, &req);
    bool pending = r != HCOMM_OK && req != MPI_REQUEST_NULL; /* MPI may still write bad */
    if (r == HCOMM_OK && bad->pairs > 0)
        r = hcomm__err(HCOMM_ERR_MISMATCH, fn,
                       "sendcounts[%lld]=%lld on rank %lld but recvcounts[%lld]=%lld on rank "
                       "%lld; no data was moved",
                       (long long)bad->receiver, (long long)bad->sent, (long long)bad->sender,
                       (long long)bad->sender, (long long)bad->expected, (long long)bad->receiver);
    if (!pending)
        free(bad);
    return r;
}

static hcomm_result_t mpi_all_to_allv(hcomm_comm_t *c, const void *sendbuf,
                                      const size_t *sendcounts, const size_t *sdispls,
                                      void *recvbuf, const size_t *recvcounts,
                                      const size_t *rdispls, bool counts_proved) {
    HCOMM__TRY(check_usable(c->call_fn, c));
    int p = c->size;
    int *v = malloc(sizeof(int) * 4 * (size_t)p); /* send counts, sdispls, recv counts, rdispls */
    if (!v)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for %d counts", 4 * p);
    void *tmp = NULL;
    const void *src = sendbuf;
    size_t sext = 0, rext = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    hcomm_result_t r = HCOMM_OK;
    HCOMM__TRY_GOTO(counts_to_int(c->call_fn, "send", p, sendcounts, sdispls, v, v + p, &sext), r,
                    done);
    HCOMM__TRY_GOTO(
        counts_to_int(c->call_fn, "recv", p, recvcounts, rdispls, v + 2 * p, v + 3 * p, &rext), r,
        done);
    if (!counts_proved) /* else the caller's own exchange proved them */
        HCOMM__TRY_GOTO(agree_on_counts(c, c->call_fn, sendcounts, recvcounts), r, done);
    HCOMM__TRY_GOTO(detach_send(c->call_fn, &src, sext, recvbuf, rext, &tmp), r, done);
    int rc = MPI_Ialltoallv(src, v, v + p, MPI_BYTE, recvbuf, v + 2 * p, v + 3 * p, MPI_BYTE,
                            mcomm(c), &req);
    r = await_posted(c, c->call_fn, "MPI_Ialltoallv", rc, &req);
done:
    if (r == HCOMM_OK || req == MPI_REQUEST_NULL) { /* a pending request may still read them */
        free(v);
        free(tmp);
    }
    return r;
}

/* clang-format off */
const hcomm__native_ops_t hcomm__mpi_native = {
    .all_reduce = mpi_all_reduce, .reduce_scatter = mpi_reduce_scatter, .reduce = mpi_reduce,
    .all_gather = mpi_all_gather, .gather = mpi_gather, .scatter = mpi_scatter,
    .broadcast = mpi_broadcast, .all_to_allv = mpi_all_to_allv, /* no v-calls: ring runs */
};
/* clang-format on */
