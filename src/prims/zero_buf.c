/* The shard plan's buffers (zero_internal.h): allocation counted in the plan's live and peak
 * bytes, spares kept for reuse, and the bucket check; used by zero_plan.c and zero_comm.c. */
#include "prims/zero_internal.h"

#include <string.h>

/* A spare of exactly bytes, taken out of the spares (still counted live), or NULL. */
static void *take_spare(hcomm_zero_plan_t *p, size_t bytes) {
    for (int i = 0; i < ZERO_SPARES; i++)
        if (p->spare[i] && p->spare_bytes[i] == bytes) {
            void *b = p->spare[i];
            p->spare[i] = NULL;
            return b;
        }
    return NULL;
}

hcomm_result_t hcomm__zero_alloc_raw(hcomm_zero_plan_t *p, size_t bytes, void **out) {
    *out = take_spare(p, bytes);
    return *out ? HCOMM_OK : hcomm__zero_alloc(p, bytes, out);
}

void hcomm__zero_recycle(hcomm_zero_plan_t *p, void **ptr, size_t bytes) {
    for (int i = 0; *ptr && i < ZERO_SPARES && i < p->cfg.spares; i++)
        if (!p->spare[i]) {
            p->spare[i] = *ptr;
            p->spare_bytes[i] = bytes;
            *ptr = NULL;
        }
    hcomm__zero_free(p, ptr, bytes);
}

hcomm_result_t hcomm__zero_alloc(hcomm_zero_plan_t *p, size_t bytes, void **out) {
    *out = take_spare(p, bytes);
    if (*out) {
        memset(*out, 0, bytes);
        return HCOMM_OK;
    }
    *out = calloc(bytes ? bytes : 1, 1);
    if (!*out)
        return hcomm__err(HCOMM_ERR_NOMEM, p->g->call_fn, "out of memory allocating %zu bytes",
                          bytes);
    p->live += bytes;
    if (p->live > p->peak)
        p->peak = p->live;
    return HCOMM_OK;
}

void hcomm__zero_free(hcomm_zero_plan_t *p, void **ptr, size_t bytes) {
    if (!*ptr)
        return;
    free(*ptr);
    *ptr = NULL;
    p->live -= bytes;
}

hcomm_result_t hcomm__zero_check_bucket(const hcomm_zero_plan_t *p, int bucket, bool all_ok) {
    if ((bucket >= 0 && bucket < p->nb) || (all_ok && bucket == HCOMM_ZERO_ALL))
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_INVALID_ARG, p->g->call_fn,
                      "bucket=%d is outside 0..%d%s (the plan has %d buckets)", bucket, p->nb - 1,
                      all_ok ? " and is not HCOMM_ZERO_ALL" : "", p->nb);
}

void hcomm__zero_fresh_grads(zbucket_t *b) {
    if (b->gfull && b->gstale)
        memset(b->gfull, 0, b->padded * hcomm__dtype_size(b->dt));
    b->gstale = false;
}
