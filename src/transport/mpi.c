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
/* process_vm_readv (Linux cross-memory attach) is a GNU extension. */
#define _GNU_SOURCE

#include "hcomm/mpi.h"

#include "transport/transport.h"

#include "core/env.h"
#include "core/topo_spec.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

/* Abort notices travel on the launch's control communicator with this tag. */
#define ABORT_TAG 1
/* On every hcomm communicator: frames use FRAME_TAG, rendezvous payloads DATA_TAG_MIN up to
 * lane_base - 1, lane messages lane_base up to the tag bound. */
#define FRAME_TAG 1
#define DATA_TAG_MIN 2
#define RECV_DEPTH 4
#define STAGE_SLOTS 64
#define STAGE_BYTES 512

typedef struct mpi_impl {
    MPI_Comm comm;
    /* HCOMM_OK, or why the comm is unusable: a collective or send that timed out or was
     * aborted stays pending inside MPI (MPI cannot cancel it), so the next call on this comm
     * would match the wrong operation. */
    hcomm_result_t broken;
    /* Frames: RECV_DEPTH receives posted ahead (any source, FRAME_TAG), completed in posting
     * order so frames of one source stay in order; a frame the p2p layer refused stays held. */
    MPI_Request rreq[4];
    unsigned char *rbuf[4];
    size_t rbuf_bytes;
    int rhead;
    bool held;
    MPI_Status held_st;
    int *next_tag; /* [size] the data tag of the next rendezvous to each peer */
    int tag_ub, lane_base;
    uint32_t lane_mask; /* lane tags: lane_base + (key & lane_mask), a power of two less one */
    /* Small eager frames are sent from a ring of staging slots the transport owns, so the
     * caller's send completes at once (no MPI_Test on its critical path); a slot is reused
     * once its MPI_Isend completed, else the frame takes the per-request path. */
    unsigned char (*stage)[STAGE_BYTES];
    MPI_Request sreq[STAGE_SLOTS];
    int snext;
    struct mpi_tx *waiting; /* rendezvous sends awaiting clear-to-send */
    void **board;           /* [size] every member's board region (transport.board), or NULL */
} mpi_impl_t;

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

static const hcomm__transport_t mpi_tr;

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

/* Runs step until it reports done or an MPI error (then *mpi_rc holds its code and the result
 * is HCOMM_OK), a peer's abort notice arrives or hcomm_comm_abort() is called on c
 * (HCOMM_ERR_ABORTED), or the timeout passes (HCOMM_ERR_TIMEOUT). c may be NULL (creating a
 * comm: the environment's timeout applies). */
