/* hcomm's own collective algorithms, each written once over the toolkit of xfer.h (p2p
 * messages with the call's signature, and on one node the peers' buffers), one family per
 * file. The entry path (coll.c, run.c) picks one by hcomm__algo_t and calls it here.
 *
 * Blocks: a vector of count elements split over p ranks gives the first count % p ranks
 * ceil(count / p) elements and the rest floor(count / p) (hcomm__block); offsets are size_t.
 * Every function handles zero sizes, sizes that do not divide the group, and fewer elements than
 * ranks. Reductions take SUM, PROD, MAX or MIN (run.c turns AVG into SUM plus a division and
 * widens f16/bf16 to f32 first), but twoshot, direct reduce_scatter(v) and reduce, and shm take
 * f16/bf16 as they are, AVG included, and reduce them in f32 themselves. Every algorithm computes
 * each output element on one rank and copies it to the others, so all ranks get identical bits;
 * the association of operands differs between algorithms (ops are commutative). */
#ifndef HCOMM_C_ALGO_ALGOS_H_
#define HCOMM_C_ALGO_ALGOS_H_

#include "algo/select.h"
#include "algo/xfer.h"

/* --- rd.c: recursive doubling (Thakur, Rabenseifner & Gropp 2005, section 4), messages of at
 * most a few KiB (on a lane, one lane message each), the signature in each: no agreement is
 * needed before it. --- */
/* The most bytes one step carries: both vectors live on the stack (cost.c models it too). */
#define HCOMM__RD_PIECE_BYTES 4096
/* all_reduce of send into recv (may alias), in pieces; count 0: a signature agreement alone. */
hcomm_result_t hcomm__ar_rd(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                            hcomm_dtype_t dt, hcomm_op_t op);
/* all_gather of bytes per rank as one vector whose blocks partners merge by union (more than two
 * ranks, where hcomm__ag_rd_whole_fits). */
bool hcomm__ag_rd_whole_fits(const hcomm_comm_t *c, size_t bytes);
hcomm_result_t hcomm__ag_rd_whole(const hcomm__xfer_t *x, const void *send, void *recv,
                                  size_t bytes);
/* broadcast by that union, a piece of up to one lane message (or rd's piece) less a byte at a time.
 */
hcomm_result_t hcomm__bc_rd(const hcomm__xfer_t *x, void *buf, size_t bytes, int root);
/* reduce_scatter by an rd all_reduce of the whole vector, keeping this rank's block (small
 * vectors: it moves p times the data). */
hcomm_result_t hcomm__rs_rd(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                            hcomm_dtype_t dt, hcomm_op_t op);
/* all_gatherv in place (this rank's block already at its place); p a power of two. */
hcomm_result_t hcomm__agv_rd(const hcomm__xfer_t *x, void *buf, const size_t *bytes);

/* --- ring.c: the ring (Patarasuk & Yuan 2009), chunked --- */
/* all_reduce's segment: the ring runs once per segment of the vector (cost.c models it too). */
#define HCOMM__RING_SEGMENT_BYTES ((size_t)4 << 20)
/* all_reduce in place on buf[0..count) (reduce_scatter + all_gather). */
hcomm_result_t hcomm__ar_ring(const hcomm__xfer_t *x, void *buf, size_t count, hcomm_dtype_t dt,
                              hcomm_op_t op);
/* all_gatherv: bytes[r] from rank r land at the sum of bytes[0..r) in buf, where this rank's own
 * block already is. */
hcomm_result_t hcomm__agv_ring(const hcomm__xfer_t *x, void *buf, const size_t *bytes);
/* reduce_scatterv: send holds sum(counts) elements; rank r gets block r (counts[r] elements at
 * the sum of counts[0..r)) reduced, in recv (which may alias send). */
hcomm_result_t hcomm__rsv_ring(const hcomm__xfer_t *x, const void *send, void *recv,
                               const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);

/* --- rhd.c: Rabenseifner's halving and doubling --- */
hcomm_result_t hcomm__ar_rhd(const hcomm__xfer_t *x, void *buf, size_t count, hcomm_dtype_t dt,
                             hcomm_op_t op);
