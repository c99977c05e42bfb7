/* The shard plan's communication, on the existing collectives: a bucket's parameters are an
 * all_gather of every rank's shard (blocking, or nonblocking as a prefetch); its gradients a
 * reduce_scatter into the shard (widened first where the reduction dtype is wider), then, for
 * HSDP, an all_reduce of the shard over the replicate group, as FSDP's HSDP does. */
#include "prims/zero_internal.h"

#include <stdio.h>
#include <string.h>

/* This rank's checks failed: it joins its peers' call so that they fail instead of waiting.
 * A nonblocking call's peers wait in the worker's operation: a failing part of one joins it. */
static hcomm_result_t join_failed(hcomm_zero_plan_t *p, hcomm_result_t res, bool nonblocking) {
    if (!nonblocking)
        return hcomm__coll_fail(p->g, res);
    char text[512];
    snprintf(text, sizeof text, "%s", hcomm_last_error());
    hcomm_request_t *req = NULL;
    if (hcomm_iall_gather(p->g, NULL, NULL, 1, &req) == HCOMM_OK && req)
        (void)hcomm_wait(req);
    return hcomm__err_text(res, text);
}

/* ---- all_gather_params ---- */

/* Points the bucket's full parameters at the caller's buffer or at one the plan owns. */
static hcomm_result_t gather_target(hcomm_zero_plan_t *p, int k, void *buf, size_t bytes) {
    zbucket_t *b = &p->b[k];
    size_t es = hcomm__dtype_size(b->dt), need = b->padded * es;
    const char *fn = p->g->call_fn;
    if (buf && p->cfg.stage < 3)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "a caller's buffer needs a ZeRO-3 plan (stage %d keeps its gathered "
                          "parameters in the plan); pass buf=NULL",
                          p->cfg.stage);
    if (buf && bytes != need)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "buf_bytes=%zu but bucket %d gathers %zu bytes (%zu elements of %s, "
                          "pad included; see hcomm_zero_locate)",
                          bytes, k, need, b->padded, hcomm__dtype_str(b->dt));
    if (b->full_owned && buf)
        hcomm__zero_free(p, &b->full, need);
    b->gathered = false;
    if (buf) {
        b->full = buf;
        b->full_owned = false;
        return HCOMM_OK;
    }
    if (!b->full_owned)
        b->full = NULL;
    b->full_owned = true;
    return b->full ? HCOMM_OK : hcomm__zero_alloc_raw(p, need, &b->full);
}

static hcomm_result_t gather_one(hcomm_zero_plan_t *p, int k, void *buf, size_t bytes, bool nb) {
    zbucket_t *b = &p->b[k];
    if (b->ag) {
        if (buf && buf != b->full)
            return join_failed(p,
                               hcomm__err(HCOMM_ERR_INVALID_ARG, p->g->call_fn,
                                          "bucket %d's gather in flight writes another buffer "
                                          "than buf; wait for it first",
                                          k),
                               nb);
        if (nb)
            return HCOMM_OK;
        return hcomm__zero_wait_bucket(p, b);
    }
    hcomm_result_t r = gather_target(p, k, buf, bytes);
    if (r != HCOMM_OK)
        return join_failed(p, r, nb);
    size_t part = b->shard * hcomm__dtype_size(b->dt);
    if (nb)
        return hcomm_iall_gather(p->g, b->pshard, b->full, part, &b->ag);
    r = hcomm__coll_all_gather(p->g, b->pshard, b->full, part);
    b->gathered = r == HCOMM_OK;
    return r;
}

static hcomm_result_t gather(hcomm_zero_plan_t *p, int bucket, void *buf, size_t bytes, bool nb) {
    hcomm_result_t r = hcomm__zero_check_bucket(p, bucket, true);
    if (r == HCOMM_OK && buf && bucket == HCOMM_ZERO_ALL)
        r = hcomm__err(HCOMM_ERR_INVALID_ARG, p->g->call_fn,
                       "a caller's buffer holds one bucket, not HCOMM_ZERO_ALL");
    if (r != HCOMM_OK)
        return join_failed(p, r, nb);
    if (bucket != HCOMM_ZERO_ALL)
        return gather_one(p, bucket, buf, bytes, nb);
    for (int k = 0; k < p->nb; k++)
        HCOMM__TRY(gather_one(p, k, NULL, 0, nb));
    return HCOMM_OK;
}

hcomm_result_t hcomm__zero_gather_all(hcomm_zero_plan_t *p) {
    return gather(p, HCOMM_ZERO_ALL, NULL, 0, false);
}

