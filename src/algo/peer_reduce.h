/* Reductions straight from the peers' buffers on one node (peer_reduce.c), shared by twoshot
 * all_reduce (twoshot.c) and direct reduce_scatter(v) and reduce (direct.c). Needs
 * transport.peer_read_ok on every rank. */
#ifndef HCOMM_C_ALGO_PEER_REDUCE_H_
#define HCOMM_C_ALGO_PEER_REDUCE_H_

#include "algo/xfer.h"

/* Elements reduced per piece: the accumulator and the piece being read stay in cache. */
#define HCOMM__PR_PIECE_BYTES ((size_t)256 << 10)

/* Where hcomm__pr_reduce_range writes finished pieces besides out: nowhere, every peer's
 * output, or (any other value) that one rank's. */
#define HCOMM__PR_PUSH_NONE (-2)
#define HCOMM__PR_PUSH_ALL (-1)

/* The room for every rank's addresses (*all, p entries) and, with scratch, the range's
 * (*tmp), taken before any address goes out: a rank short of memory then fails the call, and
 * its peers with it, before any of them may write into its buffers. Free both. */
hcomm_result_t hcomm__pr_room(const hcomm__xfer_t *x, bool scratch, hcomm__buf_pair_t **all,
                              unsigned char **tmp);
/* Elements [off, off + len) of the result, piece by piece, into out (element 0 of out is element
 * off; NULL: pieces are only pushed); send is this rank's whole input, tmp the room's scratch.
 * Streamed (hcomm__copy_stream), a piece's partial results stay in scratch and its last step
 * streams to out. Each finished piece is also written at its place into the output of every
 * peer (push HCOMM__PR_PUSH_ALL) or of rank push. f16/bf16 sums, products and means accumulate
 * in f32 and round once; AVG divides. */
hcomm_result_t hcomm__pr_reduce_range(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                      const void *send, void *out, size_t off, size_t len,
                                      hcomm_dtype_t dt, hcomm_op_t op, bool stream, int push,
                                      unsigned char *tmp);

#endif /* HCOMM_C_ALGO_PEER_REDUCE_H_ */
