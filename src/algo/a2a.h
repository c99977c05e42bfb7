/* all_to_allv over p2p, every message with the call's signature (a2a.c unless named):
 *   pairwise  step s sends to rank + s and receives from rank - s (p - 1 steps; Thakur,
 *             Rabenseifner & Gropp 2005, 3.3; MPICH's and Open MPI's pairwise): large blocks;
 *   bruck     Bruck, Ho, Kipnis, Upfal & Weathersby 1997: ceil(log2 p) steps, each forwarding
 *             the blocks whose index has that bit set, with their sizes in the message: tiny
 *             blocks, where the p - 1 latencies of pairwise dominate;
 *   direct    one node: every rank reads its blocks straight from the peers' send buffers
 *             (transport.peer_read: one copy per byte); only the addresses and a barrier are
 *             messages;
 *   hier      (a2a_hier.c) two levels over the topology's nodes: pairwise within a node; the
 *             blocks bound off the node go to the node's leader (its lowest rank), which sends
 *             each other node's leader one message with everything its node has for that node
 *             and hands its own ranks what arrived: one inter-node message per pair of nodes;
 *   shm       (a2a_shm.c) where the comm has a board: one meeting checks and carries small
 *             blocks (see hcomm__a2a_shm below).
 * Per-peer counts travel with the data: every block carries its size and what its sender
 * expects back, so a mismatch (sendcounts[j] on rank i != recvcounts[i] on rank j) is found
 * on both ranks of the pair, that block is not written, and the others complete; the call
 * then fails with HCOMM_ERR_MISMATCH naming both values and ranks. */
#ifndef HCOMM_C_ALGO_A2A_H_
#define HCOMM_C_ALGO_A2A_H_

#include "algo/algos.h"

/* One all_to_allv as the algorithms see it: byte counts and offsets per peer. */
typedef struct hcomm__a2a {
    const char *send;
    const size_t *scounts, *sdispls;
    char *recv;
    const size_t *rcounts, *rdispls;
    /* Every rank knows that every block fits HCOMM__A2A_LANE_BLOCK (the agreement proved the
     * largest): pairwise then takes the transport's lane, one message per step. */
    bool lane;
} hcomm__a2a_t;

/* The largest block pairwise sends on the lane: its payload less the (size, expected) pair. */
#define HCOMM__A2A_LANE_BLOCK(c) (hcomm__lane_payload(c) - 16)

hcomm_result_t hcomm__a2a_pairwise(const hcomm__xfer_t *x, const hcomm__a2a_t *v);
hcomm_result_t hcomm__a2a_bruck(const hcomm__xfer_t *x, const hcomm__a2a_t *v);
/* Needs transport.peer_read_ok on every rank. */
hcomm_result_t hcomm__a2a_direct(const hcomm__xfer_t *x, const hcomm__a2a_t *v);
hcomm_result_t hcomm__a2a_hier(const hcomm__xfer_t *x, const hcomm__a2a_t *v);
/* The agreement before an all_to_allv (alltoallv.c) sums every rank's HCOMM__A2A_AGREE terms:
 * [0] the 32-bit digests of each (sender, receiver, bytes) this rank sends minus those it
 * expects (the group's sum is 0 when every pair's counts agree; sums stay inside an int64 up
 * to 2^15 ranks); [1 + b] 1 for b the bit length of this rank's largest block. */
enum {
    HCOMM__A2A_BITS = 48,
    HCOMM__A2A_WIDE = 1 + HCOMM__A2A_BITS, /* 1: a nonempty block's count or displacement
                                            * exceeds INT_MAX (MPI's int arguments) */
    HCOMM__A2A_AGREE
};
/* True when a nonempty block of v (this rank's, p peers) has a count or displacement above
 * INT_MAX, which an MPI call cannot take. */
bool hcomm__a2a_wide(const hcomm__a2a_t *v, int p);
void hcomm__a2a_terms(const hcomm__a2a_t *v, int p, int me, int64_t *terms);
/* From the summed terms: the largest block of any rank rounded down to a power of two. */
size_t hcomm__a2a_largest(const int64_t *sums);

