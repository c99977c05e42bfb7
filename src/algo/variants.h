/* More of hcomm's algorithms over p2p (issue 6), and the dispatchers the algorithms layer
 * (coll.c) calls with the chosen hcomm__algo_t (select.h), HCOMM__ALGO_DET included:
 *   bruck.c   all_gather(v): recursive doubling (power-of-two groups; others run Bruck) and
 *             Bruck et al. 1997 (any group size, ceil(log2 p) steps);
 *   rh.c      reduce_scatter(v) by recursive halving (Thakur, Rabenseifner & Gropp 2005, 4.2),
 *             the extra ranks of a non-power-of-two group folded into a neighbour first;
 *   bcast.c   broadcast as a binomial scatter + ring all_gather (van de Geijn; Thakur et al.
 *             2005, 4.1) and as a pipelined chain;
 *   determ.c  deterministic mode: every reduction gives the serial rank-order bits;
 *   pair.c    two ranks on the lane: all_gather, reduce_scatter, broadcast in one exchange.
 * Blocks and offsets are size_t (hcomm__block); every function handles zero sizes, sizes that
 * do not divide the group, and fewer elements than ranks. */
#ifndef HCOMM_C_ALGO_VARIANTS_H_
#define HCOMM_C_ALGO_VARIANTS_H_

#include "algo/algos.h"

/* all_gatherv in place: bytes[r] from rank r at the sum of bytes[0..r) in buf, where this
 * rank's own block already is; algo: ring, rd or bruck (anything else: ring). */
hcomm_result_t hcomm__agv_run(const hcomm__xfer_t *x, int algo, void *buf, const size_t *bytes);
hcomm_result_t hcomm__agv_bruck(const hcomm__xfer_t *x, void *buf, const size_t *bytes);
/* Recursive doubling; p must be a power of two. */
hcomm_result_t hcomm__agv_rd(const hcomm__xfer_t *x, void *buf, const size_t *bytes);

/* reduce_scatterv as hcomm__rsv_ring says; algo: ring, rhd, or with HCOMM__ALGO_DET any. */
hcomm_result_t hcomm__rsv_run(const hcomm__xfer_t *x, int algo, const void *send, void *recv,
                              const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__rsv_rh(const hcomm__xfer_t *x, const void *send, void *recv,
                             const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);

/* broadcast of bytes from root; algo: tree, chain or scatter_allgather (else tree). */
hcomm_result_t hcomm__bc_run(const hcomm__xfer_t *x, int algo, void *buf, size_t bytes, int root);
hcomm_result_t hcomm__bc_chain(const hcomm__xfer_t *x, void *buf, size_t bytes, int root);
hcomm_result_t hcomm__bc_scatter_allgather(const hcomm__xfer_t *x, void *buf, size_t bytes,
                                           int root);

/* Two ranks on a lane (pair.c; hcomm__lane_payload > 0): one exchange per lane piece, each
 * message carrying the signature, so no agreement runs first. all_gather of bytes per rank
 * (send may be recv's own block); reduce_scatter of count elements per rank (recv may alias
 * send), rank 0's operand op rank 1's: the serial reduction's bits; broadcast from root. */
hcomm_result_t hcomm__pair_all_gather(const hcomm__xfer_t *x, const void *send, void *recv,
                                      size_t bytes);
hcomm_result_t hcomm__pair_reduce_scatter(const hcomm__xfer_t *x, const void *send, void *recv,
                                          size_t count, hcomm_dtype_t dt, hcomm_op_t op);
/* answer: the receiver sends its signature back (checking on); else the root only sends. */
hcomm_result_t hcomm__pair_broadcast(const hcomm__xfer_t *x, void *buf, size_t bytes, int root,
                                     bool answer);

/* Deterministic mode (determ.c). reduce_scatterv: the owner of block b receives every rank's
 * part of it and reduces them in rank order. */
hcomm_result_t hcomm__rsv_det(const hcomm__xfer_t *x, const void *send, void *recv,
                              const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
/* all_reduce in place on buf: algo (without the flag) picks the all_gather that follows the
 * deterministic reduce_scatter (rd: gather all vectors and reduce locally; naive: as is). */
hcomm_result_t hcomm__ar_det(const hcomm__xfer_t *x, int algo, void *buf, size_t count,
                             hcomm_dtype_t dt, hcomm_op_t op);
/* reduce to root in rank order; recv is significant on root only and may alias send there. */
hcomm_result_t hcomm__reduce_det(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root);

#endif /* HCOMM_C_ALGO_VARIANTS_H_ */
