/* Argument checks of MoE dispatch and layout. They are rank-local: a rank whose checks fail
 * still joins the count exchange, and its meta row (filled here) carries the verdict to every
 * peer, which reads it back here (hcomm__moe_check_peers) and fails with HCOMM_ERR_PEER instead
 * of waiting. */
#include "prims/moe_common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

hcomm_result_t hcomm__moe_check_ids(const char *fn, const int32_t *ids, int64_t n, int k,
                                    int num_experts, bool allow_empty) {
    if (n > 0 && ids == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument '%s' is NULL with %s=%lld tokens",
                          allow_empty ? "topk_ids" : "expert_ids", allow_empty ? "T" : "N",
                          (long long)n);
    int lo = allow_empty ? -1 : 0;
    for (int64_t s = 0; s < n * k; s++) {
        if (ids[s] >= lo && ids[s] < num_experts)
            continue;
        if (!allow_empty)
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "expert_ids[%lld]=%d outside 0..%d",
                              (long long)s, (int)ids[s], num_experts - 1);
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "topk_ids[%lld][%d]=%d outside -1..%d",
                          (long long)(s / k), (int)(s % k), (int)ids[s], num_experts - 1);
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm__moe_check_layout_args(const char *fn, int64_t n, int k, int num_experts,
                                            int ep_size) {
    if (n < 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "num_tokens=%lld, expected >= 0",
                          (long long)n);
    if (k < 1)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "k=%d, expected >= 1", k);
    if (ep_size < 1 || num_experts < 1 || num_experts % ep_size != 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "num_experts=%d is not a positive multiple of the ep_group size %d",
                          num_experts, ep_size);
    return HCOMM_OK;
}

hcomm_result_t hcomm__moe_check_options(const char *fn, const hcomm_moe_options_t *o) {
    if (o == NULL)
        return HCOMM_OK;
    if (!isfinite(o->capacity_factor))
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "options->capacity_factor=%g is not finite",
                          o->capacity_factor);
    if (o->drop_policy != HCOMM_MOE_DROP_POSITION && o->drop_policy != HCOMM_MOE_DROP_PROBS)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "options->drop_policy=%d is not HCOMM_MOE_DROP_POSITION or "
                          "HCOMM_MOE_DROP_PROBS",
                          (int)o->drop_policy);
    if (o->path != HCOMM_MOE_PATH_AUTO && o->path != HCOMM_MOE_PATH_FLAT &&
        o->path != HCOMM_MOE_PATH_HIER)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "options->path=%d is not HCOMM_MOE_PATH_AUTO, _FLAT or _HIER",
                          (int)o->path);
    return HCOMM_OK;
}

static hcomm_result_t check_weights(const char *fn, const float *w, int64_t n, int k) {
    for (int64_t s = 0; w != NULL && s < n * k; s++)
        if (!isfinite(w[s]))
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "topk_weights[%lld][%d]=%g is not finite",
                              (long long)(s / k), (int)(s % k), (double)w[s]);
    return HCOMM_OK;
}

/* A plan's call passes at most max_tokens_per_rank tokens of its hidden size and dtype. */
static hcomm_result_t check_plan_tokens(const char *fn, const hcomm_moe_plan_t *pl,
                                        const hcomm_tensor_t *t) {
    if (t->shape[0] > pl->d.max_tokens_per_rank)
        return hcomm__err(HCOMM_ERR_SHAPE, fn,
                          "tokens->shape[0]=%lld exceeds the plan's max_tokens_per_rank=%lld",
                          (long long)t->shape[0], (long long)pl->d.max_tokens_per_rank);
    if (t->shape[1] != pl->d.hidden || t->dtype != pl->d.dtype)
        return hcomm__err(HCOMM_ERR_SHAPE, fn,
                          "tokens are %s [*, %lld], the plan was made for %s [*, %lld]",
                          hcomm__dtype_str(t->dtype), (long long)t->shape[1],
                          hcomm__dtype_str(pl->d.dtype), (long long)pl->d.hidden);
    return HCOMM_OK;
}