static hcomm_result_t poll_until(hcomm_comm_t *c, const char *fn, const char *what,
                                 poll_step_t step, void *ctx, int *mpi_rc) {
    double limit = 300.0;
    if (c)
        limit = c->timeout_s;
    else if (hcomm__env_timeout(fn, &limit) != HCOMM_OK)
        limit = 300.0;
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    for (;;) {
        int done = 0;
        *mpi_rc = step(ctx, &done);
        if (*mpi_rc != MPI_SUCCESS || done)
            return HCOMM_OK;
        double waited = hcomm__backoff(&b);
        if ((b.iter & 63) != 0)
            continue;
        if (peer_aborted())
            return hcomm__err(HCOMM_ERR_ABORTED, fn, "%s abandoned: another rank's function failed",
                              what);
        if (c && atomic_load(&c->aborted))
            return hcomm__err(HCOMM_ERR_ABORTED, fn, "%s abandoned: hcomm_comm_abort() was called",
                              what);
        if (waited > limit)
            return hcomm__err(HCOMM_ERR_TIMEOUT, fn,
                              "%s: no matching peer after %g s (seq %u, HCOMM_TIMEOUT%s)", what,
                              limit, c ? (unsigned)c->call_seq : 0u, hcomm__check_hint(false));
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

/* Completes a request of setup work (no comm yet: the environment's timeout applies). */
static hcomm_result_t wait_setup(const char *fn, const char *what, MPI_Request *req) {
    MPI_Status st;
    test_ctx_t t = {req, &st};
    int rc = MPI_SUCCESS;
    HCOMM__TRY(poll_until(NULL, fn, what, test_step, &t, &rc));
    return rc == MPI_SUCCESS ? HCOMM_OK : mpi_fail(fn, what, rc);
}

/* Completes a collective request; on timeout or abort it stays pending in MPI, so the comm is
 * marked unusable. A collective that failed inside MPI may have left peers half way through
 * it (Open MPI abandons the rest of a failed schedule), so that comm is unusable too. */
static hcomm_result_t wait_request(hcomm_comm_t *c, const char *fn, const char *what,
                                   MPI_Request *req) {
    MPI_Status st;
    test_ctx_t t = {req, &st};
    int rc = MPI_SUCCESS;
    hcomm_result_t r = poll_until(c, fn, what, test_step, &t, &rc);
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
        hcomm__shm_unlink_all(); /* MPI_Abort kills the process: no destructors run */
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

static hcomm_result_t frames_init(const char *fn, hcomm_comm_t *c);
static hcomm_result_t board_init(const char *fn, hcomm_comm_t *c);

/* Wraps mc (owned from here on: freed on failure) into a new hcomm comm; parent (may be NULL)
 * passes on its settings. */
static hcomm_result_t adopt(const char *fn, MPI_Comm mc, const hcomm_comm_t *parent,
                            hcomm_comm_t **out) {
    int rank = 0, size = 0;
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mc, &rank);
    MPI_Comm_size(mc, &size);
    mpi_impl_t *impl = calloc(1, sizeof *impl);
    hcomm_comm_t *c = impl ? hcomm__comm_alloc(&mpi_tr, impl, rank, size, parent) : NULL;
    if (!c) {
        free(impl);
        MPI_Comm_free(&mc);
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for a communicator of %d ranks",
                          size);
    }
    impl->comm = mc;
    impl->broken = HCOMM_OK;
    hcomm_result_t r = fill_world_ranks(fn, c);
    if (r == HCOMM_OK)
        r = frames_init(fn, c);
    if (r == HCOMM_OK)
        r = board_init(fn, c);
    if (r != HCOMM_OK) {
        hcomm__comm_free(c);
        return r;
    }
    *out = c;
    return HCOMM_OK;
}

/* MPI_Comm_idup, polled: ranks that cannot reach each other time out instead of hanging. */
static hcomm_result_t dup_comm(const char *fn, MPI_Comm parent, hcomm_comm_t **out) {
    MPI_Comm mc = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_TRY(fn, MPI_Comm_idup(parent, &mc, &req));
    HCOMM__TRY(wait_setup(fn, "MPI_Comm_idup", &req));
    return adopt(fn, mc, NULL, out);
}

hcomm_result_t hcomm_comm_wrap_mpi(MPI_Comm comm, hcomm_comm_t **out) {
    HCOMM__CHECK_NULL(out);
    *out = NULL;
    HCOMM__TRY(hcomm__env_validate(__func__)); /* as hcomm_launch: no silent defaults */
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

/* --- frames --- */

/* What precedes the p2p header on the wire. */
typedef struct wire {
    int32_t data_tag; /* rendezvous: the tag its payload travels with; 0 for eager */
    int32_t cts;      /* 1: a clear-to-send for data_tag (no p2p header follows) */
    uint64_t bytes;
} wire_t;

#define WIRE_HDR (sizeof(wire_t) + HCOMM__HDR_BYTES)

/* A send: its frame, and for a rendezvous the payload, which is posted only once the receiver
 * has posted its receive and said so (a clear-to-send frame): until then MPI holds no reference
 * to the sender's buffer, so a send that times out can be withdrawn safely. */
typedef struct mpi_tx {
    MPI_Request frame, data;
    void *heap;
    struct mpi_tx *next_wait; /* the comm's list of rendezvous sends awaiting clear-to-send */
    const void *payload;
    int bytes, peer, data_tag;
    bool awaiting;
    unsigned char stage[sizeof(hcomm__treq_t) - 2 * sizeof(MPI_Request) - 3 * sizeof(void *) -
                        4 * sizeof(int) - 8];
} mpi_tx_t;

_Static_assert(sizeof(mpi_tx_t) <= sizeof(hcomm__treq_t), "mpi_tx_t fits a request");

static mpi_impl_t *impl_of(hcomm_comm_t *c) {
    return (mpi_impl_t *)c->impl;
}

static hcomm_result_t post_frame_recv(hcomm_comm_t *c, int i) {
    mpi_impl_t *m = impl_of(c);
    int rc = MPI_Irecv(m->rbuf[i], (int)m->rbuf_bytes, MPI_BYTE, MPI_ANY_SOURCE, FRAME_TAG, m->comm,
                       &m->rreq[i]);
    return rc == MPI_SUCCESS ? HCOMM_OK : mpi_fail(c->call_fn, "MPI_Irecv", rc);
}

static hcomm_result_t frames_init(const char *fn, hcomm_comm_t *c) {
    mpi_impl_t *m = impl_of(c);
    size_t eager = c->eager_limit > 256 ? c->eager_limit : 256; /* notices always go eager */
    m->rbuf_bytes = WIRE_HDR + eager;
    m->next_tag = calloc((size_t)c->size, sizeof *m->next_tag);
    void *ub = NULL;
    int flag = 0;
    MPI_Comm_get_attr(m->comm, MPI_TAG_UB, &ub, &flag);
    m->tag_ub = flag && ub ? *(int *)ub : 32767;
    m->lane_base = DATA_TAG_MIN + (m->tag_ub - DATA_TAG_MIN + 1) / 2;
    /* a mask, not a modulo: a lane step computes two tags, and a division costs more than the
     * rest of the tag's arithmetic */
    m->lane_mask = 1;
    while (m->lane_mask * 2 <= (uint32_t)(m->tag_ub - m->lane_base + 1))
        m->lane_mask *= 2;
    m->lane_mask -= 1;
    for (int i = 0; i < RECV_DEPTH; i++) {
        m->rreq[i] = MPI_REQUEST_NULL;
        m->rbuf[i] = malloc(m->rbuf_bytes);
    }
    for (int i = 0; i < STAGE_SLOTS; i++)
        m->sreq[i] = MPI_REQUEST_NULL;
    m->stage = malloc(sizeof *m->stage * STAGE_SLOTS); /* NULL: every frame uses its request */
    for (int i = 0; i < RECV_DEPTH; i++)
        if (!m->rbuf[i] || !m->next_tag)
            return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for receive buffers");
    for (int i = 0; i < RECV_DEPTH; i++)
        HCOMM__TRY(post_frame_recv(c, i));
    return HCOMM_OK;
}

/* A staged send still in flight keeps its slot's memory alive: then the slots are leaked. */
static void stage_free(mpi_impl_t *m) {
    bool busy = false;
    for (int i = 0; i < STAGE_SLOTS; i++) {
        int done = 1;
        if (m->sreq[i] != MPI_REQUEST_NULL)
            MPI_Test(&m->sreq[i], &done, MPI_STATUS_IGNORE);
        if (!done) {
            MPI_Request_free(&m->sreq[i]);
            busy = true;
        }
    }
    if (!busy)
        free(m->stage);
    m->stage = NULL;
}

static void frames_free(mpi_impl_t *m) {
    stage_free(m);
    for (int i = 0; i < RECV_DEPTH; i++) {
        if (m->rreq[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&m->rreq[i]);
            MPI_Wait(&m->rreq[i], MPI_STATUS_IGNORE);
        }
        free(m->rbuf[i]);
    }
    free(m->next_tag);
}

static int next_data_tag(mpi_impl_t *m, int peer) {
    int span = m->lane_base - DATA_TAG_MIN;
    int t = DATA_TAG_MIN + m->next_tag[peer];
    m->next_tag[peer] = (m->next_tag[peer] + 1) % span;
    return t;
}

/* A free staging slot (its earlier send completed), or NULL. */
static unsigned char *stage_slot(mpi_impl_t *m, MPI_Request **req) {
    int i = m->snext, done = 1;
    if (!m->stage)
        return NULL;
    if (m->sreq[i] != MPI_REQUEST_NULL &&
        MPI_Test(&m->sreq[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return NULL;
    if (!done)
        return NULL;
    m->snext = (i + 1) % STAGE_SLOTS;
    *req = &m->sreq[i];
    return m->stage[i];
}

static hcomm_result_t send_staged(hcomm_comm_t *c, int peer, const void *hdr, const void *payload,
                                  size_t bytes, bool *sent) {
    mpi_impl_t *m = impl_of(c);
    MPI_Request *req = NULL;
    unsigned char *buf = stage_slot(m, &req);
    *sent = buf != NULL;
    if (!buf)
        return HCOMM_OK;
    wire_t w = {.bytes = bytes};
    memcpy(buf, &w, sizeof w);
    memcpy(buf + sizeof w, hdr, HCOMM__HDR_BYTES);
    if (bytes)
        memcpy(buf + WIRE_HDR, payload, bytes);
    int rc = MPI_Isend(buf, (int)(WIRE_HDR + bytes), MPI_BYTE, peer, FRAME_TAG, m->comm, req);
    return rc == MPI_SUCCESS ? HCOMM_OK : mpi_fail(c->call_fn, "MPI_Isend", rc);
}

static hcomm_result_t mpi_send_frame(hcomm_comm_t *c, int peer, const void *hdr,
                                     const void *payload, size_t bytes, bool rndv,
                                     hcomm__treq_t *treq) {
    mpi_impl_t *m = impl_of(c);
    mpi_tx_t *tx = (mpi_tx_t *)treq;
    int n = 0;
    tx->frame = tx->data = MPI_REQUEST_NULL; /* empty before any early return, as lane_post */
    tx->heap = NULL;
    tx->awaiting = false;
    HCOMM__TRY(check_usable(c->call_fn, c));
    HCOMM__TRY(to_int(c->call_fn, "message bytes", bytes + WIRE_HDR, &n));
    size_t wire_bytes = WIRE_HDR + (rndv ? 0 : bytes);
    if (!rndv && wire_bytes <= STAGE_BYTES) {
        bool sent = false;
        HCOMM__TRY(send_staged(c, peer, hdr, payload, bytes, &sent));
        if (sent)
            return HCOMM_OK; /* tx has no request left: complete */
    }
    unsigned char *buf = tx->stage;
    if (wire_bytes > sizeof tx->stage && (buf = tx->heap = malloc(wire_bytes)) == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory staging %zu bytes",
                          wire_bytes);
    wire_t w = {.data_tag = rndv ? next_data_tag(m, peer) : 0, .bytes = bytes};
    memcpy(buf, &w, sizeof w);
    memcpy(buf + sizeof w, hdr, HCOMM__HDR_BYTES);
    if (!rndv && bytes)
        memcpy(buf + WIRE_HDR, payload, bytes);
    tx->awaiting = false;
    int rc = MPI_Isend(buf, (int)wire_bytes, MPI_BYTE, peer, FRAME_TAG, m->comm, &tx->frame);
    if (rc != MPI_SUCCESS) {
        free(tx->heap);
        tx->heap = NULL;
        return mpi_fail(c->call_fn, "MPI_Isend", rc);
    }
    if (rndv) { /* the payload goes once the receiver's clear-to-send arrives (offer) */
        tx->payload = payload;
        tx->bytes = (int)bytes;
        tx->peer = peer;
        tx->data_tag = w.data_tag;
        tx->awaiting = true;
        tx->next_wait = m->waiting;
        m->waiting = tx;
    }
    return HCOMM_OK;
}

static bool mpi_test_tx(hcomm_comm_t *c, hcomm__treq_t *treq, hcomm_result_t *res) {
    mpi_tx_t *tx = (mpi_tx_t *)treq;
    int done = 0, rc = MPI_SUCCESS;
    *res = HCOMM_OK;
    if (tx->awaiting)
        return false;
    if (tx->frame != MPI_REQUEST_NULL && tx->data != MPI_REQUEST_NULL) {
        MPI_Request both[2] = {tx->frame, tx->data};
        rc = MPI_Testall(2, both, &done, MPI_STATUSES_IGNORE);
        tx->frame = both[0];
        tx->data = both[1];
    } else if (tx->frame != MPI_REQUEST_NULL || tx->data != MPI_REQUEST_NULL) {
        MPI_Request *one = tx->frame != MPI_REQUEST_NULL ? &tx->frame : &tx->data;
        rc = MPI_Test(one, &done, MPI_STATUS_IGNORE);
    } else {
        done = 1;
    }
    *res = rc == MPI_SUCCESS ? HCOMM_OK : mpi_fail(c->call_fn, "MPI_Testall (send)", rc);
    if (done || rc != MPI_SUCCESS) {
        free(tx->heap);
        tx->heap = NULL;
        return true;
    }
    return false;
}

/* Offers the frame in rbuf[rhead]; false when the p2p layer left it for later. */
/* The receiver posted its receive for data_tag: post the payload it waits for. */
static void clear_to_send(hcomm_comm_t *c, int src, int data_tag) {
    mpi_impl_t *m = impl_of(c);
    for (mpi_tx_t **pt = &m->waiting; *pt; pt = &(*pt)->next_wait) {
        mpi_tx_t *tx = *pt;
        if (tx->peer != src || tx->data_tag != data_tag)
            continue;
        *pt = tx->next_wait;
        tx->awaiting = false;
        if (MPI_Isend(tx->payload, tx->bytes, MPI_BYTE, src, data_tag, m->comm, &tx->data) !=
            MPI_SUCCESS)
            mark_broken(c, HCOMM_ERR_BACKEND, false);
        return;
    }
    /* No such send: it was withdrawn; the receiver's receive then ends by its timeout. */
}

static bool offer(hcomm_comm_t *c, hcomm__deliver_fn_t deliver, const MPI_Status *st) {
    mpi_impl_t *m = impl_of(c);
    const unsigned char *buf = m->rbuf[m->rhead];
    wire_t w;
    memcpy(&w, buf, sizeof w);
    if (w.cts) {
        clear_to_send(c, st->MPI_SOURCE, w.data_tag);
        return true;
    }
    hcomm__rndv_t rv = {(uint64_t)w.data_tag, 0};
    const void *payload = w.data_tag ? NULL : buf + WIRE_HDR;
    return deliver(c, st->MPI_SOURCE, buf + sizeof w, payload, (size_t)w.bytes,
                   w.data_tag ? &rv : NULL);
}

/* Delivers at most one frame per call: each MPI_Test runs Open MPI's whole progress engine,
 * so testing for a second frame right after the first costs a latency-bound exchange about a
 * tenth of its time; the waiter calls again anyway. */
static hcomm_result_t mpi_poll(hcomm_comm_t *c, hcomm__deliver_fn_t deliver) {
    mpi_impl_t *m = impl_of(c);
    MPI_Status st;
    if (m->held) {
        st = m->held_st;
    } else {
        int done = 0;
        int rc = MPI_Test(&m->rreq[m->rhead], &done, &st);
        if (rc != MPI_SUCCESS)
            return mpi_fail(c->call_fn, "MPI_Test (frame receive)", rc);
        if (!done)
            return HCOMM_OK;
    }
    if (!offer(c, deliver, &st)) {
        m->held = true;
        m->held_st = st;
        return HCOMM_OK;
    }
    m->held = false;
    HCOMM__TRY(post_frame_recv(c, m->rhead));
    m->rhead = (m->rhead + 1) % RECV_DEPTH;
    return HCOMM_OK;
}

/* Tells src that the receive for data_tag is posted; from a staging slot, or a small heap
 * buffer that is left to MPI (freed only if the send completes here) when all slots are busy. */
static hcomm_result_t send_cts(hcomm_comm_t *c, int src, int data_tag) {
    mpi_impl_t *m = impl_of(c);
    wire_t w = {.data_tag = data_tag, .cts = 1};
    MPI_Request *req = NULL, spare = MPI_REQUEST_NULL;
    unsigned char *buf = stage_slot(m, &req);
    void *heap = NULL;
    if (!buf) {
        buf = heap = malloc(sizeof w);
        req = &spare;
        if (!heap)
            return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for a clear-to-send");
    }
    memcpy(buf, &w, sizeof w);
    int rc = MPI_Isend(buf, (int)sizeof w, MPI_BYTE, src, FRAME_TAG, m->comm, req);
    if (rc != MPI_SUCCESS)
        return mpi_fail(c->call_fn, "MPI_Isend (clear-to-send)", rc);
    if (heap) {
        int done = 0;
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done)
            free(heap);
        else
            MPI_Request_free(req); /* heap stays MPI's: a few bytes, only when slots run out */
    }
    return HCOMM_OK;
}

static hcomm_result_t mpi_pull(hcomm_comm_t *c, int src, const hcomm__rndv_t *rv, void *dst,
                               size_t bytes, hcomm__treq_t *treq) {
    mpi_tx_t *rx = (mpi_tx_t *)treq;
    int n = 0;
    HCOMM__TRY(to_int(c->call_fn, "message bytes", bytes, &n));
    rx->frame = rx->data = MPI_REQUEST_NULL;
    rx->heap = NULL;
    rx->awaiting = false;
    int rc = MPI_Irecv(dst, n, MPI_BYTE, src, (int)rv->a, impl_of(c)->comm, &rx->data);
    if (rc != MPI_SUCCESS)
        return mpi_fail(c->call_fn, "MPI_Irecv", rc);
    return send_cts(c, src, (int)rv->a);
}

/* A receive can be cancelled; a started synchronous send cannot be, reliably. */
static bool mpi_cancel(hcomm_comm_t *c, hcomm__treq_t *treq, bool is_tx) {
    mpi_tx_t *r = (mpi_tx_t *)treq;
    if (is_tx) {
        hcomm_result_t res;
        mpi_tx_t *tx = (mpi_tx_t *)treq;
        if (tx->awaiting) { /* MPI never saw the payload: withdrawn, nothing pending */
            mpi_impl_t *m = impl_of(c);
            for (mpi_tx_t **pt = &m->waiting; *pt; pt = &(*pt)->next_wait)
                if (*pt == tx) {
                    *pt = tx->next_wait;
                    break;
                }
            tx->awaiting = false;
            return true;
        }
        if (mpi_test_tx(c, treq, &res))
            return true;
        mark_broken(c, HCOMM_ERR_TIMEOUT, true);
        return false;
    }
    if (r->data != MPI_REQUEST_NULL) {
        MPI_Cancel(&r->data);
        MPI_Wait(&r->data, MPI_STATUS_IGNORE);
    }
    return true;
}

/* --- the lane: one MPI message per lane send, on a tag of its own per sequence number --- */

static int lane_tag(const mpi_impl_t *m, uint32_t key) {
    return m->lane_base + (int)(key & m->lane_mask);
}

static hcomm_result_t mpi_lane_post(hcomm_comm_t *c, int peer, uint32_t key, void *buf,
                                    size_t bytes, bool is_send, hcomm__treq_t *treq) {
    mpi_impl_t *m = impl_of(c);
    mpi_tx_t *r = (mpi_tx_t *)treq;
    /* an empty request before any early return: the caller's cleanup cancels and tests it */
    r->frame = r->data = MPI_REQUEST_NULL;
    r->heap = NULL;
    r->awaiting = false;
    HCOMM__TRY(check_usable(c->call_fn, c));
    int rc = is_send
                 ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, lane_tag(m, key), m->comm, &r->frame)
                 : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, lane_tag(m, key), m->comm, &r->data);
    return rc == MPI_SUCCESS
               ? HCOMM_OK
               : mpi_fail(c->call_fn, is_send ? "MPI_Isend (lane)" : "MPI_Irecv (lane)", rc);
}

static bool mpi_lane_test(hcomm_comm_t *c, hcomm__treq_t *treq, hcomm_result_t *res, size_t *got) {
    mpi_tx_t *r = (mpi_tx_t *)treq;
    bool is_recv = r->data != MPI_REQUEST_NULL;
    MPI_Request *req = is_recv ? &r->data : &r->frame;
    MPI_Status st;
    int done = 1, rc = MPI_SUCCESS, n = 0;
    *res = HCOMM_OK;
    *got = 0;
    if (*req != MPI_REQUEST_NULL)
        rc = MPI_Test(req, &done, &st);
    if (rc != MPI_SUCCESS) {
        *res = mpi_error(c->call_fn, "MPI_Test (lane)", rc);
        return true;
    }
    if (done && is_recv && MPI_Get_count(&st, MPI_BYTE, &n) == MPI_SUCCESS)
        *got = (size_t)n;
    return done;
}

static bool mpi_world_aborted(hcomm_comm_t *c) {
    (void)c;
    return peer_aborted();
}

/* Per world rank, gathered once per launch: a hash of its host name, its process id, and
 * the address of its cross-memory probe word (0: process_vm_readv does not work in it). The same
 * gather carries the digests of the algorithm-selection inputs (core/topo_spec.h): GATHERED words
 * per rank. */
typedef struct node_info {
    uint64_t host;
    uint64_t pid;
    uint64_t cma;
} node_info_t;

enum { NODE_WORDS = 3, GATHERED = NODE_WORDS + HCOMM__SEL_COUNT };
static node_info_t *world_node;
/* Every rank of the world can read every peer on its host (agreed at launch). */
static bool world_cma;
static int world_node_size;

static uint64_t mpi_node_of(hcomm_comm_t *c, int rank) {
    int w = c->world_ranks[rank];
    return world_node && w < world_node_size ? world_node[w].host : 0; /* unknown: one node */
}

static bool mpi_shares_memory(hcomm_comm_t *c, int peer) {
    int a = c->world_ranks[c->rank], b = c->world_ranks[peer];
    if (!world_node || a >= world_node_size || b >= world_node_size)
        return a == b;
    return world_node[a].host == world_node[b].host;
}

/* Every member on this node with cross-memory attach: each rank computes the same answer
 * from the launch's table. */
static bool mpi_peer_read_ok(hcomm_comm_t *c) {
    for (int r = 0; r < c->size; r++) {
        int w = c->world_ranks[r];
        if (!world_cma || !world_node || w >= world_node_size || !mpi_shares_memory(c, r))
            return false;
    }
    return true;
}

/* --- the board (transport.board) --- */

/* Maps peer's board object read-only; NULL when it cannot. */
static void *map_board(hcomm_comm_t *c, int peer, uint32_t id) {
    char name[HCOMM__SHM_NAME_MAX];
    hcomm__shm_name(name, (int)world_node[c->world_ranks[peer]].pid, id);
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0)
        return NULL;
    void *p = mmap(NULL, HCOMM__BOARD_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

static void board_free(hcomm_comm_t *c) {
    mpi_impl_t *m = c->impl;
    if (!m->board)
        return;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && m->board[r])
            munmap(m->board[r], HCOMM__BOARD_BYTES);
    hcomm_mem_free(m->board[c->rank]);
    free(m->board);
    m->board = NULL;
}

/* Every rank's answer to "can all members use the board", as a MIN over the comm. */
static hcomm_result_t board_agree(const char *fn, hcomm_comm_t *c, int *ok) {
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, ok, 1, MPI_INT, MPI_MIN, mcomm(c), &req);
    return rc == MPI_SUCCESS ? wait_setup(fn, "MPI_Iallreduce of the board's state", &req)
                             : mpi_fail(fn, "MPI_Iallreduce", rc);
}

/* A comm whose members share one node gets a board: each rank makes its region in /dev/shm,
 * the ids travel in one all_gather, and each rank maps its peers'. Where any rank cannot, no
 * rank has one (the algorithms then exchange messages instead). */
static hcomm_result_t board_init(const char *fn, hcomm_comm_t *c) {
    mpi_impl_t *m = c->impl;
    bool one_node = c->size > 1 && world_node;
    for (int r = 0; r < c->size && one_node; r++)
        one_node = c->world_ranks[r] < world_node_size && mpi_shares_memory(c, r);
    if (!one_node)
        return HCOMM_OK; /* every member reads the same launch table */
    uint32_t *ids = calloc((size_t)c->size, sizeof *ids);
    m->board = calloc((size_t)c->size, sizeof *m->board);
    if (!ids || !m->board) {
        free(ids);
        free(m->board);
        m->board = NULL;
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for a board of %d ranks", c->size);
    }
    uint64_t off = 0;
    /* HCOMM_NO_BOARD=1 on any rank turns it off for the comm (to compare: architecture.md) */
    const char *no = getenv("HCOMM_NO_BOARD");
    if (!(no && no[0] == '1') &&
        hcomm_mem_alloc(HCOMM__BOARD_BYTES, &m->board[c->rank]) == HCOMM_OK)
        hcomm__mem_shared(m->board[c->rank], HCOMM__BOARD_BYTES, &ids[c->rank], &off);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc =
        MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, ids, 1, MPI_UINT32_T, mcomm(c), &req);
    hcomm_result_t res = rc == MPI_SUCCESS
                             ? wait_setup(fn, "MPI_Iallgather of the board's objects", &req)
                             : mpi_fail(fn, "MPI_Iallgather", rc);
    int ok = ids[c->rank] != 0;
    for (int r = 0; res == HCOMM_OK && ok && r < c->size; r++)
        if (r != c->rank)
            ok = ids[r] != 0 && (m->board[r] = map_board(c, r, ids[r])) != NULL;
    free(ids);
    if (res == HCOMM_OK)
        res = board_agree(fn, c, &ok);
    if (res != HCOMM_OK || !ok)
        board_free(c);
    return res;
}