hcomm_result_t hcomm_zero_all_gather_params(hcomm_zero_plan_t *plan, int bucket, void *buf,
                                            size_t buf_bytes) {
    HCOMM__CHECK_NULL(plan);
    hcomm__enter(plan->g, __func__);
    return hcomm__leave(plan->g, gather(plan, bucket, buf, buf_bytes, false));
}

hcomm_result_t hcomm_zero_iall_gather_params(hcomm_zero_plan_t *plan, int bucket, void *buf,
                                             size_t buf_bytes) {
    HCOMM__CHECK_NULL(plan);
    hcomm__enter(plan->g, __func__);
    return hcomm__leave(plan->g, gather(plan, bucket, buf, buf_bytes, true));
}

static hcomm_result_t release_one(hcomm_zero_plan_t *p, int k) {
    zbucket_t *b = &p->b[k];
    if (b->ag)
        return hcomm__err(HCOMM_ERR_STATE, p->g->call_fn,
                          "bucket %d's gather has not completed; wait for it (hcomm_zero_wait) "
                          "before releasing it",
                          k);
    if (p->cfg.stage < 3)
        return HCOMM_OK;
    if (b->full_owned)
        hcomm__zero_recycle(p, &b->full, b->padded * hcomm__dtype_size(b->dt));
    b->full = NULL;
    b->full_owned = false;
    b->gathered = false;
    return HCOMM_OK;
}

hcomm_result_t hcomm_zero_release(hcomm_zero_plan_t *plan, int bucket) {
    HCOMM__CHECK_NULL(plan);
    hcomm__enter(plan->g, __func__);
    hcomm_result_t r = hcomm__zero_check_bucket(plan, bucket, true);
    for (int k = 0; r == HCOMM_OK && k < plan->nb; k++) /* checked first: all or nothing */
        if ((bucket == k || bucket == HCOMM_ZERO_ALL) && plan->b[k].ag)
            r = release_one(plan, k);
    for (int k = 0; r == HCOMM_OK && k < plan->nb; k++)
        if (bucket == k || bucket == HCOMM_ZERO_ALL)
            r = release_one(plan, k);
    return hcomm__leave(plan->g, r);
}

/* ---- reduce_scatter_grads ---- */

/* dst (rd) = src (dt) widened, for the pairs reduce_dtype allows. */
static void widen(void *dst, hcomm_dtype_t rd, const void *src, hcomm_dtype_t dt, size_t n) {
    if (rd == HCOMM_F32) {
        hcomm__widen(dst, src, n, dt);
        return;
    }
    double *d = dst;
    for (size_t i = 0; i < n; i++)
        if (dt == HCOMM_F32)
            d[i] = ((const float *)src)[i];
        else
            d[i] = dt == HCOMM_F16 ? hcomm__f16_to_f32(((const uint16_t *)src)[i])
                                   : hcomm__bf16_to_f32(((const uint16_t *)src)[i]);
}

/* After the shard group's reduce_scatter (result r): the replicate all_reduce (or, if r
 * failed, this rank's failed part of it, so that replicas do not wait), then the full
 * gradients start the next window: zeroed (ZeRO-1) or freed. */
static hcomm_result_t rs_finish(hcomm_zero_plan_t *p, zbucket_t *b, hcomm_result_t r) {
    void *dst = b->gnew ? b->gnew : b->gshard;
    size_t es = hcomm__dtype_size(b->dt), rs = hcomm__dtype_size(b->rd);
    if (p->rep) {
        hcomm__enter(p->rep, p->g->call_fn);
        r = r == HCOMM_OK ? hcomm__coll_all_reduce(p->rep, dst, dst, b->shard, b->rd, p->cfg.op)
                          : hcomm__coll_fail(p->rep, r);
        hcomm__leave(p->rep, r);
    }
    if (b->gnew && r == HCOMM_OK)
        hcomm__reduce(b->gshard, b->gnew, b->shard, b->rd, HCOMM_SUM);
    hcomm__zero_free(p, &b->gnew, b->shard * rs);
    hcomm__zero_recycle(p, &b->gwide, b->padded * rs);
    if (p->cfg.stage == 1 && b->gfull)
        b->gstale = true;
    else
        hcomm__zero_recycle(p, &b->gfull, b->padded * es);
    return r;
}

