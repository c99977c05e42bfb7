/**
 * @file core.h
 * @brief hcomm core: result codes, errors, dtypes, tensor descriptors, communicators
 *        (groups) and launching a world of ranks.
 *
 * Every public function returns ::hcomm_result_t. On failure it also records a
 * per-thread message naming the function, the argument and its bad value; read it
 * with hcomm_last_error(). Strings returned by hcomm_strerror() and hcomm_last_error()
 * are the only non-result returns in the API.
 *
 * Ranks and threads: functions that do not communicate (result names, dtypes, tensor
 * descriptors, comm_rank/size/members/backend) are local to the calling rank and thread-safe.
 * Communicating calls on one communicator must be made one at a time (by one thread of each
 * rank); distinct communicators may be used from distinct threads (mpi: see hcomm/mpi.h).
 */
#ifndef HCOMM_C_CORE_H_
#define HCOMM_C_CORE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(HCOMM_C_BUILDING) && defined(__GNUC__)
#define HCOMM_API __attribute__((visibility("default")))
#else
#define HCOMM_API
#endif

/** X-macro table of result codes: (name, value, text). One table makes the enum,
 *  hcomm_strerror() and hcomm_result_name() so they never drift apart. */
#define HCOMM_RESULT_TABLE(X)                                                                      \
    X(HCOMM_OK, 0, "success")                                                                      \
    X(HCOMM_ERR_NULL, 1, "a required pointer argument is NULL")                                    \
    X(HCOMM_ERR_INVALID_ARG, 2, "an argument has an invalid value")                                \
    X(HCOMM_ERR_DTYPE, 3, "unsupported or mismatched dtype")                                       \
    X(HCOMM_ERR_SHAPE, 4, "invalid or mismatched tensor shape")                                    \
    X(HCOMM_ERR_GROUP, 5, "wrong group, or rank not a member of the group")                        \
    X(HCOMM_ERR_MISMATCH, 6, "peers disagree (message size, shape, dtype or call)")                \
    X(HCOMM_ERR_STATE, 7, "call not valid in the current state")                                   \
    X(HCOMM_ERR_NOMEM, 8, "out of memory")                                                         \
    X(HCOMM_ERR_BACKEND, 9, "the backend failed or is not available")                              \
    X(HCOMM_ERR_TIMEOUT, 10, "timed out waiting for peers")                                        \
    X(HCOMM_ERR_ABORTED, 11, "aborted because another rank failed")                                \
    X(HCOMM_ERR_UNSUPPORTED, 12, "not supported by this build or backend")                         \
    X(HCOMM_ERR_IO, 13, "input/output error")                                                      \
    X(HCOMM_ERR_INTERNAL, 14, "internal error")                                                    \
    X(HCOMM_ERR_PEER, 15, "a peer's checks failed in this call; nothing moved, the group works")   \
    X(HCOMM_ERR_PEER_LOST, 16, "a member of the group was lost (its process or thread stopped)")   \
    X(HCOMM_ERR_REVOKED, 17, "the communicator was revoked (hcomm_comm_revoke)")

/** Result of every hcomm call; HCOMM_OK (0) is success. */
typedef enum hcomm_result {
#define HCOMM_C_RESULT_ENUM_(name, value, text) name = value,
    HCOMM_RESULT_TABLE(HCOMM_C_RESULT_ENUM_)
#undef HCOMM_C_RESULT_ENUM_
        HCOMM_RESULT_COUNT
} hcomm_result_t;

/** Text of a result code; never NULL ("unknown result" for out-of-range values). Thread-safe. */
HCOMM_API const char *hcomm_strerror(hcomm_result_t r);
/** Name of a result code, e.g. "HCOMM_ERR_SHAPE". Thread-safe. */
HCOMM_API const char *hcomm_result_name(hcomm_result_t r);
/** Message of the last failed hcomm call on this thread ("" if none), e.g.
 *  "hcomm_tp_all_gather: dim=2 out of range for ndim=2". Valid until the next failing
 *  call on the same thread. Thread-safe (per-thread storage). */
HCOMM_API const char *hcomm_last_error(void);

/** Element types. Sizes in bytes: f32 4, f64 8, f16 2, bf16 2, i8 1, u8 1, i32 4, i64 8. */
typedef enum hcomm_dtype {
    HCOMM_F32 = 0,
    HCOMM_F64,
    HCOMM_F16,
    HCOMM_BF16,
    HCOMM_I8,
    HCOMM_U8,
    HCOMM_I32,
    HCOMM_I64,
    HCOMM_DTYPE_COUNT
} hcomm_dtype_t;

/** Reduction operators (all commutative). AVG is SUM divided by the group size; for integer
 *  dtypes that is the SUM in the dtype's own wrap-around arithmetic, then an integer division
 *  truncating toward zero (as NCCL's ncclAvg: exact while the sum fits the dtype; 3 ranks' i8
 *  AVG of 100 is (300 mod 256 = 44) / 3 = 14). f16/bf16 SUM, PROD and AVG accumulate
 *  in f32 and round once, AVG dividing before the rounding, so an f16 mean never overflows
 *  (3 ranks' f16 AVG of 40000 is 40000). bf16 has f32's range: its AVG, like f32's, is inf
 *  where the sum passes the f32 range (3 ranks' AVG of 3e38), whatever the mean. MAX and MIN of
 * floats are NaN when any rank's element is NaN. Where two NaNs meet in a SUM, PROD or AVG, which
 * sign and payload the NaN result carries is not specified (IEEE 754 leaves it open) and may differ
 * between algorithms, deterministic mode included. */