static hcomm_result_t mpi_usable(hcomm_comm_t *c) {
    return check_usable(c->call_fn, c);
}

static void *mpi_board(hcomm_comm_t *c, int rank) {
    mpi_impl_t *m = c->impl;
    return m->board ? m->board[rank] : NULL;
}

/* One copy between this process and the peer's (Linux cross-memory attach), out of it or
 * into it (write), repeated until every byte moved. */
static hcomm_result_t cross_copy(hcomm_comm_t *c, int peer, void *mine, void *far_at, size_t bytes,
                                 bool write) {
    pid_t pid = (pid_t)world_node[c->world_ranks[peer]].pid;
    size_t done = 0;
    while (done < bytes) {
        struct iovec local = {(char *)mine + done, bytes - done};
        struct iovec far = {(char *)far_at + done, bytes - done};
        ssize_t n = write ? process_vm_writev(pid, &local, 1, &far, 1, 0)
                          : process_vm_readv(pid, &local, 1, &far, 1, 0);
        if (n <= 0)
            return hcomm__err(HCOMM_ERR_BACKEND, c->call_fn,
                              "%s of %zu bytes %s rank %d failed: %s",
                              write ? "process_vm_writev" : "process_vm_readv", bytes - done,
                              write ? "to" : "from", peer,
                              n < 0   ? strerror(errno)
                              : write ? "nothing written"
                                      : "nothing read");
        done += (size_t)n;
    }
    return HCOMM_OK;
}

