/* The mpi backend: each process of an mpirun/srun job is one rank; every hcomm communicator
 * owns a duplicate MPI communicator, so hcomm's traffic never matches the application's.
 *
 * Why every wait polls: blocking MPI calls cannot time out, and hcomm promises that a peer
 * that never arrives gives HCOMM_ERR_TIMEOUT (after HCOMM_TIMEOUT seconds) and that a peer
 * whose rank function failed gives HCOMM_ERR_ABORTED instead of a hang. So each call posts
 * the nonblocking MPI operation and tests it in a loop, also checking for an abort notice
 * that a failing rank sends to every process on a control communicator (see launch below).
 *
 * No MPI error is fatal: hcomm's communicators use MPI_ERRORS_RETURN, and hcomm also sets
 * MPI_ERRORS_RETURN on MPI_COMM_WORLD and MPI_COMM_SELF whenever it initializes MPI or first
 * uses it (every hcomm_launch and hcomm_comm_wrap_mpi), because Open MPI reports errors of
 * nonblocking collectives (raised in MPI_Test) on MPI_COMM_WORLD. An application that wants
 * MPI_ERRORS_ARE_FATAL for its own calls must set it again on those two. A failed MPI call
 * becomes HCOMM_ERR_MISMATCH (MPI_ERR_TRUNCATE) or HCOMM_ERR_BACKEND with MPI's text.
 *
 * Ranks that disagree on a collective fail together with HCOMM_ERR_MISMATCH, as on the local
 * backend, instead of feeding MPI mismatched calls (which truncate, corrupt or hang): every
 * collective starts with one small allreduce of a signature (which call, dtype, op, root,
 * count), and all_to_allv also exchanges its per-peer byte counts before moving any data.
 *
 * Reductions use user-defined MPI_Ops that call hcomm__reduce for every dtype, so each
 * pairwise step rounds (f16/bf16) and wraps (integers) as the local backend does. The order
 * of the steps is Open MPI's, not rank order: floating-point results can differ from the
 * local backend's (f32 SUM of 1e8, 1, -1e8, 1 over 4 ranks: 1 on local, 0 on mpi). Within
 * one job every rank gets the same bits: the algorithms Open MPI 4.1's libnbc picks for
 * MPI_Iallreduce (binomial tree then broadcast, ring, or reduce-scatter then allgather)
 * reduce each element on one rank and copy the result to the others. */
#include "hcomm/mpi.h"

#include "backend/backend.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Abort notices travel on the launch's control communicator with this tag. */
#define ABORT_TAG 1

typedef struct mpi_impl {
    MPI_Comm comm;
    /* HCOMM_OK, or why the comm is unusable: a collective or send that timed out or was
     * aborted stays pending inside MPI (MPI cannot cancel it), so the next call on this comm
     * would match the wrong operation. */
    hcomm_result_t broken;
} mpi_impl_t;

struct hcomm__req {
    MPI_Request req;
    size_t bytes;
    int peer, tag;
    bool is_recv;
};

/* MPI objects created once per MPI session; freed when MPI is finalized. Launch and wrap
 * run on the thread that initialized MPI, before any rank function, so no lock is needed. */
static struct {
    bool ready;
    MPI_Datatype f16, bf16; /* 2-byte contiguous types, distinct so the ops can tell them apart */
    MPI_Op ops[HCOMM_AVG];  /* SUM, PROD, MAX, MIN */
    MPI_Datatype a2a_bad;   /* an a2a_mismatch_t */
    MPI_Op a2a_first;       /* keeps the first a2a_mismatch_t (see below), sums the pair counts */
} mpi_objs;

/* The running launch's control communicator (MPI_COMM_NULL outside a launch). */
static MPI_Comm abort_comm = MPI_COMM_NULL;
/* Set when a request had to be abandoned: MPI_Finalize could then hang, so exit aborts. */
static atomic_bool mpi_poisoned;

static const hcomm__backend_ops_t mpi_ops;

/* --- errors --- */

static hcomm_result_t mpi_fail(const char *fn, const char *call, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error code %d", rc);
    return hcomm__err(HCOMM_ERR_BACKEND, fn, "%s failed: %s", call, text);
}

/* As mpi_fail, but a message longer than its receive buffer (MPI_ERR_TRUNCATE) means the
 * ranks disagreed on a size: HCOMM_ERR_MISMATCH. */
static hcomm_result_t mpi_error(const char *fn, const char *call, int rc) {
    int cls = MPI_ERR_OTHER;
    MPI_Error_class(rc, &cls);
    if (cls != MPI_ERR_TRUNCATE)
        return mpi_fail(fn, call, rc);
    return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                      "%s failed: a message was longer than its receive buffer (MPI_ERR_TRUNCATE); "
                      "ranks passed different sizes",
                      call);
}