static hcomm_result_t rs_one(hcomm_zero_plan_t *p, int k, bool nb) {
    zbucket_t *b = &p->b[k];
    if (b->rs)
        return nb ? HCOMM_OK : hcomm__zero_wait_bucket(p, b);
    size_t es = hcomm__dtype_size(b->dt);
    hcomm_result_t r = b->gfull ? HCOMM_OK : hcomm__zero_alloc(p, b->padded * es, &b->gfull);
    hcomm__zero_fresh_grads(b);
    const void *src = b->gfull;
    if (r == HCOMM_OK && b->rd != b->dt) {
        r = hcomm__zero_alloc_raw(p, b->padded * hcomm__dtype_size(b->rd), &b->gwide);
        if (r == HCOMM_OK)
            widen(b->gwide, b->rd, b->gfull, b->dt, b->padded);
        src = b->gwide;
    }
    if (r == HCOMM_OK && !b->gshard) /* the first reduce_scatter since clear_grads */
        r = hcomm__zero_alloc(p, b->shard * hcomm__dtype_size(b->rd), &b->gshard);
    if (r == HCOMM_OK && p->cfg.accumulate)
        r = hcomm__zero_alloc(p, b->shard * hcomm__dtype_size(b->rd), &b->gnew);
    if (r != HCOMM_OK)
        return rs_finish(p, b, join_failed(p, r, nb));
    void *dst = b->gnew ? b->gnew : b->gshard;
    if (nb)
        return hcomm_ireduce_scatter(p->g, src, dst, b->shard, b->rd, p->cfg.op, &b->rs);
    r = hcomm__coll_reduce_scatter(p->g, src, dst, b->shard, b->rd, p->cfg.op);
    return rs_finish(p, b, r);
}

static hcomm_result_t reduce_scatter(hcomm_zero_plan_t *p, int bucket, bool nb) {
    hcomm_result_t r = hcomm__zero_check_bucket(p, bucket, true);
    if (r != HCOMM_OK) {
        r = join_failed(p, r, nb);
        if (p->rep) { /* replicas would wait in the all_reduce after it */
            hcomm__enter(p->rep, p->g->call_fn);
            hcomm__leave(p->rep, hcomm__coll_fail(p->rep, r));
        }
        return r;
    }
    if (p->no_sync)
        return HCOMM_OK;
    for (int k = 0; k < p->nb; k++)
        if (bucket == k || bucket == HCOMM_ZERO_ALL)
            HCOMM__TRY(rs_one(p, k, nb));
    return HCOMM_OK;
}

hcomm_result_t hcomm_zero_reduce_scatter_grads(hcomm_zero_plan_t *plan, int bucket) {
    HCOMM__CHECK_NULL(plan);
    hcomm__enter(plan->g, __func__);
    return hcomm__leave(plan->g, reduce_scatter(plan, bucket, false));
}

hcomm_result_t hcomm_zero_ireduce_scatter_grads(hcomm_zero_plan_t *plan, int bucket) {
    HCOMM__CHECK_NULL(plan);
    hcomm__enter(plan->g, __func__);
    return hcomm__leave(plan->g, reduce_scatter(plan, bucket, true));
}

/* ---- completion ---- */

hcomm_result_t hcomm__zero_wait_bucket(hcomm_zero_plan_t *p, zbucket_t *b) {
    hcomm_result_t r = HCOMM_OK;
    if (b->ag) {
        r = hcomm_wait(b->ag);
        b->ag = NULL;
        b->gathered = r == HCOMM_OK;
    }
    if (b->rs) {
        hcomm_result_t w = hcomm_wait(b->rs);
        b->rs = NULL;
        w = rs_finish(p, b, w);
        r = r == HCOMM_OK ? w : r;
    }
    return r;
}

static hcomm_result_t wait_call(hcomm_zero_plan_t *p, int bucket, double *wait_s) {
    double t0 = hcomm__now();
    hcomm_result_t r = hcomm__zero_check_bucket(p, bucket, true);
    bool ok = r == HCOMM_OK;
    for (int k = 0; ok && k < p->nb; k++) /* every bucket, even after an error */
        if (bucket == k || bucket == HCOMM_ZERO_ALL) {
            hcomm_result_t w = hcomm__zero_wait_bucket(p, &p->b[k]);
            r = r == HCOMM_OK ? w : r;
        }
    if (wait_s)
        *wait_s = hcomm__now() - t0;
    return r;
}

hcomm_result_t hcomm_zero_wait(hcomm_zero_plan_t *plan, int bucket, double *wait_s) {
    HCOMM__CHECK_NULL(plan);
    hcomm__enter(plan->g, __func__);
    return hcomm__leave(plan->g, wait_call(plan, bucket, wait_s));
}
