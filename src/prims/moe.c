/* Mixture-of-experts dispatch and combine over the EP group (GShard, Lepikhin et al. 2020;
 * the data path of Megatron-Core's MoEAlltoAllTokenDispatcher).
 *
 * Dispatch: tokens are stably sorted by expert id (experts are contiguous per rank, so this
 * also sorts by destination), counts are exchanged, rows move with one all_to_allv, and the
 * received rows (source-major) are reordered to expert-major. The handle keeps both
 * permutations and the per-peer row counts, so every later pass is a pure data path:
 *   forward route  (dispatch, combine_bwd): in[N] -sort-> all_to_allv -reorder-> out[R]
 *   backward route (combine, dispatch_bwd): in[R] -unreorder-> all_to_allv -unsort-> out[N]
 */
#include "hcomm/moe.h"
#include "prims/prims.h"

#include <stdio.h>
#include <string.h>

struct hcomm_moe_handle {
    hcomm_comm_t *group;
    int size, num_local;        /* EP group size, experts per rank */
    int64_t n, r, h;            /* tokens sent, rows received, row width of the dispatch */
    hcomm_dtype_t dtype;        /* of the dispatched tokens */
    int64_t *send_rows;         /* [size] rows to each rank; sorted order is rank-major */
    int64_t *send_off;          /* [size] first sorted row for each rank */
    int64_t *recv_rows;         /* [size] rows from each rank */
    int64_t *recv_off;          /* [size] first raw (source-major) row from each rank */
    int64_t *sorted_to_token;   /* [n] sorted position -> original token index */
    int64_t *recv_to_raw;       /* [r] expert-major row -> raw received row */
    int64_t *tokens_per_expert; /* [num_local] */
    void *recv;                 /* [r, h] received tokens, expert-major */
};

/* What each rank tells each peer before the rows move: its argument-check status (so a rank
 * with bad input fails every rank instead of leaving them waiting), its row layout (so a
 * disagreement is reported, not mis-delivered) and its per-expert counts for that peer. */
enum { META_STATUS, META_H, META_DTYPE, META_COUNTS };

static int64_t *alloc_i64(size_t n) {
    return calloc(n ? n : 1, sizeof(int64_t));
}

static void exclusive_scan(const int64_t *counts, int64_t *offsets, int n) {
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        offsets[i] = sum;
        sum += counts[i];
    }
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

/* Forward route: in [n rows] in token order -> out [r rows] expert-major. */
static hcomm_result_t route_forward(const char *fn, const hcomm_moe_handle_t *h, const void *in,
                                    void *out, size_t rb) {
    char *sbuf = NULL, *rbuf = NULL;
    hcomm_result_t res;
    HCOMM__TRY_GOTO(hcomm__alloc(fn, (size_t)h->n * rb, (void **)&sbuf), res, done);
    HCOMM__TRY_GOTO(hcomm__alloc(fn, (size_t)h->r * rb, (void **)&rbuf), res, done);
    for (int64_t j = 0; j < h->n; j++)
        memcpy(sbuf + (size_t)j * rb, (const char *)in + (size_t)h->sorted_to_token[j] * rb, rb);
    HCOMM__TRY_GOTO(exchange_rows(fn, h->group, sbuf, h->send_rows, h->send_off, rbuf, h->recv_rows,
                                  h->recv_off, rb),
                    res, done);
    for (int64_t k = 0; k < h->r; k++)
        memcpy((char *)out + (size_t)k * rb, rbuf + (size_t)h->recv_to_raw[k] * rb, rb);
done:
    free(sbuf);
    free(rbuf);
    return res;
}

/* Backward route: in [r rows] expert-major -> out [n rows] in token order. */
static hcomm_result_t route_backward(const char *fn, const hcomm_moe_handle_t *h, const void *in,
                                     void *out, size_t rb) {
    char *sbuf = NULL, *rbuf = NULL;
    hcomm_result_t res;
    HCOMM__TRY_GOTO(hcomm__alloc(fn, (size_t)h->r * rb, (void **)&rbuf), res, done);
    HCOMM__TRY_GOTO(hcomm__alloc(fn, (size_t)h->n * rb, (void **)&sbuf), res, done);
    for (int64_t k = 0; k < h->r; k++)
        memcpy(rbuf + (size_t)h->recv_to_raw[k] * rb, (const char *)in + (size_t)k * rb, rb);
    HCOMM__TRY_GOTO(exchange_rows(fn, h->group, rbuf, h->recv_rows, h->recv_off, sbuf, h->send_rows,
                                  h->send_off, rb),
                    res, done);
    for (int64_t j = 0; j < h->n; j++)
        memcpy((char *)out + (size_t)h->sorted_to_token[j] * rb, sbuf + (size_t)j * rb, rb);
done:
    free(sbuf);
    free(rbuf);
    return res;
}