typedef enum hcomm_op {
    HCOMM_SUM = 0,
    HCOMM_PROD,
    HCOMM_MAX,
    HCOMM_MIN,
    HCOMM_AVG,
    HCOMM_OP_COUNT
} hcomm_op_t;

/** Most dims a tensor descriptor holds. */
#define HCOMM_MAX_DIMS 8

/** A contiguous row-major tensor in host memory. hcomm never owns @c data.
 *  Elements = product of shape[0..ndim-1] (1 for ndim 0, a scalar); any extent may be 0. */
typedef struct hcomm_tensor {
    void *data;                    /**< first element; may be NULL only if it has 0 elements */
    hcomm_dtype_t dtype;           /**< element type */
    int ndim;                      /**< 0..HCOMM_MAX_DIMS */
    int64_t shape[HCOMM_MAX_DIMS]; /**< extents, outermost first; each >= 0 */
} hcomm_tensor_t;

/** Size of one element of @p dtype in bytes, in @p *bytes. Local, thread-safe.
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_DTYPE. */
HCOMM_API hcomm_result_t hcomm_dtype_size(hcomm_dtype_t dtype, size_t *bytes);
/** Name ("f32", "bf16", ...) of @p dtype in @p *name (a static string). Local, thread-safe.
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_DTYPE. */
HCOMM_API hcomm_result_t hcomm_dtype_name(hcomm_dtype_t dtype, const char **name);
/** Fills @p t as a tensor over @p data with @p ndim extents (elements, not bytes) from
 *  @p shape[0..ndim-1]; @p data is not checked here. Local, thread-safe.
 *  Errors: HCOMM_ERR_NULL (@p t, or @p shape with ndim > 0), HCOMM_ERR_DTYPE, HCOMM_ERR_SHAPE
 *  (ndim out of 0..8, negative extent). */
HCOMM_API hcomm_result_t hcomm_tensor_init(hcomm_tensor_t *t, void *data, hcomm_dtype_t dtype,
                                           int ndim, const int64_t *shape);
/** Number of elements (not bytes) of @p t in @p *count. Local, thread-safe.
 *  Errors: HCOMM_ERR_NULL (also data NULL with elements), HCOMM_ERR_DTYPE, HCOMM_ERR_SHAPE
 *  (ndim out of range, negative extent, size overflow). */
HCOMM_API hcomm_result_t hcomm_tensor_numel(const hcomm_tensor_t *t, size_t *count);

/** A communicator: an ordered group of ranks with its own message space. Opaque. */
typedef struct hcomm_comm hcomm_comm_t;

/** This rank's index in @p comm (0..size-1). Errors: HCOMM_ERR_NULL. Thread-safe. */
HCOMM_API hcomm_result_t hcomm_comm_rank(const hcomm_comm_t *comm, int *rank);
/** Number of ranks in @p comm. Errors: HCOMM_ERR_NULL. Thread-safe. */
HCOMM_API hcomm_result_t hcomm_comm_size(const hcomm_comm_t *comm, int *size);
/** Members of @p comm as world ranks, in member order, into @p ranks[0..size-1] (int; @p cap
 *  is its capacity in entries). Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (cap < size).
 *  Thread-safe. */
HCOMM_API hcomm_result_t hcomm_comm_members(const hcomm_comm_t *comm, int *ranks, int cap);
/** Name of the backend @p comm runs on ("local" or "mpi"). Errors: HCOMM_ERR_NULL.
 *  Thread-safe. */
HCOMM_API hcomm_result_t hcomm_comm_backend(const hcomm_comm_t *comm, const char **name);

/** Splits @p comm like MPI_Comm_split: ranks with equal @p color form one new communicator,
 *  ordered by (@p key, old rank). color < 0 gives *out = NULL. Collective: every rank of
 *  @p comm must call it. Errors: HCOMM_ERR_NULL, HCOMM_ERR_MISMATCH (a peer is in another
 *  collective), HCOMM_ERR_NOMEM, HCOMM_ERR_TIMEOUT, HCOMM_ERR_ABORTED, HCOMM_ERR_BACKEND. */
HCOMM_API hcomm_result_t hcomm_comm_split(hcomm_comm_t *comm, int color, int key,
                                          hcomm_comm_t **out);
/** Frees @p comm (NULL is a no-op). Collective over @p comm; no call may be in flight on it.
 *  Not for the world communicator handed to a rank function, nor for groups owned by a
 *  domain context. Errors: HCOMM_ERR_STATE (world communicator). */
