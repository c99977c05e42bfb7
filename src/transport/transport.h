/* The transport: the one thing each backend writes. It moves frames (a fixed-size header that
 * the p2p layer fills, plus a payload) between the ranks of a communicator, and optionally runs
 * native collectives. Everything else (matching, tags, channels, checks, algorithms) lives
 * above it and is written once for every backend; see docs/architecture.md.
 *
 * A frame is sent eager (the payload travels with the header; the send completes at once) or
 * rendezvous (the header carries a handle; the payload stays in the sender's buffer until the
 * receiver pulls it straight into its destination, and the send completes then). Frames from
 * one source arrive in the order they were sent. Buffers are host memory today; a device
 * transport (NCCL, HCCL) reports HCOMM__MEM_DEVICE from mem_kind and moves frames as group
 * calls on a stream, so it adds a transport, not a new interface (docs/architecture.md).
 *
 * Threading: one thread drives a communicator at a time (the rank that owns it); only
 * hcomm_comm_abort() touches a communicator from another thread, through its atomic flag. */
#ifndef HCOMM_C_TRANSPORT_H_
#define HCOMM_C_TRANSPORT_H_

#include "core/internal.h"

#include <stdatomic.h>

/* Bytes of the header the p2p layer puts in every frame (its envelope). */
#define HCOMM__HDR_BYTES 128

/* The most bytes one lane message holds (see hcomm__transport_t.lane_post): small enough that
 * the backends send it eagerly (Open MPI's shared-memory eager limit is 4 KiB with its own
 * header inside), so a lane send completes without its receive. */
#define HCOMM__LANE_MAX 4032

/* A board (transport.board): each member's region of shared memory, where the p2p layer's
 * meetings post signatures and small payloads (p2p.h). HCOMM__BOARD_ROOM payload bytes per
 * half; the region holds two halves and their headers. */
#define HCOMM__BOARD_ROOM (64u << 10)
#define HCOMM__BOARD_BYTES (2 * HCOMM__BOARD_ROOM + 4096)
/* Where a member's hcomm__ft_slot_t lies in its board region: the last line of the head,
 * which the p2p layer's meetings leave alone. */
#define HCOMM__BOARD_FT_AT (4096 - 64)

/* Opaque per-operation state a transport keeps inside the caller's request. */
typedef union hcomm__treq {
    uint64_t u[48];
    void *p[1];
} hcomm__treq_t;

/* What a receiver needs to pull a rendezvous payload; filled by the sending transport. */
typedef struct hcomm__rndv {
    uint64_t a, b;
} hcomm__rndv_t;

typedef enum { HCOMM__MEM_HOST = 0, HCOMM__MEM_SHARED, HCOMM__MEM_DEVICE } hcomm__mem_kind_t;

/* A buffer as a peer on this node sees it (transport.buf_export): its address in the owner,
 * and where it lies in a shared object the peer may map (obj 0: none). 24 bytes, no pointers,
 * so it travels in messages as it is. */
typedef struct hcomm__peer_buf {
    uint64_t addr;
    uint64_t off;
    uint32_t obj;
    uint32_t reserved;
} hcomm__peer_buf_t;

/* Called by poll for each arrived frame, per source in send order. payload is the eager data
 * (valid during the call) or NULL with rv set for a rendezvous frame. Returns false to leave
 * the frame with the transport (it is offered again on a later poll, before any later frame). */
typedef bool (*hcomm__deliver_fn_t)(hcomm_comm_t *c, int src, const void *hdr, const void *payload,
                                    size_t bytes, const hcomm__rndv_t *rv);

/* Native collectives: same contracts as the public calls in hcomm/core.h (op is never AVG),
 * called only after the algorithms layer checked the call on every rank. */
