/* Sequence parallelism of hcomm-train (--sequence-parallel; Megatron-LM, Korthikanti et al.
 * 2022): outside the TP block each TP rank holds n = rows / tp of the micro-batch's rows (TP
 * rank t: rows t*n .. t*n + n - 1, mb_cache_t.n), so the embedding, the MoE layer (through
 * moe.h's sequence-parallel expert-TP path), the head and the PP messages work on 1/tp of the
 * tokens. The TP block's entry gathers its input along the rows (gather_from_sequence_parallel)
 * and its exit reduce-scatters (reduce_scatter_to_sequence_parallel), where without it they are
 * copy_to and reduce_from. The weights every TP rank keeps whole then see only their rank's
 * tokens: their gradients are summed over TP after the step's backward (sp_reduce_grads). */
#ifndef HCOMM_TRAIN_SP_H_
#define HCOMM_TRAIN_SP_H_

#include "model.h"

/* Rows of the micro-batch inside the TP block: every token of this CP rank. */
static inline int64_t mb_rows(const mb_cache_t *c) {
    return c->nseq * c->seq_len;
}

/* The block's entry: x [rows, C] from this rank's h [n, C]. */
static hcomm_result_t sp_enter_fwd(train_rt_t *rt, const mb_cache_t *c, real_t *h, real_t *x,
                                   int64_t C);
/* The block's exit: s [n, C] = this rank's rows of the sum over TP of y [rows, C]. */
static hcomm_result_t sp_exit_fwd(train_rt_t *rt, const mb_cache_t *c, real_t *y, real_t *s,
                                  int64_t C);
/* The exit's backward: dy [rows, C] from dh [n, C]. */
static hcomm_result_t sp_exit_bwd(train_rt_t *rt, const mb_cache_t *c, real_t *dh, real_t *dy,
                                  int64_t C);
/* The entry's backward: dx [n, C] from the partial input gradient dxp [rows, C]. */
static hcomm_result_t sp_enter_bwd(train_rt_t *rt, const mb_cache_t *c, real_t *dxp, real_t *dx,
                                   int64_t C);
/* With --sequence-parallel: sums over TP the gradients of the dense weights every TP rank keeps
 * whole (embeddings, router, head, the blocks' output biases). */
static hcomm_result_t sp_reduce_grads(const model_t *m, train_rt_t *rt);

#endif /* HCOMM_TRAIN_SP_H_ */