/* reduce_scatterv as hcomm__rsv_ring says, by recursive halving. */
hcomm_result_t hcomm__rsv_rh(const hcomm__xfer_t *x, const void *send, void *recv,
                             const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
/* reduce to root: that reduce_scatter, then a gather; recv significant on root only. */
hcomm_result_t hcomm__reduce_rhd(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root);

/* --- tree.c: binomial trees (MPICH; Thakur et al. 2005, section 4) --- */
hcomm_result_t hcomm__bc_tree(const hcomm__xfer_t *x, void *buf, size_t bytes, int root);
/* reduce to root in place on buf (significant on root after the call); tmp holds count
 * elements received from a child. */
hcomm_result_t hcomm__reduce_tree(const hcomm__xfer_t *x, void *buf, void *tmp, size_t count,
                                  hcomm_dtype_t dt, hcomm_op_t op, int root);
/* gather / scatter of bytes per rank; the root's own block is copied by the caller, or by
 * these. */
hcomm_result_t hcomm__gather_tree(const hcomm__xfer_t *x, const void *send, void *recv,
                                  size_t bytes, int root);
hcomm_result_t hcomm__scatter_tree(const hcomm__xfer_t *x, const void *send, void *recv,
                                   size_t bytes, int root);

/* --- linear.c: the root exchanges with every rank --- */
/* all_reduce in place: rank 0 reduces in rank order (the serial reference), then a broadcast. */
hcomm_result_t hcomm__ar_naive(const hcomm__xfer_t *x, void *buf, size_t count, hcomm_dtype_t dt,
                               hcomm_op_t op);
/* gather / scatter of bytes per rank; the root's own block is copied by the caller. */
hcomm_result_t hcomm__gather_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                    size_t bytes, int root);
hcomm_result_t hcomm__scatter_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                     size_t bytes, int root);

/* --- bruck.c: Bruck et al. 1997 --- */
hcomm_result_t hcomm__agv_bruck(const hcomm__xfer_t *x, void *buf, const size_t *bytes);
/* all_gatherv in place by algorithm: rd (a power-of-two group; else bruck), bruck, else ring. */
hcomm_result_t hcomm__agv_run(const hcomm__xfer_t *x, int algo, void *buf, const size_t *bytes);

/* --- bcast.c: broadcasts for long messages --- */
/* The chain's pipeline segment (cost.c models it too). */
#define HCOMM__CHAIN_SEGMENT_BYTES ((size_t)128 << 10)
hcomm_result_t hcomm__bc_chain(const hcomm__xfer_t *x, void *buf, size_t bytes, int root);
hcomm_result_t hcomm__bc_scatter_allgather(const hcomm__xfer_t *x, void *buf, size_t bytes,
                                           int root);

/* --- twoshot.c and direct.c: one node, the peers' buffers read (and written) where they lie
 * (transport.peer_read_ok); addresses and barriers take the transport's lane where it has one,
 * each with the signature, and every rank exchanges addresses with every other before it reads:
 * on a lane they need no agreement first. --- */
/* all_reduce of send into recv (may alias). */
hcomm_result_t hcomm__ar_twoshot(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op);
/* reduce_scatter of count elements per rank (recv may alias send); all_gather of bytes per rank
 * (send may be recv's own block). */
hcomm_result_t hcomm__rs_direct(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__ag_direct(const hcomm__xfer_t *x, const void *send, void *recv, size_t bytes);
/* The v forms: counts[r] elements / bytes[r] bytes for rank r, blocks back to back in rank
 * order; reduce_scatterv in place lands at the start of the buffer. */
hcomm_result_t hcomm__rsv_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                 const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__agv_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                 const size_t *bytes);
/* reduce to root; recv significant on root only and may alias send there. */
hcomm_result_t hcomm__reduce_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                    size_t count, hcomm_dtype_t dt, hcomm_op_t op, int root);
/* Bytes from which direct reduce among p ranks splits its work (the cost model prices it;
 * f16/bf16 sums split at every size, which the model, blind to the dtype, does not see). */
size_t hcomm__reduce_split_bytes(int p);
/* broadcast, every other rank reading the root's buffer. */
hcomm_result_t hcomm__bc_direct(const hcomm__xfer_t *x, void *buf, size_t bytes, int root);

