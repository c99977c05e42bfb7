/* Mixture-of-experts dispatch and combine over the EP group (GShard, Lepikhin et al. 2020;
 * the data path of Megatron-Core's MoEAlltoAllTokenDispatcher; DeepEP's send-once layout).
 *
 * Dispatch: the layout step counts, per destination rank, the distinct tokens with a kept slot
 * there and, per (rank, local expert), the slots. One count exchange (an all_to_allv of a meta
 * row per peer, which also carries each rank's argument-check status) and one token exchange
 * (each token once per destination rank, followed by a header of k local-expert ids per row)
 * follow. The receiver expands every row into one row per slot, expert-major. The handle keeps
 * three orders and the maps between them:
 *   tokens [n]        the caller's order; slot t*k+j is (token t, slot j)
 *   pairs  [npair]    slots sent, rank-major, then token, then slot (source side)
 *   recv   [r]        slots received, expert-major, then source, then token, then slot
 * Every later pass is a pure data path over one all_to_allv:
 *   redispatch:            tokens -> (distinct rows) -> recv
 *   combine, dispatch_bwd: recv -> pairs, then a slot-ordered sum per token at the source
 *   combine_bwd:           pairs (w * grad) -> recv
 * Summing at the source in slot order is what makes combine independent of the EP layout and
 * of other ranks' batches; the price is that combine returns one row per slot. */
#include "prims/moe_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int meta_width(const hcomm_moe_handle_t *h) {
    return META_COUNTS + h->size * h->num_local;
}

/* Source row m's slots for this rank's local expert l. */
static int64_t local_count(const hcomm_moe_handle_t *h, const int64_t *m, int l) {
    return m[META_COUNTS + h->group->rank * h->num_local + l];
}

static int64_t *alloc_i64(size_t n) {
    return calloc(n ? n : 1, sizeof(int64_t));
}

static int64_t exclusive_scan(const int64_t *counts, int64_t *offsets, int n) {
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        offsets[i] = sum;
        sum += counts[i];
    }
    return sum;
}

/* ---- layout: counts, stable expert-major permutation, capacity ---- */

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
    exclusive_scan(per_expert, next, num_experts);
    for (int64_t s = 0; s < n * k; s++)
        if (ids[s] >= 0 && (keep == NULL || keep[s]))
            perm[next[ids[s]]++] = s;
}

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

/* ---- argument checks (rank-local; their outcome rides on the count exchange) ---- */