static hcomm_result_t mpi_peer_read(hcomm_comm_t *c, int peer, const void *remote, void *dst,
                                    size_t bytes) {
    return cross_copy(c, peer, dst, (void *)(uintptr_t)remote, bytes, false);
}

static hcomm_result_t mpi_peer_write(hcomm_comm_t *c, int peer, void *remote, const void *src,
                                     size_t bytes) {
    return cross_copy(c, peer, (void *)(uintptr_t)src, remote, bytes, true);
}

static void mpi_buf_export(hcomm_comm_t *c, const void *p, size_t bytes, hcomm__peer_buf_t *b) {
    (void)c;
    *b = (hcomm__peer_buf_t){.addr = (uint64_t)(uintptr_t)p};
    if (!hcomm__mem_shared(p, bytes, &b->obj, &b->off))
        b->obj = 0;
}

/* A mapping of the peer's hcomm_mem_alloc object, when the buffer lies in one. */
static const void *mpi_buf_view(hcomm_comm_t *c, int peer, const hcomm__peer_buf_t *b,
                                size_t bytes) {
    if (b->obj == 0 || peer == c->rank || !world_node || !mpi_shares_memory(c, peer))
        return NULL;
    return hcomm__shm_view((int)world_node[c->world_ranks[peer]].pid, b->obj, b->off, bytes);
}

