/* Running a chosen algorithm (run.c): each collective's runner, once its call is agreed on,
 * dispatches to the algorithm's function (algos.h) or the transport's native call; reductions
 * go through one widening step (AVG as SUM and a division, f16/bf16 sums and products in f32,
 * except for the algorithms that reduce halves themselves). And each collective's meeting
 * form (shm, direct on a board), which checks the call in its own meetings on the board. */
#ifndef HCOMM_C_ALGO_RUN_H_
#define HCOMM_C_ALGO_RUN_H_

#include "algo/state.h"

/* One collective's arguments as the entry path and the runners carry them. */
typedef struct hcomm__args {
    const void *send;
    void *recv;           /* broadcast: the buffer */
    size_t in, out;       /* reductions: elements this rank passes in and gets out; moves: bytes
                             per rank in `in`; v-calls: `in` is the counts' total */
    const size_t *counts; /* v-calls: one entry per rank (elements; all_gatherv: bytes) */
    hcomm_dtype_t dt;     /* moves: HCOMM_U8 */
    hcomm_op_t op;        /* moves: HCOMM_SUM */
    int root;
} hcomm__args_t;

typedef hcomm_result_t (*hcomm__runner_t)(hcomm__call_t *k, int algo, const hcomm__args_t *a);

/* The runners, after the agreement (HCOMM__ALGO_DET included where choose.c set it). */
hcomm_result_t hcomm__run_all_reduce(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__run_reduce_scatter(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__run_reduce(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__run_all_gather(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__run_all_gatherv(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__run_broadcast(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__run_gather(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__run_scatter(hcomm__call_t *k, int algo, const hcomm__args_t *a);

/* The meeting forms, run instead of the agreement and the runner (shm; broadcast, gather and
 * scatter also direct on a board). */
hcomm_result_t hcomm__meet_all_reduce(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__meet_reduce_scatter(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__meet_reduce(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__meet_all_gather(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__meet_all_gatherv(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__meet_broadcast(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__meet_gather(hcomm__call_t *k, int algo, const hcomm__args_t *a);
hcomm_result_t hcomm__meet_scatter(hcomm__call_t *k, int algo, const hcomm__args_t *a);

#endif /* HCOMM_C_ALGO_RUN_H_ */