HCOMM_API hcomm_result_t hcomm_comm_destroy(hcomm_comm_t *comm);
/** Makes every pending and later communicating call on @p comm fail at once with
 *  HCOMM_ERR_ABORTED (for example from a watchdog thread when a peer is known dead), its
 *  pending nonblocking collectives included (their hcomm_wait() returns it). The
 *  communicator stays unusable; destroy it. Peers' calls on it then fail with HCOMM_ERR_PEER
 *  naming the abort, once this rank has made or is in a call on it (a local collective that
 *  had passed its meeting completes first: no rank returns while a peer reads its buffers; a
 *  split or a call's first nonblocking collective whose agreement every rank has reached makes
 *  its communicator first, as the peers do, and only the calls after it fail). Local
 *  to the calling rank; the one hcomm call that may be made on a communicator from another
 *  thread while the owning thread is inside a call. Errors: HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_comm_abort(hcomm_comm_t *comm);
/** Sets how long any wait on @p comm may last, in seconds (> 0, at most 1e9), before
 *  HCOMM_ERR_TIMEOUT; overrides HCOMM_TIMEOUT for this communicator and the ones split from it
 *  afterwards. Local to the calling rank; not thread-safe with calls on @p comm.
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (seconds out of range or NaN). */
HCOMM_API hcomm_result_t hcomm_comm_set_timeout(hcomm_comm_t *comm, double seconds);
/** Allocates @p bytes of host memory for communication buffers into @p *ptr (page-aligned),
 *  freed with hcomm_mem_free(). The memory is a POSIX shared-memory object where /dev/shm can
 *  hold it (else private memory, silently). On the mpi backend, processes on one node then map
 *  each other's buffers and the one-node algorithms (twoshot, direct) load from them with no
 *  copy at all, and twoshot's all_reduce stores each rank's block of the result straight into
 *  its peers' outputs when every rank's output comes from here; a buffer from anywhere else is
 *  read with Linux cross-memory attach (process_vm_readv, one copy, about half the speed here). Any
 * buffer works with every call, and both kinds may be mixed across ranks. A peer keeps its mapping
 * of this buffer after a call, for the next; hcomm_mem_free() unlinks the object and a peer unmaps
 * it at its next call that maps a new buffer (or within a second of calls), so the memory goes back
 * then. The object does not outlive the process: what is still allocated at exit (or when hcomm
 *  aborts an MPI job) is unlinked then, and the objects of a process killed by a signal are
 *  unlinked by the next hcomm process on the node at its first hcomm_mem_alloc.
 *  Local, thread-safe.
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_NOMEM. */
HCOMM_API hcomm_result_t hcomm_mem_alloc(size_t bytes, void **ptr);
/** Frees memory from hcomm_mem_alloc() (NULL is a no-op). Local, thread-safe.
 *  Errors: HCOMM_ERR_INVALID_ARG (@p ptr did not come from hcomm_mem_alloc). */
HCOMM_API hcomm_result_t hcomm_mem_free(void *ptr);
/** Blocks until every rank of @p comm has called it. Collective. Errors: HCOMM_ERR_NULL,
 *  HCOMM_ERR_MISMATCH (a peer is in another collective), HCOMM_ERR_NOMEM, HCOMM_ERR_TIMEOUT,
 *  HCOMM_ERR_ABORTED, HCOMM_ERR_BACKEND. */
HCOMM_API hcomm_result_t hcomm_barrier(hcomm_comm_t *comm);