static bool mpi_threads_ok(void) {
    int level = MPI_THREAD_SINGLE;
    return MPI_Query_thread(&level) == MPI_SUCCESS && level == MPI_THREAD_MULTIPLE;
}

static hcomm__mem_kind_t mpi_mem_kind(hcomm_comm_t *c, const void *p) {
    (void)c;
    uint32_t obj;
    uint64_t off;
    return hcomm__mem_shared(p, 1, &obj, &off) ? HCOMM__MEM_SHARED : HCOMM__MEM_HOST;
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
    HCOMM__TRY(check_reduction(c->call_fn, c, dt, op));
    HCOMM__TRY(to_int(c->call_fn, "count", count, &n));
    size_t bytes = count * hcomm__dtype_size(dt);
    void *tmp = NULL;
    const void *src = sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
    if (src != MPI_IN_PLACE)
        HCOMM__TRY(detach_send(c->call_fn, &src, bytes, recvbuf, bytes, &tmp));
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(src, recvbuf, n, mpi_dtype(dt), mpi_objs.ops[op], mcomm(c), &req);
    hcomm_result_t r = await_posted(c, c->call_fn, "MPI_Iallreduce", rc, &req);
    if (r == HCOMM_OK || req == MPI_REQUEST_NULL)
        free(tmp); /* a pending request may still read tmp */
    return r;
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
    hcomm_result_t r = await_posted(c, c->call_fn, "MPI_Iallgather", rc, &req);
    if (r == HCOMM_OK || req == MPI_REQUEST_NULL)
        free(tmp);
    return r;
}

