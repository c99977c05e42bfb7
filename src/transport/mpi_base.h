/* Private to the mpi transport: a communicator's state and the helpers every part of the
 * transport uses. Its files form a stack; each calls only files listed before it:
 *   mpi_base.c    MPI's errors in hcomm's words, and the polled wait every request ends in
 *   mpi_ring.c    frame rings in the board regions of members on one node
 *   mpi_frames.c  frames (sends, posted receives, rendezvous) and the lane
 *   mpi_peer.c    which ranks share a node, peer memory (cross-memory attach, views), the board
 *   mpi_coll.c    the native collectives (Open MPI's nonblocking ones, polled)
 *   mpi_launch.c  the MPI session, communicator creation and split, launch, and the
 *                 transport's table (hcomm__transport_t), which names every part
 * The parts call only mpi_base.c and this header; mpi_launch.c calls them all. */
#ifndef HCOMM_C_MPI_BASE_H_
#define HCOMM_C_MPI_BASE_H_

#include "transport/transport.h"

#include <limits.h>
#include <mpi.h>
#include <stdatomic.h>

/* Abort notices travel on the launch's control communicator with this tag. */
#define ABORT_TAG 1
/* Frame receives posted ahead; staging slots for small eager frames, and their bytes. */
#define RECV_DEPTH 4
#define STAGE_SLOTS 64
#define STAGE_BYTES 512
/* Frame rings (mpi_ring.c): bytes of one ring, and the most members a comm with rings has (each
 * member's region then holds one ring per peer past its board). */
#define HCOMM__RING_BYTES ((size_t)32 << 10)
#define HCOMM__RING_MAX_RANKS 16

typedef struct mpi_ring mpi_ring_t;

typedef struct mpi_impl {
    MPI_Comm comm;
    /* HCOMM_OK, or why the comm is unusable: a collective or send that timed out or was
     * aborted stays pending inside MPI (MPI cannot cancel it), so the next call on this comm
     * would match the wrong operation. */
    hcomm_result_t broken;
    /* Frames: RECV_DEPTH receives posted ahead (any source, FRAME_TAG), completed in posting
     * order so frames of one source stay in order; a frame the p2p layer refused stays held. */
    MPI_Request rreq[RECV_DEPTH];
    unsigned char *rbuf[RECV_DEPTH];
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
    mpi_ring_t *ring;       /* frames through shared memory (a board of few members), or NULL */
    bool adopted;           /* its setup finished here: destroy says goodbye to each peer */
    bool cma;     /* every member reads its host's members by cross-memory attach (agreed) */
    bool wrapped; /* hcomm_comm_wrap_mpi's outside a launch: counted among ranks needing a core */
} mpi_impl_t;

/* The running launch's control communicator (MPI_COMM_NULL outside a launch). */
extern MPI_Comm hcomm__mpi_abort_comm;
/* Set when a request had to be abandoned: MPI_Finalize could then hang, so exit aborts. */
extern atomic_bool hcomm__mpi_poisoned;

/* --- errors (mpi_base.c) --- */

/* "call failed: MPI's text" as HCOMM_ERR_BACKEND. */
hcomm_result_t hcomm__mpi_fail(const char *fn, const char *call, int rc);
/* As hcomm__mpi_fail, but a message longer than its receive buffer (MPI_ERR_TRUNCATE) means
 * the ranks disagreed on a size: HCOMM_ERR_MISMATCH. */
hcomm_result_t hcomm__mpi_error(const char *fn, const char *call, int rc);
/* The error of a call on a comm marked broken with why. */
hcomm_result_t hcomm__mpi_unusable(const char *fn, hcomm_result_t why);