#define MPI_TRY(fn, call)                                                                          \
    do {                                                                                           \
        int mpi_rc_ = (call);                                                                      \
        if (mpi_rc_ != MPI_SUCCESS)                                                                \
            return mpi_fail(fn, #call, mpi_rc_);                                                   \
    } while (0)

static hcomm_result_t to_int(const char *fn, const char *what, size_t v, int *out) {
    if (v > INT_MAX)
        return hcomm__err(HCOMM_ERR_UNSUPPORTED, fn,
                          "%s=%zu exceeds INT_MAX, the most one MPI call can take", what, v);
    *out = (int)v;
    return HCOMM_OK;
}

static MPI_Comm mcomm(const hcomm_comm_t *c) {
    return ((const mpi_impl_t *)c->impl)->comm;
}

/* poisoned: an operation stays pending inside MPI (see mpi_poisoned). */
static void mark_broken(hcomm_comm_t *c, hcomm_result_t why, bool poisoned) {
    ((mpi_impl_t *)c->impl)->broken = why;
    if (poisoned)
        mpi_poisoned = true;
}

static hcomm_result_t check_usable(const char *fn, const hcomm_comm_t *c) {
    hcomm_result_t why = ((const mpi_impl_t *)c->impl)->broken;
    if (why == HCOMM_OK)
        return HCOMM_OK;
    return hcomm__err(why, fn,
                      "communicator unusable: an earlier collective or send on it failed with %s; "
                      "it may still be pending inside MPI, or its ranks may disagree on which "
                      "operation comes next",
                      hcomm_result_name(why));
}

/* --- polling waits --- */

typedef int (*poll_step_t)(void *ctx, int *done);

static bool peer_aborted(void) {
    int flag = 0;
    if (abort_comm == MPI_COMM_NULL)
        return false;
    MPI_Iprobe(MPI_ANY_SOURCE, ABORT_TAG, abort_comm, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
}

static void nap(void) {
    struct timespec ts = {0, 50 * 1000}; /* 50 us: yields the core to oversubscribed peers */
    nanosleep(&ts, NULL);
}

/* Runs step until it reports done or an MPI error (then *mpi_rc holds its code and the result
 * is HCOMM_OK), a peer's abort notice arrives (HCOMM_ERR_ABORTED) or HCOMM_TIMEOUT passes
 * (HCOMM_ERR_TIMEOUT). Spins for the first millisecond, then naps between tests. */
static hcomm_result_t poll_until(const char *fn, const char *what, poll_step_t step, void *ctx,
                                 int *mpi_rc) {
    double start = hcomm__now(), limit = hcomm__timeout_s();
    for (unsigned long spin = 0;; spin++) {
        int done = 0;
        *mpi_rc = step(ctx, &done);
        if (*mpi_rc != MPI_SUCCESS || done)
            return HCOMM_OK;
        if (spin % 64 != 63)
            continue;
        if (peer_aborted())
            return hcomm__err(HCOMM_ERR_ABORTED, fn, "%s abandoned: another rank's function failed",
                              what);
        double waited = hcomm__now() - start;
        if (waited > limit)
            return hcomm__err(HCOMM_ERR_TIMEOUT, fn,
                              "%s: no matching peer after %.0f s (HCOMM_TIMEOUT)", what, limit);
        if (waited > 1e-3)
            nap();
    }
}

typedef struct {
    MPI_Request *req;
    MPI_Status *st;
} test_ctx_t;

static int test_step(void *ctx, int *done) {
    test_ctx_t *t = ctx;
    return MPI_Test(t->req, done, t->st);
}

/* Completes a collective request; on timeout or abort it stays pending in MPI, so the comm is
 * marked unusable. A collective that failed inside MPI may have left peers half way through
 * it (Open MPI abandons the rest of a failed schedule), so that comm is unusable too. */
static hcomm_result_t wait_request(hcomm_comm_t *c, const char *fn, const char *what,
                                   MPI_Request *req) {
    MPI_Status st;
    test_ctx_t t = {req, &st};
    int rc = MPI_SUCCESS;
    hcomm_result_t r = poll_until(fn, what, test_step, &t, &rc);
    if (r != HCOMM_OK) {
        mark_broken(c, r, true);
        return r;
    }
    if (rc == MPI_SUCCESS)
        return HCOMM_OK;
    r = mpi_error(fn, what, rc);
    mark_broken(c, r, *req != MPI_REQUEST_NULL);
    return r;
}

/* Completes a collective just posted; rc is what posting it returned. */
static hcomm_result_t await_posted(hcomm_comm_t *c, const char *fn, const char *what, int rc,
                                   MPI_Request *req) {
    return rc == MPI_SUCCESS ? wait_request(c, fn, what, req) : mpi_error(fn, what, rc);
}

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

static hcomm_result_t create_objects(const char *fn) {
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

/* --- MPI session --- */

static void finalize_at_exit(void) {
    int done = 0;
    MPI_Finalized(&done);
    if (done)
        return;
    if (mpi_poisoned) {
        fprintf(stderr, "hcomm: an MPI operation was abandoned after a timeout or abort; "
                        "aborting the job instead of a possibly hanging MPI_Finalize\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
}

/* Errors that Open MPI raises for hcomm's requests go to MPI_COMM_WORLD (nonblocking
 * collectives) or MPI_COMM_SELF; with the default MPI_ERRORS_ARE_FATAL a mismatch would kill
 * the job instead of returning an error (see the top of this file). */
static hcomm_result_t errors_return(const char *fn) {
    MPI_TRY(fn, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_TRY(fn, MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));
    return HCOMM_OK;
}

/* MPI is usable: initializes it when may_init (and finalizes it at exit), else requires it. */
static hcomm_result_t mpi_ready(const char *fn, bool may_init) {
    static bool exit_registered;
    int flag = 0;
    MPI_Finalized(&flag);
    if (flag)
        return hcomm__err(HCOMM_ERR_STATE, fn, "MPI is already finalized");
    MPI_Initialized(&flag);
    if (!flag && !may_init)
        return hcomm__err(HCOMM_ERR_STATE, fn, "MPI is not initialized: call MPI_Init first");
    if (!flag) {
        /* MULTIPLE keeps hcomm's promise that distinct comms may be used from distinct
         * threads; with less provided, one thread at a time still works. */
        int provided = 0;
        MPI_TRY(fn, MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided));
        if (!exit_registered && atexit(finalize_at_exit) == 0)
            exit_registered = true;
    }
    HCOMM__TRY(errors_return(fn));
    return create_objects(fn);
}

/* --- communicators --- */

/* world_ranks[i] = the MPI_COMM_WORLD rank of member i. */
static hcomm_result_t fill_world_ranks(const char *fn, hcomm_comm_t *c) {
    int *idx = malloc(sizeof(int) * (size_t)c->size);
    if (!idx)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %d ranks", c->size);
    for (int i = 0; i < c->size; i++)
        idx[i] = i;
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    int rc = MPI_Comm_group(mcomm(c), &mine);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_group(MPI_COMM_WORLD, &world);
    if (rc == MPI_SUCCESS)
        rc = MPI_Group_translate_ranks(mine, c->size, idx, world, c->world_ranks);
    if (mine != MPI_GROUP_NULL)
        MPI_Group_free(&mine);
    if (world != MPI_GROUP_NULL)
        MPI_Group_free(&world);
    free(idx);
    return rc == MPI_SUCCESS ? HCOMM_OK : mpi_fail(fn, "MPI_Group_translate_ranks", rc);
}

/* Wraps mc (owned from here on: freed on failure) into a new hcomm comm. */
static hcomm_result_t adopt(const char *fn, MPI_Comm mc, hcomm_comm_t **out) {
    int rank = 0, size = 0;
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mc, &rank);
    MPI_Comm_size(mc, &size);
    mpi_impl_t *impl = malloc(sizeof *impl);
    hcomm_comm_t *c = impl ? hcomm__comm_alloc(&mpi_ops, impl, rank, size) : NULL;
    if (!c) {
        free(impl);
        MPI_Comm_free(&mc);
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for a communicator of %d ranks",
                          size);
    }
    *impl = (mpi_impl_t){.comm = mc, .broken = HCOMM_OK};
    hcomm_result_t r = fill_world_ranks(fn, c);
    if (r != HCOMM_OK) {
        hcomm__comm_free(c);
        return r;
    }
    *out = c;
    return HCOMM_OK;
}

static hcomm_result_t dup_comm(const char *fn, MPI_Comm parent, hcomm_comm_t **out) {
    MPI_Comm mc = MPI_COMM_NULL;
    MPI_TRY(fn, MPI_Comm_dup(parent, &mc));
    return adopt(fn, mc, out);
}

hcomm_result_t hcomm_comm_wrap_mpi(MPI_Comm comm, hcomm_comm_t **out) {
    HCOMM__CHECK_NULL(out);
    *out = NULL;
    HCOMM__TRY(mpi_ready(__func__, false));
    if (comm == MPI_COMM_NULL)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "comm is MPI_COMM_NULL");
    int inter = 0;
    MPI_TRY(__func__, MPI_Comm_test_inter(comm, &inter));
    if (inter)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__,
                          "comm is an intercommunicator; hcomm needs an intracommunicator");
    return dup_comm(__func__, comm, out);
}

