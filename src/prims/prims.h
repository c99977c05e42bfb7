/* Helpers shared by the primitives (tp, pp, moe, dp). Primitives communicate only through the
 * algorithms layer (collectives) and hcomm's p2p layer (PP), never a transport directly. */
#ifndef HCOMM_C_PRIMS_H_
#define HCOMM_C_PRIMS_H_

#include "algo/coll.h"

#include <stdlib.h>

/* Fails with HCOMM_ERR_DTYPE naming both dtypes unless a and b have the same dtype. */
static inline hcomm_result_t hcomm__same_dtype(const char *fn, const char *an,
                                               const hcomm_tensor_t *a, const char *bn,
                                               const hcomm_tensor_t *b) {
    if (a->dtype == b->dtype)
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_DTYPE, fn, "%s->dtype=%s differs from %s->dtype=%s", an,
                      hcomm__dtype_str(a->dtype), bn, hcomm__dtype_str(b->dtype));
}

/* Allocates scratch of bytes (at least 1, so a 0-byte buffer is still a valid pointer). */
static inline hcomm_result_t hcomm__alloc(const char *fn, size_t bytes, void **out) {
    *out = malloc(bytes ? bytes : 1);
    if (*out == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory allocating %zu bytes of scratch",
                          bytes);
    return HCOMM_OK;
}

/* DP helpers shared by the one-shot call and the reducer (dp.c). */
hcomm_result_t hcomm__dp_check_grads(const char *fn, const hcomm_tensor_t *grads, int n,
                                     hcomm_op_t op);
/* A digest of the list's dtypes and shapes, and a short text of it (cap bytes) for messages. */
uint64_t hcomm__dp_list_digest(const hcomm_tensor_t *grads, int n, char *desc, size_t cap);

#endif /* HCOMM_C_PRIMS_H_ */
