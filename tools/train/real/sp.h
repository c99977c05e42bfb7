/* Sequence parallelism of hcomm-train (--sequence-parallel; Megatron-LM, Korthikanti et al.
 * 2022): outside the TP block each TP rank holds n = rows / tp of the micro-batch's rows (TP
 * rank t: rows t*n .. t*n + n - 1, mb_cache_t.n), so the embedding, the MoE layer (through
 * moe.h's sequence-parallel expert-TP path), the head and the PP messages work on 1/tp of the
 * tokens. The TP block's entry gathers its input along the rows (gather_from_sequence_parallel)
 * and its exit reduce-scatters (reduce_scatter_to_sequence_parallel), where without it they are
 * copy_to and reduce_from. The weights every TP rank keeps whole then see only their rank's
 * tokens: their gradients are summed over TP after the step's backward (model.c:
 * sp_reduce_grads). */
#ifndef HCOMM_TRAIN_SP_H_
#define HCOMM_TRAIN_SP_H_

#include "comm.h"

/* A micro-batch's rows as the TP block's entry and exit see them. */
typedef struct sp_rows {
    int64_t n;    /* this TP rank's rows outside the block */
    int64_t rows; /* the rows inside the block: every token of this CP rank */
    int on;       /* --sequence-parallel; else n == rows and the mappings are copy/reduce */
} sp_rows_t;

/* The block's entry: x [rows, C] from this rank's h [n, C]. */
static hcomm_result_t sp_enter_fwd(train_rt_t *rt, sp_rows_t r, real_t *h, real_t *x, int64_t C);
/* The block's exit: s [n, C] = this rank's rows of the sum over TP of y [rows, C]. */
static hcomm_result_t sp_exit_fwd(train_rt_t *rt, sp_rows_t r, real_t *y, real_t *s, int64_t C);
/* The exit's backward: dy [rows, C] from dh [n, C]. */
static hcomm_result_t sp_exit_bwd(train_rt_t *rt, sp_rows_t r, real_t *dh, real_t *dy, int64_t C);
/* The entry's backward: dx [n, C] from the partial input gradient dxp [rows, C]. */
static hcomm_result_t sp_enter_bwd(train_rt_t *rt, sp_rows_t r, real_t *dxp, real_t *dx, int64_t C);

#endif /* HCOMM_TRAIN_SP_H_ */