/** @name Raw collectives
 * Raw collectives. Algorithms (docs/architecture.md): on the local backend a one-copy direct
 * (mesh) scheme over shared memory (each rank reduces 1/n of the buffer reading every peer's
 * input in rank order, then every rank copies the n reduced chunks: a reduce_scatter +
 * all_gather as in Thakur, Rabenseifner & Gropp 2005, with the transfers done as direct
 * loads), which gives on every rank the bits of a serial left-to-right reduction; on the mpi
 * backend with every rank on one host small calls run shm (each rank copies its part into its
 * region of a shared-memory board the communicator made at creation, meets its peers there and
 * reads theirs, as Open MPI's coll/sm does; reductions in rank order, so the serial bits too),
 * larger ones twoshot or direct (peers' buffers loaded directly when they come from
 * hcomm_mem_alloc, else read with cross-memory attach; a broadcast's private root buffer goes
 * through the board instead when more than two ranks would read it); across hosts small calls run
 * hcomm's own recursive doubling, halving or binomial tree over its p2p layer (Thakur et al. 2005;
 * the extra ranks of a non-power-of-two group folded in first), all_to_allv pairwise or Bruck, and
 * the rest Open MPI's non-blocking collectives (polled, so they time out) with hcomm's reduction
 * kernels as user ops: the table of sizes is in docs/architecture.md, and the cost model picks on
 * declared multi-node topologies. HCOMM_ALGO or hcomm_comm_set_algo() may choose other algorithms
 * of hcomm's over its p2p layer (ring, recursive halving-doubling, naive, binomial tree; see
 * hcomm_comm_set_algo). Every rank gets identical bits; the association may differ between backends
 * and algorithms (the ops are commutative).
 *
 * Checks: every rank must make the same call (collective, count, dtype, op with SUM and AVG
 * told apart, root; DP tensor lists too); otherwise every rank fails with HCOMM_ERR_MISMATCH
 * and one wording, e.g. "hcomm_all_reduce: count=8 on rank 0 but count=5 on rank 1". The check
 * rides in shared memory where the ranks share a host (the local backend's slots; on mpi the
 * board, where every checked call meets first: a few hundred ns with 2 processes, about 5 us
 * with 4 sharing 2 cores, and part of the data exchange itself for shm) or in the call's own
 * messages (mpi across hosts: recursive doubling and the two-rank exchanges); before an Open
 * MPI collective across hosts it is a small signature exchange. The environment variable
 * HCOMM_CHECK controls the check before Open MPI collectives: always (default), first (the
 * first call of each signature per communicator), off (none: a mismatch then shows as MPI's
 * error, wrong data or a timeout; shm's meetings still compare signatures).
 *
 * Each collective below is called by every rank of the communicator, in the same order, even
 * with a zero size (buffers may then be NULL). Buffers are host memory. A rank whose argument
 * check fails still joins the call: it returns its own error, its peers HCOMM_ERR_PEER naming it
 * and its message, nothing moves and the communicator stays usable. Input and output buffers
 * either are the documented in-place form or share no byte (a partial overlap is
 * HCOMM_ERR_INVALID_ARG).
 *
 * Buffers: a buffer of a reduction (all_reduce, reduce_scatter(v), reduce, and the tensors of
 * tp, dp and moe calls) must be aligned to its dtype's element size (a float to 4 bytes; u8
 * and i8 to nothing), else HCOMM_ERR_INVALID_ARG naming the argument: the reduction kernels
 * load typed elements. Moves (all_gather(v), broadcast, gather, scatter, all_to_allv, p2p)
 * take any address. No buffer may span more than 2^47 bytes (128 TiB, the user address space
 * of 64-bit Linux on x86-64 and AArch64; half the address space on 32-bit machines): a size,
 * count*ranks or an all_to_allv block's displacement+count beyond that is
 * HCOMM_ERR_INVALID_ARG ("bytes=... is larger than any buffer can be") before any pointer is
 * formed from it. Counts above INT_MAX work on both backends wherever hcomm's own algorithms
 * run, which is every collective on one host (tested: a u8 all_reduce of 2^31+5 elements,
 * in place, on 2 ranks: test_big_count); Open MPI's own collectives take int counts, so where
 * one of them would run (across hosts at large sizes, or HCOMM_ALGO=native) a count or byte
 * size above INT_MAX fails with HCOMM_ERR_UNSUPPORTED instead.
 *
 * On the mpi backend a communicator whose Open MPI collective timed out, was aborted or
 * failed inside MPI stays unusable: later calls on it return that same error.
 * Common errors of the five: HCOMM_ERR_NULL (comm; a buffer with a nonzero size),
 * HCOMM_ERR_INVALID_ARG (partial overlap), HCOMM_ERR_MISMATCH, HCOMM_ERR_PEER, HCOMM_ERR_NOMEM,
 * HCOMM_ERR_TIMEOUT (the message names the call, the peer awaited, channel, tag and sequence
 * number; each rank prints its last calls, see HCOMM_TRACE_FILE, and with HCOMM_DUMP_DIR set
 * writes them as JSON for hcomm-doctor, as after ABORTED, PEER and MISMATCH), HCOMM_ERR_ABORTED,
 * HCOMM_ERR_UNSUPPORTED, HCOMM_ERR_BACKEND; more are listed per function.
 * Thread-safe for distinct comms.
 * @{ */

/** all_reduce: @p recvbuf[0..count) = @p op over ranks of @p sendbuf[0..count), on every rank;
 *  @p count is in elements (not bytes) of @p dtype. sendbuf == recvbuf is in place.
 *  All ranks pass the same count, dtype and op. Errors: the common ones, HCOMM_ERR_DTYPE,
 *  HCOMM_ERR_INVALID_ARG (op). */
HCOMM_API hcomm_result_t hcomm_all_reduce(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, hcomm_dtype_t dtype, hcomm_op_t op);
/** broadcast: @p bytes bytes at @p buf on rank @p root (a rank in @p comm) are copied to
 *  @p buf on every rank. All ranks pass the same bytes and root. Errors: the common ones,
 *  HCOMM_ERR_INVALID_ARG (root outside 0..size-1). */
HCOMM_API hcomm_result_t hcomm_broadcast(hcomm_comm_t *comm, void *buf, size_t bytes, int root);
/** all_gather: each rank contributes @p bytes bytes (the same on every rank) from @p sendbuf;
 *  @p recvbuf gets size*bytes bytes, rank r's block at byte offset r*bytes. In place when
 *  sendbuf == recvbuf + rank*bytes; otherwise the buffers must not overlap.
 *  Errors: the common ones. */
HCOMM_API hcomm_result_t hcomm_all_gather(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t bytes);

/** reduce_scatter: @p sendbuf holds size blocks of @p recvcount elements (not bytes) of
 *  @p dtype; rank r gets block r reduced with @p op over all ranks in @p recvbuf[0..recvcount).
 *  In place when sendbuf == recvbuf (the result lands at the start of the buffer) or when
 *  recvbuf is this rank's block (sendbuf + rank*recvcount elements). All ranks pass the same
 *  recvcount, dtype and op. Errors: the common ones, HCOMM_ERR_DTYPE, HCOMM_ERR_INVALID_ARG
 *  (op). */
HCOMM_API hcomm_result_t hcomm_reduce_scatter(hcomm_comm_t *comm, const void *sendbuf,
                                              void *recvbuf, size_t recvcount, hcomm_dtype_t dtype,
                                              hcomm_op_t op);