static hcomm_result_t check_ids(const char *fn, const int32_t *ids, int64_t n, int k,
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

hcomm_result_t hcomm_moe_layout(const int32_t *topk_ids, int64_t num_tokens, int k, int num_experts,
                                int ep_size, int64_t *tokens_per_rank, int64_t *tokens_per_expert,
                                int64_t *perm) {
    HCOMM__CHECK_NULL(tokens_per_rank);
    HCOMM__CHECK_NULL(tokens_per_expert);
    HCOMM__TRY(hcomm__moe_check_layout_args(__func__, num_tokens, k, num_experts, ep_size));
    HCOMM__TRY(check_ids(__func__, topk_ids, num_tokens, k, num_experts, true));
    int64_t *scratch = alloc_i64((size_t)ep_size + (size_t)num_experts);
    if (scratch == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, __func__, "out of memory for %d counts",
                          ep_size + num_experts);
    count_layout(topk_ids, NULL, num_tokens, k, num_experts, ep_size, tokens_per_rank,
                 tokens_per_expert, perm, scratch);
    free(scratch);
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

static hcomm_result_t check_dispatch(const hcomm__moe_args_t *a, const hcomm_moe_options_t *o) {
    const char *fn = a->fn;
    HCOMM__TRY(hcomm__tensor_check(fn, "tokens", a->tokens, NULL));
    if (a->tokens->ndim != 2)
        return hcomm__err(HCOMM_ERR_SHAPE, fn, "tokens->ndim=%d, expected 2 ([%s, H])",
                          a->tokens->ndim, a->topk ? "T" : "N");
    if (!a->topk)
        return check_ids(fn, a->ids, a->tokens->shape[0], 1, a->num_experts, false);
    if (a->tokens->shape[1] < 1)
        return hcomm__err(HCOMM_ERR_SHAPE, fn, "tokens->shape[1]=%lld (hidden), expected >= 1",
                          (long long)a->tokens->shape[1]);
    if (a->k < 1)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "k=%d, expected >= 1", a->k);
    HCOMM__TRY(check_ids(fn, a->ids, a->tokens->shape[0], a->k, a->num_experts, true));
    HCOMM__TRY(check_weights(fn, a->weights, a->tokens->shape[0], a->k));
    if (a->plan != NULL)
        return check_plan_tokens(fn, a->plan, a->tokens);
    return hcomm__moe_check_options(fn, o);
}

/* ---- the handle ---- */

static hcomm_moe_handle_t *handle_alloc(hcomm_comm_t *g, int num_local, int64_t n, int k) {
    hcomm_moe_handle_t *h = calloc(1, sizeof *h);
    if (h == NULL)
        return NULL;
    size_t p = (size_t)g->size, slots = (size_t)(n * k);
    *h = (hcomm_moe_handle_t){.group = g,
                              .pool = hcomm__moe_pool_of(g),
                              .size = g->size,
                              .num_local = num_local,
                              .n = n,
                              .k = k,
                              .capacity = -1};
    if (h->pool == NULL) {
        free(h);
        return NULL;
    }
    hcomm__moe_pool_ref(h->pool);
    h->send_rows = alloc_i64(p);
    h->send_off = alloc_i64(p);
    h->pair_rows = alloc_i64(p);
    h->pair_off = alloc_i64(p);
    h->recv_rows = alloc_i64(p);
    h->recv_off = alloc_i64(p);
    h->rpair_rows = alloc_i64(p);
    h->rpair_off = alloc_i64(p);
    h->slot_pair = alloc_i64(slots);
    h->dropped = alloc_i64(p * (size_t)num_local);
    h->global_count = alloc_i64(p * (size_t)num_local);
    h->expert_off = alloc_i64((size_t)num_local + 1);
    h->weights = malloc(sizeof(float) * (slots ? slots : 1));
    if (!h->send_rows || !h->send_off || !h->pair_rows || !h->pair_off || !h->recv_rows ||
        !h->recv_off || !h->rpair_rows || !h->rpair_off || !h->slot_pair || !h->dropped ||
        !h->global_count || !h->expert_off || !h->weights) {
        hcomm__moe_handle_release(h);
        return NULL;
    }
    return h;
}

hcomm_result_t hcomm_moe_handle_free(hcomm_moe_handle_t *handle) {
    if (handle != NULL && handle->plan == NULL) /* a plan's handle lives as long as the plan */
        hcomm__moe_handle_release(handle);
    return HCOMM_OK;
}

void hcomm__moe_handle_release(hcomm_moe_handle_t *handle) {
    if (handle == NULL)
        return;
    void *owned[] = {handle->send_rows,    handle->send_off,  handle->send_tok,  handle->pair_rows,
                     handle->pair_off,     handle->pair_slot, handle->slot_pair, handle->weights,
                     handle->dropped,      handle->recv_rows, handle->recv_off,  handle->rpair_rows,
                     handle->rpair_off,    handle->rpair_row, handle->out_pair,  handle->expert_off,
                     handle->global_count, handle->etp_rows,  handle->etp_perm,  handle->relay_rows,
                     handle->src_k,        handle->ids};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
        free(owned[i]);
    if (handle->plan == NULL)
        hcomm__moe_pool_put(handle->pool, handle->recv);
    hcomm__moe_pool_put(handle->pool, handle->y);
    hcomm__moe_pool_unref(handle->pool);
    free(handle);
}

/* ---- moving rows ---- */

/* One row. Rows of 2 KiB and more go in fixed 256-byte pieces, which the compiler turns into
 * vector moves: glibc's memcpy takes `rep movsb` from 2 KiB on, and on the AMD EPYC hosts we
 * measured that ran a permutation of 14 KiB rows at 6-38% of memcpy's bandwidth (GLIBC_TUNABLES
 * moving the threshold gave 188%). */
static inline void copy_row(char *restrict dst, const char *restrict src, size_t rb) {
    size_t i = 0;
    if (rb >= 2048)
        for (; i + 256 <= rb; i += 256)
            memcpy(dst + i, src + i, 256);
    memcpy(dst + i, src + i, rb - i);
}

/* A permutation larger than this leaves the cache behind it: its rows are streamed (stores
 * that bypass the cache), as glibc's memcpy does for a copy of that size. With cached stores,
 * dispatch's 470 MB permutation (T=4096, k=8, H=7168 bf16) measured 49% of memcpy's bandwidth
 * on the same bytes, which took the streaming path. */
#define STREAM_MIN_BYTES ((size_t)64 << 20)

/* Rows of 1 KiB and more: a scatter writes rows in random order, and a row that does not fill
 * its cache lines leaves partial write-combining flushes at its ends, costly on short rows. */
static bool streams(const void *dst, size_t rb, int64_t n) {
    return (size_t)n * rb >= STREAM_MIN_BYTES && rb >= 1024 && rb % 16 == 0 &&
           (uintptr_t)dst % 16 == 0;
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

/* all_to_allv of rows of row_bytes: counts and offsets in rows, one per peer. */
static hcomm_result_t exchange_rows(const char *fn, hcomm_comm_t *g, const void *sendbuf,
                                    const int64_t *srows, const int64_t *soff, void *recvbuf,
                                    const int64_t *rrows, const int64_t *roff, size_t row_bytes) {
    size_t p = (size_t)g->size;
    size_t *v = malloc(4 * p * sizeof *v);
    if (v == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %zu all_to_allv counts", 4 * p);
    for (size_t i = 0; i < p; i++) {
        v[i] = (size_t)srows[i] * row_bytes;
        v[p + i] = (size_t)soff[i] * row_bytes;
        v[2 * p + i] = (size_t)rrows[i] * row_bytes;
        v[3 * p + i] = (size_t)roff[i] * row_bytes;
    }
    hcomm_result_t res =
        hcomm__coll_all_to_allv(g, sendbuf, v, v + p, recvbuf, v + 2 * p, v + 3 * p);
    free(v);
    return res;
}

/* Slots forward: pairs [npair rows] in pair order -> out [r rows] expert-major. */
static hcomm_result_t route_pairs_fwd(const char *fn, const hcomm_moe_handle_t *h,
                                      const void *pairs, void *out, size_t rb) {
    char *raw = NULL;
    hcomm_result_t res;
    HCOMM__TRY_GOTO(hcomm__moe_pool_get(h->pool, fn, (size_t)h->r * rb, (void **)&raw), res, done);
    HCOMM__TRY_GOTO(exchange_rows(fn, h->group, pairs, h->pair_rows, h->pair_off, raw,
                                  h->rpair_rows, h->rpair_off, rb),
                    res, done);
    hcomm__moe_gather_rows(out, raw, h->out_pair, h->r, rb);
done:
    hcomm__moe_pool_put(h->pool, raw);
    return res;
}

/* Slots backward: in [r rows] expert-major -> pairs [npair rows] in pair order. */
static hcomm_result_t route_pairs_bwd(const char *fn, const hcomm_moe_handle_t *h, const void *in,
                                      void *pairs, size_t rb) {
    char *raw = NULL;
    hcomm_result_t res;
    HCOMM__TRY_GOTO(hcomm__moe_pool_get(h->pool, fn, (size_t)h->r * rb, (void **)&raw), res, done);
    hcomm__moe_scatter_rows(raw, in, h->out_pair, h->r, rb);
    res = exchange_rows(fn, h->group, raw, h->rpair_rows, h->rpair_off, pairs, h->pair_rows,
                        h->pair_off, rb);
done:
    hcomm__moe_pool_put(h->pool, raw);
    return res;
}

/* The hierarchical exchange's receiver in a redispatch: source s's j-th row is compacted row
 * recv_off[s] + j, placed by the stored maps. */
static hcomm_result_t place_sink(const char *fn, hcomm_moe_handle_t *h, const char *raw,
                                 const size_t *roff, size_t rb, void *out) {
    int64_t nrecv = h->recv_off[h->size - 1] + h->recv_rows[h->size - 1];
    char *compact = NULL;
    HCOMM__TRY(hcomm__moe_pool_get(h->pool, fn, (size_t)nrecv * rb, (void **)&compact));
    for (int s = 0; s < h->size; s++)
        memcpy(compact + (size_t)h->recv_off[s] * rb, raw + roff[s], (size_t)h->recv_rows[s] * rb);
    for (int64_t i = 0; i < h->r; i++)
        memcpy((char *)out + (size_t)i * rb, compact + (size_t)h->rpair_row[h->out_pair[i]] * rb,
               rb);
    hcomm__moe_pool_put(h->pool, compact);
    return HCOMM_OK;
}

/* Tokens forward with the stored routing: in [n rows] -> out [r rows], each token sent once
 * per rank (hierarchical: once per node) and expanded there. */
static hcomm_result_t route_tokens(const char *fn, hcomm_moe_handle_t *h, const void *in, void *out,
                                   size_t rb) {
    if (h->hier) {
        size_t *roff = malloc(sizeof *roff * (size_t)h->size);
        if (roff == NULL)
            return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %d offsets", h->size);
        hcomm_result_t res = hcomm__moe_hier_move(fn, h, in, h->ids, rb, roff, place_sink, out);
        free(roff);
        return res;
    }
    int64_t nsend = h->send_off[h->size - 1] + h->send_rows[h->size - 1];
    int64_t nrecv = h->recv_off[h->size - 1] + h->recv_rows[h->size - 1];
    char *sbuf = NULL, *raw = NULL;
    hcomm_result_t res;
    HCOMM__TRY_GOTO(hcomm__moe_pool_get(h->pool, fn, (size_t)nsend * rb, (void **)&sbuf), res,
                    done);
    HCOMM__TRY_GOTO(hcomm__moe_pool_get(h->pool, fn, (size_t)nrecv * rb, (void **)&raw), res, done);
    hcomm__moe_gather_rows(sbuf, in, h->send_tok, nsend, rb);
    HCOMM__TRY_GOTO(exchange_rows(fn, h->group, sbuf, h->send_rows, h->send_off, raw, h->recv_rows,
                                  h->recv_off, rb),
                    res, done);
    for (int64_t i = 0; i < h->r; i++)
        memcpy((char *)out + (size_t)i * rb, raw + (size_t)h->rpair_row[h->out_pair[i]] * rb, rb);
done:
    hcomm__moe_pool_put(h->pool, sbuf);
    hcomm__moe_pool_put(h->pool, raw);
    return res;
}

/* ---- dispatch ---- */

/* Capacity mode: the per-expert capacity from the largest T of any rank (GShard's
 * expert capacity), so every rank computes the same number. A rank whose checks failed
 * still joins with T = 0. */
static hcomm_result_t find_capacity(const hcomm__moe_args_t *a, hcomm_moe_handle_t *h) {
    int64_t t = h->n, t_max = 0;
    HCOMM__TRY(hcomm__coll_all_reduce(h->group, &t, &t_max, 1, HCOMM_I64, HCOMM_MAX));
    double cap = ceil((double)t_max * a->k / a->num_experts * a->capacity_factor);
    h->capacity = cap < (double)(t_max * a->k) ? (int64_t)cap : t_max * a->k;
    return HCOMM_OK;
}

/* keep[s]: slot s is routed (not empty, not dropped); counts the drops per expert. */
static hcomm_result_t mark_kept(const hcomm__moe_args_t *a, hcomm_moe_handle_t *h, uint8_t *keep) {
    int64_t slots = h->n * h->k, e_all = a->num_experts;
    for (int64_t s = 0; s < slots; s++)
        keep[s] = a->ids[s] >= 0;
    if (h->capacity < 0)
        return HCOMM_OK;
    int64_t *perm = alloc_i64((size_t)slots), *cnt = alloc_i64((size_t)(e_all + h->size)),
            *scratch = alloc_i64((size_t)(e_all + h->size));
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

/* Counting pass: distinct rows and slots per rank, slots per (rank, local expert) in meta. */
static void count_send(const hcomm_moe_handle_t *h, const int32_t *ids, const uint8_t *keep,
                       int64_t *meta, int64_t *last) {
    for (int p = 0; p < h->size; p++)
        last[p] = -1;
    for (int64_t s = 0; s < h->n * h->k; s++) {
        if (!keep[s])
            continue;
        int p = ids[s] / h->num_local;
        meta[META_COUNTS + ids[s]]++; /* row 0; dispatch copies it to the others */
        h->pair_rows[p]++;
        if (last[p] != s / h->k) {
            last[p] = s / h->k;
            h->send_rows[p]++;
        }
    }
}

/* Placing pass: send_tok, pair_slot, slot_pair and the header (k local experts per sent row,
 * -1 where the slot goes elsewhere). scratch holds 3 * size entries. */
static void place_send(hcomm_moe_handle_t *h, const int32_t *ids, const uint8_t *keep, int32_t *hdr,
                       int64_t *scratch) {
    int64_t *last = scratch, *row = scratch + h->size, *pcur = scratch + 2 * h->size;
    int64_t nsend = exclusive_scan(h->send_rows, h->send_off, h->size);
    exclusive_scan(h->pair_rows, h->pair_off, h->size);
    memset(hdr, 0xff, sizeof(int32_t) * (size_t)(nsend * h->k)); /* every entry -1 */
    for (int p = 0; p < h->size; p++) {
        last[p] = -1;
        row[p] = h->send_off[p] - 1;
        pcur[p] = h->pair_off[p];
    }
    for (int64_t s = 0; s < h->n * h->k; s++) {
        h->slot_pair[s] = -1;
        if (!keep[s])
            continue;
        int64_t t = s / h->k;
        int p = ids[s] / h->num_local;
        if (last[p] != t) {
            last[p] = t;
            h->send_tok[++row[p]] = t;
        }
        hdr[row[p] * h->k + s % h->k] = ids[s] % h->num_local;
        h->pair_slot[pcur[p]] = s;
        h->slot_pair[s] = pcur[p]++;
    }
}

/* Routes this rank's tokens and fills the per-expert counts of meta row 0; *hdr gets the
 * headers of the sent rows. */
static hcomm_result_t plan_send(const hcomm__moe_args_t *a, hcomm_moe_handle_t *h, int64_t *meta,
                                int32_t **hdr) {
    uint8_t *keep = malloc((size_t)(h->n * h->k) + 1);
    int64_t *scratch = alloc_i64(3 * (size_t)h->size);
    hcomm_result_t res = HCOMM_OK;
    if (keep == NULL || scratch == NULL) {
        res = hcomm__err(HCOMM_ERR_NOMEM, a->fn, "out of memory for the layout");
        goto done;
    }
    HCOMM__TRY_GOTO(mark_kept(a, h, keep), res, done);
    count_send(h, a->ids, keep, meta, scratch);
    int64_t nsend = 0;
    for (int p = 0; p < h->size; p++) {
        nsend += h->send_rows[p];
        h->npair += h->pair_rows[p];
    }
    h->send_tok = alloc_i64((size_t)nsend);
    h->pair_slot = alloc_i64((size_t)h->npair);
    *hdr = malloc(sizeof(int32_t) * (size_t)(nsend * h->k) + 1);
    if (!h->send_tok || !h->pair_slot || !*hdr) {
        res = hcomm__err(HCOMM_ERR_NOMEM, a->fn, "out of memory for %lld sent rows",
                         (long long)nsend);
        goto done;
    }
    place_send(h, a->ids, keep, *hdr, scratch);
done:
    free(keep);
    free(scratch);
    return res;
}

/* Fails if a peer failed its checks or disagrees on the rows. */
static hcomm_result_t check_peers(const char *fn, const hcomm_moe_handle_t *h,
                                  const int64_t *meta) {
    int w = meta_width(h);
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

/* The group's statistics: the sum of every source's counts and drops. */
static void add_stats(hcomm_moe_handle_t *h, const int64_t *m) {
    h->global_dropped += m[META_DROPPED];
    for (int e = 0; e < h->size * h->num_local; e++)
        h->global_count[e] += m[META_COUNTS + e];
}

/* The receive side from the peers' meta rows: row and slot counts per source, rows per local
 * expert and their offsets. */
static hcomm_result_t plan_recv(const char *fn, hcomm_moe_handle_t *h, const int64_t *meta) {
    int w = meta_width(h);
    HCOMM__TRY(check_peers(fn, h, meta));
    int64_t *per_expert = alloc_i64((size_t)h->num_local);
    if (per_expert == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for counts");
    for (int s = 0; s < h->size; s++) {
        const int64_t *m = meta + s * w;
        h->recv_rows[s] = m[META_ROWS];
        for (int l = 0; l < h->num_local; l++) {
            h->rpair_rows[s] += local_count(h, m, l);
            per_expert[l] += local_count(h, m, l);
        }
        add_stats(h, m);
    }
    exclusive_scan(h->recv_rows, h->recv_off, h->size);
    h->r = exclusive_scan(h->rpair_rows, h->rpair_off, h->size);
    h->expert_off[h->num_local] = exclusive_scan(per_expert, h->expert_off, h->num_local);
    free(per_expert);
    h->rpair_row = alloc_i64((size_t)h->r);
    h->out_pair = alloc_i64((size_t)h->r);
    if (!h->rpair_row || !h->out_pair)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %lld received rows",
                          (long long)h->r);
    return HCOMM_OK;
}

/* Exchanges the meta rows: every rank gets one row from each peer. The call's signature rides
 * in these messages, so no agreement runs before them (hcomm__coll_all_to_all_checked). A row
 * holds a count per expert, so ranks passing different num_experts disagree on its size: the
 * message says so (the exchange alone names only a byte count). */
static hcomm_result_t exchange_meta(const char *fn, hcomm_moe_handle_t *h, const int64_t *send,
                                    int64_t *recv) {
    hcomm_result_t res = hcomm__coll_all_to_all_checked(h->group, send, recv,
                                                        (size_t)meta_width(h) * sizeof(int64_t));
    if (res != HCOMM_ERR_MISMATCH)
        return res;
    char detail[512];
    snprintf(detail, sizeof detail, "%s", hcomm__err_detail(fn));
    return hcomm__err(res, fn,
                      "%s in the count exchange over ep_group, whose rows hold %d + num_experts "
                      "int64: do the ranks pass the same num_experts (%d on rank %d)?",
                      detail, META_COUNTS, h->size * h->num_local, h->group->rank);
}

/* Byte counts and offsets of the first token exchange: each peer's rows, then their headers
 * (the peer's k int32 each). v is [4][size]: send counts, send offsets, recv counts, recv. */
static void token_bytes(const hcomm_moe_handle_t *h, const int64_t *meta, size_t rb, size_t *v) {
    size_t p = (size_t)h->size, soff = 0, roff = 0;
    int w = meta_width(h);
    for (size_t i = 0; i < p; i++) {
        v[i] = (size_t)h->send_rows[i] * (rb + sizeof(int32_t) * (size_t)h->k);
        v[p + i] = soff;
        soff += v[i];
        v[2 * p + i] =
            (size_t)h->recv_rows[i] * (rb + sizeof(int32_t) * (size_t)meta[i * w + META_K]);
        v[3 * p + i] = roff;
        roff += v[2 * p + i];
    }
}

/* Packs each peer's rows and headers (token_bytes' layout). */
static void pack_tokens(const hcomm_moe_handle_t *h, const void *tokens, const int32_t *hdr,
                        size_t rb, const size_t *soff, char *buf) {
    for (int p = 0; p < h->size; p++) {
        char *dst = buf + soff[p];
        hcomm__moe_gather_rows(dst, tokens, h->send_tok + h->send_off[p], h->send_rows[p], rb);
        memcpy(dst + (size_t)h->send_rows[p] * rb, hdr + h->send_off[p] * h->k,
               sizeof(int32_t) * (size_t)(h->send_rows[p] * h->k));
    }
}

/* Expands source s's rows into expert-major rows by their headers; next[l] is the next row
 * of local expert l for this source. A header that disagrees with the counts is an error. */
static hcomm_result_t expand_source(const char *fn, hcomm_moe_handle_t *h, int s, int ks,
                                    const char *msg, size_t rb, int64_t *next, int64_t *q) {
    const char *hdr = msg + (size_t)h->recv_rows[s] * rb;
    for (int64_t i = 0; i < h->recv_rows[s]; i++)
        for (int j = 0; j < ks; j++) {
            int32_t l;
            memcpy(&l, hdr + sizeof l * (size_t)(i * ks + j), sizeof l);
            if (l < 0)
                continue;
            if (l >= h->num_local || *q >= h->rpair_off[s] + h->rpair_rows[s])
                return hcomm__err(HCOMM_ERR_INTERNAL, fn,
                                  "rank %d sent a row header that disagrees with its counts", s);
            int64_t k = next[l]++;
            memcpy((char *)h->recv + (size_t)k * rb, msg + (size_t)i * rb, rb);
            h->out_pair[k] = *q;
            h->rpair_row[(*q)++] = h->recv_off[s] + i;
        }
    return HCOMM_OK;
}

hcomm_result_t hcomm__moe_expand_all(const char *fn, hcomm_moe_handle_t *h, const int64_t *meta,
                                     const char *raw, const size_t *roff, size_t rb) {
    int w = meta_width(h);
    int64_t *next = alloc_i64((size_t)h->num_local);
    hcomm_result_t res = HCOMM_OK;
    if (next == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for counts");
    for (int s = 0; s < h->size && res == HCOMM_OK; s++) {
        int64_t q = h->rpair_off[s];
        for (int l = 0; l < h->num_local; l++) { /* first row of (l, s) */
            next[l] = h->expert_off[l];
            for (int s2 = 0; s2 < s; s2++)
                next[l] += local_count(h, meta + s2 * w, l);
        }
        res = expand_source(fn, h, s, (int)meta[s * w + META_K], raw + roff[s], rb, next, &q);
    }
    free(next);
    return res;
}

/* The hierarchical exchange's receiver in a first dispatch: the flat path's expansion. */
static hcomm_result_t expand_sink(const char *fn, hcomm_moe_handle_t *h, const char *raw,
                                  const size_t *roff, size_t rb, void *meta) {
    return hcomm__moe_expand_all(fn, h, meta, raw, roff, rb);
}

/* The token exchange of a first dispatch: rows plus headers, then expansion into h->recv. */
static hcomm_result_t move_tokens(const char *fn, hcomm_moe_handle_t *h, const int64_t *meta,
                                  const void *tokens, const int32_t *ids, const int32_t *hdr) {
    size_t rb = (size_t)h->h * hcomm__dtype_size(h->dtype), p = (size_t)h->size;
    size_t *v = malloc(4 * p * sizeof *v);
    char *sbuf = NULL, *raw = NULL;
    hcomm_result_t res = HCOMM_OK;
    if (v == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %zu counts", 4 * p);
    token_bytes(h, meta, rb, v);
    if (h->plan == NULL)
        HCOMM__TRY_GOTO(hcomm__moe_pool_get(h->pool, fn, (size_t)h->r * rb, &h->recv), res, done);
    else if (h->r > h->plan->max_rows) /* the plan's own limits make this impossible */
        HCOMM__TRY_GOTO(hcomm__err(HCOMM_ERR_INTERNAL, fn, "%lld rows exceed the plan's %lld",
                                   (long long)h->r, (long long)h->plan->max_rows),
                        res, done);
    if (h->hier) { /* kept for redispatch, which takes the same path */
        res = hcomm__moe_hier_keep(fn, h, meta);
        if (res == HCOMM_OK) {
            memcpy(h->ids, ids, sizeof(int32_t) * (size_t)(h->n * h->k));
            res =
                hcomm__moe_hier_move(fn, h, tokens, ids, rb, v + 3 * p, expand_sink, (void *)meta);
        }
        goto done;
    }
    HCOMM__TRY_GOTO(hcomm__moe_pool_get(h->pool, fn, v[p - 1] + v[2 * p - 1], (void **)&sbuf), res,
                    done);
    HCOMM__TRY_GOTO(hcomm__moe_pool_get(h->pool, fn, v[3 * p - 1] + v[4 * p - 1], (void **)&raw),
                    res, done);
    pack_tokens(h, tokens, hdr, rb, v + p, sbuf);
    /* The count exchange proved that every rank is in this dispatch with these counts. */
    HCOMM__TRY_GOTO(
        hcomm__coll_all_to_allv_agreed(h->group, sbuf, v, v + p, raw, v + 2 * p, v + 3 * p), res,
        done);
    res = hcomm__moe_expand_all(fn, h, meta, raw, v + 3 * p, rb);
done:
    free(v);
    hcomm__moe_pool_put(h->pool, sbuf);
    hcomm__moe_pool_put(h->pool, raw);
    return res;
}

/* Fills the meta row for each peer (row p at meta + p * w; row 0's counts are filled). */
static void fill_meta(const hcomm_moe_handle_t *h, hcomm_result_t local, int64_t *meta, int w) {
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

/* ---- pad-to-capacity: static shapes, no count exchange ----
 * Each rank sends each peer one block of fixed size: its meta row (checks and statistics ride
 * here), then capacity rows for each of the peer's experts, the kept slots in token order and
 * zeros after them. Pairs are those rows (pair e * capacity + c: expert e, position c; slot -1
 * for padding); received rows are [local expert][source][capacity]. */

/* Places this rank's kept slots into the pair rows of their expert; meta row 0 gets the
 * counts per expert. */
static hcomm_result_t pad_layout(const hcomm__moe_args_t *a, hcomm_moe_handle_t *h, int64_t *meta) {
    uint8_t *keep = malloc((size_t)(h->n * h->k) + 1);
    if (keep == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, a->fn, "out of memory for the layout");
    hcomm_result_t res = mark_kept(a, h, keep);
    for (int64_t s = 0; res == HCOMM_OK && s < h->n * h->k; s++) {
        h->slot_pair[s] = -1;
        if (!keep[s])
            continue;
        int64_t e = a->ids[s], q = e * h->capacity + meta[META_COUNTS + e]++;
        h->pair_slot[q] = s;
        h->slot_pair[s] = q;
    }
    free(keep);
    return res;
}

/* Sets the fixed layout both sides know without exchanging counts. */
static void pad_routes(hcomm_moe_handle_t *h) {
    int64_t block = h->num_local * h->capacity;
    for (int p = 0; p < h->size; p++) {
        h->pair_rows[p] = h->rpair_rows[p] = block;
        h->pair_off[p] = h->rpair_off[p] = p * block;
    }
    h->r = h->npair = h->size * block;
    for (int l = 0; l <= h->num_local; l++)
        h->expert_off[l] = (int64_t)l * h->size * h->capacity;
    for (int l = 0; l < h->num_local; l++)
        for (int s = 0; s < h->size; s++)
            for (int64_t c = 0; c < h->capacity; c++)
                h->out_pair[(l * h->size + s) * h->capacity + c] = s * block + l * h->capacity + c;
}

/* Packs each peer's block: meta row, then its pair rows (zeros for padding). */
static void pad_pack(const hcomm_moe_handle_t *h, const void *tokens, const int64_t *meta, int w,
                     size_t rb, size_t block_bytes, char *buf) {
    for (int p = 0; p < h->size; p++) {
        char *dst = buf + (size_t)p * block_bytes;
        memcpy(dst, meta + p * w, sizeof(int64_t) * (size_t)w);
        dst += sizeof(int64_t) * (size_t)w;
        for (int64_t i = 0; i < h->pair_rows[p]; i++) {
            int64_t s = h->pair_slot[h->pair_off[p] + i];
            if (s < 0)
                memset(dst + (size_t)i * rb, 0, rb);
            else
                memcpy(dst + (size_t)i * rb, (const char *)tokens + (size_t)(s / h->k) * rb, rb);
        }
    }
}

/* Reads every source's meta row from its block, then its rows into [expert][source][cap]. */
static hcomm_result_t pad_unpack(const char *fn, hcomm_moe_handle_t *h, const char *buf, int w,
                                 size_t rb, size_t block_bytes) {
    int64_t *meta = alloc_i64((size_t)(h->size * w));
    if (meta == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for counts");
    for (int s = 0; s < h->size; s++)
        memcpy(meta + s * w, buf + (size_t)s * block_bytes, sizeof(int64_t) * (size_t)w);
    hcomm_result_t res = check_peers(fn, h, meta);
    for (int s = 0; res == HCOMM_OK && s < h->size; s++) {
        add_stats(h, meta + s * w);
        const char *rows = buf + (size_t)s * block_bytes + sizeof(int64_t) * (size_t)w;
        for (int l = 0; l < h->num_local; l++) /* one block copy per (expert, source) */
            memcpy((char *)h->recv + (size_t)((l * h->size + s) * h->capacity) * rb,
                   rows + (size_t)(l * h->capacity) * rb, (size_t)h->capacity * rb);
    }
    free(meta);
    return res;
}

/* The padded dispatch: one all_to_all of fixed blocks. */
static hcomm_result_t dispatch_padded(const hcomm__moe_args_t *a, hcomm_moe_handle_t *h,
                                      hcomm_result_t local) {
    int w = meta_width(h);
    size_t rb = (size_t)h->plan->d.hidden * hcomm__dtype_size(h->plan->d.dtype),
           block_bytes = sizeof(int64_t) * (size_t)w + (size_t)(h->num_local * h->capacity) * rb;
    int64_t npair = h->size * h->num_local * h->capacity;
    int64_t *meta = alloc_i64((size_t)(h->size * w));
    char *sbuf = NULL, *rbuf = NULL;
    hcomm_result_t res = HCOMM_OK;
    h->pair_slot = alloc_i64((size_t)npair);
    h->out_pair = alloc_i64((size_t)npair);
    if (!meta || !h->pair_slot || !h->out_pair) {
        res = hcomm__err(HCOMM_ERR_NOMEM, a->fn, "out of memory for %lld padded rows",
                         (long long)npair);
        goto done;
    }
    HCOMM__TRY_GOTO(
        hcomm__moe_pool_get(h->pool, a->fn, block_bytes * (size_t)h->size, (void **)&sbuf), res,
        done);
    HCOMM__TRY_GOTO(
        hcomm__moe_pool_get(h->pool, a->fn, block_bytes * (size_t)h->size, (void **)&rbuf), res,
        done);
    memset(h->pair_slot, 0xff, sizeof(int64_t) * (size_t)npair); /* every pair padding */
    pad_routes(h);
    if (local == HCOMM_OK)
        local = pad_layout(a, h, meta);
    fill_meta(h, local, meta, w);
    for (int p = 0; p < h->size; p++)
        meta[p * w + META_ROWS] = h->pair_rows[p];
    pad_pack(h, local == HCOMM_OK ? a->tokens->data : NULL, meta, w, rb, block_bytes, sbuf);
    HCOMM__TRY_GOTO(hcomm__coll_all_to_all_checked(h->group, sbuf, rbuf, block_bytes), res, done);
    res = local != HCOMM_OK ? local : pad_unpack(a->fn, h, rbuf, w, rb, block_bytes);
done:
    free(meta);
    hcomm__moe_pool_put(h->pool, sbuf);
    hcomm__moe_pool_put(h->pool, rbuf);
    return res;
}

/* Expert-TP, sequence-parallel tokens: the rows of every member of the etp group, from this
 * rank's rows per (local expert, source) in meta (prev: this rank's EP exchange result). */
static hcomm_result_t etp_step(const char *fn, hcomm_moe_handle_t *h, hcomm_result_t prev,
                               const int64_t *meta) {
    int w = meta_width(h);
    int64_t *cnt = NULL;
    if (prev == HCOMM_OK) {
        cnt = alloc_i64((size_t)(h->num_local * h->size));
        if (cnt == NULL)
            prev = hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for counts");
        for (int l = 0; cnt && l < h->num_local; l++)
            for (int s = 0; s < h->size; s++)
                cnt[l * h->size + s] = local_count(h, meta + s * w, l);
    }
    hcomm_result_t res = hcomm__moe_etp_dispatch(fn, h, prev, cnt);
    free(cnt);
    return res;
}

/* The collective part of dispatch once the group and num_experts are known good; local is
 * this rank's check result, which every peer learns from the count exchange. */
static hcomm_result_t dispatch(const hcomm__moe_args_t *a, hcomm_moe_handle_t *h,
                               hcomm_result_t local) {
    if (h->pad)
        return dispatch_padded(a, h, local);
    int w = meta_width(h);
    int64_t *meta_send = alloc_i64((size_t)(h->size * w)),
            *meta_recv = alloc_i64((size_t)(h->size * w));
    int32_t *hdr = NULL;
    hcomm_result_t res = HCOMM_OK;
    if (!meta_send || !meta_recv) {
        res = hcomm__err(HCOMM_ERR_NOMEM, a->fn, "out of memory for counts");
        goto done;
    }
    if (a->capacity_mode)
        HCOMM__TRY_GOTO(find_capacity(a, h), res, done);
    if (local == HCOMM_OK)
        local = hcomm__moe_hier_setup(a->fn, h, a->path);
    if (local == HCOMM_OK)
        local = plan_send(a, h, meta_send, &hdr);
    fill_meta(h, local, meta_send, w);
    if (local == HCOMM_OK) /* rows per node for each relay, rows crossing nodes */
        hcomm__moe_hier_meta(h, a->ids, meta_send, w);
    HCOMM__TRY_GOTO(exchange_meta(a->fn, h, meta_send, meta_recv), res, done);
    if (local != HCOMM_OK) { /* the message from the failed check is still the last error */
        res = local;
        goto done;
    }
    HCOMM__TRY_GOTO(plan_recv(a->fn, h, meta_recv), res, done);
    res = move_tokens(a->fn, h, meta_recv, a->tokens->data, a->ids, hdr);
done:
    if (h->etp != NULL) /* every member joins, also after a failure here */
        res = etp_step(a->fn, h, res, meta_recv);
    free(meta_send);
    free(meta_recv);
    free(hdr);
    return res;
}

/* A check that needs no handle failed (num_experts, the groups): its peers, which may have
 * passed it, meet this rank's failure in their first exchange and fail with HCOMM_ERR_PEER
 * (returning at once instead left them to pair with this rank's next call); expert-TP peers
 * likewise in their gather. */
static hcomm_result_t fail_joined(hcomm_comm_t *g, const hcomm__moe_args_t *a,
                                  const hcomm_moe_options_t *o, hcomm_result_t res) {
    hcomm__enter(g, a->fn);
    res = hcomm__leave(g, hcomm__coll_fail(g, res));
    hcomm_comm_t *etp = o != NULL && a->plan == NULL ? o->etp_group : NULL;
    if (etp != NULL && etp != g && etp->size > 1) {
        hcomm__enter(etp, a->fn);
        res = hcomm__leave(etp, hcomm__coll_fail(etp, res));
    }
    return res;
}

/* Checks, allocates the handle and runs the collective part; shared by both dispatch calls. */
hcomm_result_t hcomm__moe_dispatch_call(hcomm_comm_t *g, const hcomm__moe_args_t *a,
                                        const hcomm_moe_options_t *o, hcomm_moe_handle_t **out) {
    if (out == NULL)
        return fail_joined(g, a, o, hcomm__err(HCOMM_ERR_NULL, a->fn, "argument 'handle' is NULL"));
    if (a->num_experts < 1 || a->num_experts % g->size != 0)
        return fail_joined(g, a, o,
                           hcomm__err(HCOMM_ERR_INVALID_ARG, a->fn,
                                      "num_experts=%d is not a positive multiple of the ep_group "
                                      "size %d",
                                      a->num_experts, g->size));
    if (o != NULL && o->etp_group == g)
        return fail_joined(g, a, o,
                           hcomm__err(HCOMM_ERR_INVALID_ARG, a->fn,
                                      "options->etp_group is ep_group: the expert-TP group is "
                                      "another group"));
    /* Token checks are rank-local: a failure still joins the count exchange, flagged. */
    hcomm_result_t local = check_dispatch(a, o);
    bool ok = local == HCOMM_OK;
    hcomm_moe_handle_t *h =
        handle_alloc(g, a->num_experts / g->size, ok ? a->tokens->shape[0] : 0, ok ? a->k : 1);
    if (h == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, a->fn, "out of memory for the routing handle");
    h->topk = a->topk;
    if (a->plan != NULL) { /* its buffer, its capacity: no all_reduce of the largest T */
        h->plan = (hcomm_moe_plan_t *)a->plan;
        h->recv = a->plan->recv;
        h->capacity = a->plan->capacity;
        h->pad = a->plan->d.pad_to_capacity != 0;
    }
    h->h = ok ? a->tokens->shape[1] : 0;
    h->dtype = ok ? a->tokens->dtype : HCOMM_F32;
    for (int64_t s = 0; s < h->n * h->k; s++)
        h->weights[s] = a->weights ? a->weights[s] : 1.0f;
    if (o != NULL && o->etp_group != NULL && o->etp_group->size > 1 && a->plan == NULL) {
        h->etp = o->etp_group;
        h->etp_size = o->etp_group->size;
    }
    hcomm__enter(g, a->fn);
    hcomm_result_t res = hcomm__leave(g, dispatch(a, h, local));
    if (res != HCOMM_OK) {
        hcomm__moe_handle_release(h);
        return res;
    }
    if (h->etp == NULL)
        h->r_all = h->r;
    *out = h;
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_dispatch(hcomm_comm_t *ep_group, const hcomm_tensor_t *tokens,
                                  const int32_t *expert_ids, int num_experts,
                                  hcomm_moe_handle_t **handle) {
    if (handle != NULL) /* a NULL one still joins the call (hcomm__moe_dispatch_call) */
        *handle = NULL;
    HCOMM__CHECK_NULL(ep_group);
    hcomm__moe_args_t a = {
        .fn = __func__, .tokens = tokens, .ids = expert_ids, .k = 1, .num_experts = num_experts};
    return hcomm__moe_dispatch_call(ep_group, &a, NULL, handle);
}

hcomm_result_t hcomm_moe_dispatch_topk(hcomm_comm_t *ep_group, const hcomm_tensor_t *tokens,
                                       const int32_t *topk_ids, const float *topk_weights, int k,
                                       int num_experts, const hcomm_moe_options_t *options,
                                       hcomm_moe_handle_t **handle) {
    if (handle != NULL) /* a NULL one still joins the call (hcomm__moe_dispatch_call) */
        *handle = NULL;
    HCOMM__CHECK_NULL(ep_group);
    hcomm__moe_args_t a = {.fn = __func__,
                           .tokens = tokens,
                           .ids = topk_ids,
                           .weights = topk_weights,
                           .k = k,
                           .num_experts = num_experts,
                           .topk = true};
    if (options != NULL)
        a.path = (int)options->path;
    if (options != NULL && options->capacity_factor > 0) {
        a.capacity_mode = true;
        a.capacity_factor = options->capacity_factor;
        a.policy = (int)options->drop_policy;
    }
    return hcomm__moe_dispatch_call(ep_group, &a, options, handle);
}

/* ---- reading the handle ---- */

hcomm_result_t hcomm_moe_received(const hcomm_moe_handle_t *handle, hcomm_tensor_t *recv,
                                  int64_t *tokens_per_expert) {
    HCOMM__CHECK_NULL(handle);
    HCOMM__CHECK_NULL(recv);
    *recv = (hcomm_tensor_t){.data = handle->recv, .dtype = handle->dtype, .ndim = 2};
    recv->shape[0] = handle->r_all;
    recv->shape[1] = handle->h;
    for (int l = 0; tokens_per_expert && l < handle->num_local; l++)
        tokens_per_expert[l] = handle->expert_off[l + 1] - handle->expert_off[l];
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_expert_offsets(const hcomm_moe_handle_t *handle, int64_t *offsets) {
    HCOMM__CHECK_NULL(handle);
    HCOMM__CHECK_NULL(offsets);
    memcpy(offsets, handle->expert_off, sizeof(int64_t) * (size_t)(handle->num_local + 1));
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_dropped(const hcomm_moe_handle_t *handle, int64_t *dropped_per_expert,
                                 int64_t *total, int64_t *capacity) {
    HCOMM__CHECK_NULL(handle);
    int e_all = handle->size * handle->num_local;
    int64_t sum = 0;
    for (int e = 0; e < e_all; e++)
        sum += handle->dropped[e];
    if (dropped_per_expert)
        memcpy(dropped_per_expert, handle->dropped, sizeof(int64_t) * (size_t)e_all);
    if (total)
        *total = sum;
    if (capacity)
        *capacity = handle->capacity;
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_stats(const hcomm_moe_handle_t *handle, int64_t *tokens_per_expert,
                               double *imbalance, int64_t *dropped) {
    HCOMM__CHECK_NULL(handle);
    int e_all = handle->size * handle->num_local;
    int64_t sum = 0, max = 0;
    for (int e = 0; e < e_all; e++) {
        sum += handle->global_count[e];
        max = handle->global_count[e] > max ? handle->global_count[e] : max;
    }
    if (tokens_per_expert)
        memcpy(tokens_per_expert, handle->global_count, sizeof(int64_t) * (size_t)e_all);
    if (imbalance) /* max / mean, mean = sum / E */
        *imbalance = sum > 0 ? (double)max * e_all / (double)sum : 0.0;
    if (dropped)
        *dropped = handle->global_dropped;
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_route_info(const hcomm_moe_handle_t *handle,
                                    hcomm_moe_route_info_t *info) {
    HCOMM__CHECK_NULL(handle);
    HCOMM__CHECK_NULL(info);
    *info = (hcomm_moe_route_info_t){.hierarchical = handle->hier,
                                     .nnodes = handle->nnodes > 0 ? handle->nnodes : 1,
                                     .token_exchanges = handle->pad    ? 0
                                                        : handle->hier ? 2
                                                                       : 1,
                                     .internode_rows = handle->internode_rows};
    return HCOMM_OK;
}

/* ---- arithmetic of combine and the backward passes ---- */

static double load_f64(const void *row, int64_t c) {
    double d;
    memcpy(&d, (const char *)row + 8 * (size_t)c, 8);
    return d;
}

/* A row of f16, bf16 or f32 as f32, and back (rounded to nearest even). */
static void row_to_f32(hcomm_dtype_t dt, const void *row, int64_t cols, float *out) {
    if (dt == HCOMM_F32)
        memcpy(out, row, sizeof(float) * (size_t)cols);
    else
        hcomm__widen(out, row, (size_t)cols, dt);
}

static void row_from_f32(hcomm_dtype_t dt, const float *in, int64_t cols, void *row) {
    if (dt == HCOMM_F32)
        memcpy(row, in, sizeof(float) * (size_t)cols);
    else
        hcomm__narrow(row, in, (size_t)cols, dt);
}

/* acc (+)= w * y over one row: the first term initialises, so one term is exact (sign of zero
 * included); f32 for f16/bf16/f32 (y converted into tmp), f64 for f64. */
static void add_row(hcomm_dtype_t dt, const char *y, int64_t cols, float w, bool first, void *acc,
                    float *tmp) {
    if (dt == HCOMM_F64) {
        double *a = acc;
        for (int64_t c = 0; c < cols; c++) {
            double v = (double)w * load_f64(y, c);
            a[c] = first ? v : a[c] + v;
        }
        return;
    }
    float *a = acc;
    row_to_f32(dt, y, cols, tmp);
    if (first)
        for (int64_t c = 0; c < cols; c++)
            a[c] = w * tmp[c];
    else
        for (int64_t c = 0; c < cols; c++)
            a[c] += w * tmp[c];
}

/* out[t] = sum over kept slots j in slot order of (weighted ? w[t, j] : 1) * pairs[slot],
 * rounded once; zeros for a token with no kept slot. acc and tmp hold cols doubles each. */
static void sum_slots(const hcomm_moe_handle_t *h, const char *pairs, hcomm_dtype_t dt,
                      int64_t cols, bool weighted, char *out, void *acc, float *tmp) {
    size_t rb = (size_t)cols * hcomm__dtype_size(dt);
    for (int64_t t = 0; t < h->n; t++) {
        bool first = true;
        for (int j = 0; j < h->k; j++) {
            int64_t p = h->slot_pair[t * h->k + j];
            if (p < 0)
                continue;
            float w = weighted ? h->weights[t * h->k + j] : 1.0f;
            add_row(dt, pairs + (size_t)p * rb, cols, w, first, acc, tmp);
            first = false;
        }
        if (first)
            memset(acc, 0, (size_t)cols * sizeof(double));
        if (dt == HCOMM_F64)
            memcpy(out + (size_t)t * rb, acc, rb);
        else
            row_from_f32(dt, acc, cols, out + (size_t)t * rb);
    }
}

/* pairs[p] = w[slot] * grad_out[token of slot], rounded once to dt; tmp holds cols floats. */
static void scale_to_pairs(const hcomm_moe_handle_t *h, const char *grad_out, hcomm_dtype_t dt,
                           int64_t cols, char *pairs, float *tmp) {
    size_t rb = (size_t)cols * hcomm__dtype_size(dt);
    for (int64_t p = 0; p < h->npair; p++) {
        int64_t s = h->pair_slot[p];
        char *dst = pairs + (size_t)p * rb;
        if (s < 0) { /* a padding row */
            memset(dst, 0, rb);
            continue;
        }
        const char *src = grad_out + (size_t)(s / h->k) * rb;
        float w = h->weights[s];
        if (dt == HCOMM_F64) {
            for (int64_t c = 0; c < cols; c++) {
                double v = (double)w * load_f64(src, c);
                memcpy(dst + 8 * (size_t)c, &v, 8);
            }
            continue;
        }
        row_to_f32(dt, src, cols, tmp);
        for (int64_t c = 0; c < cols; c++)
            tmp[c] *= w;
        row_from_f32(dt, tmp, cols, dst);
    }
}

/* grad_w[t, j] = <grad_out[t], y[slot]> in column order, f32 (f64 for f64); 0 if not kept.
 * tg and ty hold y_h floats each. */
static void weight_grads(const hcomm_moe_handle_t *h, const char *grad_out, float *grad_w,
                         float *tg, float *ty) {
    hcomm_dtype_t dt = h->y_dtype;
    size_t rb = (size_t)h->y_h * hcomm__dtype_size(dt);
    for (int64_t s = 0; s < h->n * h->k; s++) {
        int64_t p = h->slot_pair[s];
        const char *g = grad_out + (size_t)(s / h->k) * rb,
                   *y = (const char *)h->y + (size_t)(p < 0 ? 0 : p) * rb;
        float a32 = 0;
        double a64 = 0;
        if (p >= 0 && dt == HCOMM_F64)
            for (int64_t c = 0; c < h->y_h; c++)
                a64 += load_f64(g, c) * load_f64(y, c);
        else if (p >= 0) {
            row_to_f32(dt, g, h->y_h, tg);
            row_to_f32(dt, y, h->y_h, ty);
            for (int64_t c = 0; c < h->y_h; c++)
                a32 += tg[c] * ty[c];
        }
        grad_w[s] = dt == HCOMM_F64 ? (float)a64 : a32;
    }
}

/* ---- the passes over a handle ---- */

/* Checks t is [rows, cols] (cols < 0: any width). */
static hcomm_result_t check_rows(const char *fn, const char *name, const hcomm_tensor_t *t,
                                 int64_t rows, int64_t cols) {
    HCOMM__TRY(hcomm__tensor_check(fn, name, t, NULL));
    if (t->ndim == 2 && t->shape[0] == rows && (cols < 0 || t->shape[1] == cols))
        return HCOMM_OK;
    char got[160], want[32];
    if (cols < 0)
        snprintf(want, sizeof want, "[%lld, *]", (long long)rows);
    else
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
    return hcomm__err(HCOMM_ERR_SHAPE, fn, "%s shape %s, expected %s", name,
                      hcomm__shape_str(t, got, sizeof got), want);
}

/* What one pass moves: in [in_rows, cols] -> out [out_rows, cols], one dtype. */
typedef struct pass {
    const char *fn;
    const hcomm_tensor_t *in;
    hcomm_tensor_t *out;
    size_t rb;
    float *grad_w;
    bool etp_first; /* expert-TP: the gather's dual (reduce_scatterv) runs before the EP step */
} pass_t;

/* Checks in [in_rows, width] and out [out_rows, the same width] of one dtype (float_only: a
 * summing pass); cols < 0 lets the width be any. */
static hcomm_result_t check_pass(pass_t *ps, const hcomm_moe_handle_t *h, const char *in_name,
                                 int64_t in_rows, const char *out_name, int64_t out_rows,
                                 int64_t cols, bool float_only) {
    const char *fn = ps->fn;
    if (h == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'handle' is NULL");
    HCOMM__TRY(check_rows(fn, in_name, ps->in, in_rows, cols));
    HCOMM__TRY(check_rows(fn, out_name, ps->out, out_rows, ps->in->shape[1]));
    HCOMM__TRY(hcomm__same_dtype(fn, in_name, ps->in, out_name, ps->out));
    if (float_only && !hcomm__dtype_is_float(ps->in->dtype))
        return hcomm__err(HCOMM_ERR_DTYPE, fn, "%s->dtype=%s, expected f16, bf16, f32 or f64",
                          in_name, hcomm__dtype_str(ps->in->dtype));
    ps->rb = (size_t)ps->in->shape[1] * hcomm__dtype_size(ps->in->dtype);
    if (!float_only && h->topk) /* the top-1 passes copy; a top-k handle needs the sums */
        return hcomm__err(HCOMM_ERR_STATE, fn,
                          "handle comes from hcomm_moe_dispatch_topk: use the _topk passes");
    return HCOMM_OK;
}

typedef hcomm_result_t (*pass_body_t)(hcomm_moe_handle_t *h, const pass_t *ps);

/* Runs a collective pass: a rank whose checks failed joins its peers' exchange so they fail
 * with HCOMM_ERR_PEER instead of waiting. */
static hcomm_result_t run_pass(hcomm_moe_handle_t *h, const pass_t *ps, hcomm_result_t chk,
                               pass_body_t body) {
    if (h == NULL)
        return chk;
    hcomm__enter(h->group, ps->fn);
    if (chk != HCOMM_OK) { /* joins the expert-TP step too, in the body's order */
        if (ps->etp_first)
            chk = hcomm__moe_etp_fail(ps->fn, h, chk);
        chk = hcomm__coll_fail(h->group, chk);
        if (!ps->etp_first)
            chk = hcomm__moe_etp_fail(ps->fn, h, chk);
        return hcomm__leave(h->group, chk);
    }
    return hcomm__leave(h->group, body(h, ps));
}

/* recv -> pairs, then each token's slots copied (top-1) or summed in slot order. */
static hcomm_result_t back_to_tokens(hcomm_moe_handle_t *h, const pass_t *ps, bool weighted,
                                     bool keep_y) {
    char *pairs = NULL, *own = NULL;
    void *acc = NULL;
    hcomm_result_t res;
    int64_t cols = ps->in->shape[1];
    const void *in = ps->in->data;
    if (h->etp != NULL) { /* expert-TP: the members' partial outputs summed, own rows kept */
        res = hcomm__moe_pool_get(h->pool, ps->fn, (size_t)h->r * ps->rb, (void **)&own);
        res = res != HCOMM_OK ? hcomm__moe_etp_fail(ps->fn, h, res)
                              : hcomm__moe_etp_reduce(ps->fn, h, in, ps->in->dtype, cols, own);
        if (res != HCOMM_OK) {
            res = hcomm__coll_fail(h->group, res);
            goto done;
        }
        in = own;
    }
    HCOMM__TRY_GOTO(
        hcomm__moe_pool_get(h->pool, ps->fn, (size_t)h->npair * ps->rb, (void **)&pairs), res,
        done);
    HCOMM__TRY_GOTO(hcomm__alloc(ps->fn, 2 * (size_t)cols * sizeof(double), &acc), res, done);
    HCOMM__TRY_GOTO(route_pairs_bwd(ps->fn, h, in, pairs, ps->rb), res, done);
    if (!h->topk) /* top-1: every token has exactly one slot, copied as bytes */
        hcomm__moe_scatter_rows(ps->out->data, pairs, h->pair_slot, h->npair, ps->rb);
    else
        sum_slots(h, pairs, ps->in->dtype, cols, weighted, ps->out->data, acc,
                  (float *)((double *)acc + cols));
    if (keep_y) { /* combine_bwd's weight gradients need y */
        hcomm__moe_pool_put(h->pool, h->y);
        h->y = pairs;
        h->y_h = cols;
        h->y_dtype = ps->in->dtype;
        pairs = NULL;
    }
done:
    hcomm__moe_pool_put(h->pool, pairs);
    hcomm__moe_pool_put(h->pool, own);
    free(acc);
    return res;
}

static hcomm_result_t combine_body(hcomm_moe_handle_t *h, const pass_t *ps) {
    return back_to_tokens(h, ps, true, h->topk);
}

static hcomm_result_t dispatch_bwd_body(hcomm_moe_handle_t *h, const pass_t *ps) {
    return back_to_tokens(h, ps, false, false);
}

/* Expert-TP after an EP step that ended with res: own [r] rows gathered into ps->out, or the
 * members' gather joined as failed. */
static hcomm_result_t etp_then_gather(const pass_t *ps, const hcomm_moe_handle_t *h,
                                      hcomm_result_t res, const void *own) {
    if (h->etp == NULL)
        return res;
    if (res != HCOMM_OK)
        return hcomm__moe_etp_fail(ps->fn, h, res);
    return hcomm__moe_etp_gather(ps->fn, h, own, ps->out->data, ps->rb);
}

/* pairs from grad_out (copied for top-1, weighted for top-k), then forward to recv. */
static hcomm_result_t combine_bwd_body(hcomm_moe_handle_t *h, const pass_t *ps) {
    char *pairs = NULL, *own = NULL;
    float *tmp = NULL;
    hcomm_result_t res;
    int64_t cols = ps->in->shape[1];
    if (h->etp)
        HCOMM__TRY_GOTO(hcomm__moe_pool_get(h->pool, ps->fn, (size_t)h->r * ps->rb, (void **)&own),
                        res, done);
    HCOMM__TRY_GOTO(
        hcomm__moe_pool_get(h->pool, ps->fn, (size_t)h->npair * ps->rb, (void **)&pairs), res,
        done);
    HCOMM__TRY_GOTO(hcomm__alloc(ps->fn, 2 * sizeof(float) * (size_t)cols, (void **)&tmp), res,
                    done);
    if (!h->topk)
        hcomm__moe_gather_rows(pairs, ps->in->data, h->pair_slot, h->npair, ps->rb);
    else
        scale_to_pairs(h, ps->in->data, ps->in->dtype, cols, pairs, tmp);
    if (ps->grad_w)
        weight_grads(h, ps->in->data, ps->grad_w, tmp, tmp + cols);
    res = route_pairs_fwd(ps->fn, h, pairs, h->etp ? own : ps->out->data, ps->rb);
done:
    res = etp_then_gather(ps, h, res, own);
    hcomm__moe_pool_put(h->pool, pairs);
    hcomm__moe_pool_put(h->pool, own);
    free(tmp);
    return res;
}

static hcomm_result_t redispatch_body(hcomm_moe_handle_t *h, const pass_t *ps) {
    if (h->etp != NULL) { /* own rows, then every member's */
        char *own = NULL;
        hcomm_result_t res =
            hcomm__moe_pool_get(h->pool, ps->fn, (size_t)h->r * ps->rb, (void **)&own);
        if (res == HCOMM_OK)
            res = route_tokens(ps->fn, h, ps->in->data, own, ps->rb);
        res = etp_then_gather(ps, h, res, own);
        hcomm__moe_pool_put(h->pool, own);
        return res;
    }
    if (!h->pad)
        return route_tokens(ps->fn, h, ps->in->data, ps->out->data, ps->rb);
    char *pairs = NULL; /* padded: every pair row travels, zeros for padding */
    hcomm_result_t res;
    HCOMM__TRY_GOTO(
        hcomm__moe_pool_get(h->pool, ps->fn, (size_t)h->npair * ps->rb, (void **)&pairs), res,
        done);
    for (int64_t p = 0; p < h->npair; p++) {
        int64_t s = h->pair_slot[p];
        if (s < 0)
            memset(pairs + (size_t)p * ps->rb, 0, ps->rb);
        else
            memcpy(pairs + (size_t)p * ps->rb,
                   (const char *)ps->in->data + (size_t)(s / h->k) * ps->rb, ps->rb);
    }
    res = route_pairs_fwd(ps->fn, h, pairs, ps->out->data, ps->rb);
done:
    hcomm__moe_pool_put(h->pool, pairs);
    return res;
}

hcomm_result_t hcomm_moe_combine(hcomm_moe_handle_t *handle, const hcomm_tensor_t *expert_out,
                                 hcomm_tensor_t *out) {
    pass_t ps = {__func__, expert_out, out, 0, NULL, true};
    hcomm_result_t chk = check_pass(&ps, handle, "expert_out", handle ? handle->r_all : 0, "out",
                                    handle ? handle->n : 0, -1, false);
    return run_pass(handle, &ps, chk, combine_body);
}

hcomm_result_t hcomm_moe_combine_bwd(hcomm_moe_handle_t *handle, const hcomm_tensor_t *grad_out,
                                     hcomm_tensor_t *grad_expert_out) {
    pass_t ps = {__func__, grad_out, grad_expert_out, 0, NULL};
    hcomm_result_t chk = check_pass(&ps, handle, "grad_out", handle ? handle->n : 0,
                                    "grad_expert_out", handle ? handle->r_all : 0, -1, false);
    return run_pass(handle, &ps, chk, combine_bwd_body);
}

hcomm_result_t hcomm_moe_dispatch_bwd(hcomm_moe_handle_t *handle, const hcomm_tensor_t *grad_recv,
                                      hcomm_tensor_t *grad_tokens) {
    pass_t ps = {__func__, grad_recv, grad_tokens, 0, NULL, true};
    hcomm_result_t chk =
        check_pass(&ps, handle, "grad_recv", handle ? handle->r_all : 0, "grad_tokens",
                   handle ? handle->n : 0, handle ? handle->h : 0, false);
    return run_pass(handle, &ps, chk, dispatch_bwd_body);
}

hcomm_result_t hcomm_moe_redispatch(hcomm_moe_handle_t *handle, const hcomm_tensor_t *tokens,
                                    hcomm_tensor_t *recv) {
    pass_t ps = {__func__, tokens, recv, 0, NULL};
    hcomm_result_t chk = check_pass(&ps, handle, "tokens", handle ? handle->n : 0, "recv",
                                    handle ? handle->r_all : 0, -1, false);
    if (chk == HCOMM_ERR_STATE) /* both kinds of handle redispatch */
        chk = HCOMM_OK;
    return run_pass(handle, &ps, chk, redispatch_body);
}

hcomm_result_t hcomm_moe_combine_topk(hcomm_moe_handle_t *handle, const hcomm_tensor_t *expert_out,
                                      hcomm_tensor_t *out) {
    pass_t ps = {__func__, expert_out, out, 0, NULL, true};
    hcomm_result_t chk = check_pass(&ps, handle, "expert_out", handle ? handle->r_all : 0, "out",
                                    handle ? handle->n : 0, -1, true);
    return run_pass(handle, &ps, chk, combine_body);
}

hcomm_result_t hcomm_moe_dispatch_topk_bwd(hcomm_moe_handle_t *handle,
                                           const hcomm_tensor_t *grad_recv,
                                           hcomm_tensor_t *grad_tokens) {
    pass_t ps = {__func__, grad_recv, grad_tokens, 0, NULL, true};
    hcomm_result_t chk =
        check_pass(&ps, handle, "grad_recv", handle ? handle->r_all : 0, "grad_tokens",
                   handle ? handle->n : 0, handle ? handle->h : 0, true);
    return run_pass(handle, &ps, chk, dispatch_bwd_body);
}

/* Weight gradients need the y of a combine with the same width and dtype. */
static hcomm_result_t check_y(const pass_t *ps, const hcomm_moe_handle_t *h) {
    if (ps->grad_w == NULL || (h->y && h->y_h == ps->in->shape[1] && h->y_dtype == ps->in->dtype))
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_STATE, ps->fn,
                      "grad_weights needs a hcomm_moe_combine_topk of %s [*, %lld] before",
                      hcomm__dtype_str(ps->in->dtype), (long long)ps->in->shape[1]);
}

hcomm_result_t hcomm_moe_combine_topk_bwd(hcomm_moe_handle_t *handle,
                                          const hcomm_tensor_t *grad_out,
                                          hcomm_tensor_t *grad_expert_out, float *grad_weights) {
    pass_t ps = {__func__, grad_out, grad_expert_out, 0, grad_weights};
    hcomm_result_t chk = check_pass(&ps, handle, "grad_out", handle ? handle->n : 0,
                                    "grad_expert_out", handle ? handle->r_all : 0, -1, true);
    if (chk == HCOMM_OK)
        chk = check_y(&ps, handle);
    return run_pass(handle, &ps, chk, combine_bwd_body);
}
