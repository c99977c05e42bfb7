/* Private to the local transport: what the ranks of a communicator share, one rank's view of
 * it, and the helpers every part uses. Its files form a stack; each calls only files listed
 * before it:
 *   local_base.c  creating and freeing the state, the waits' abort/timeout verdict
 *   local_coll.c  the barrier and the native collectives over posted slots, and split
 *   local.c       frames through the per-pair rings, the answers about peer memory, launch,
 *                 and the transport's table (hcomm__transport_t), which names every part
 * local_coll.c calls only local_base.c and this header; local.c calls them all. */
#ifndef HCOMM_C_LOCAL_BASE_H_
#define HCOMM_C_LOCAL_BASE_H_

#include "transport/transport.h"

#include <stddef.h>
#include <stdlib.h>

enum { RING_SLOTS = 64, INLINE_BYTES = 256, SMALL_REDUCE_BYTES = 256 };

typedef struct local_world {
    atomic_int aborted; /* set once any rank's function fails or a wait timed out */
    int size;
    atomic_int *lost; /* [size] per world rank: it called hcomm_fault_stop (stopped for good) */
    atomic_int nlost; /* how many have */
    atomic_int done;  /* rank functions that returned */
} local_world_t;

typedef struct frame {
    unsigned char hdr[HCOMM__HDR_BYTES];
    size_t bytes;
    bool rndv;
    const void *src_buf; /* rendezvous: the sender's buffer */
    atomic_int *done;    /* rendezvous: the sender's completion flag */
    void *heap;          /* eager payload above INLINE_BYTES */
    double ready;        /* simulated inter-node link: not delivered before (hcomm__now), or 0 */
    unsigned char inl[INLINE_BYTES];
} frame_t;

/* One ring of a (sender, receiver) pair's chain. The sender pushes to the newest ring; when
 * it is full the sender links a fresh one as next and pushes there from then on, so a send
 * never waits for the receiver and needs no later call to reach it. The receiver moves to next
 * (and frees the ring it left) once the ring is empty and next is set. */
typedef struct ring {
    _Alignas(64) atomic_size_t head; /* consumer */
    _Alignas(64) atomic_size_t tail; /* producer */
    _Atomic(struct ring *) next;     /* producer, once: the ring after this full one */
    frame_t slot[RING_SLOTS];
} ring_t;

/* What one rank posts for a native collective; valid from its first barrier to its last. */
typedef struct local_slot {
    /* A line per rank: packed, 2 ranks' slots shared one, which both wrote on every call. */
    _Alignas(64) const void *send;
    void *aux;
    const size_t *counts, *displs, *rcounts;
    int color, key;
} local_slot_t;

/* What a rank posts with every call besides its slot: the call's signature and, for a small
 * all_reduce, its input itself. Two per rank, picked by the parity of the rank's post count:
 * a call that ends without a barrier (the small all_reduce) lets its rank post the next call
 * while slower peers still read this one; the one after can reuse this post only once every
 * peer posted the next, and so finished reading this one. */
typedef struct local_post {
    /* The post count it was written at, stored last (release): the small all_reduce waits on
     * its peers' seq instead of a barrier, and finds their signature and the first 16 bytes
     * of their input in the same cache line, where the barrier's counter, its generation, the
     * signature and the input took four transfers of a line in turn. */
    _Alignas(64) _Atomic unsigned seq;
    int32_t failed; /* as in hcomm__posted_sig_t */
    uint64_t words[5];
    _Alignas(16) unsigned char data[SMALL_REDUCE_BYTES];
    const char *failed_text;
} local_post_t;

_Static_assert(sizeof(((local_post_t *)0)->words) == sizeof(((hcomm__posted_sig_t *)0)->words),
               "a post holds the whole signature");
_Static_assert(offsetof(local_post_t, data) == 48, "a small input starts in the seq's line");

typedef struct local_shared {
    local_world_t *world;
    atomic_int aborted; /* a member's hcomm_comm_abort() reached a wait: the group is dead */
    int size;
    atomic_int refs;
    /* The barrier's arrivals: its generation in the high 32 bits, the count in the low, so
     * that a rank giving up takes its arrival back only from a barrier still open. */
    _Alignas(64) _Atomic uint64_t bar_arrivals;
    _Alignas(64) atomic_uint bar_gen;
    local_slot_t *slots;  /* [size] */
    local_post_t *posts;  /* [2 * size]: rank r's of parity k at 2r + k */
    hcomm__ft_slot_t *ft; /* [size] the agreements that survive lost members (transport/ft.c) */
    /* [size * size], sender-major: the oldest ring of each pair's chain, which the receiver
     * reads; NULL until the sender's first frame. */
    _Atomic(ring_t *) *rings;
} local_shared_t;

/* One rank's view of a communicator. */
typedef struct local_comm {
    local_shared_t *sh;
    ring_t **tx; /* [size] the newest ring of the chain to each receiver (this rank pushes) */
    /* The reduced chunk of the shared-memory all_reduce / reduce_scatter, kept between calls
     * (grown to the largest, freed with the communicator): a fresh malloc per call above
     * glibc's mmap threshold page-faulted every 4 KiB of it, 1.5-4x the call at 32-128 MiB. */
    hcomm__scratch_t scratch;
    unsigned posts;              /* calls posted on this comm: the parity picks the local_post_t */
    hcomm__posted_sig_t views[]; /* [size]: the posts as local_posted_sig hands them out */
} local_comm_t;

static inline local_comm_t *lc_of(hcomm_comm_t *c) {
    return (local_comm_t *)c->impl;
}

static inline local_shared_t *shared_of(hcomm_comm_t *c) {
    return lc_of(c)->sh;
}

/* --- state (local_base.c) --- */

/* The state size ranks of world share (one reference per rank), or NULL: out of memory. */
local_shared_t *hcomm__local_shared_new(local_world_t *world, int size);
/* Drops one reference; the last frees the state and what its rings still hold. */
void hcomm__local_shared_release(local_shared_t *sh);
/* A comm of tr for rank of size ranks on sh, with the settings of parent (NULL: the
 * environment's), or NULL: out of memory (sh keeps the reference the comm would have taken). */
hcomm_comm_t *hcomm__local_comm_new(const hcomm__transport_t *tr, local_shared_t *sh, int rank,
                                    int size, const hcomm_comm_t *parent);
/* The communicator of a new group on sh (one reference each, dropped on failure) whose member
 * i is ranks[i] of c, c's rank among them; it has c's settings. (split and shrink) */
hcomm_result_t hcomm__local_group_comm(hcomm_comm_t *c, local_shared_t *sh, const int *ranks, int n,
                                       hcomm_comm_t **out);
/* Frees c's transport state and its reference to the shared state (the last reference frees
 * the frames still queued). */
void hcomm__local_destroy(hcomm_comm_t *c);

/* --- waits (local_base.c) --- */

/* Why a wait must end now, or HCOMM_OK to keep waiting. what names the awaited event. Runs the
 * layers' idle progress first (comm.idle). */
hcomm_result_t hcomm__local_wait_verdict(hcomm_comm_t *c, double waited, const char *what);

/* --- native collectives and split (local_coll.c): the entries of the same names --- */

extern const hcomm__native_ops_t hcomm__local_native;
hcomm_result_t hcomm__local_posted_only(hcomm_comm_t *c);
const hcomm__posted_sig_t *hcomm__local_posted_sig(hcomm_comm_t *c, int rank);
hcomm_result_t hcomm__local_posted_release(hcomm_comm_t *c);
hcomm_result_t hcomm__local_split(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out);

#endif /* HCOMM_C_LOCAL_BASE_H_ */