/* Rank-local checks of dispatch arguments; the result travels to every peer. */
static hcomm_result_t check_tokens(const char *fn, const hcomm_tensor_t *tokens, const int32_t *ids,
                                   int num_experts) {
    HCOMM__TRY(hcomm__tensor_check(fn, "tokens", tokens, NULL));
    if (tokens->ndim != 2)
        return hcomm__err(HCOMM_ERR_SHAPE, fn, "tokens->ndim=%d, expected 2 ([N, H])",
                          tokens->ndim);
    int64_t n = tokens->shape[0];
    if (n > 0 && ids == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'expert_ids' is NULL with N=%lld tokens",
                          (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= num_experts)
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "expert_ids[%lld]=%d outside 0..%d",
                              (long long)i, (int)ids[i], num_experts - 1);
    return HCOMM_OK;
}

/* Stable counting sort of tokens by expert: counts[e] tokens for expert e and sorted position
 * -> token index. next is scratch of num_experts. */
static void sort_by_expert(const int32_t *ids, int64_t n, int num_experts, int64_t *counts,
                           int64_t *next, int64_t *sorted_to_token) {
    for (int64_t i = 0; i < n; i++)
        counts[ids[i]]++;
    exclusive_scan(counts, next, num_experts);
    for (int64_t i = 0; i < n; i++)
        sorted_to_token[next[ids[i]]++] = i;
}

static hcomm_moe_handle_t *handle_alloc(hcomm_comm_t *g, int num_local, int64_t n) {
    hcomm_moe_handle_t *h = calloc(1, sizeof *h);
    if (h == NULL)
        return NULL;
    size_t p = (size_t)g->size;
    *h = (hcomm_moe_handle_t){.group = g, .size = g->size, .num_local = num_local, .n = n};
    h->send_rows = alloc_i64(p);
    h->send_off = alloc_i64(p);
    h->recv_rows = alloc_i64(p);
    h->recv_off = alloc_i64(p);
    h->sorted_to_token = alloc_i64((size_t)n);
    h->tokens_per_expert = alloc_i64((size_t)num_local);
    if (!h->send_rows || !h->send_off || !h->recv_rows || !h->recv_off || !h->sorted_to_token ||
        !h->tokens_per_expert) {
        hcomm_moe_handle_free(h);
        return NULL;
    }
    return h;
}

/* Routes this rank's tokens: fills sorted_to_token, send_rows/off and the meta rows for every
 * peer (meta is [size][META_COUNTS + num_local]). */
static hcomm_result_t plan_send(const char *fn, hcomm_moe_handle_t *h, const int32_t *ids,
                                int64_t *meta) {
    int num_experts = h->size * h->num_local, w = META_COUNTS + h->num_local;
    int64_t *counts = alloc_i64(2 * (size_t)num_experts);
    if (counts == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for counts");
    sort_by_expert(ids, h->n, num_experts, counts, counts + num_experts, h->sorted_to_token);
    for (int p = 0; p < h->size; p++)
        for (int l = 0; l < h->num_local; l++) {
            meta[p * w + META_COUNTS + l] = counts[p * h->num_local + l];
            h->send_rows[p] += counts[p * h->num_local + l];
        }
    exclusive_scan(h->send_rows, h->send_off, h->size);
    free(counts);
    return HCOMM_OK;
}

/* From the peers' meta rows: fails if a peer failed or disagrees, else fills the receive
 * side: recv_rows/off, tokens_per_expert and the expert-major reorder. */
static hcomm_result_t plan_recv(const char *fn, hcomm_moe_handle_t *h, const int64_t *meta) {
    int w = META_COUNTS + h->num_local;
    for (int s = 0; s < h->size; s++) {
        const int64_t *m = meta + s * w;
        if (m[META_STATUS] != HCOMM_OK)
            return hcomm__err(HCOMM_ERR_PEER, fn,
                              "rank %d of ep_group failed its argument checks with %s", s,
                              hcomm_result_name((hcomm_result_t)m[META_STATUS]));
        if (m[META_H] != h->h || m[META_DTYPE] != (int64_t)h->dtype)
            return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                              "rank %d sent tokens of %s [*, %lld], this rank %s [*, %lld]", s,
                              hcomm__dtype_str((hcomm_dtype_t)m[META_DTYPE]), (long long)m[META_H],
                              hcomm__dtype_str(h->dtype), (long long)h->h);
        for (int l = 0; l < h->num_local; l++) {
            h->recv_rows[s] += m[META_COUNTS + l];
            h->tokens_per_expert[l] += m[META_COUNTS + l];
        }
        h->r += h->recv_rows[s];
    }
    exclusive_scan(h->recv_rows, h->recv_off, h->size);
    h->recv_to_raw = alloc_i64((size_t)h->r);
    if (h->recv_to_raw == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %lld received rows",
                          (long long)h->r);
    /* Raw rows from source s are expert-sorted; walk expert-major, then source. */
    int64_t k = 0;
    for (int l = 0; l < h->num_local; l++)
        for (int s = 0; s < h->size; s++) {
            const int64_t *m = meta + s * w;
            int64_t base = h->recv_off[s];
            for (int e = 0; e < l; e++)
                base += m[META_COUNTS + e];
            for (int64_t t = 0; t < m[META_COUNTS + l]; t++)
                h->recv_to_raw[k++] = base + t;
        }
    return HCOMM_OK;
}

