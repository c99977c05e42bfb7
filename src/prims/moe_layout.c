/* The layout of a dispatch and the permutation kernels of every pass: counts per rank and per
 * expert, the stable expert-major permutation (hcomm_moe_layout), capacity drops, and the row
 * gather and scatter that reorder tokens between the handle's orders (moe_common.h). */
#include "prims/moe_common.h"

#include <math.h>
#include <string.h>

int64_t hcomm__moe_scan(const int64_t *counts, int64_t *offsets, int n) {
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        offsets[i] = sum;
        sum += counts[i];
    }
    return sum;
}

/* ---- counts and the stable expert-major permutation ---- */

/* Counts tokens per rank (a token once per rank) and slots per expert over the slots keep
 * marks (NULL: every non-empty slot); perm (may be NULL) gets the expert-major order. scratch
 * holds ep_size + num_experts entries. */
static void count_layout(const int32_t *ids, const uint8_t *keep, int64_t n, int k, int num_experts,
                         int ep_size, int64_t *per_rank, int64_t *per_expert, int64_t *perm,
                         int64_t *scratch) {
    int64_t *last = scratch, *next = scratch + ep_size;
    int num_local = num_experts / ep_size;
    memset(per_rank, 0, sizeof(int64_t) * (size_t)ep_size);
    memset(per_expert, 0, sizeof(int64_t) * (size_t)num_experts);
    for (int p = 0; p < ep_size; p++)
        last[p] = -1;
    for (int64_t s = 0; s < n * k; s++) {
        if (ids[s] < 0 || (keep && !keep[s]))
            continue;
        int p = ids[s] / num_local;
        per_expert[ids[s]]++;
        if (last[p] != s / k) {
            last[p] = s / k;
            per_rank[p]++;
        }
    }
    if (perm == NULL)
        return;
    hcomm__moe_scan(per_expert, next, num_experts);
    for (int64_t s = 0; s < n * k; s++)
        if (ids[s] >= 0 && (keep == NULL || keep[s]))
            perm[next[ids[s]]++] = s;
}

hcomm_result_t hcomm_moe_layout(const int32_t *topk_ids, int64_t num_tokens, int k, int num_experts,
                                int ep_size, int64_t *tokens_per_rank, int64_t *tokens_per_expert,
                                int64_t *perm) {
    HCOMM__CHECK_NULL(tokens_per_rank);
    HCOMM__CHECK_NULL(tokens_per_expert);
    HCOMM__TRY(hcomm__moe_check_layout_args(__func__, num_tokens, k, num_experts, ep_size));
    HCOMM__TRY(hcomm__moe_check_ids(__func__, topk_ids, num_tokens, k, num_experts, true));
    int64_t *scratch = hcomm__moe_alloc_i64((size_t)ep_size + (size_t)num_experts);
    if (scratch == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, __func__, "out of memory for %d counts",
                          ep_size + num_experts);
    count_layout(topk_ids, NULL, num_tokens, k, num_experts, ep_size, tokens_per_rank,
                 tokens_per_expert, perm, scratch);
    free(scratch);
    return HCOMM_OK;
}

/* ---- capacity: the slots past an expert's capacity are dropped ---- */

/* One slot of an expert over capacity, for the probs policy's sort. */
typedef struct ranked {
    float w;
    int64_t slot;
} ranked_t;

/* Highest weight first; ties (and NaN, ranked lowest) keep the earlier slot: a total order,
 * so qsort's instability cannot show. */