/* --- point-to-point --- */

static hcomm_result_t check_p2p(const char *fn, const hcomm_comm_t *c, const void *buf,
                                size_t bytes, int peer, int tag, int *count) {
    HCOMM__TRY(check_usable(fn, c));
    if (peer < 0 || peer >= c->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "peer=%d outside 0..%d", peer, c->size - 1);
    if (tag < 0 || tag > HCOMM__TAG_MAX)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "tag=%d outside 0..%d", tag, HCOMM__TAG_MAX);
    if (bytes > 0 && buf == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "buffer is NULL with bytes=%zu", bytes);
    return to_int(fn, "bytes", bytes, count);
}

static hcomm_result_t mismatch(const char *fn, size_t got, size_t want, int peer, int tag) {
    return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                      "message from peer %d tag %d has %zu bytes, the receive expects %zu", peer,
                      tag, got, want);
}

/* Posts one non-blocking send or receive of bytes with peer and tag as a request. */
static hcomm_result_t post_request(const char *fn, hcomm_comm_t *c, void *buf, size_t bytes,
                                   int peer, int tag, bool is_recv, hcomm__req_t **req) {
    int n = 0;
    HCOMM__TRY(check_p2p(fn, c, buf, bytes, peer, tag, &n));
    hcomm__req_t *r = malloc(sizeof *r);
    if (!r)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for a request");
    *r = (hcomm__req_t){.bytes = bytes, .peer = peer, .tag = tag, .is_recv = is_recv};
    int rc = is_recv ? MPI_Irecv(buf, n, MPI_BYTE, peer, tag, mcomm(c), &r->req)
                     : MPI_Isend(buf, n, MPI_BYTE, peer, tag, mcomm(c), &r->req);
    if (rc != MPI_SUCCESS) {
        free(r);
        return mpi_fail(fn, is_recv ? "MPI_Irecv" : "MPI_Isend", rc);
    }
    *req = r;
    return HCOMM_OK;
}