/* Exchanges the meta rows: every rank gets one row from each peer. */
static hcomm_result_t exchange_meta(const char *fn, hcomm_moe_handle_t *h, const int64_t *send,
                                    int64_t *recv) {
    size_t p = (size_t)h->size, w = (size_t)(META_COUNTS + h->num_local) * sizeof(int64_t);
    size_t *v = malloc(2 * p * sizeof *v);
    if (v == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %zu counts", 2 * p);
    for (size_t i = 0; i < p; i++) {
        v[i] = w;
        v[p + i] = i * w;
    }
    hcomm_result_t res = hcomm__coll_all_to_allv(h->group, send, v, v + p, recv, v, v + p);
    free(v);
    return res;
}

/* The collective part of dispatch once the group and num_experts are known good. */
static hcomm_result_t dispatch(const char *fn, hcomm_moe_handle_t *h, const hcomm_tensor_t *tokens,
                               const int32_t *ids, hcomm_result_t local) {
    int w = META_COUNTS + h->num_local;
    int64_t *meta_send = alloc_i64((size_t)(h->size * w)),
            *meta_recv = alloc_i64((size_t)(h->size * w));
    hcomm_result_t res = HCOMM_OK;
    if (!meta_send || !meta_recv) {
        res = hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for counts");
        goto done;
    }
    if (local == HCOMM_OK)
        local = plan_send(fn, h, ids, meta_send);
    for (int p = 0; p < h->size; p++) {
        meta_send[p * w + META_STATUS] = local;
        meta_send[p * w + META_H] = h->h;
        meta_send[p * w + META_DTYPE] = h->dtype;
    }
    HCOMM__TRY_GOTO(exchange_meta(fn, h, meta_send, meta_recv), res, done);
    if (local != HCOMM_OK) { /* the message from the failed check is still the last error */
        res = local;
        goto done;
    }
    HCOMM__TRY_GOTO(plan_recv(fn, h, meta_recv), res, done);
    size_t rb = (size_t)h->h * hcomm__dtype_size(h->dtype);
    HCOMM__TRY_GOTO(hcomm__alloc(fn, (size_t)h->r * rb, &h->recv), res, done);
    res = route_forward(fn, h, tokens->data, h->recv, rb);
done:
    free(meta_send);
    free(meta_recv);
    return res;
}

hcomm_result_t hcomm_moe_dispatch(hcomm_comm_t *ep_group, const hcomm_tensor_t *tokens,
                                  const int32_t *expert_ids, int num_experts,
                                  hcomm_moe_handle_t **handle) {
    HCOMM__CHECK_NULL(handle);
    *handle = NULL;
    HCOMM__CHECK_NULL(ep_group);
    /* num_experts is the same on every rank: failing here fails them all. */
    if (num_experts < 1 || num_experts % ep_group->size != 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__,
                          "num_experts=%d is not a positive multiple of the ep_group size %d",
                          num_experts, ep_group->size);
    /* Token checks are rank-local: a failure still joins the count exchange, flagged. */
    hcomm_result_t local = check_tokens(__func__, tokens, expert_ids, num_experts);
    bool ok = local == HCOMM_OK;
    hcomm_moe_handle_t *h =
        handle_alloc(ep_group, num_experts / ep_group->size, ok ? tokens->shape[0] : 0);
    if (h == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, __func__, "out of memory for the routing handle");
    h->h = ok ? tokens->shape[1] : 0;
    h->dtype = ok ? tokens->dtype : HCOMM_F32;
    hcomm__enter(ep_group, __func__);
    hcomm_result_t res = hcomm__leave(ep_group, dispatch(__func__, h, tokens, expert_ids, local));
    if (res != HCOMM_OK) {
        hcomm_moe_handle_free(h);
        return res;
    }
    *handle = h;
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_received(const hcomm_moe_handle_t *handle, hcomm_tensor_t *recv,
                                  int64_t *tokens_per_expert) {
    HCOMM__CHECK_NULL(handle);
    HCOMM__CHECK_NULL(recv);
    *recv = (hcomm_tensor_t){.data = handle->recv, .dtype = handle->dtype, .ndim = 2};
    recv->shape[0] = handle->r;
    recv->shape[1] = handle->h;
    if (tokens_per_expert)
        memcpy(tokens_per_expert, handle->tokens_per_expert,
               sizeof(int64_t) * (size_t)handle->num_local);
    return HCOMM_OK;
}

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

/* Checks in [in_rows, width] and out [out_rows, the same width] of one dtype; cols < 0 lets
 * the width be any; *rb is the row size in bytes. */
static hcomm_result_t check_route(const char *fn, const hcomm_moe_handle_t *h, const char *in_name,
                                  const hcomm_tensor_t *in, int64_t in_rows, const char *out_name,
                                  const hcomm_tensor_t *out, int64_t out_rows, int64_t cols,
                                  size_t *rb) {
    if (h == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'handle' is NULL");
    HCOMM__TRY(check_rows(fn, in_name, in, in_rows, cols));
    HCOMM__TRY(check_rows(fn, out_name, out, out_rows, in->shape[1]));
    HCOMM__TRY(hcomm__same_dtype(fn, in_name, in, out_name, out));
    *rb = (size_t)in->shape[1] * hcomm__dtype_size(in->dtype);
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_combine(hcomm_moe_handle_t *handle, const hcomm_tensor_t *expert_out,
                                 hcomm_tensor_t *out) {
    size_t rb = 0;
    hcomm_result_t chk = check_route(__func__, handle, "expert_out", expert_out, handle ? handle->r : 0,
                           "out", out, handle ? handle->n : 0, -1, &rb);
    if (handle == NULL)
        return chk;
    hcomm__enter(handle->group, __func__);
    if (chk != HCOMM_OK)
        return hcomm__leave(handle->group, hcomm__coll_fail(handle->group, chk));
    return hcomm__leave(handle->group, route_backward(__func__, handle, expert_out->data, out->data, rb));
}

hcomm_result_t hcomm_moe_combine_bwd(hcomm_moe_handle_t *handle, const hcomm_tensor_t *grad_out,
                                     hcomm_tensor_t *grad_expert_out) {
    size_t rb = 0;
    hcomm_result_t chk = check_route(__func__, handle, "grad_out", grad_out, handle ? handle->n : 0,
                           "grad_expert_out", grad_expert_out, handle ? handle->r : 0, -1, &rb);
    if (handle == NULL)
        return chk;
    hcomm__enter(handle->group, __func__);
    if (chk != HCOMM_OK)
        return hcomm__leave(handle->group, hcomm__coll_fail(handle->group, chk));
    return hcomm__leave(handle->group, route_forward(__func__, handle, grad_out->data, grad_expert_out->data, rb));
}

hcomm_result_t hcomm_moe_dispatch_bwd(hcomm_moe_handle_t *handle, const hcomm_tensor_t *grad_recv,
                                      hcomm_tensor_t *grad_tokens) {
    size_t rb = 0;
    hcomm_result_t chk = check_route(__func__, handle, "grad_recv", grad_recv, handle ? handle->r : 0,
                           "grad_tokens", grad_tokens, handle ? handle->n : 0,
                           handle ? handle->h : 0, &rb);
    if (handle == NULL)
        return chk;
    hcomm__enter(handle->group, __func__);
    if (chk != HCOMM_OK)
        return hcomm__leave(handle->group, hcomm__coll_fail(handle->group, chk));
    return hcomm__leave(handle->group, route_backward(__func__, handle, grad_recv->data, grad_tokens->data, rb));
}

hcomm_result_t hcomm_moe_handle_free(hcomm_moe_handle_t *handle) {
    if (handle == NULL)
        return HCOMM_OK;
    free(handle->send_rows);
    free(handle->send_off);
    free(handle->recv_rows);
    free(handle->recv_off);
    free(handle->sorted_to_token);
    free(handle->recv_to_raw);
    free(handle->tokens_per_expert);
    free(handle->recv);
    free(handle);
    return HCOMM_OK;
}
