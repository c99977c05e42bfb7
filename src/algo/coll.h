/* The algorithms layer: collectives as the primitives call them. Each call gets a sequence
 * number on its communicator, a signature (call, dtype, op, root, count, extra) that every
 * rank must share, a flight-recorder entry, and an algorithm:
 *   - shared-memory transports (local): the transport's native collectives, which check the
 *     signature in the slots they post anyway (no message);
 *   - otherwise: small all_reduce runs hcomm's own recursive doubling over p2p with the
 *     signature in every envelope (checked for free); everything else runs the backend's native
 *     collective after a signature agreement over p2p, as HCOMM_CHECK says (always, first, off);
 *   - or whatever HCOMM_ALGO / hcomm_comm_set_algo narrow the choice to (select.h): hcomm's
 *     algorithms over p2p (algos.h), preceded on shared-memory transports by a meeting in the
 *     posted slots. The chosen algorithm is part of the signature.
 * Reductions: f16/bf16 SUM, PROD and AVG accumulate in f32 and round once; AVG divides before
 * rounding. twoshot and direct (and the shared-memory native path) do it as they read each
 * piece of every input; every other algorithm runs on widened f32 copies, so partial sums
 * travel in f32.
 * A rank whose own argument checks failed calls hcomm__coll_fail: its peers in the same call
 * fail with HCOMM_ERR_PEER (naming it and its message) instead of waiting for a timeout. */
#ifndef HCOMM_C_ALGO_COLL_H_
#define HCOMM_C_ALGO_COLL_H_

#include "p2p/p2p.h"

/* Names the public call running on c for every message below it (the outermost call wins);
 * hcomm__leave restores the previous name and, after a timeout, prints the flight recorder. */
void hcomm__enter(hcomm_comm_t *c, const char *fn);
hcomm_result_t hcomm__leave(hcomm_comm_t *c, hcomm_result_t res);

hcomm_result_t hcomm__coll_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t count, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__coll_all_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t bytes_per_rank);
hcomm_result_t hcomm__coll_reduce_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                          size_t count, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__coll_broadcast(hcomm_comm_t *c, void *buf, size_t bytes, int root);
hcomm_result_t hcomm__coll_all_to_allv(hcomm_comm_t *c, const void *sendbuf,
                                       const size_t *sendcounts, const size_t *sdispls,
                                       void *recvbuf, const size_t *recvcounts,
                                       const size_t *rdispls);
/* all_to_all of bytes per rank whose checks ride on the data: over p2p the signature travels
 * in every message (no separate agreement), on shared memory in the posted slots. For a
 * caller's small count exchange that carries its own argument checks (MoE dispatch). */
hcomm_result_t hcomm__coll_all_to_all_checked(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                              size_t bytes);
/* all_to_allv without a signature agreement before a native call, and without the transport's
 * own count check (mpi: an MPI_Ialltoall of the counts and an MPI_Iallreduce): only for a
 * caller whose previous exchange on c proved that every rank makes this call with matching
 * counts (the token exchange after MoE's count exchange). */
hcomm_result_t hcomm__coll_all_to_allv_agreed(hcomm_comm_t *c, const void *sendbuf,
                                              const size_t *sendcounts, const size_t *sdispls,
                                              void *recvbuf, const size_t *recvcounts,
                                              const size_t *rdispls);
/* Collective calls made on c so far (each sequence number) and the signature agreements run
 * before native calls among them: what tests count per MoE dispatch. */
void hcomm__coll_counts(hcomm_comm_t *c, uint64_t *calls, uint64_t *agreements);
hcomm_result_t hcomm__coll_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                  hcomm_dtype_t dt, hcomm_op_t op, int root);
hcomm_result_t hcomm__coll_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes,
                                  int root);
hcomm_result_t hcomm__coll_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                   size_t bytes, int root);
hcomm_result_t hcomm__coll_all_gatherv(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                       const size_t *bytes);
hcomm_result_t hcomm__coll_reduce_scatterv(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                           const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__coll_barrier(hcomm_comm_t *c);
hcomm_result_t hcomm__coll_split(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out);
/* The duplicate of c that a nonblocking worker owns (collective: a first nonblocking call,
 * named so in a mismatch). */
hcomm_result_t hcomm__coll_worker_dup(hcomm_comm_t *c, hcomm_comm_t **out);

/* This rank's checks failed with res (its message is the thread's last error): joins the call
 * its peers are making so they fail with HCOMM_ERR_PEER, and returns res with the message. */
hcomm_result_t hcomm__coll_fail(hcomm_comm_t *c, hcomm_result_t res);

/* A digest and a short description of what a call's count cannot say (a DP tensor list):
 * carried in the signature of the calls that follow until hcomm__coll_clear_extra. */
void hcomm__coll_set_extra(hcomm_comm_t *c, uint64_t digest, const char *desc);
void hcomm__coll_clear_extra(hcomm_comm_t *c);

/* Narrows this rank's algorithm choice on c (HCOMM_ALGO syntax; NULL or "" undoes it). */
hcomm_result_t hcomm__coll_set_algo(hcomm_comm_t *c, const char *spec);

/* The name of the algorithm the last collective on c chose since the previous ask (NULL if
 * none chose one), so hcomm-bench can report what the automatic choice picked. */
const char *hcomm__coll_take_algo(hcomm_comm_t *c);

/* True when a collective on c since the previous ask was one of the calls that time two
 * candidates near a switch (tune.h): the same on every rank of c, so hcomm-bench can run auto
 * past those calls before it times it. */
bool hcomm__coll_take_probed(hcomm_comm_t *c);

/* True when algo, running coll (as HCOMM_ALGO names it) on c, moves data outside the links of a
 * simulated multi-node machine (HCOMM_TOPO nodes= on the local backend): the algorithms the
 * cost model gives no estimate there (cost.c: the shared-memory native collectives, twoshot,
 * direct reads). Auto never picks them, and their times say nothing of the simulated machine
 * (hcomm-bench leaves them out of regret). */
bool hcomm__coll_bypasses_links(hcomm_comm_t *c, const char *coll, int algo);

#endif /* HCOMM_C_ALGO_COLL_H_ */