/* --- shm.c: through the board (hcomm__board_on), in meetings of up to HCOMM__BOARD_ROOM bytes
 * per rank that check the call themselves; every rank reduces every input in rank order (the
 * serial reduction's bits; any op, AVG and f16/bf16 included, in one pass). At most
 * hcomm__shm_fits ranks. --- */
bool hcomm__shm_fits(const hcomm_comm_t *c);
hcomm_result_t hcomm__ag_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t bytes);
hcomm_result_t hcomm__ar_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                             hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__rs_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                             hcomm_dtype_t dt, hcomm_op_t op);
/* The v forms (counts / bytes: one entry per rank, the same on every rank). */
hcomm_result_t hcomm__agv_shm(const hcomm__xfer_t *x, const void *send, void *recv,
                              const size_t *bytes);
hcomm_result_t hcomm__rsv_shm(const hcomm__xfer_t *x, const void *send, void *recv,
                              const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__bc_shm(const hcomm__xfer_t *x, void *buf, size_t bytes, int root);
hcomm_result_t hcomm__reduce_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root);
/* gather and scatter leave the root's own block to the caller */
hcomm_result_t hcomm__gather_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t bytes,
                                 int root);
hcomm_result_t hcomm__scatter_shm(const hcomm__xfer_t *x, const void *send, void *recv,
                                  size_t bytes, int root);
/* direct on a board (peers can read each other's memory): one copy through the views where the
 * buffer read comes from hcomm_mem_alloc, else with cross-memory attach (a broadcast's or
 * scatter's private root buffer among more than two ranks: shm's pieces); meetings instead of
 * the lane's address exchange and barrier, checking the call. gather and scatter leave the
 * root's own block to the caller. */
hcomm_result_t hcomm__bc_board_direct(const hcomm__xfer_t *x, void *buf, size_t bytes, int root);
hcomm_result_t hcomm__gather_board_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                          size_t bytes, int root);
hcomm_result_t hcomm__scatter_board_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                           size_t bytes, int root);

/* --- hier.c: two levels over the topology's nodes --- */
/* all_reduce of send into recv (may alias); reduce_scatter of m elements per rank (recv may
 * alias send); all_gather of m bytes per rank in place on buf (this rank's block already at
 * rank * m). */
hcomm_result_t hcomm__ar_hier(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                              hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__rs_hier(const hcomm__xfer_t *x, const void *send, void *recv, size_t m,
                              hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__ag_hier(const hcomm__xfer_t *x, void *buf, size_t m);

/* --- pair.c: two ranks on a lane (hcomm__lane_payload > 0): one exchange per lane piece, each
 * message carrying the signature, so no agreement runs first. --- */
/* all_gather of bytes per rank (send may be recv's own block). */
hcomm_result_t hcomm__pair_all_gather(const hcomm__xfer_t *x, const void *send, void *recv,
                                      size_t bytes);
/* reduce_scatter of count elements per rank (recv may alias send), rank 0's operand op rank 1's:
 * the serial reduction's bits. */
hcomm_result_t hcomm__pair_reduce_scatter(const hcomm__xfer_t *x, const void *send, void *recv,
                                          size_t count, hcomm_dtype_t dt, hcomm_op_t op);
/* broadcast from root; answer: the receiver sends its signature back (checking on), else the
 * root only sends. */
hcomm_result_t hcomm__pair_broadcast(const hcomm__xfer_t *x, void *buf, size_t bytes, int root,
                                     bool answer);

/* --- determ.c: deterministic mode, the bits of the serial reduction in rank order --- */
/* reduce_scatterv: the owner of block b receives every rank's part of it and reduces them in
 * rank order. */
hcomm_result_t hcomm__rsv_det(const hcomm__xfer_t *x, const void *send, void *recv,
                              const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
/* all_reduce in place on buf: algo (without the flag) picks the all_gather that follows the
 * deterministic reduce_scatter (rd: gather all vectors and reduce locally; naive: as is). */
hcomm_result_t hcomm__ar_det(const hcomm__xfer_t *x, int algo, void *buf, size_t count,
                             hcomm_dtype_t dt, hcomm_op_t op);
/* reduce to root in rank order; recv significant on root only and may alias send there. */
hcomm_result_t hcomm__reduce_det(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root);

#endif /* HCOMM_C_ALGO_ALGOS_H_ */