/* Two ranks on a transport with a lane: the agreement and, when both blocks fit, the data in
 * one lane message each way, carrying the four counts of the pair and each rank's largest
 * block. A count mismatch is HCOMM_ERR_MISMATCH on both ranks with nothing written. Else
 * *largest is the call's largest block, as hcomm__a2a_largest gives it, *wide_any whether
 * either rank has a block hcomm__a2a_wide, and *done tells that
 * the data has moved (both ranks agree on it). */
hcomm_result_t hcomm__a2a_pair(const hcomm__xfer_t *x, const hcomm__a2a_t *v, size_t *largest,
                               bool *wide_any, bool *done);

/* shm, where the comm has a board: one meeting in which every rank posts its counts checks the
 * call and every pair's counts (HCOMM_ERR_MISMATCH on every rank, nothing moved) and carries
 * the blocks of the ranks whose blocks for their peers fit the post (8 KiB with 2 processes,
 * else the board's room less a 40-byte header and 24 bytes per rank). Larger blocks are read where
 * they lie (one copy per byte) where that runs well (shared memory, or cross-memory attach with 2
 * processes), and a second meeting lets their senders return; where it does not, *fallback names
 * what every rank runs instead, the counts agreed (native, or pairwise for counts beyond an int);
 * else -1. */
hcomm_result_t hcomm__a2a_shm(const hcomm__xfer_t *x, const hcomm__a2a_t *v, int *fallback);

/* --- For the family's files (a2a.c, a2a_hier.c, a2a_shm.c) --- */

/* The first count mismatch this rank saw, lowest (receiver, sender) first. */
typedef struct hcomm__a2a_bad {
    bool set;
    int receiver, sender;
    size_t sent, expected;
} hcomm__a2a_bad_t;

/* A block from `from` arrived with sent bytes and what `from` expects back: both directions of
 * the pair checked against this rank's counts. True when it may land. */
bool hcomm__a2a_check_pair(const hcomm__xfer_t *x, const hcomm__a2a_t *v, int from, uint64_t sent,
                           uint64_t their_expect, hcomm__a2a_bad_t *b);
/* HCOMM_ERR_MISMATCH naming b's pair (what: the counts' name), or success when b is unset. */
hcomm_result_t hcomm__a2a_verdict_as(const hcomm__xfer_t *x, const hcomm__a2a_bad_t *b,
                                     const char *what);
hcomm_result_t hcomm__a2a_verdict(const hcomm__xfer_t *x, const hcomm__a2a_bad_t *b);
/* This rank's block for / from peer, NULL when empty. */
static inline const char *hcomm__a2a_sblock(const hcomm__a2a_t *v, int peer) {
    return v->scounts[peer] ? v->send + v->sdispls[peer] : NULL;
}
static inline char *hcomm__a2a_rblock(const hcomm__a2a_t *v, int peer) {
    return v->rcounts[peer] ? v->recv + v->rdispls[peer] : NULL;
}
/* This rank's block to itself, checked like any pair's. */
void hcomm__a2a_self_copy(const hcomm__xfer_t *x, const hcomm__a2a_t *v, hcomm__a2a_bad_t *b);
hcomm_result_t hcomm__a2a_nomem(const hcomm__xfer_t *x, size_t bytes);
/* One message from `from` into buf (cap bytes), or into *got, allocated, when alloc. */
hcomm_result_t hcomm__a2a_recv_msg(const hcomm__xfer_t *x, int from, void *buf, size_t cap,
                                   bool alloc, hcomm__env_t *env, void **got);
/* Send sbuf to `to` (carrying expect) while receiving from `from` as hcomm__a2a_recv_msg. */
hcomm_result_t hcomm__a2a_swap(const hcomm__xfer_t *x, int to, const void *sbuf, size_t sbytes,
                               uint64_t expect, int from, void *rbuf, size_t rcap, bool alloc,
                               hcomm__env_t *env, void **got);
/* Pairwise among ranks[0..n) (this rank is ranks[me]). */
hcomm_result_t hcomm__a2a_pairwise_over(const hcomm__xfer_t *x, const hcomm__a2a_t *v,
                                        const int *ranks, int n, int me, hcomm__a2a_bad_t *b);

#endif /* HCOMM_C_ALGO_A2A_H_ */
