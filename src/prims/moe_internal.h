/* What the MoE files share (moe.c: dispatch, combine and the passes; moe_pool.c: scratch kept
 * per group; moe_plan.c: preallocated plans and pad-to-capacity). */
#ifndef HCOMM_C_PRIMS_MOE_INTERNAL_H_
#define HCOMM_C_PRIMS_MOE_INTERNAL_H_

#include "hcomm/moe.h"
#include "prims/prims.h"

/* ---- scratch pool (moe_pool.c) ---- */

typedef struct hcomm__moe_pool hcomm__moe_pool_t;

/* The group's pool, created on first use and freed with the group (NULL: out of memory). */
hcomm__moe_pool_t *hcomm__moe_pool_of(hcomm_comm_t *c);
/* A handle holding buffers of the pool keeps it alive past its group. */
void hcomm__moe_pool_ref(hcomm__moe_pool_t *pool);
void hcomm__moe_pool_unref(hcomm__moe_pool_t *pool);
/* A buffer of at least bytes (64-byte aligned, contents undefined), reused when one is free. */
hcomm_result_t hcomm__moe_pool_get(hcomm__moe_pool_t *pool, const char *fn, size_t bytes,
                                   void **out);
/* Gives p (from hcomm__moe_pool_get; NULL is a no-op) back for reuse. */
void hcomm__moe_pool_put(hcomm__moe_pool_t *pool, void *p);

/* ---- dispatch (moe.c) and plans (moe_plan.c) ---- */

/* What a dispatch was asked to do. */
typedef struct hcomm__moe_args {
    const char *fn;
    const hcomm_tensor_t *tokens;
    const int32_t *ids;
    const float *weights;
    int k, num_experts;
    bool topk, capacity_mode;
    double capacity_factor;
    int policy;
    const hcomm_moe_plan_t *plan; /* preallocated mode: the limits every call is checked against */
} hcomm__moe_args_t;

/* A preallocated dispatch: limits agreed by every rank at creation, one receive buffer of the
 * worst case, one handle reused by every dispatch. */
struct hcomm_moe_plan {
    hcomm_comm_t *group;
    hcomm_moe_plan_desc_t d;
    int64_t capacity; /* from max_tokens_per_rank; -1 dropless */
    int64_t max_rows; /* rows the buffer holds: the most any rank can receive */
    void *recv;       /* [max_rows, hidden] */
    hcomm_moe_handle_t *handle;
};

/* Checks (rank-local), allocates the handle and runs the collective part of a dispatch. */
hcomm_result_t hcomm__moe_dispatch_call(hcomm_comm_t *g, const hcomm__moe_args_t *a,
                                        const hcomm_moe_options_t *o, hcomm_moe_handle_t **out);
/* Frees a handle, also a plan's (NULL is a no-op). */
void hcomm__moe_handle_release(hcomm_moe_handle_t *handle);
/* Rank-local checks of options, and of T, k, E and the group size, worded for fn. */
hcomm_result_t hcomm__moe_check_options(const char *fn, const hcomm_moe_options_t *o);
hcomm_result_t hcomm__moe_check_layout_args(const char *fn, int64_t n, int k, int num_experts,
                                            int ep_size);

/* The local permutation of dispatch and combine: dst row i = src row idx[i] (gather) or
 * dst row idx[i] = src row i (scatter), n rows of rb bytes. Tests time it against memcpy. */
void hcomm__moe_gather_rows(void *dst, const void *src, const int64_t *idx, int64_t n, size_t rb);
void hcomm__moe_scatter_rows(void *dst, const void *src, const int64_t *idx, int64_t n, size_t rb);

#endif /* HCOMM_C_PRIMS_MOE_INTERNAL_H_ */