static int by_weight(const void *a, const void *b) {
    const ranked_t *x = a, *y = b;
    float wx = isnan(x->w) ? -INFINITY : x->w, wy = isnan(y->w) ? -INFINITY : y->w;
    if (wx != wy)
        return wx > wy ? -1 : 1;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/* Clears keep for the slots of one expert past capacity (seg: its slots in token order). */
static hcomm_result_t drop_segment(const char *fn, const int64_t *seg, int64_t cnt, int64_t cap,
                                   const float *w, int policy, uint8_t *keep) {
    if (cnt <= cap)
        return HCOMM_OK;
    if (policy == HCOMM_MOE_DROP_POSITION || w == NULL) {
        for (int64_t i = cap; i < cnt; i++)
            keep[seg[i]] = 0;
        return HCOMM_OK;
    }
    ranked_t *rk = malloc(sizeof *rk * (size_t)cnt);
    if (rk == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory ranking %lld slots", (long long)cnt);
    for (int64_t i = 0; i < cnt; i++)
        rk[i] = (ranked_t){w[seg[i]], seg[i]};
    qsort(rk, (size_t)cnt, sizeof *rk, by_weight);
    for (int64_t i = cap; i < cnt; i++)
        keep[rk[i].slot] = 0;
    free(rk);
    return HCOMM_OK;
}

/* keep[s]: slot s is routed (not empty, not dropped); counts the drops per expert. */
hcomm_result_t hcomm__moe_mark_kept(const hcomm__moe_args_t *a, hcomm_moe_handle_t *h,
                                    uint8_t *keep) {
    int64_t slots = h->n * h->k, e_all = a->num_experts;
    for (int64_t s = 0; s < slots; s++)
        keep[s] = a->ids[s] >= 0;
    if (h->capacity < 0)
        return HCOMM_OK;
    int64_t *perm = hcomm__moe_alloc_i64((size_t)slots),
            *cnt = hcomm__moe_alloc_i64((size_t)(e_all + h->size)),
            *scratch = hcomm__moe_alloc_i64((size_t)(e_all + h->size));
    hcomm_result_t res = HCOMM_OK;
    if (!perm || !cnt || !scratch) {
        res = hcomm__err(HCOMM_ERR_NOMEM, a->fn, "out of memory for the layout of %lld slots",
                         (long long)slots);
        goto done;
    }
    count_layout(a->ids, NULL, h->n, h->k, a->num_experts, h->size, cnt + e_all, cnt, perm,
                 scratch);
    const int64_t *seg = perm;
    for (int64_t e = 0; e < e_all && res == HCOMM_OK; seg += cnt[e], e++) {
        h->dropped[e] = cnt[e] > h->capacity ? cnt[e] - h->capacity : 0;
        res = drop_segment(a->fn, seg, cnt[e], h->capacity, a->weights, a->policy, keep);
    }
done:
    free(perm);
    free(cnt);
    free(scratch);
    return res;
}

/* ---- moving rows: the permutation kernels ---- */

/* One row. Rows of 2 KiB and more go in fixed 256-byte pieces, which the compiler turns into
 * vector moves: glibc's memcpy takes `rep movsb` from 2 KiB on, which ran row permutations at a
 * fraction of memcpy's bandwidth on AMD EPYC hosts (docs/tuning.md: moe.copy-row). */
static inline void copy_row(char *restrict dst, const char *restrict src, size_t rb) {
    size_t i = 0;
    if (rb >= 2048)
        for (; i + 256 <= rb; i += 256)
            memcpy(dst + i, src + i, 256);
    memcpy(dst + i, src + i, rb - i);
}

/* A permutation of HCOMM__STREAM_MIN_BYTES and more leaves the cache behind it: its rows are
 * streamed (stores that bypass the cache), as glibc's memcpy does for a copy of that size
 * (docs/tuning.md: moe.stream-rows). Rows of 1 KiB and more: a scatter writes rows in random
 * order, and a row that does not fill its cache lines leaves partial write-combining flushes at
 * its ends, costly on short rows. */
static bool streams_from(const void *dst, size_t rb, int64_t n, size_t min_bytes) {
    return (size_t)n * rb >= min_bytes && rb >= 1024 && rb % 16 == 0 && (uintptr_t)dst % 16 == 0;
}

static bool streams(const void *dst, size_t rb, int64_t n) {
    return streams_from(dst, rb, n, HCOMM__STREAM_MIN_BYTES);
}

/* Dispatch's expansion of rows read where they lie streams from 1 MiB: the received rows are
 * read next by the experts, not by this copy, and a cached store first reads each line it
 * owns (docs/tuning.md: moe.pull). */
bool hcomm__moe_streams(const void *dst, size_t rb, int64_t n) {
    return streams_from(dst, rb, n, (size_t)1 << 20);
}

/* dst row i = src row idx[i] (gather) or dst row idx[i] = src row i (scatter), streamed. */
static void stream_rows(char *dst, const char *src, const int64_t *idx, int64_t n, size_t rb,
                        bool gather) {
    for (int64_t i = 0; i < n; i++)
        hcomm__copy_stream(dst + (size_t)(gather ? i : idx[i]) * rb,
                           src + (size_t)(gather ? idx[i] : i) * rb, rb);
    hcomm__stream_fence(); /* the streamed stores are visible before the rows are sent */
}

void hcomm__moe_gather_rows(void *dst, const void *src, const int64_t *idx, int64_t n, size_t rb) {
    if (streams(dst, rb, n)) {
        stream_rows(dst, src, idx, n, rb, true);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        copy_row((char *)dst + (size_t)i * rb, (const char *)src + (size_t)idx[i] * rb, rb);
}

void hcomm__moe_scatter_rows(void *dst, const void *src, const int64_t *idx, int64_t n, size_t rb) {
    if (streams(dst, rb, n)) {
        stream_rows(dst, src, idx, n, rb, false);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        copy_row((char *)dst + (size_t)idx[i] * rb, (const char *)src + (size_t)i * rb, rb);
}

void hcomm__moe_copy_row(void *dst, const void *src, size_t rb) {
    copy_row(dst, src, rb);
}
