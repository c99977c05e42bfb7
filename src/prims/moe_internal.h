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

/* The local permutation of dispatch and combine: dst row i = src row idx[i] (gather) or
 * dst row idx[i] = src row i (scatter), n rows of rb bytes. Tests time it against memcpy. */
void hcomm__moe_gather_rows(void *dst, const void *src, const int64_t *idx, int64_t n, size_t rb);
void hcomm__moe_scatter_rows(void *dst, const void *src, const int64_t *idx, int64_t n, size_t rb);

#endif /* HCOMM_C_PRIMS_MOE_INTERNAL_H_ */