static hcomm_result_t mpi_reduce_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                         size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    int n = 0;
    HCOMM__TRY(check_reduction(c->call_fn, c, dt, op));
    HCOMM__TRY(to_int(c->call_fn, "count", count, &n));
    size_t es = hcomm__dtype_size(dt);
    void *tmp = NULL;
    const void *src = sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
    if (src != MPI_IN_PLACE)
        HCOMM__TRY(
            detach_send(c->call_fn, &src, count * es * (size_t)c->size, recvbuf, count * es, &tmp));
    MPI_Request req = MPI_REQUEST_NULL;
    int rc =
        MPI_Ireduce_scatter_block(src, recvbuf, n, mpi_dtype(dt), mpi_objs.ops[op], mcomm(c), &req);
    hcomm_result_t r = await_posted(c, c->call_fn, "MPI_Ireduce_scatter_block", rc, &req);
    if (r == HCOMM_OK || req == MPI_REQUEST_NULL)
        free(tmp);
    return r;
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
    int n = 0;
    HCOMM__TRY(check_reduction(c->call_fn, c, dt, op));
    HCOMM__TRY(to_int(c->call_fn, "count", count, &n));
    bool at_root = c->rank == root;
    size_t bytes = count * hcomm__dtype_size(dt);
    void *tmp = NULL;
    const void *src = at_root && sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
    if (at_root && src != MPI_IN_PLACE)
        HCOMM__TRY(detach_send(c->call_fn, &src, bytes, recvbuf, bytes, &tmp));
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Ireduce(src, recvbuf, n, mpi_dtype(dt), mpi_objs.ops[op], root, mcomm(c), &req);
    hcomm_result_t r = await_posted(c, c->call_fn, "MPI_Ireduce", rc, &req);
    if (r == HCOMM_OK || req == MPI_REQUEST_NULL)
        free(tmp);
    return r;
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
                                      const size_t *rdispls) {
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
    if (!c->counts_agreed) /* else the caller's own exchange proved them */
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

/* The algorithms layer has seen every rank arrive (a signature agreement over p2p) before it
 * calls this, so the blocking MPI_Comm_split cannot hang. */
static hcomm_result_t mpi_split(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out) {
    HCOMM__TRY(check_usable(c->call_fn, c));
    MPI_Comm mc = MPI_COMM_NULL;
    MPI_TRY(c->call_fn, MPI_Comm_split(mcomm(c), color < 0 ? MPI_UNDEFINED : color, key, &mc));
    *out = NULL;
    if (mc == MPI_COMM_NULL)
        return HCOMM_OK;
    return adopt(c->call_fn, mc, c, out);
}

static void mpi_destroy(hcomm_comm_t *c) {
    mpi_impl_t *impl = c->impl;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (impl)
        board_free(c);
    if (impl && !finalized) {
        frames_free(impl);
        if (impl->comm != MPI_COMM_NULL)
            MPI_Comm_free(&impl->comm);
    }
    free(impl);
    c->impl = NULL;
}

static const hcomm__native_ops_t mpi_native = {
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .broadcast = mpi_broadcast,
    .all_to_allv = mpi_all_to_allv,
    .reduce = mpi_reduce,
    .gather = mpi_gather,
    .scatter = mpi_scatter,
};

static const hcomm__transport_t mpi_tr = {
    .name = "mpi",
    .send_frame = mpi_send_frame,
    .test_tx = mpi_test_tx,
    .poll = mpi_poll,
    .pull = mpi_pull,
    .test_rx = mpi_test_tx,
    .cancel = mpi_cancel,
    .lane_post = mpi_lane_post,
    .lane_test = mpi_lane_test,
    .world_aborted = mpi_world_aborted,
    .shares_memory = mpi_shares_memory,
    .peer_read_ok = mpi_peer_read_ok,
    .peer_read = mpi_peer_read,
    .peer_write = mpi_peer_write,
    .views_writable = true,
    .buf_export = mpi_buf_export,
    .buf_view = mpi_buf_view,
    .node_of = mpi_node_of,
    .mem_kind = mpi_mem_kind,
    .threads_ok = mpi_threads_ok,
    .native = &mpi_native,
    .board = mpi_board,
    .usable = mpi_usable,
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

/* A word every rank publishes (its address travels in the launch's gather) so that peers on
 * its host can try a cross-memory read of it. */
static const volatile uint64_t cma_probe = 0x5eedc0ffee5eedull;
/* True when the word at addr in process pid reads as cma_probe's value. */
static bool probe_reads(uint64_t pid, uint64_t addr) {
    uint64_t dst = 0;
    struct iovec local = {&dst, sizeof dst}, far = {(void *)(uintptr_t)addr, sizeof dst};
    return addr && process_vm_readv((pid_t)pid, &local, 1, &far, 1, 0) == (ssize_t)sizeof dst &&
           dst == cma_probe;
}

/* Where this process writes its own memory through process_vm_writev (peer_write: direct
 * reduce writes its blocks into the root's output with it). */
static volatile uint64_t cma_written;

static bool self_writes(void) {
    uint64_t v = cma_probe;
    struct iovec local = {&v, sizeof v}, far = {(void *)(uintptr_t)&cma_written, sizeof v};
    return process_vm_writev(getpid(), &local, 1, &far, 1, 0) == (ssize_t)sizeof v &&
           cma_written == cma_probe;
}

/* The address of cma_probe when this process may read and write its own memory through
 * process_vm_readv and process_vm_writev (a seccomp profile may forbid either), else 0. */
static uint64_t cma_self(void) {
    uint64_t addr = (uint64_t)(uintptr_t)&cma_probe;
    return probe_reads((uint64_t)getpid(), addr) && self_writes() ? addr : 0;
}

/* True when this rank can read the probe of every peer on its host: a ptrace policy (Yama's
 * ptrace_scope=1, the Ubuntu default) may allow reading oneself but not a sibling process. */
static bool cma_reaches_peers(const node_info_t *nodes, int size, int me) {
    for (int r = 0; r < size; r++) {
        if (r == me || nodes[r].host != nodes[me].host)
            continue;
        if (!probe_reads(nodes[r].pid, nodes[r].cma))
            return false;
    }
    return nodes[me].cma != 0;
}

/* world_cma: every rank's verdict, so all of them decide alike (polled, as the gather). */
static hcomm_result_t agree_on_cma(int size, int me) {
    int ok = cma_reaches_peers(world_node, size, me), all = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_TRY("hcomm_launch", MPI_Iallreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &req));
    HCOMM__TRY(wait_setup("hcomm_launch", "MPI_Iallreduce of the cross-memory probes", &req));
    world_cma = all != 0;
    return HCOMM_OK;
}

/* The first rank whose selection input i (HCOMM_ALGO, HCOMM_TOPO, the tuning file, HCOMM_CHECK)
 * differs from rank 0's: every rank runs the same check on the same table, so all fail alike. */
static hcomm_result_t check_selection(const uint64_t *all, int size) {
    for (int i = 0; i < HCOMM__SEL_COUNT; i++)
        for (int r = 1; r < size; r++)
            if (all[(size_t)r * GATHERED + NODE_WORDS + (size_t)i] != all[NODE_WORDS + (size_t)i])
                return hcomm__err(HCOMM_ERR_MISMATCH, "hcomm_launch",
                                  "%s differs between rank 0 and rank %d%s; algorithm selection "
                                  "needs the same on every rank (mpirun -x %s)",
                                  hcomm__selection_var(i), r,
                                  i == HCOMM__SEL_TUNING ? " (the files' contents)" : "",
                                  hcomm__selection_var(i));
    return HCOMM_OK;
}

/* world_node[r]: world rank r's host (a hash of its name), pid and cross-memory attach (polled:
 * a rank that never arrives times out), so shares_memory can tell which peers are on this node
 * and peer_read can reach them. The same gather carries the digests of the algorithm-selection
 * inputs, which every rank must share. */
static hcomm_result_t gather_nodes(int size) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    uint64_t mine[GATHERED];
    mine[0] = hcomm__fnv(host, strlen(host), HCOMM__FNV_SEED);
    mine[1] = (uint64_t)getpid();
    mine[2] = cma_self();
    hcomm__selection_digests(mine + NODE_WORDS);
    free(world_node);
    world_node_size = 0;
    world_node = malloc(sizeof *world_node * (size_t)size);
    uint64_t *all = malloc(sizeof *all * (size_t)size * GATHERED);
    if (!world_node || !all) {
        free(all);
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_launch", "out of memory for %d node ids", size);
    }
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(mine, GATHERED, MPI_UINT64_T, all, GATHERED, MPI_UINT64_T,
                            MPI_COMM_WORLD, &req);
    hcomm_result_t res = rc == MPI_SUCCESS
                             ? wait_setup("hcomm_launch", "MPI_Iallgather of the host names", &req)
                             : mpi_fail("hcomm_launch", "MPI_Iallgather", rc);
    if (res == HCOMM_OK)
        res = check_selection(all, size);
    for (int r = 0; res == HCOMM_OK && r < size; r++)
        world_node[r] = (node_info_t){all[(size_t)r * GATHERED], all[(size_t)r * GATHERED + 1],
                                      all[(size_t)r * GATHERED + 2]};
    free(all);
    if (res == HCOMM_OK)
        world_node_size = size;
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    return res == HCOMM_OK ? agree_on_cma(size, me) : res;
}