/** all_to_allv with per-peer sizes, in bytes (as MPI_Alltoallv over MPI_BYTE): the four arrays
 *  have size entries each; rank r sends sendcounts[p] bytes from sendbuf + sdispls[p] to each
 *  p and receives recvcounts[p] bytes into recvbuf + rdispls[p]. Every rank calls it. Send and
 *  receive ranges must not overlap (in place is not supported: HCOMM_ERR_INVALID_ARG).
 *  Counts of any size (zero, not aligned) and any displacements. recvcounts[p] on r must equal
 *  sendcounts[r] on p, else HCOMM_ERR_MISMATCH on every rank before any data moves, naming the
 *  lowest such pair: "sendcounts[1]=8 on rank 0 but recvcounts[0]=5 on rank 1" (with
 *  HCOMM_CHECK=off and a forced hcomm algorithm, on the two ranks of the pair, whose block is
 *  not written, the others completing). Not thread-safe per communicator.
 *  Algorithms (HCOMM_ALGO "alltoallv:NAME" or "alltoall:NAME", hcomm_comm_set_algo):
 *  `pairwise` (step s to rank+s, from rank-s: Thakur, Rabenseifner & Gropp 2005, as MPICH and
 *  Open MPI), `bruck` for tiny blocks (Bruck et al. 1997, ceil(log2 p) steps, block sizes in
 *  the messages), `direct` (ranks on one node read their blocks from the senders' buffers: one
 *  copy per byte), `hier` (two levels: one inter-node message per pair of nodes through each
 *  node's leader), `shm` (one board meeting on one host; below) and `native` (the backend's).
 *  The default: native on the local backend; under mpi with every rank on one host shm,
 *  checked or not: one meeting in which every rank posts its counts (and its blocks, where
 *  they fit: 8 KiB with 2 processes, about 64 KiB with more) checks every pair before any data
 *  moves, larger blocks are then read from the senders' buffers (or, for private buffers read
 *  by several peers, go through Open MPI's call). Across hosts by the largest block of any
 *  pair, learnt in the signature agreement: pairwise for small blocks, bruck for tiny ones from
 *  8 processes, then native, or the cost model on a declared topology (docs/architecture.md);
 *  two ranks there agree in one message each way that also carries blocks up to about 3.9 KiB
 *  (then the call is one exchange), also under HCOMM_CHECK=off. Errors: the common ones (NULL also
 * for any count array). A nonempty block whose count or displacement exceeds INT_MAX (Open MPI's
 * call takes ints; an empty block's displacement is never used) makes every rank run pairwise
 * instead of the mpi native call, learnt in the agreement; where only native is allowed every rank
 * fails with HCOMM_ERR_UNSUPPORTED (with HCOMM_CHECK=off and native forced, only the ranks holding
 *  such a block do, and their peers wait for HCOMM_TIMEOUT). */
HCOMM_API hcomm_result_t hcomm_all_to_allv(hcomm_comm_t *comm, const void *sendbuf,
                                           const size_t *sendcounts, const size_t *sdispls,
                                           void *recvbuf, const size_t *recvcounts,
                                           const size_t *rdispls);

/** A pending nonblocking collective. Opaque. */
typedef struct hcomm_request hcomm_request_t;
/** @} */

/** @name Nonblocking collectives
 * Nonblocking collectives: the same contract, checks and results as the blocking calls above,
 * issued without waiting. Every rank issues the same sequence on a communicator; operations
 * run in issue order (several may be in flight) on a worker thread that hcomm starts for the
 * communicator at its first nonblocking call and owns, so the caller's thread keeps computing
 * and needs no progress calls (on MPI without MPI_THREAD_MULTIPLE they run at once instead).
 * That first call sets the worker up collectively: it returns once every rank has made it
 * (later calls return at once), so issue one early (e.g. at setup) where overlap matters.
 * Buffers must stay untouched until the request completes. *req gets the request: complete it
 * with hcomm_wait() or hcomm_test(). A rank whose argument check fails still issues its part
 * (its peers' request then fails with HCOMM_ERR_PEER) and gets its own error from the request.
 * A NULL req is HCOMM_ERR_NULL at issue, returned once this rank's failure has joined its
 * peers' operation (they get HCOMM_ERR_PEER), so no peer waits for a call that never comes.
 * Errors at issue: HCOMM_ERR_NULL (comm, req), HCOMM_ERR_NOMEM, HCOMM_ERR_BACKEND (no worker);
 * at completion: those of the blocking call.
 * @{ */

/** Nonblocking hcomm_all_reduce(). */
HCOMM_API hcomm_result_t hcomm_iall_reduce(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, hcomm_dtype_t dtype, hcomm_op_t op,
                                           hcomm_request_t **req);
/** Nonblocking hcomm_all_gather() (@p bytes per rank). */
HCOMM_API hcomm_result_t hcomm_iall_gather(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           size_t bytes, hcomm_request_t **req);
/** Nonblocking hcomm_reduce_scatter(). */
HCOMM_API hcomm_result_t hcomm_ireduce_scatter(hcomm_comm_t *comm, const void *sendbuf,
                                               void *recvbuf, size_t recvcount, hcomm_dtype_t dtype,
                                               hcomm_op_t op, hcomm_request_t **req);
