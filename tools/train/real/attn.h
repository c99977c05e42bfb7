/* Causal multi-head self-attention of hcomm-train's TP block, and its context parallelism.
 *
 * The block (Megatron-LM's ParallelAttention without normalization):
 *   x = copy_to(h); q, k, v = x Wq, x Wk, x Wv   (column-parallel: TP rank t has heads
 *                                                  t*H/tp .. (t+1)*H/tp - 1, head dim D = C/H)
 *   o = softmax(q k^T / sqrt(D), causal) v        per head, over the whole sequence
 *   h = x + reduce_from(o Wo) + bo                (row-parallel Wo)
 * The sequence of each micro-batch row is split over the CP group (--cp, --cp-algo): ring
 * (zigzag split; K and V travel round the CP ring, hcomm_cp_ring_*; dK and dV travel with them
 * and one more step brings them home), allgather (zigzag; hcomm_cp_all_gather of K and V,
 * hcomm_cp_reduce_scatter of dK and dV), ulysses (contiguous split; hcomm_cp_a2a_seq_to_head
 * gives each rank the whole sequence for heads/cp of its heads) and a2a+p2p (Ulysses over the
 * a2a group of hcomm_cp_hier_create, the ring over its p2p group).
 * Every layout, one rank included, computes each query's attention over fixed key blocks of
 * --attn-block positions (one partial softmax (max, sum, weighted values) per block, keys in
 * ascending order) and merges the partials in ascending block order (online softmax, Milakov &
 * Gimelshein 2018; FlashAttention, Dao et al. 2022), so the forward gives the same bits on
 * every layout; the backward recomputes each block's probabilities from the log-sum-exp.
 */
#ifndef HCOMM_TRAIN_ATTN_H_
#define HCOMM_TRAIN_ATTN_H_

#include "model.h"

/* CP algorithms, in --cp-algo's order. */
enum { CP_RING, CP_ALLGATHER, CP_ULYSSES, CP_A2A_P2P };

/* Takes this rank's CP and DP coordinates from the context, and for a2a+p2p splits the CP group
 * (collective). */
static hcomm_result_t attn_setup(train_rt_t *rt, const train_opts_t *o, hcomm_ctx_t *ctx);
/* Frees what attn_setup made (collective when @p ok). */
static void attn_teardown(train_rt_t *rt, int ok);
/* The position in its sequence of this rank's local token t (0 <= t < seq / cp). */
static int64_t attn_token_pos(const train_rt_t *rt, int64_t t);

/* The attention sublayer of the TP block, forward and backward: h [n, C] gets h + attn(h);
 * dh gets the gradient of the sublayer's input. */
static hcomm_result_t attn_forward(const model_t *m, train_rt_t *rt, mb_cache_t *c, real_t *h);
static hcomm_result_t attn_backward(model_t *m, train_rt_t *rt, mb_cache_t *c, real_t *dh);

#endif /* HCOMM_TRAIN_ATTN_H_ */