/* The world's processes on this rank's host (after gather_nodes). */
static int processes_here(int rank) {
    int n = 0;
    for (int r = 0; r < world_node_size; r++)
        n += world_node[r].host == world_node[rank].host;
    return n;
}

static hcomm_result_t run_world(hcomm_rank_fn_t fn, void *arg, int rank, int size) {
    hcomm_comm_t *world = NULL;
    MPI_Comm ctrl = MPI_COMM_NULL;
    HCOMM__TRY(gather_nodes(size));
    HCOMM__TRY(hcomm__topo_spec_env_fits("hcomm_launch", size)); /* the same text everywhere now */
    int here = processes_here(rank);
    HCOMM__TRY(dup_comm("hcomm_launch", MPI_COMM_WORLD, &world));
    world->is_world = true;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &ctrl);
    if (rc != MPI_SUCCESS) {
        hcomm__comm_free(world);
        return mpi_fail("hcomm_launch", "MPI_Comm_dup", rc);
    }
    MPI_Comm_set_errhandler(ctrl, MPI_ERRORS_RETURN);
    abort_comm = ctrl;
    hcomm__ranks_here(1, here);
    hcomm_result_t r = fn(world, arg);
    hcomm__ranks_here(-1, -here);
    abort_comm = MPI_COMM_NULL;
    r = agree(ctrl, r, rank, size);
    MPI_Comm_free(&ctrl);
    hcomm__comm_free(world);
    hcomm__shm_views_drop(); /* every peer has left: their objects may go now */
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
                          "nranks=%d but the MPI job has %d process%s (pass 0 to use the MPI "
                          "world size, or start the job with mpirun -np %d)",
                          nranks, size, size == 1 ? "" : "es", nranks);
    return run_world(fn, arg, rank, size);
}