/** Nonblocking hcomm_broadcast(): @p buf must stay untouched on every rank until the request
 *  completes. Collective, in issue order. Errors at issue: HCOMM_ERR_NULL (comm, req),
 *  HCOMM_ERR_NOMEM; at completion: hcomm_broadcast()'s (root outside the group included). */
HCOMM_API hcomm_result_t hcomm_ibroadcast(hcomm_comm_t *comm, void *buf, size_t bytes, int root,
                                          hcomm_request_t **req);
/** Nonblocking hcomm_reduce() (below): recvbuf is written on the root only. Collective, in
 *  issue order. Errors at issue: HCOMM_ERR_NULL (comm, req), HCOMM_ERR_NOMEM; at completion:
 *  hcomm_reduce()'s. */
HCOMM_API hcomm_result_t hcomm_ireduce(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                       size_t count, hcomm_dtype_t dtype, hcomm_op_t op, int root,
                                       hcomm_request_t **req);
/** Nonblocking hcomm_all_to_allv(): the four count arrays are copied at issue (the caller may
 *  reuse them at once); the buffers must stay untouched until the request completes. A count
 *  mismatch between a pair fails every rank's request with HCOMM_ERR_MISMATCH. Collective, in
 *  issue order. Errors at issue: HCOMM_ERR_NULL (comm, req), HCOMM_ERR_NOMEM; at completion:
 *  hcomm_all_to_allv()'s. */
HCOMM_API hcomm_result_t hcomm_iall_to_allv(hcomm_comm_t *comm, const void *sendbuf,
                                            const size_t *sendcounts, const size_t *sdispls,
                                            void *recvbuf, const size_t *recvcounts,
                                            const size_t *rdispls, hcomm_request_t **req);
/** Blocks until @p req completed, frees it and returns its result. Call from the thread that
 *  issued it. Errors: HCOMM_ERR_NULL, the collective's. */
HCOMM_API hcomm_result_t hcomm_wait(hcomm_request_t *req);
/** *done = 1 when @p req completed; it is then freed (as MPI_Test) and its result returned.
 *  Call from the thread that issued it. Errors: HCOMM_ERR_NULL, the collective's. */
HCOMM_API hcomm_result_t hcomm_test(hcomm_request_t *req, int *done);
/** @} */

/** @name Rooted and variable-size collectives
 * Rooted and variable-size collectives (docs/architecture.md). reduce runs up a binomial tree
 * (Thakur, Rabenseifner & Gropp 2005, section 4) or, where ranks can read each other's memory,
 * by the root's direct reads of every input in rank order (by default from 4 KiB on mpi and
 * on local with 2 ranks, 128 KiB with 3 or 4, 256 KiB with more), or as Rabenseifner's
 * reduce_scatter + gather (hcomm_comm_set_algo "reduce:rhd"); gather and scatter with the root
 * exchanging with each rank directly on local (or down a binomial tree: "tree") and as Open MPI's
 * own on mpi across hosts; on mpi on one host the small ones (reduce up to 4 KiB with 2 processes,
 * 64 KiB with more; gather up to 1 KiB or 32 KiB; scatter up to 1 KiB or 64 KiB) run shm through
 * the communicator's board, and larger gathers and scatters copy each
 * block once from the buffer it lies in (direct reads of hcomm_mem_alloc buffers, else cross-memory
 * attach). all_gatherv and reduce_scatterv run as the local backend's own (each rank copies, or
 * reduces in rank order, straight from the posted inputs), on mpi on one host through the board
 * (shm), above 8 KiB with 2 processes (all_gatherv; 4 KiB with HCOMM_CHECK=off) or 16 KiB
 * (reduce_scatterv), 128 KiB or 64 KiB with more, directly: one copy of each block from its
 * owner's input, or each rank reducing its block of every input in rank order; across hosts
 * around a ring (Patarasuk & Yuan 2009). The common rules
 * and errors above apply (every rank calls, same order; a rank whose check fails makes its peers
 * fail with HCOMM_ERR_PEER); f16/bf16 SUM, PROD and AVG are accumulated in f32 and rounded once.
 * Operands associate differently in different algorithms (the ops are commutative); every rank that
 * gets a result gets the same bits.
 * @{ */

/** reduce: @p recvbuf[0..count) on rank @p root = @p op over ranks of @p sendbuf[0..count);
 *  @p count in elements of @p dtype. recvbuf is used on the root only (may be NULL elsewhere);
 *  sendbuf == recvbuf on the root is in place. All ranks pass the same count, dtype, op and
 *  root. Errors: the common ones, HCOMM_ERR_DTYPE, HCOMM_ERR_INVALID_ARG (op; root outside
 *  0..size-1). */
HCOMM_API hcomm_result_t hcomm_reduce(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                      size_t count, hcomm_dtype_t dtype, hcomm_op_t op, int root);
/** gather: each rank's @p bytes bytes at @p sendbuf land on rank @p root at byte offset
 *  rank*bytes of @p recvbuf (size*bytes bytes, used on the root only). In place on the root
 *  when sendbuf == recvbuf + root*bytes. All ranks pass the same bytes and root.
 *  Errors: the common ones, HCOMM_ERR_INVALID_ARG (root). */