static hcomm_result_t mpi_isend(hcomm_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
                                hcomm__req_t **req) {
    /* MPI_Isend takes the buffer as const; the cast only shares the posting code. */
    return post_request(__func__, c, (void *)(uintptr_t)buf, bytes, peer, tag, false, req);
}

static hcomm_result_t mpi_irecv(hcomm_comm_t *c, void *buf, size_t bytes, int peer, int tag,
                                hcomm__req_t **req) {
    return post_request(__func__, c, buf, bytes, peer, tag, true, req);
}

/* A receive that timed out or was aborted can be cancelled; a send cannot (reliably). */
static void abandon(hcomm_comm_t *c, hcomm__req_t *r, hcomm_result_t why) {
    if (!r->is_recv) {
        mark_broken(c, why, true);
        return;
    }
    MPI_Cancel(&r->req);
    MPI_Wait(&r->req, MPI_STATUS_IGNORE);
}

/* Result of a completed request: a receive of another size is a mismatch (MPI reports a
 * longer message as MPI_ERR_TRUNCATE, after consuming it). */
static hcomm_result_t completed(const char *fn, const hcomm__req_t *r, int rc, MPI_Status *st) {
    int cls = MPI_SUCCESS, got = 0;
    if (rc != MPI_SUCCESS)
        MPI_Error_class(rc, &cls);
    if (r->is_recv && cls == MPI_ERR_TRUNCATE)
        return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                          "message from peer %d tag %d is longer than the %zu bytes expected",
                          r->peer, r->tag, r->bytes);
    if (rc != MPI_SUCCESS)
        return mpi_fail(fn, r->is_recv ? "MPI_Irecv" : "MPI_Isend", rc);
    if (r->is_recv && MPI_Get_count(st, MPI_BYTE, &got) == MPI_SUCCESS && (size_t)got != r->bytes)
        return mismatch(fn, (size_t)got, r->bytes, r->peer, r->tag);
    return HCOMM_OK;
}

static hcomm_result_t mpi_wait(hcomm_comm_t *c, hcomm__req_t *r) {
    if (!r)
        return hcomm__err(HCOMM_ERR_NULL, __func__, "request is NULL");
    MPI_Status st;
    test_ctx_t t = {&r->req, &st};
    int rc = MPI_SUCCESS;
    hcomm_result_t res = poll_until(__func__, r->is_recv ? "irecv" : "isend", test_step, &t, &rc);
    if (res != HCOMM_OK)
        abandon(c, r, res);
    else
        res = completed(__func__, r, rc, &st);
    free(r);
    return res;
}

static hcomm_result_t mpi_send(hcomm_comm_t *c, const void *buf, size_t bytes, int peer, int tag) {
    hcomm__req_t *r = NULL;
    HCOMM__TRY(mpi_isend(c, buf, bytes, peer, tag, &r));
    return mpi_wait(c, r);
}

typedef struct {
    MPI_Comm comm;
    int peer, tag;
    MPI_Message *msg;
    MPI_Status *st;
} probe_ctx_t;

static int probe_step(void *ctx, int *done) {
    probe_ctx_t *p = ctx;
    return MPI_Improbe(p->peer, p->tag, p->comm, done, p->msg, p->st);
}