typedef struct hcomm__native_ops {
    hcomm_result_t (*all_reduce)(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op);
    hcomm_result_t (*all_gather)(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                 size_t bytes_per_rank);
    hcomm_result_t (*reduce_scatter)(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                     size_t count, hcomm_dtype_t dt, hcomm_op_t op);
    hcomm_result_t (*broadcast)(hcomm_comm_t *c, void *buf, size_t bytes, int root);
    /* counts_proved: the caller's earlier exchange proved every pair's counts (MoE's count
     * exchange), so the transport may skip its own count check. */
    hcomm_result_t (*all_to_allv)(hcomm_comm_t *c, const void *sendbuf, const size_t *sendcounts,
                                  const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                  const size_t *rdispls, bool counts_proved);
    /* The rooted calls as hcomm_reduce, hcomm_gather and hcomm_scatter define them (op never
     * AVG; f16/bf16 sums arrive widened to f32). */
    hcomm_result_t (*reduce)(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                             hcomm_dtype_t dt, hcomm_op_t op, int root);
    hcomm_result_t (*gather)(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes,
                             int root);
    hcomm_result_t (*scatter)(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes,
                              int root);
    /* The v calls as hcomm_all_gatherv and hcomm_reduce_scatterv define them (op as reduce's);
     * NULL where the transport has none. */
    hcomm_result_t (*all_gatherv)(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                  const size_t *bytes);
    hcomm_result_t (*reduce_scatterv)(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
} hcomm__native_ops_t;

/* A shared-memory transport checks calls itself: each rank posts its call's signature next to
 * its buffers, so a collective there needs no signature message at all. */
typedef struct hcomm__posted_sig {
    uint64_t words[5];       /* the algorithms layer's signature, compared word by word */
    hcomm_result_t failed;   /* HCOMM_OK, or why this rank's own checks failed */
    const char *failed_text; /* its message, valid until the call returns */
} hcomm__posted_sig_t;

/* A member's slot for the agreements that must survive lost members (transport/ft.c): one
 * cache line of shared memory its owner writes and every member reads, still readable after
 * the owner died. value and aux by the parity of round: a member posts round k + 1 only after
 * reading every post of round k, so a slower member still finds round k's. */
typedef struct hcomm__ft_slot {
    _Alignas(64) _Atomic uint64_t round; /* the last round posted, stored last (release) */
    uint64_t value[2];
    uint64_t aux[2];
} hcomm__ft_slot_t;

typedef struct hcomm__transport {
    const char *name;
    /* Sends one frame to peer; hdr has HCOMM__HDR_BYTES. rndv: payload stays in place until
     * pulled. tx must stay alive (not moved) until test_tx reports it complete. */
    hcomm_result_t (*send_frame)(hcomm_comm_t *c, int peer, const void *hdr, const void *payload,
                                 size_t bytes, bool rndv, hcomm__treq_t *tx);
    /* Non-blocking: true when tx completed (*res tells how). */
    bool (*test_tx)(hcomm_comm_t *c, hcomm__treq_t *tx, hcomm_result_t *res);
    /* Delivers arrived frames; fails only when the transport itself broke. */
    hcomm_result_t (*poll)(hcomm_comm_t *c, hcomm__deliver_fn_t deliver);
    /* Starts copying the rendezvous payload of a delivered frame into dst (bytes of it). */
    hcomm_result_t (*pull)(hcomm_comm_t *c, int src, const hcomm__rndv_t *rv, void *dst,
                           size_t bytes, hcomm__treq_t *rx);
    /* pull takes dst NULL: the send completes and nothing is copied (local). A message nobody
     * keeps is then dropped without a sink of its size, which out of memory may not give. */
    bool pull_discards;
    bool (*test_rx)(hcomm_comm_t *c, hcomm__treq_t *rx, hcomm_result_t *res);
    /* Gives up a pending tx or rx (abort, timeout): afterwards the transport never touches its
     * buffer. Returns false when that cannot be promised (the communicator is then unusable). */
    bool (*cancel)(hcomm_comm_t *c, hcomm__treq_t *r, bool is_tx);
    /* True once the world is going down (a rank function failed). */
    bool (*world_aborted)(hcomm_comm_t *c);
    /* Optional: this rank found hcomm_comm_abort() called on c; ends the peers' waits on c
     * that run outside the p2p layer (the local transport's native collectives). */
    void (*abort_group)(hcomm_comm_t *c);
    /* True when peer shares this rank's memory (threads, or processes on one node). */
    bool (*shares_memory)(hcomm_comm_t *c, int peer);
    /* An id of the host that rank runs on (equal ids: one node); NULL: every rank on one. */
    uint64_t (*node_of)(hcomm_comm_t *c, int rank);
    hcomm__mem_kind_t (*mem_kind)(hcomm_comm_t *c, const void *p);
    /* Optional (NULL when absent): one-copy reads of a peer's memory on this node. peer_read_ok
     * is true when every member of c can read every other's (all ranks of c get the same
     * answer); peer_read then copies bytes at remote, an address in peer's memory, into dst.
     * local: the ranks share one address space; mpi: Linux cross-memory attach
     * (process_vm_readv) between processes on one host. */
    bool (*peer_read_ok)(hcomm_comm_t *c);
    hcomm_result_t (*peer_read)(hcomm_comm_t *c, int peer, const void *remote, void *dst,
                                size_t bytes);
    /* Optional with peer_read: loads straight from a peer's memory. buf_export describes
     * [p, p + bytes) of this rank's memory for its peers; buf_view returns where this rank can
     * load [b->addr, b->addr + bytes) of peer's memory itself, valid while the peer stays in
     * the call, or NULL (then copy it with peer_read). local: the address itself; mpi: a
     * mapping of the peer's hcomm_mem_alloc buffer (zero copies), NULL for other memory. */
    void (*buf_export)(hcomm_comm_t *c, const void *p, size_t bytes, hcomm__peer_buf_t *b);
    const void *(*buf_view)(hcomm_comm_t *c, int peer, const hcomm__peer_buf_t *b, size_t bytes);
    /* True when buf_view's answer may be written too (local: the ranks are threads of one
     * process, so a view is the peer's memory itself; mpi: peers' hcomm_mem_alloc objects are
     * mapped for reading and writing). */
    bool views_writable;
    /* Optional: copies bytes from src into remote, an address in peer's memory, where no view
     * of it could be had (mpi: process_vm_writev). */
    hcomm_result_t (*peer_write)(hcomm_comm_t *c, int peer, void *remote, const void *src,
                                 size_t bytes);
    /* True when distinct communicators may be driven from distinct threads at once (the
     * nonblocking collectives then run on a worker thread of their own). */
    bool (*threads_ok)(void);
    /* Optional (NULL when absent): a lane for the small messages of hcomm's latency-bound
     * collectives (recursive doubling, the signature agreement before a native call), matched
     * by the backend itself on (peer, key) without a frame header or p2p matching, so one
     * exchange costs what the backend's own send and receive cost. key is the call's sequence
     * number; messages of one (peer, key) stay in order; a message holds at most
     * HCOMM__LANE_MAX bytes. lane_post starts a send of bytes from buf, or a receive of up to
     * bytes into buf, in r; lane_test reports completion and, for a receive, *got bytes. cancel
     * gives a lane request up as it does a frame's (is_tx: a send). */
    hcomm_result_t (*lane_post)(hcomm_comm_t *c, int peer, uint32_t key, void *buf, size_t bytes,
                                bool is_send, hcomm__treq_t *r);
    bool (*lane_test)(hcomm_comm_t *c, hcomm__treq_t *r, hcomm_result_t *res, size_t *got);
    /* Native collectives; NULL entries are not offered. */
    const hcomm__native_ops_t *native;
    /* Optional (NULL when absent): rank's region of c's board, HCOMM__BOARD_BYTES of shared
     * memory each member mapped when c was created (zeroed then), writable for c->rank and
     * read-only for the others; NULL on every member when c has none. mpi: every member on
     * one node, each region an object in /dev/shm that its owner made and the peers map. */
    void *(*board)(hcomm_comm_t *c, int rank);
    /* Optional (NULL: nothing is ever found lost): true when member rank of c is known to
     * have stopped for good (local: its thread called hcomm_fault_stop; mpi: its process on
     * this host is gone). Never true for a live rank, however slow. Cheap: a backend that
     * has to ask the system does so at most every HCOMM_FAILURE_DETECT / 10 seconds. */
    bool (*lost)(hcomm_comm_t *c, int rank);
    /* Optional with lost (NULL: lost is always current): looks at the members now, whatever
     * the HCOMM_FAILURE_DETECT rate, so that an error a loss caused names it. */
    void (*lost_scan)(hcomm_comm_t *c);
    /* Optional (NULL: no agreement survives a lost member): rank's slot (hcomm__ft_slot_t),
     * shared memory that every member of c reads. local: in the group's shared state; mpi: in
     * the member's board region (members on one host only). */
    hcomm__ft_slot_t *(*ft_slot)(hcomm_comm_t *c, int rank);
    /* Optional with ft_slot: the communicator of members[0..n) of c (ascending, this rank one
     * of them), collective over those members only. token: what members[0] published (its
     * subset_token), the same on every member. */
    uint64_t (*subset_token)(hcomm_comm_t *c, int n, uint64_t round);
    hcomm_result_t (*subset)(hcomm_comm_t *c, const int *members, int n, uint64_t token,
                             hcomm_comm_t **out);
    /* Optional: this rank stops for good, as a crash would (hcomm_fault_stop). local: marked
     * lost, the thread waits until every other rank's function returned; mpi: SIGKILL. */
    hcomm_result_t (*stop)(hcomm_comm_t *c);
    /* Optional: HCOMM_OK, or the error every later call on c returns (a comm the backend
     * cannot use any more); checked where a call would not reach the backend otherwise. */
    hcomm_result_t (*usable)(hcomm_comm_t *c);
    /* Shared-memory call check (NULL entries when the transport has none). Before a native
     * collective the algorithms layer sets c->posted; the collective posts it with its buffers
     * and, after its first barrier, returns HCOMM_ERR_MISMATCH without moving data when any
     * rank's posted signature differs from rank 0's or says it failed. The caller then reads
     * every rank's with posted_sig and calls posted_release (all ranks do). posted_only is the
     * same meeting without a collective: a rank whose own checks failed joins its peers' call
     * through it, and hcomm_barrier is one. */
    hcomm_result_t (*posted_only)(hcomm_comm_t *c);
    const hcomm__posted_sig_t *(*posted_sig)(hcomm_comm_t *c, int rank);
    hcomm_result_t (*posted_release)(hcomm_comm_t *c);
    /* Optional: a duplicate of c (as split with one color and key = rank) whose wait ends
     * when a member is lost. */
    hcomm_result_t (*dup)(hcomm_comm_t *c, hcomm_comm_t **out);
    /* As MPI_Comm_split; color < 0 gives *out = NULL. Fills the new comm's world_ranks. */
    hcomm_result_t (*split)(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out);
    /* Frees c->impl and whatever the transport owns; the caller frees c itself. */
    void (*destroy)(hcomm_comm_t *c);
} hcomm__transport_t;

/* State an upper layer keeps per communicator, created on first use, freed with the comm. */
typedef enum {
    HCOMM__LAYER_P2P,
    HCOMM__LAYER_ALGO,
    HCOMM__LAYER_TOPO,
    HCOMM__LAYER_PRIMS,
    HCOMM__LAYER_MOE,    /* MoE scratch (the primitives layer's pool) */
    HCOMM__LAYER_BOARD,  /* meetings on the transport's board (the p2p layer) */
    HCOMM__LAYER_DOMAIN, /* the context built on it (the domain layer) */
    HCOMM__LAYER_ASYNC,  /* freed first: its worker drives a duplicate of the comm */
    HCOMM__LAYER_COUNT
} hcomm__layer_t;

struct hcomm_comm {
    const hcomm__transport_t *tr;
    void *impl;            /* transport state */
    int rank, size;        /* this rank's index, members */
    int *world_ranks;      /* [size] members as world ranks, malloc'ed */
    bool is_world;         /* the communicator handed to a rank function; not destroyable */
    double timeout_s;      /* any wait on this comm fails after this long (HCOMM_TIMEOUT) */
    size_t eager_limit;    /* HCOMM_EAGER_LIMIT: larger messages go rendezvous */
    size_t unexpected_cap; /* HCOMM_UNEXPECTED_BYTES */
    atomic_int aborted;    /* hcomm_comm_abort() was called */
    /* An agreement that a blocking backend call follows is under way: peers may pass it once
     * this rank has arrived, so this rank's own abort is not seen until it ends (hcomm__aborted).
     */
    bool abort_deferred;
    /* A communicator that hcomm_comm_abort() aborts with this one (the nonblocking worker's
     * duplicate, set by the algorithms layer; cleared before that duplicate is freed). */
    _Atomic(struct hcomm_comm *) abort_with;
    const hcomm__posted_sig_t *posted; /* see hcomm__transport_t.posted_only */
    bool posted_held; /* a posted check failed: the slots wait for posted_release */
    /* The call running on this comm as every layer's messages name it, written by the layer
     * that runs it: the public call ("hcomm_..."), and a collective's sequence number, which
     * the transports' and p2p's timeouts print (the algorithms layer keeps its own count). */
    const char *call_fn;
    uint32_t call_seq;
    bool deterministic; /* reductions give the serial rank-order bits (HCOMM_DETERMINISTIC) */
    void *layer[HCOMM__LAYER_COUNT];
    void (*layer_free[HCOMM__LAYER_COUNT])(void *);
    /* Set by the p2p layer once it has state: its progress, which a transport's own waits (the
     * local posted meetings) run now and then, so that a failed call's messages still reach
     * their drain while this rank waits in its next call (their senders wait on that). */
    void (*idle)(hcomm_comm_t *c);
    /* Where c came from: its parent's id and call sequence number at the split, the same on
     * every member (hcomm__comm_id adds the members). */
    uint64_t lineage;
    /* The rank of c the current call's wait was waiting on when its verdict last ran, for the
     * flight recorder's dump; -1: unknown (a wait that counts arrivals). */
    int wait_peer;
    /* Rounds of fault-tolerant agreement run on c (transport/ft.c): every live member runs the
     * same ones in the same order. */
    uint64_t ft_round;
};

/* Values of hcomm_comm_t.aborted: hcomm_comm_abort() and hcomm_comm_revoke(). */
enum { HCOMM__ABORT_CALLED = 1, HCOMM__REVOKE_CALLED = 2 };

/* Whether this rank's hcomm_comm_abort() ends c's waits now (see abort_deferred). */
static inline bool hcomm__aborted(const hcomm_comm_t *c) {
    return atomic_load_explicit(&c->aborted, memory_order_relaxed) && !c->abort_deferred;
}

/* --- lost members and agreements that survive them (ft.c) --- */

/* The first member of c known lost (transport.lost), or -1. */
int hcomm__lost_member(hcomm_comm_t *c);
/* The same after the backend looked at the members now (transport.lost_scan): for errors that
 * may echo a loss (a peer's revoke arriving before this rank's own look found it). */
int hcomm__lost_member_now(hcomm_comm_t *c);
/* HCOMM_ERR_PEER_LOST naming the call, member rank of c (and its world rank) and the call's
 * sequence number, where rank (>= 0) or, with rank -1, any member of c is lost; else HCOMM_OK. */
hcomm_result_t hcomm__lost_verdict(hcomm_comm_t *c, int rank);
/* HCOMM_ERR_PEER_LOST naming member r (known lost), and r kept as the rank waited on. */
hcomm_result_t hcomm__lost_error(hcomm_comm_t *c, int r);
/* The error this rank's own hcomm_comm_abort() or hcomm_comm_revoke() gives calls on c. */
hcomm_result_t hcomm__own_abort_error(hcomm_comm_t *c);
/* One round of agreement among c's live members (ULFM's MPI_Comm_agree): *value becomes the
 * AND of every live member's, lost[r] (size c->size, may be NULL) says which members were lost
 * before they posted; the same on every survivor. Needs transport.ft_slot. */
hcomm_result_t hcomm__ft_agree(hcomm_comm_t *c, const char *fn, uint64_t *value, bool *lost);
/* The communicator of c's live members in c's order (ULFM's MPI_Comm_shrink); collective over
 * the live members. */
hcomm_result_t hcomm__ft_shrink(hcomm_comm_t *c, const char *fn, hcomm_comm_t **out);

/* Allocates a comm with world_ranks[size] and the settings of parent (or of the environment
 * when parent is NULL); NULL on out-of-memory. */
hcomm_comm_t *hcomm__comm_alloc(const hcomm__transport_t *tr, void *impl, int rank, int size,
                                const hcomm_comm_t *parent);
/* An id of c that every member computes alike: its lineage and its members' world ranks. */
uint64_t hcomm__comm_id(const hcomm_comm_t *c);
/* Frees the upper layers' state, calls tr->destroy, then frees the comm. */
void hcomm__comm_free(hcomm_comm_t *c);
/* The settings every new world starts with, read once per launch (malformed: an error). */
hcomm_result_t hcomm__comm_settings(const char *fn, double *timeout_s, size_t *eager,
                                    size_t *unexpected);

/* Private memory that hcomm_mem_free() frees: what hcomm hands users (receive by envelope). */
hcomm_result_t hcomm__mem_alloc_private(size_t bytes, void **ptr);
/* True when [p, p + bytes) lies in one buffer from hcomm_mem_alloc: *id then names its
 * shared-memory object (with this process's id, through hcomm__shm_name) and *offset is p's
 * place in it. */
bool hcomm__mem_shared(const void *p, size_t bytes, uint32_t *id, uint64_t *offset);
/* The POSIX shared-memory name of object id of process pid of this pid namespace
 * (HCOMM__SHM_NAME_MAX bytes). */
#define HCOMM__SHM_NAME_MAX 64
void hcomm__shm_name(char *name, int pid, uint32_t id);
/* Unlinks every object this process still has (before the process ends without exit()). */
void hcomm__shm_unlink_all(void);
/* Where this process can load bytes at byte offset off of object id of process pid on this
 * node (hcomm_mem_alloc memory of a peer), through a read-only mapping kept for later calls;
 * NULL when it cannot be mapped (then read it with cross-memory attach). The mapping lives
 * until its owner frees the object and a later call notices, or until
 * hcomm__shm_views_drop. Thread-safe. (shm_view.c) */
const void *hcomm__shm_view(int pid, uint32_t id, uint64_t off, size_t bytes);
/* Unmaps every view (at the end of the process's last world). */
void hcomm__shm_views_drop(void);

/* The backend hcomm_launch runs for requested (NULL: none named): requested, else
 * HCOMM_BACKEND, else mpi when an MPI launcher (mpirun, srun) started a job of more than one
 * process, else local. Fails on torchrun's variables and on local inside a multi-process MPI
 * job (unless HCOMM_BACKEND=local). Logs the choice at info level. (launch_detect.c) */
hcomm_result_t hcomm__launch_detect(const char *fn, const char *requested, const char **backend);
/* Processes in the job of the launcher (mpirun, srun, PMI/PMIx) that started this process: 0
 * when none did, -1 when it does not say. */
long hcomm__launch_job_size(void);

/* Launchers, one per backend (hcomm_launch picks one). */
hcomm_result_t hcomm__local_launch(int nranks, hcomm_rank_fn_t fn, void *arg);
hcomm_result_t hcomm__mpi_launch(int nranks, hcomm_rank_fn_t fn, void *arg);

#endif /* HCOMM_C_TRANSPORT_H_ */