HCOMM_API hcomm_result_t hcomm_gather(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                      size_t bytes, int root);
/** scatter: the root's @p sendbuf holds size blocks of @p bytes bytes (used on the root only);
 *  rank r gets block r in @p recvbuf. In place on the root when recvbuf == sendbuf +
 *  root*bytes. All ranks pass the same bytes and root. Errors: the common ones,
 *  HCOMM_ERR_INVALID_ARG (root). */
HCOMM_API hcomm_result_t hcomm_scatter(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                       size_t bytes, int root);
/** all_gatherv: rank r contributes @p bytes[r] bytes from @p sendbuf; @p recvbuf gets every
 *  block in rank order, rank r's at byte offset bytes[0] + ... + bytes[r-1] (no gaps). @p bytes
 *  has size entries, the same on every rank (else HCOMM_ERR_MISMATCH). In place when sendbuf is
 *  this rank's block of recvbuf. Errors: the common ones (NULL also for bytes). */
HCOMM_API hcomm_result_t hcomm_all_gatherv(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           const size_t *bytes);
/** reduce_scatterv: @p sendbuf holds sum(@p counts) elements of @p dtype, block r (counts[r]
 *  elements) starting at counts[0] + ... + counts[r-1]; rank r gets block r reduced with @p op
 *  over all ranks in @p recvbuf[0..counts[r]). @p counts has size entries, the same on every
 *  rank. In place when recvbuf is sendbuf or this rank's block of it. Errors: the common ones,
 *  HCOMM_ERR_DTYPE, HCOMM_ERR_INVALID_ARG (op), HCOMM_ERR_NULL (counts). */
HCOMM_API hcomm_result_t hcomm_reduce_scatterv(hcomm_comm_t *comm, const void *sendbuf,
                                               void *recvbuf, const size_t *counts,
                                               hcomm_dtype_t dtype, hcomm_op_t op);
/** Narrows which algorithms this rank's collectives on @p comm may use, in the syntax of the
 *  environment variable HCOMM_ALGO (which it overrides for this communicator): entries separated
 *  by ';', each "[collective:][^]name[,name...]" allowing (or with '^' excluding) algorithms,
 *  e.g. "allreduce:ring;allgather:^ring". Collectives: allreduce, allgather, reducescatter,
 *  broadcast, reduce, gather, scatter, allgatherv, reducescatterv, alltoallv (also spelled
 *  alltoall; see hcomm_all_to_allv). Algorithms: native (the backend's own), rd (recursive
 *  doubling; all_gather(v) on a group that is not a power of two runs Bruck; broadcast merges what
 *  partners hold; reduce_scatter is an all_reduce of the whole vector, for small vectors), ring,
 *  rhd (recursive halving-doubling; reduce_scatter(v) by recursive halving; reduce as that
 *  halving then a gather to the root), naive (reduce to rank 0 in rank order, then broadcast:
 *  the deterministic reference), tree (binomial: broadcast, reduce, gather, scatter), direct
 *  (gather, scatter; on one node all_gather, reduce_scatter(v), broadcast, reduce, and on mpi
 *  gather and scatter, by reads of the peers' buffers), hier (two levels over the nodes of
 * hcomm/topo.h: allreduce, allgather, reducescatter, alltoallv), twoshot (allreduce), bruck
 * (all_gather(v) and all_to_allv, Bruck et al. 1997), chain (pipelined broadcast),
 * scatter_allgather (broadcast as binomial scatter + ring all_gather, van de Geijn), pairwise
 * (alltoallv), shm (allreduce, allgather, reducescatter, broadcast, reduce, gather, scatter through
 * the mpi backend's shared-memory board on one host; elsewhere the local backend's native, which
 * works alike, or recursive doubling, ring, tree or direct). native of reduce, gather and scatter
 * is Open MPI's (on local: tree and direct). Where a communicator spans several nodes the allowed
 * algorithm with the smallest cost-model estimate runs (docs/architecture.md, "Cost model");
 * elsewhere the measured defaults, except that on a board (mpi on one host), within 2x of a
 * size where shm hands over to another algorithm, a communicator's first 18 calls of each size
 * (16 sizes at most) alternate between the two in runs of 3 (the first run of each untimed)
 * and every rank then keeps the one whose slowest rank was faster: this host's placement of
 * the processes decides which leads there. @p spec replaces HCOMM_ALGO for this communicator
 * as a whole: a collective it does not name runs its default choice. NULL or "" restores the
 * default choice (HCOMM_ALGO's, where set).
 * Every rank must choose the same (the algorithm is part of each call's signature: else
 * HCOMM_ERR_MISMATCH). Local; not thread-safe with calls on @p comm. Errors: HCOMM_ERR_NULL,
 * HCOMM_ERR_INVALID_ARG (an unknown name, listing the valid ones; a collective left without an
 * algorithm). */