/* Takes a matched message of the wrong size out of MPI so the next one can arrive. */
static hcomm_result_t discard(const char *fn, MPI_Message *msg, int got) {
    void *sink = malloc(got > 0 ? (size_t)got : 1);
    if (!sink) {
        /* Receiving 0 bytes truncates (an error we expect) but still consumes the message. */
        MPI_Mrecv(NULL, 0, MPI_BYTE, msg, MPI_STATUS_IGNORE);
        return HCOMM_OK;
    }
    int rc = MPI_Mrecv(sink, got, MPI_BYTE, msg, MPI_STATUS_IGNORE);
    free(sink);
    return rc == MPI_SUCCESS ? HCOMM_OK : mpi_fail(fn, "MPI_Mrecv", rc);
}

/* Matches the message first (MPI_Improbe), so its size is known before it is received. */
static hcomm_result_t mpi_recv(hcomm_comm_t *c, void *buf, size_t bytes, int peer, int tag) {
    int n = 0, got = 0, rc = MPI_SUCCESS;
    HCOMM__TRY(check_p2p(__func__, c, buf, bytes, peer, tag, &n));
    MPI_Message msg = MPI_MESSAGE_NULL;
    MPI_Status st;
    probe_ctx_t p = {mcomm(c), peer, tag, &msg, &st};
    HCOMM__TRY(poll_until(__func__, "recv", probe_step, &p, &rc));
    if (rc != MPI_SUCCESS)
        return mpi_fail(__func__, "MPI_Improbe", rc);
    MPI_TRY(__func__, MPI_Get_count(&st, MPI_BYTE, &got));
    if (got != n) {
        HCOMM__TRY(discard(__func__, &msg, got));
        return mismatch(__func__, (size_t)got, bytes, peer, tag);
    }
    MPI_TRY(__func__, MPI_Mrecv(buf, n, MPI_BYTE, &msg, MPI_STATUS_IGNORE));
    return HCOMM_OK;
}

/* --- collectives --- */

static bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return an > 0 && bn > 0 && pa < pb + bn && pb < pa + an;
}

/* MPI forbids aliased send and receive buffers: an overlapping send range is copied first. */
static hcomm_result_t detach_send(const char *fn, const void **send, size_t sn, const void *recv,
                                  size_t rn, void **tmp) {
    *tmp = NULL;
    if (!overlaps(*send, sn, recv, rn))
        return HCOMM_OK;
    *tmp = malloc(sn);
    if (!*tmp)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory copying %zu overlapping bytes", sn);
    memcpy(*tmp, *send, sn);
    *send = *tmp;
    return HCOMM_OK;
}

/* --- agreeing on the call --- */

/* Which collective a signature names; only equality across ranks matters. */
typedef enum {
    CALL_ALL_REDUCE,
    CALL_REDUCE_SCATTER,
    CALL_ALL_GATHER,
    CALL_BROADCAST,
    CALL_ALL_TO_ALLV,
    CALL_BARRIER,
    CALL_SPLIT,
    CALL_KINDS
} call_kind_t;

static const char *const call_names[CALL_KINDS] = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_allv", "barrier", "split"};
/* What a signature's count holds, per call. */
static const char *const count_names[CALL_KINDS] = {"count", "count", "bytes_per_rank", "bytes",
                                                    "count", "count", "count"};
static const char *const op_names[HCOMM_AVG] = {"sum", "prod", "max", "min"};

enum { SIG_CALL, SIG_DTYPE, SIG_OP, SIG_ROOT, SIG_COUNT, SIG_FIELDS };

typedef struct {
    int value, rank; /* MPI_2INT */
} sig_entry_t;

static void field_text(int call, int field, int value, char *buf, size_t n) {
    const char *dname = "?";
    switch (field) {
    case SIG_CALL:
        snprintf(buf, n, "%s", value >= 0 && value < CALL_KINDS ? call_names[value] : "?");
        break;
    case SIG_DTYPE:
        hcomm_dtype_name((hcomm_dtype_t)value, &dname);
        snprintf(buf, n, "dtype=%s", dname);
        break;
    case SIG_OP:
        snprintf(buf, n, "op=%s", value >= 0 && value < HCOMM_AVG ? op_names[value] : "?");
        break;
    case SIG_ROOT:
        snprintf(buf, n, "root=%d", value);
        break;
    default:
        snprintf(buf, n, "%s=%d", count_names[call], value);
        break;
    }
}

/* Every rank computes the same message from the same reduced signature. */
static hcomm_result_t disagreement(const char *fn, int call, int field, const sig_entry_t *hi,
                                   const sig_entry_t *lo) {
    char a[64], b[64];
    field_text(call, field, hi->value, a, sizeof a);
    field_text(call, field, -lo->value, b, sizeof b);
    if (field == SIG_CALL)
        return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                          "ranks called different collectives: rank %d called %s, rank %d "
                          "called %s",
                          hi->rank, a, lo->rank, b);
    return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                      "ranks called %s with different arguments: %s on rank %d, %s on rank %d",
                      call_names[call], a, hi->rank, b, lo->rank);
}