hcomm_result_t hcomm__moe_check_dispatch(const hcomm__moe_args_t *a, const hcomm_moe_options_t *o) {
    const char *fn = a->fn;
    HCOMM__TRY(hcomm__tensor_check(fn, "tokens", a->tokens, NULL));
    if (a->tokens->ndim != 2)
        return hcomm__err(HCOMM_ERR_SHAPE, fn, "tokens->ndim=%d, expected 2 ([%s, H])",
                          a->tokens->ndim, a->topk ? "T" : "N");
    if (!a->topk)
        return hcomm__moe_check_ids(fn, a->ids, a->tokens->shape[0], 1, a->num_experts, false);
    if (a->tokens->shape[1] < 1)
        return hcomm__err(HCOMM_ERR_SHAPE, fn, "tokens->shape[1]=%lld (hidden), expected >= 1",
                          (long long)a->tokens->shape[1]);
    if (a->k < 1)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "k=%d, expected >= 1", a->k);
    HCOMM__TRY(hcomm__moe_check_ids(fn, a->ids, a->tokens->shape[0], a->k, a->num_experts, true));
    HCOMM__TRY(check_weights(fn, a->weights, a->tokens->shape[0], a->k));
    if (a->plan != NULL)
        return check_plan_tokens(fn, a->plan, a->tokens);
    return hcomm__moe_check_options(fn, o);
}

/* ---- the meta row: this rank's verdict out, the peers' verdicts in ---- */

/* Fills the meta row for each peer (row p at meta + p * w; row 0's counts are filled). */
void hcomm__moe_fill_meta(const hcomm_moe_handle_t *h, hcomm_result_t local, int64_t *meta, int w) {
    for (int p = 0; p < h->size; p++) {
        int64_t *m = meta + p * w;
        m[META_STATUS] = local;
        m[META_H] = h->h;
        m[META_DTYPE] = h->dtype;
        m[META_K] = h->k;
        m[META_ROWS] = h->send_rows[p];
        m[META_PATH] = h->hier;
        m[META_ETP] = h->etp != NULL ? h->etp_size : 1;
        m[META_NODE_ROWS] = 0;
        m[META_DROPPED] = 0;
        for (int e = 0; e < h->size * h->num_local; e++)
            m[META_DROPPED] += h->dropped[e];
        if (p > 0)
            memcpy(m + META_COUNTS, meta + META_COUNTS,
                   sizeof(int64_t) * (size_t)(h->size * h->num_local));
    }
}

/* Fails if a peer failed its checks or disagrees on the rows. */
hcomm_result_t hcomm__moe_check_peers(const char *fn, const hcomm_moe_handle_t *h,
                                      const int64_t *meta) {
    int w = hcomm__moe_meta_width(h);
    for (int s = 0; s < h->size; s++) {
        const int64_t *m = meta + s * w;
        if (m[META_STATUS] != HCOMM_OK)
            return hcomm__err(HCOMM_ERR_PEER, fn,
                              "rank %d of ep_group failed its argument checks with %s", s,
                              hcomm_result_name((hcomm_result_t)m[META_STATUS]));
    }
    for (int s = 0; s < h->size; s++)
        if (meta[s * w + META_PATH] != (int64_t)h->hier)
            return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                              "options->path: the %s token exchange on rank %d of ep_group but "
                              "the %s on rank %d",
                              meta[s * w + META_PATH] ? "hierarchical" : "flat", s,
                              h->hier ? "hierarchical" : "flat", h->group->rank);
    int etp = h->etp != NULL ? h->etp_size : 1;
    for (int s = 0; s < h->size; s++)
        if (meta[s * w + META_ETP] != etp)
            return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                              "options->etp_group size=%lld on rank %d of ep_group but size=%d "
                              "on rank %d (1: none; every EP rank needs an expert-TP group of one "
                              "size)",
                              (long long)meta[s * w + META_ETP], s, etp, h->group->rank);
    for (int s = 0; s < h->size; s++) {
        const int64_t *m = meta + s * w;
        if (m[META_H] != h->h || m[META_DTYPE] != (int64_t)h->dtype)
            return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                              "rank %d sent tokens of %s [*, %lld], this rank %s [*, %lld]", s,
                              hcomm__dtype_str((hcomm_dtype_t)m[META_DTYPE]), (long long)m[META_H],
                              hcomm__dtype_str(h->dtype), (long long)h->h);
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm__moe_mismatch(const char *fn, hcomm_result_t res, const char *fmt, ...) {
    if (res != HCOMM_ERR_MISMATCH)
        return res;
    char detail[512], more[512];
    snprintf(detail, sizeof detail, "%s", hcomm__err_detail(fn));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(more, sizeof more, fmt, ap);
    va_end(ap);
    return hcomm__err(res, fn, "%s%s", detail, more);
}