HCOMM_API hcomm_result_t hcomm_comm_set_algo(hcomm_comm_t *comm, const char *spec);
/** Turns deterministic mode on (@p on = 1) or off (0) for this rank's reductions on @p comm
 *  (all_reduce, reduce_scatter, reduce, reduce_scatterv, and the TP/DP primitives built on
 *  them) and for the communicators split from it afterwards; the default is the environment
 *  variable HCOMM_DETERMINISTIC (0 or 1, read when a world is created). In this mode every
 *  algorithm gives the bits of the serial reduction in rank order, (((x0 op x1) op x2) ...),
 *  whatever algorithm HCOMM_ALGO or hcomm_comm_set_algo() picks, however the data is chunked
 *  and wherever an element sits: f16/bf16 accumulate in f32 and round once, f32 and f64 in
 *  their own precision, AVG divides the sum by the group size (before rounding for f16/bf16);
 *  integers are exact anyway. Design (docs/architecture.md): the owner of each block receives
 *  every rank's contribution to it and reduces them in rank order (a reduce_scatter that gathers
 *  instead of passing partial sums), then the blocks travel by the chosen algorithm's
 *  all_gather (ring: ring, rhd: recursive doubling or Bruck); rd gathers every rank's vector
 *  (Bruck) and reduces all of it locally; naive and reduce go to the root in rank order. Cost
 *  against the non-deterministic forms: the same bytes on the wire for ring and rhd (each rank
 *  sends (p-1)/p of the vector in the reduce phase) but p-1 messages at once instead of p-1 or
 *  log2 p steps, scratch of one segment per peer, and the reduction of a block serialised on its
 *  owner; rd moves p times the data (small messages only). The local backend's native
 *  collectives, shm, twoshot and direct reduce_scatter and reduce already reduce in rank order
 *  and run unchanged. Every rank of a
 *  call must use the same mode (it is part of the call's signature: else HCOMM_ERR_MISMATCH,
 *  "deterministic=1 on rank 0 but deterministic=0 on rank 1", where the call is checked). Local;
 * not thread-safe with calls on @p comm. Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (@p on
 * neither 0 nor 1). */
HCOMM_API hcomm_result_t hcomm_comm_set_deterministic(hcomm_comm_t *comm, int on);

/** A rank's body for hcomm_launch(): called once per rank, on that rank's thread (local) or
 *  process (mpi), with that rank's world communicator and the launch's @p arg; its result is
 *  the rank's result. */
typedef hcomm_result_t (*hcomm_rank_fn_t)(hcomm_comm_t *world, void *arg);

/** The backend hcomm_launch(@p backend, ...) would run, in *@p chosen (a static string), without
 *  launching: @p backend if not NULL, else HCOMM_BACKEND if set, else "mpi" when the process
 *  was started by mpirun or srun as part of a job of more than one process (Open MPI's
 *  OMPI_COMM_WORLD_SIZE, MPICH's PMI_SIZE, PMIx's PMIX_RANK, Slurm's SLURM_STEP_NUM_TASKS),
 *  else "local". With HCOMM_LOG_LEVEL=info the choice and its reason are logged.
 *  Local, thread-safe. Errors: HCOMM_ERR_NULL (chosen), HCOMM_ERR_INVALID_ARG: torchrun's
 *  RANK, WORLD_SIZE (> 1) and LOCAL_RANK without MPI (hcomm cannot join a torchrun job: launch
 *  with mpirun, or use the local backend), or "local" inside an MPI job of more than one
 *  process unless HCOMM_BACKEND=local says so explicitly. An unknown name is returned as it is
 *  (hcomm_launch rejects it). */
HCOMM_API hcomm_result_t hcomm_launch_backend(const char *backend, const char **chosen);

/** Runs @p fn on every rank of a new world and returns when all have returned.
 *
 *  @p backend: "local" (ranks are @p nranks threads of this process, sharing memory), "mpi"
 *  (this process is one rank of the job mpirun/srun started; @p nranks must be 0 or equal
 *  the MPI world size; MPI is initialized if needed and finalized at exit), or NULL to read
 *  the environment variable HCOMM_BACKEND, and without it to detect the launcher as
 *  hcomm_launch_backend() does (mpi under mpirun/srun with more than one process, else local).
 *  Result: local: HCOMM_OK if every rank returned HCOMM_OK, else the lowest failing rank's
 *  result (a rank's own error before HCOMM_ERR_ABORTED), its message prefixed "rank r failed";
 *  mpi: this process's rank result, or HCOMM_ERR_ABORTED if it succeeded and another failed.
 *  When a rank's function fails, peers waiting on it get HCOMM_ERR_ABORTED (both backends)
 *  instead of hanging; any wait longer than HCOMM_TIMEOUT seconds (env, default 300) fails
 *  with HCOMM_ERR_TIMEOUT (with HCOMM_DUMP_DIR=DIR each failed rank writes its flight recorder
 *  into DIR; hcomm-doctor DIR names the rank behind). Called by the program's main thread (for mpi,
 * the thread that initializes MPI), one world at a time; worlds can be launched repeatedly. Not
 * thread-safe. Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (those of hcomm_launch_backend,
 * unknown backend, nranks < 1 or > 4096 for local, nranks != MPI size or < 0), HCOMM_ERR_STATE
 * (mpi: a world is already running in this process, or MPI is finalized), HCOMM_ERR_NOMEM,
 * HCOMM_ERR_UNSUPPORTED (built without MPI), HCOMM_ERR_BACKEND, or a rank's result as above. */
HCOMM_API hcomm_result_t hcomm_launch(const char *backend, int nranks, hcomm_rank_fn_t fn,
                                      void *arg);
/** @} */

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_CORE_H_ */