/* One small allreduce before every collective: if the ranks' signatures (call, dtype, op,
 * root, count) differ, every rank returns HCOMM_ERR_MISMATCH and no data moves, so the comm
 * stays usable. MPI itself would truncate, corrupt or hang on such calls. MAXLOC of each
 * field and of its negation gives its largest and smallest value and a rank holding each. */
static hcomm_result_t agree_on_call(hcomm_comm_t *c, const char *fn, call_kind_t call,
                                    hcomm_dtype_t dt, hcomm_op_t op, int root, int count) {
    const int sig[SIG_FIELDS] = {(int)call, (int)dt, (int)op, root, count};
    sig_entry_t *e = malloc(sizeof *e * 2 * SIG_FIELDS); /* a pending request may write it */
    if (!e)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for the call signature");
    for (int f = 0; f < SIG_FIELDS; f++) {
        e[f] = (sig_entry_t){sig[f], c->rank};
        e[SIG_FIELDS + f] = (sig_entry_t){-sig[f], c->rank};
    }
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, e, 2 * SIG_FIELDS, MPI_2INT, MPI_MAXLOC, mcomm(c), &req);
    hcomm_result_t r = await_posted(c, fn, "MPI_Iallreduce of the call signature", rc, &req);
    bool pending = r != HCOMM_OK && req != MPI_REQUEST_NULL; /* MPI may still write e */
    for (int f = 0; r == HCOMM_OK && f < SIG_FIELDS; f++)
        if (e[f].value != -e[SIG_FIELDS + f].value)
            r = disagreement(fn, (int)call, f, &e[f], &e[SIG_FIELDS + f]);
    if (!pending)
        free(e);
    return r;
}

static hcomm_result_t check_reduction(const char *fn, const hcomm_comm_t *c, hcomm_dtype_t dt,
                                      hcomm_op_t op) {
    HCOMM__TRY(check_usable(fn, c));
    if (!hcomm__dtype_valid(dt))
        return hcomm__err(HCOMM_ERR_DTYPE, fn, "dtype=%d is not a valid hcomm_dtype_t", (int)dt);
    if (!hcomm__op_valid(op) || op == HCOMM_AVG)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "op=%d is not SUM, PROD, MAX or MIN", (int)op);
    return HCOMM_OK;
}

static hcomm_result_t mpi_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                     size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    int n = 0;
    HCOMM__TRY(check_reduction(__func__, c, dt, op));
    HCOMM__TRY(to_int(__func__, "count", count, &n));
    HCOMM__TRY(agree_on_call(c, __func__, CALL_ALL_REDUCE, dt, op, 0, n));
    size_t bytes = count * hcomm__dtype_size(dt);
    void *tmp = NULL;
    const void *src = sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
    if (src != MPI_IN_PLACE)
        HCOMM__TRY(detach_send(__func__, &src, bytes, recvbuf, bytes, &tmp));
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(src, recvbuf, n, mpi_dtype(dt), mpi_objs.ops[op], mcomm(c), &req);
    hcomm_result_t r = await_posted(c, __func__, "MPI_Iallreduce", rc, &req);
    if (r == HCOMM_OK || req == MPI_REQUEST_NULL)
        free(tmp); /* a pending request may still read tmp */
    return r;
}

static hcomm_result_t mpi_all_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                     size_t bytes_per_rank) {
    int n = 0;
    HCOMM__TRY(check_usable(__func__, c));
    HCOMM__TRY(to_int(__func__, "bytes_per_rank", bytes_per_rank, &n));
    HCOMM__TRY(agree_on_call(c, __func__, CALL_ALL_GATHER, 0, 0, 0, n));
    size_t total = bytes_per_rank * (size_t)c->size;
    void *tmp = NULL;
    const void *src = sendbuf;
    if (sendbuf == (const char *)recvbuf + bytes_per_rank * (size_t)c->rank)
        src = MPI_IN_PLACE;
    else
        HCOMM__TRY(detach_send(__func__, &src, bytes_per_rank, recvbuf, total, &tmp));
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(src, n, MPI_BYTE, recvbuf, n, MPI_BYTE, mcomm(c), &req);
    hcomm_result_t r = await_posted(c, __func__, "MPI_Iallgather", rc, &req);
    if (r == HCOMM_OK || req == MPI_REQUEST_NULL)
        free(tmp);
    return r;
}

