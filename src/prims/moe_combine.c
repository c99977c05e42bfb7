/* The passes over a dispatch's handle: combine (the slot-ordered sum per token at the source),
 * redispatch (tokens again along the stored routing) and the backward passes, each one
 * all_to_allv of rows along the handle's maps, top-1 and top-k forms. */
#include "prims/moe_common.h"

#include <stdio.h>
#include <string.h>

/* ---- moving rows along the stored routing ---- */

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
        hcomm__coll_all_to_allv(g, sendbuf, v, v + p, recvbuf, v + 2 * p, v + 3 * p, false);
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

/* out = sum over j < n in order of w[j] * rows[j] (n = 0: zeros), accumulated in f32 for
 * f16/bf16/f32 (f64 for f64) and rounded once: each term's product, then its sum. */
static void sum_rows(hcomm_dtype_t dt, const char *const *rows, const float *w, int n, int64_t cols,
                     char *out) {
    if (n == 0) {
        memset(out, 0, (size_t)cols * hcomm__dtype_size(dt));
        return;
    }
    if (dt != HCOMM_F64) {
        hcomm__weighted_sum(out, (const void *const *)rows, w, n, (size_t)cols, dt);
        return;
    }
    for (int64_t c = 0; c < cols; c++) {
        double acc = (double)w[0] * load_f64(rows[0], c);
        for (int j = 1; j < n; j++)
            acc += (double)w[j] * load_f64(rows[j], c);
        memcpy(out + 8 * (size_t)c, &acc, 8);
    }
}

/* out[t] = sum over kept slots j in slot order of (weighted ? w[t, j] : 1) * pairs[slot],
 * rounded once; zeros for a token with no kept slot. */