#define MPI_TRY(fn, call)                                                                          \
    do {                                                                                           \
        int mpi_rc_ = (call);                                                                      \
        if (mpi_rc_ != MPI_SUCCESS)                                                                \
            return hcomm__mpi_fail(fn, #call, mpi_rc_);                                            \
    } while (0)

static inline hcomm_result_t to_int(const char *fn, const char *what, size_t v, int *out) {
    if (v > INT_MAX)
        return hcomm__err(HCOMM_ERR_UNSUPPORTED, fn,
                          "%s=%zu exceeds INT_MAX, the most one MPI call can take", what, v);
    *out = (int)v;
    return HCOMM_OK;
}

static inline mpi_impl_t *impl_of(hcomm_comm_t *c) {
    return (mpi_impl_t *)c->impl;
}

static inline MPI_Comm mcomm(const hcomm_comm_t *c) {
    return ((const mpi_impl_t *)c->impl)->comm;
}

/* poisoned: an operation stays pending inside MPI (see hcomm__mpi_poisoned). */
static inline void mark_broken(hcomm_comm_t *c, hcomm_result_t why, bool poisoned) {
    ((mpi_impl_t *)c->impl)->broken = why;
    if (poisoned)
        hcomm__mpi_poisoned = true;
}

static inline hcomm_result_t check_usable(const char *fn, const hcomm_comm_t *c) {
    hcomm_result_t why = ((const mpi_impl_t *)c->impl)->broken;
    return why == HCOMM_OK ? HCOMM_OK : hcomm__mpi_unusable(fn, why);
}

/* --- polled waits (mpi_base.c) --- */

/* True once a peer's abort notice arrived on the launch's control communicator. */
bool hcomm__mpi_peer_aborted(void);
/* Completes a request of setup work (no comm yet: the environment's timeout applies). */
hcomm_result_t hcomm__mpi_wait_setup(const char *fn, const char *what, MPI_Request *req);
/* Completes a request of c's own setup (c's members and settings are known): a member lost
 * meanwhile ends it, as in the calls on c. */
hcomm_result_t hcomm__mpi_wait_making(hcomm_comm_t *c, const char *fn, const char *what,
                                      MPI_Request *req);
/* Completes a collective request; on timeout or abort it stays pending in MPI, so the comm is
 * marked unusable. A collective that failed inside MPI may have left peers half way through
 * it (Open MPI abandons the rest of a failed schedule), so that comm is unusable too. */
hcomm_result_t hcomm__mpi_wait_request(hcomm_comm_t *c, const char *fn, const char *what,
                                       MPI_Request *req);

/* Completes a collective just posted; rc is what posting it returned. */
static inline hcomm_result_t await_posted(hcomm_comm_t *c, const char *fn, const char *what, int rc,
                                          MPI_Request *req) {
    return rc == MPI_SUCCESS ? hcomm__mpi_wait_request(c, fn, what, req)
                             : hcomm__mpi_error(fn, what, rc);
}

/* --- frame rings (mpi_ring.c) --- */

/* Bytes past HCOMM__BOARD_BYTES that a board region of size members holds for rings (0: none). */
size_t hcomm__mpi_ring_bytes(int size);
/* Once a board is mapped (regions of HCOMM__BOARD_BYTES + hcomm__mpi_ring_bytes): the comm's
 * rings; this rank sends through them when largest_frame (bytes) fits one. Frees them. */
hcomm_result_t hcomm__mpi_ring_init(const char *fn, hcomm_comm_t *c, size_t largest_frame);
void hcomm__mpi_ring_free(mpi_impl_t *m);
/* Writes one frame (the n parts in order) into the ring to peer; false when the frame must go
 * through MPI instead (no rings, no room, or frames sent through MPI not yet taken), and then
 * hcomm__mpi_ring_spill counts it just before it goes. */
bool hcomm__mpi_ring_put(mpi_impl_t *m, int peer, const void *const *part, const size_t *part_len,
                         int n);
void hcomm__mpi_ring_spill(mpi_impl_t *m, int peer);
/* The oldest frame from the next source in turn that has one (*src, *len bytes; valid until
 * consumed), or NULL; consume takes it off its ring. */
const void *hcomm__mpi_ring_peek(mpi_impl_t *m, int *src, size_t *len);
void hcomm__mpi_ring_consume(mpi_impl_t *m, int src, size_t len);
/* Whether src's ring to this rank holds a frame: one that came before any of src's frames
 * waiting in MPI, so it goes first. took counts a frame from src taken off MPI. */
bool hcomm__mpi_ring_holds(mpi_impl_t *m, int src);
void hcomm__mpi_ring_took(mpi_impl_t *m, int src);
/* True on most polls of a comm with rings while no peer's frame waits in MPI: the frame
 * receives through MPI are then tested on one poll in 16 only. */
bool hcomm__mpi_ring_skip_mpi(mpi_impl_t *m);

/* --- frames and the lane (mpi_frames.c) --- */

/* Posts a new comm's frame receives (after its MPI communicator is set); frees them. */
hcomm_result_t hcomm__mpi_frames_init(const char *fn, hcomm_comm_t *c);
void hcomm__mpi_frames_free(mpi_impl_t *m);
/* Before MPI_Comm_free: Open MPI gives a freed comm's context id to the next comm it makes,
 * and a message still in flight on the old one (a failure notice nobody waited for, a lane
 * message of a failed call) is then delivered there. So every member sends each peer a
 * goodbye and drops whatever arrives until it has every peer's (messages of one sender arrive
 * in order). False when some goodbye did not come within limit seconds: then the MPI comm
 * must stay allocated, its id unused. */
bool hcomm__mpi_frames_drain(hcomm_comm_t *c, double limit);
/* The transport's entries of the same names (transport.h). */
hcomm_result_t hcomm__mpi_send_frame(hcomm_comm_t *c, int peer, const void *hdr,
                                     const void *payload, size_t bytes, bool rndv,
                                     hcomm__treq_t *treq);
bool hcomm__mpi_test_tx(hcomm_comm_t *c, hcomm__treq_t *treq, hcomm_result_t *res);
hcomm_result_t hcomm__mpi_poll(hcomm_comm_t *c, hcomm__deliver_fn_t deliver);
hcomm_result_t hcomm__mpi_pull(hcomm_comm_t *c, int src, const hcomm__rndv_t *rv, void *dst,
                               size_t bytes, hcomm__treq_t *treq);
bool hcomm__mpi_cancel(hcomm_comm_t *c, hcomm__treq_t *treq, bool is_tx);
hcomm_result_t hcomm__mpi_lane_post(hcomm_comm_t *c, int peer, uint32_t key, void *buf,
                                    size_t bytes, bool is_send, hcomm__treq_t *treq);
bool hcomm__mpi_lane_test(hcomm_comm_t *c, hcomm__treq_t *treq, hcomm_result_t *res, size_t *got);

/* --- nodes, peer memory and the board (mpi_peer.c) --- */

/* The launch's table of the world's ranks (mpi_launch.c gathers it): room for size rows, emptied
 * (false: out of memory); then the rows, each a host hash, process id and probe address
 * (hcomm__mpi_cma_self) at all[r * stride]. */
bool hcomm__mpi_nodes_reset(int size);
void hcomm__mpi_nodes_set(const uint64_t *all, size_t stride, int size);
/* The world's processes on world rank rank's host. */
int hcomm__mpi_processes_here(int rank);
/* The address of a probe word when this process may read and write its own memory through
 * process_vm_readv and process_vm_writev (a seccomp profile may forbid either), else 0. */
uint64_t hcomm__mpi_cma_self(void);
/* Whether every rank of the world can read every peer on its host, agreed over
 * MPI_COMM_WORLD (polled) once the table is filled; the launch's comms keep the answer
 * (hcomm__mpi_world_cma) and peer_read_ok gives it. */
hcomm_result_t hcomm__mpi_cma_agree(int size, int me);
bool hcomm__mpi_world_cma(void);
/* Outside a launch (hcomm_comm_wrap_mpi): the rows of comm's members, gathered over comm
 * (polled), join the table, so a wrapped comm finds its node and board as a launched one;
 * *cma is the members' agreed cross-memory verdict, *here the members on this host. */
hcomm_result_t hcomm__mpi_nodes_learn(const char *fn, MPI_Comm comm, bool *cma, int *here);
/* Maps a board for a new comm whose members share one node (else none); unmaps it. */
hcomm_result_t hcomm__mpi_board_init(const char *fn, hcomm_comm_t *c);
void hcomm__mpi_board_free(hcomm_comm_t *c);
/* The transport's entries of the same names (transport.h). */
uint64_t hcomm__mpi_node_of(hcomm_comm_t *c, int rank);
bool hcomm__mpi_shares_memory(hcomm_comm_t *c, int peer);
bool hcomm__mpi_peer_read_ok(hcomm_comm_t *c);
hcomm_result_t hcomm__mpi_peer_read(hcomm_comm_t *c, int peer, const void *remote, void *dst,
                                    size_t bytes);
hcomm_result_t hcomm__mpi_peer_write(hcomm_comm_t *c, int peer, void *remote, const void *src,
                                     size_t bytes);
void hcomm__mpi_buf_export(hcomm_comm_t *c, const void *p, size_t bytes, hcomm__peer_buf_t *b);
const void *hcomm__mpi_buf_view(hcomm_comm_t *c, int peer, const hcomm__peer_buf_t *b,
                                size_t bytes);
hcomm__mem_kind_t hcomm__mpi_mem_kind(hcomm_comm_t *c, const void *p);
void *hcomm__mpi_board(hcomm_comm_t *c, int rank);
/* transport.lost, lost_scan and ft_slot: a member on this host whose process is gone (checked
 * at most every HCOMM_FAILURE_DETECT / 10 s), and its slot in its board region. */
bool hcomm__mpi_lost(hcomm_comm_t *c, int rank);
void hcomm__mpi_lost_scan(hcomm_comm_t *c);
hcomm__ft_slot_t *hcomm__mpi_ft_slot(hcomm_comm_t *c, int rank);
/* A process of the world was found lost (its abandoned operations then wait on it alone). */
bool hcomm__mpi_any_lost(void);

/* --- native collectives (mpi_coll.c) --- */

/* Creates the datatypes and reduction ops the collectives use, once per MPI session (freed
 * when MPI is finalized). */
hcomm_result_t hcomm__mpi_objects_create(const char *fn);
extern const hcomm__native_ops_t hcomm__mpi_native;

#endif /* HCOMM_C_MPI_BASE_H_ */