static hcomm_result_t mpi_reduce_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                         size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    int n = 0;
    HCOMM__TRY(check_reduction(__func__, c, dt, op));
    HCOMM__TRY(to_int(__func__, "count", count, &n));
    HCOMM__TRY(agree_on_call(c, __func__, CALL_REDUCE_SCATTER, dt, op, 0, n));
    size_t es = hcomm__dtype_size(dt);
    void *tmp = NULL;
    const void *src = sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
    if (src != MPI_IN_PLACE)
        HCOMM__TRY(
            detach_send(__func__, &src, count * es * (size_t)c->size, recvbuf, count * es, &tmp));
    MPI_Request req = MPI_REQUEST_NULL;
    int rc =
        MPI_Ireduce_scatter_block(src, recvbuf, n, mpi_dtype(dt), mpi_objs.ops[op], mcomm(c), &req);
    hcomm_result_t r = await_posted(c, __func__, "MPI_Ireduce_scatter_block", rc, &req);
    if (r == HCOMM_OK || req == MPI_REQUEST_NULL)
        free(tmp);
    return r;
}

static hcomm_result_t mpi_broadcast(hcomm_comm_t *c, void *buf, size_t bytes, int root) {
    int n = 0;
    HCOMM__TRY(check_usable(__func__, c));
    if (root < 0 || root >= c->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "root=%d outside 0..%d", root,
                          c->size - 1);
    HCOMM__TRY(to_int(__func__, "bytes", bytes, &n));
    HCOMM__TRY(agree_on_call(c, __func__, CALL_BROADCAST, 0, 0, root, n));
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Ibcast(buf, n, MPI_BYTE, root, mcomm(c), &req);
    return await_posted(c, __func__, "MPI_Ibcast", rc, &req);
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
        HCOMM__TRY(to_int(fn, name, displs[p], &idispls[p]));
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
                       "rank %lld sends %lld bytes to rank %lld, which expects %lld (%lld "
                       "send count(s) differ from the receivers' recvcounts; no data was moved)",
                       (long long)bad->sender, (long long)bad->sent, (long long)bad->receiver,
                       (long long)bad->expected, (long long)bad->pairs);
    if (!pending)
        free(bad);
    return r;
}

static hcomm_result_t mpi_all_to_allv(hcomm_comm_t *c, const void *sendbuf,
                                      const size_t *sendcounts, const size_t *sdispls,
                                      void *recvbuf, const size_t *recvcounts,
                                      const size_t *rdispls) {
    HCOMM__TRY(check_usable(__func__, c));
    int p = c->size;
    int *v = malloc(sizeof(int) * 4 * (size_t)p); /* send counts, sdispls, recv counts, rdispls */
    if (!v)
        return hcomm__err(HCOMM_ERR_NOMEM, __func__, "out of memory for %d counts", 4 * p);
    void *tmp = NULL;
    const void *src = sendbuf;
    size_t sext = 0, rext = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    hcomm_result_t r = HCOMM_OK;
    HCOMM__TRY_GOTO(counts_to_int(__func__, "send", p, sendcounts, sdispls, v, v + p, &sext), r,
                    done);
    HCOMM__TRY_GOTO(
        counts_to_int(__func__, "recv", p, recvcounts, rdispls, v + 2 * p, v + 3 * p, &rext), r,
        done);
    HCOMM__TRY_GOTO(agree_on_call(c, __func__, CALL_ALL_TO_ALLV, 0, 0, 0, 0), r, done);
    HCOMM__TRY_GOTO(agree_on_counts(c, __func__, sendcounts, recvcounts), r, done);
    HCOMM__TRY_GOTO(detach_send(__func__, &src, sext, recvbuf, rext, &tmp), r, done);
    int rc = MPI_Ialltoallv(src, v, v + p, MPI_BYTE, recvbuf, v + 2 * p, v + 3 * p, MPI_BYTE,
                            mcomm(c), &req);
    r = await_posted(c, __func__, "MPI_Ialltoallv", rc, &req);
done:
    if (r == HCOMM_OK || req == MPI_REQUEST_NULL) { /* a pending request may still read them */
        free(v);
        free(tmp);
    }
    return r;
}

/* The signature allreduce doubles as the barrier: no rank leaves it before all arrived. */
static hcomm_result_t mpi_barrier(hcomm_comm_t *c) {
    HCOMM__TRY(check_usable(__func__, c));
    return agree_on_call(c, __func__, CALL_BARRIER, 0, 0, 0, 0);
}

/* MPI_Comm_split blocks and cannot time out, so a polled signature allreduce first proves that
 * every rank has arrived (and called split); the split after it cannot hang. */
static hcomm_result_t mpi_split(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out) {
    HCOMM__TRY(check_usable(__func__, c));
    HCOMM__TRY(agree_on_call(c, __func__, CALL_SPLIT, 0, 0, 0, 0));
    MPI_Comm mc = MPI_COMM_NULL;
    MPI_TRY(__func__, MPI_Comm_split(mcomm(c), color < 0 ? MPI_UNDEFINED : color, key, &mc));
    *out = NULL;
    if (mc == MPI_COMM_NULL)
        return HCOMM_OK;
    return adopt(__func__, mc, out);
}