static void sum_slots(const hcomm_moe_handle_t *h, const char *pairs, hcomm_dtype_t dt,
                      int64_t cols, bool weighted, char *out, const char **rows, float *w) {
    size_t rb = (size_t)cols * hcomm__dtype_size(dt);
    for (int64_t t = 0; t < h->n; t++) {
        int n = 0;
        for (int j = 0; j < h->k; j++) {
            int64_t p = h->slot_pair[t * h->k + j];
            if (p < 0)
                continue;
            w[n] = weighted ? h->weights[t * h->k + j] : 1.0f;
            rows[n++] = pairs + (size_t)p * rb;
        }
        sum_rows(dt, rows, w, n, cols, out + (size_t)t * rb);
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

/* The handle keeps pairs (npair rows of this pass's input, pair order) as y, which
 * combine_bwd's weight gradients need, in place of the last one; returns NULL (the handle owns
 * them now). */
static char *keep_as_y(hcomm_moe_handle_t *h, const pass_t *ps, char *pairs) {
    hcomm__moe_pool_put(h->pool, h->y);
    h->y = pairs;
    h->y_h = ps->in->shape[1];
    h->y_dtype = ps->in->dtype;
    return NULL;
}

/* ---- the passes back to the tokens where the ranks read each other's rows (h->pull) ---- */

/* The rank a pair went to. */
static int rank_of_pair(const hcomm_moe_handle_t *h, int64_t q) {
    int lo = 0, hi = h->size - 1;
    while (lo < hi) { /* the last rank whose pairs start at or before q */
        int mid = (lo + hi + 1) / 2;
        if (h->pair_off[mid] <= q)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Scratch of a pull back: k rows where they cannot be loaded in place, and the sum's terms. */
typedef struct back_tmp {
    char *rows;
    const char **at;
    float *w;
} back_tmp_t;

/* out[t] from its slots' rows, each loaded from the rank that holds it (sum_slots' arithmetic,
 * so the result is bitwise the all_to_allv path's); y (NULL: not kept) gets each row in pair
 * order. */
static hcomm_result_t pull_token(const pass_t *ps, const hcomm_moe_handle_t *h,
                                 const hcomm__remote_t *all, int64_t t, bool weighted, char *y,
                                 const back_tmp_t *tmp) {
    char *out = (char *)ps->out->data + (size_t)t * ps->rb;
    int n = 0;
    for (int j = 0; j < h->k; j++) {
        int64_t q = h->slot_pair[t * h->k + j];
        if (q < 0)
            continue;
        int p = rank_of_pair(h, q);
        const void *row;
        HCOMM__TRY(hcomm__coll_load(h->group, ps->fn, p, &all[p],
                                    (size_t)h->pair_remote[q] * ps->rb,
                                    tmp->rows + (size_t)n * ps->rb, ps->rb, &row));
        if (y)
            hcomm__moe_copy_row(y + (size_t)q * ps->rb, row, ps->rb);
        tmp->w[n] = weighted ? h->weights[t * h->k + j] : 1.0f;
        tmp->at[n++] = row;
    }
    if (!h->topk) { /* top-1: the token's one slot, as bytes (none: dropped, out untouched) */
        if (n > 0)
            hcomm__moe_copy_row(out, tmp->at[0], ps->rb);
    } else
        sum_rows(ps->in->dtype, tmp->at, tmp->w, n, ps->in->shape[1], out);
    return HCOMM_OK;
}

/* Every token's slots read where the experts' rows lie: one exchange of where they are, the
 * sums, and the end of the reads (no all_to_allv of the rows). */
static hcomm_result_t pull_back(hcomm_moe_handle_t *h, const pass_t *ps, bool weighted,
                                bool keep_y) {
    hcomm__remote_t *all = malloc(sizeof *all * (size_t)h->size);
    if (all == NULL)
        return hcomm__coll_fail(
            h->group, hcomm__err(HCOMM_ERR_NOMEM, ps->fn, "out of memory for %d exports", h->size));
    hcomm_result_t res = hcomm__coll_exports(h->group, ps->in->data, (size_t)h->r * ps->rb, all);
    if (res != HCOMM_OK) {
        free(all);
        return res;
    }
    char *y = NULL;
    size_t k = (size_t)h->k;
    back_tmp_t tmp = {malloc(k * ps->rb + 1), malloc(k * sizeof(char *)),
                      malloc(k * sizeof(float))};
    if (!tmp.rows || !tmp.at || !tmp.w)
        res = hcomm__err(HCOMM_ERR_NOMEM, ps->fn, "out of memory for %zu rows of %zu bytes", k,
                         ps->rb);
    if (res == HCOMM_OK && keep_y)
        res = hcomm__moe_pool_get(h->pool, ps->fn, (size_t)h->npair * ps->rb, (void **)&y);
    for (int64_t t = 0; t < h->n && res == HCOMM_OK; t++)
        res = pull_token(ps, h, all, t, weighted, y, &tmp);
    res = hcomm__coll_reads_done(h->group, ps->fn, res);
    if (res == HCOMM_OK && keep_y)
        y = keep_as_y(h, ps, y);
    hcomm__moe_pool_put(h->pool, y);
    free(tmp.rows);
    free(tmp.at);
    free(tmp.w);
    free(all);
    return res;
}

/* recv -> pairs, then each token's slots copied (top-1) or summed in slot order. */
static hcomm_result_t back_to_tokens(hcomm_moe_handle_t *h, const pass_t *ps, bool weighted,
                                     bool keep_y) {
    char *pairs = NULL, *own = NULL;
    void *terms = NULL;
    hcomm_result_t res;
    int64_t cols = ps->in->shape[1];
    const void *in = ps->in->data;
    if (h->pull)
        return pull_back(h, ps, weighted, keep_y);
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
    HCOMM__TRY_GOTO(hcomm__alloc(ps->fn, (size_t)h->k * (sizeof(char *) + sizeof(float)), &terms),
                    res, done);
    HCOMM__TRY_GOTO(route_pairs_bwd(ps->fn, h, in, pairs, ps->rb), res, done);
    if (!h->topk) /* top-1: every token has exactly one slot, copied as bytes */
        hcomm__moe_scatter_rows(ps->out->data, pairs, h->pair_slot, h->npair, ps->rb);
    else
        sum_slots(h, pairs, ps->in->dtype, cols, weighted, ps->out->data, terms,
                  (float *)((const char **)terms + h->k));
    if (keep_y)
        pairs = keep_as_y(h, ps, pairs);
done:
    hcomm__moe_pool_put(h->pool, pairs);
    hcomm__moe_pool_put(h->pool, own);
    free(terms);
    return res;
}

static hcomm_result_t combine_body(hcomm_moe_handle_t *h, const pass_t *ps) {
    return back_to_tokens(h, ps, true, h->topk && !h->no_y);
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

/* Weight gradients need the y of a combine with the same width and dtype. */
static hcomm_result_t check_y(const pass_t *ps, const hcomm_moe_handle_t *h) {
    if (ps->grad_w == NULL || (h->y && h->y_h == ps->in->shape[1] && h->y_dtype == ps->in->dtype))
        return HCOMM_OK;
    if (h->no_y)
        return hcomm__err(HCOMM_ERR_STATE, ps->fn,
                          "grad_weights needs y, which combine does not keep for a handle "
                          "dispatched with options->no_weight_grads");
    return hcomm__err(HCOMM_ERR_STATE, ps->fn,
                      "grad_weights needs a hcomm_moe_combine_topk of %s [*, %lld] before",
                      hcomm__dtype_str(ps->in->dtype), (long long)ps->in->shape[1]);
}

/* ---- the public passes: each top-1 call and its _topk form run one pass (topk: summing) ---- */

/* expert_out [r_all, C] -> out [n, C]. */
static hcomm_result_t combine(const char *fn, hcomm_moe_handle_t *handle,
                              const hcomm_tensor_t *expert_out, hcomm_tensor_t *out, bool topk) {
    pass_t ps = {fn, expert_out, out, 0, NULL, true};
    hcomm_result_t chk = check_pass(&ps, handle, "expert_out", handle ? handle->r_all : 0, "out",
                                    handle ? handle->n : 0, -1, topk);
    return run_pass(handle, &ps, chk, combine_body);
}

/* grad_out [n, C] -> grad_expert_out [r_all, C]; grad_weights [n, k] (top-k, may be NULL). */
static hcomm_result_t combine_bwd(const char *fn, hcomm_moe_handle_t *handle,
                                  const hcomm_tensor_t *grad_out, hcomm_tensor_t *grad_expert_out,
                                  float *grad_weights, bool topk) {
    pass_t ps = {fn, grad_out, grad_expert_out, 0, grad_weights};
    hcomm_result_t chk = check_pass(&ps, handle, "grad_out", handle ? handle->n : 0,
                                    "grad_expert_out", handle ? handle->r_all : 0, -1, topk);
    if (chk == HCOMM_OK)
        chk = check_y(&ps, handle);
    return run_pass(handle, &ps, chk, combine_bwd_body);
}

/* grad_recv [r_all, H] -> grad_tokens [n, H]. */
static hcomm_result_t dispatch_bwd(const char *fn, hcomm_moe_handle_t *handle,
                                   const hcomm_tensor_t *grad_recv, hcomm_tensor_t *grad_tokens,
                                   bool topk) {
    pass_t ps = {fn, grad_recv, grad_tokens, 0, NULL, true};
    hcomm_result_t chk =
        check_pass(&ps, handle, "grad_recv", handle ? handle->r_all : 0, "grad_tokens",
                   handle ? handle->n : 0, handle ? handle->h : 0, topk);
    return run_pass(handle, &ps, chk, dispatch_bwd_body);
}

hcomm_result_t hcomm_moe_combine(hcomm_moe_handle_t *handle, const hcomm_tensor_t *expert_out,
                                 hcomm_tensor_t *out) {
    return combine(__func__, handle, expert_out, out, false);
}

hcomm_result_t hcomm_moe_combine_bwd(hcomm_moe_handle_t *handle, const hcomm_tensor_t *grad_out,
                                     hcomm_tensor_t *grad_expert_out) {
    return combine_bwd(__func__, handle, grad_out, grad_expert_out, NULL, false);
}

hcomm_result_t hcomm_moe_dispatch_bwd(hcomm_moe_handle_t *handle, const hcomm_tensor_t *grad_recv,
                                      hcomm_tensor_t *grad_tokens) {
    return dispatch_bwd(__func__, handle, grad_recv, grad_tokens, false);
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
    return combine(__func__, handle, expert_out, out, true);
}

hcomm_result_t hcomm_moe_dispatch_topk_bwd(hcomm_moe_handle_t *handle,
                                           const hcomm_tensor_t *grad_recv,
                                           hcomm_tensor_t *grad_tokens) {
    return dispatch_bwd(__func__, handle, grad_recv, grad_tokens, true);
}

hcomm_result_t hcomm_moe_combine_topk_bwd(hcomm_moe_handle_t *handle,
                                          const hcomm_tensor_t *grad_out,
                                          hcomm_tensor_t *grad_expert_out, float *grad_weights) {
    return combine_bwd(__func__, handle, grad_out, grad_expert_out, grad_weights, true);
}