static void mpi_destroy(hcomm_comm_t *c) {
    mpi_impl_t *impl = c->impl;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (impl && !finalized && impl->comm != MPI_COMM_NULL)
        MPI_Comm_free(&impl->comm);
    free(impl);
    c->impl = NULL;
}

static const hcomm__backend_ops_t mpi_ops = {
    .name = "mpi",
    .send = mpi_send,
    .recv = mpi_recv,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .wait = mpi_wait,
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .broadcast = mpi_broadcast,
    .all_to_allv = mpi_all_to_allv,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .destroy = mpi_destroy,
};

/* --- launch --- */

/* Tells every other process that this rank's function failed, so peers polling on it return
 * HCOMM_ERR_ABORTED. *reqs gets the pending sends (NULL if none could be posted). */
static int notify_abort(MPI_Comm ctrl, int rank, int size, MPI_Request **reqs) {
    static const int one = 1;
    *reqs = malloc(sizeof(MPI_Request) * (size_t)size);
    if (!*reqs)
        return 0;
    for (int p = 0; p < size; p++) {
        (*reqs)[p] = MPI_REQUEST_NULL;
        if (p != rank)
            MPI_Isend(&one, 1, MPI_INT, p, ABORT_TAG, ctrl, &(*reqs)[p]);
    }
    return 1;
}

/* Every process learns how many rank functions failed, so all return consistent results, and
 * the abort notices are drained so ctrl can be freed. This allreduce does not poll: a peer
 * whose own function never returns (blocked outside hcomm) keeps this process waiting too. */
static hcomm_result_t agree(MPI_Comm ctrl, hcomm_result_t mine, int rank, int size) {
    MPI_Request *notes = NULL;
    int local[2] = {mine != HCOMM_OK, 0}, total[2] = {0, 0};
    if (mine != HCOMM_OK)
        local[1] = notify_abort(ctrl, rank, size, &notes);
    int rc = MPI_Allreduce(local, total, 2, MPI_INT, MPI_SUM, ctrl);
    for (int i = 0; rc == MPI_SUCCESS && i < total[1] - local[1]; i++) {
        int dummy = 0;
        MPI_Recv(&dummy, 1, MPI_INT, MPI_ANY_SOURCE, ABORT_TAG, ctrl, MPI_STATUS_IGNORE);
    }
    if (notes)
        MPI_Waitall(size, notes, MPI_STATUSES_IGNORE);
    free(notes);
    if (mine != HCOMM_OK)
        return mine;
    if (rc != MPI_SUCCESS)
        return mpi_fail("hcomm_launch", "MPI_Allreduce of the rank results", rc);
    if (total[0] > 0)
        return hcomm__err(HCOMM_ERR_ABORTED, "hcomm_launch",
                          "%d of %d ranks failed (this rank's function returned HCOMM_OK); "
                          "see their messages",
                          total[0], size);
    return HCOMM_OK;
}

static hcomm_result_t run_world(hcomm_rank_fn_t fn, void *arg, int rank, int size) {
    hcomm_comm_t *world = NULL;
    MPI_Comm ctrl = MPI_COMM_NULL;
    HCOMM__TRY(dup_comm("hcomm_launch", MPI_COMM_WORLD, &world));
    world->is_world = true;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &ctrl);
    if (rc != MPI_SUCCESS) {
        hcomm__comm_free(world);
        return mpi_fail("hcomm_launch", "MPI_Comm_dup", rc);
    }
    MPI_Comm_set_errhandler(ctrl, MPI_ERRORS_RETURN);
    abort_comm = ctrl;
    hcomm_result_t r = fn(world, arg);
    abort_comm = MPI_COMM_NULL;
    r = agree(ctrl, r, rank, size);
    MPI_Comm_free(&ctrl);
    hcomm__comm_free(world);
    return r;
}

hcomm_result_t hcomm__mpi_launch(int nranks, hcomm_rank_fn_t fn, void *arg) {
    int size = 0, rank = 0;
    if (abort_comm != MPI_COMM_NULL)
        return hcomm__err(HCOMM_ERR_STATE, "hcomm_launch",
                          "backend=\"mpi\" is already running a world in this process; "
                          "launch worlds one after another, not from a rank function");
    HCOMM__TRY(mpi_ready("hcomm_launch", true));
    MPI_TRY("hcomm_launch", MPI_Comm_size(MPI_COMM_WORLD, &size));
    MPI_TRY("hcomm_launch", MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (nranks != 0 && nranks != size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, "hcomm_launch",
                          "nranks=%d but the MPI job has %d processes (pass 0 to use the MPI "
                          "world size, or start the job with mpirun -np %d)",
                          nranks, size, nranks);
    return run_world(fn, arg, rank, size);
}
