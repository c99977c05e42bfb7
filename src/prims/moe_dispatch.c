/* MoE dispatch (moe_common.h describes the orders it builds): the capacity, the send side's
 * routing, the count exchange of meta rows, the receive side's layout, the token exchange
 * (flat here, per node in moe_hier.c) and its expansion into expert-major rows, then the
 * expert-TP gather (moe_etp.c); the entry points hcomm_moe_dispatch and _topk. */
#include "prims/moe_common.h"

#include <math.h>
#include <string.h>

/* Source row m's slots for this rank's local expert l. */
static int64_t local_count(const hcomm_moe_handle_t *h, const int64_t *m, int l) {
    return m[META_COUNTS + h->group->rank * h->num_local + l];
}

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
    int64_t nsend = hcomm__moe_scan(h->send_rows, h->send_off, h->size);
    hcomm__moe_scan(h->pair_rows, h->pair_off, h->size);
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
    int64_t *scratch = hcomm__moe_alloc_i64(3 * (size_t)h->size);
    hcomm_result_t res = HCOMM_OK;
    if (keep == NULL || scratch == NULL) {
        res = hcomm__err(HCOMM_ERR_NOMEM, a->fn, "out of memory for the layout");
        goto done;
    }
    HCOMM__TRY_GOTO(hcomm__moe_mark_kept(a, h, keep), res, done);
    count_send(h, a->ids, keep, meta, scratch);
    int64_t nsend = 0;
    for (int p = 0; p < h->size; p++) {
        nsend += h->send_rows[p];
        h->npair += h->pair_rows[p];
    }
    h->send_tok = hcomm__moe_alloc_i64((size_t)nsend);
    h->pair_slot = hcomm__moe_alloc_i64((size_t)h->npair);
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

/* The pull path's meta fields (moe_common.h): the buffers each peer reads its rows from. */
static void export_rows(hcomm_moe_handle_t *h, const void *tokens, const int32_t *hdr,
                        int64_t *meta, int w) {
    int64_t nsend = h->send_off[h->size - 1] + h->send_rows[h->size - 1];
    size_t rb = (size_t)h->h * hcomm__dtype_size(h->dtype);
    hcomm__exported_t e[3] = {
        hcomm__coll_export(h->group, tokens, (size_t)h->n * rb),
        hcomm__coll_export(h->group, h->send_tok, sizeof(int64_t) * (size_t)nsend),
        hcomm__coll_export(h->group, hdr, sizeof(int32_t) * (size_t)(nsend * h->k))};
    for (int p = 0; p < h->size; p++) {
        int64_t *m = meta + p * w;
        memcpy(m + META_TOKENS, e, sizeof e);
        m[META_FIRST] = h->send_off[p];
    }
}

/* Pull path: the expert-major row at each destination of every pair this rank sends (the
 * receiver's layout: local expert, then source, then token, then slot), from every source's
 * counts in meta. */
static hcomm_result_t remote_rows(const char *fn, hcomm_moe_handle_t *h, const int32_t *ids,
                                  const int64_t *meta) {
    int w = hcomm__moe_meta_width(h), e_all = h->size * h->num_local;
    int64_t *base = hcomm__moe_alloc_i64((size_t)e_all);
    h->pair_remote = hcomm__moe_alloc_i64((size_t)h->npair);
    if (base == NULL || h->pair_remote == NULL) {
        free(base);
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %lld pairs", (long long)h->npair);
    }
    for (int p = 0; p < h->size; p++) { /* expert e = p * num_local + l of rank p */
        int64_t at = 0;
        for (int l = 0; l < h->num_local; l++) {
            int e = p * h->num_local + l;
            base[e] = at;
            for (int s = 0; s < h->size; s++) {
                int64_t c = meta[s * w + META_COUNTS + e];
                at += c;
                base[e] += s < h->group->rank ? c : 0;
            }
        }
    }
    for (int64_t q = 0; q < h->npair; q++)
        h->pair_remote[q] = base[ids[h->pair_slot[q]]]++;
    free(base);
    return HCOMM_OK;
}

/* The receive side from the peers' meta rows (checked): row and slot counts per source, rows
 * per local expert and their offsets. */
static hcomm_result_t plan_recv(const char *fn, hcomm_moe_handle_t *h, const int64_t *meta) {
    int w = hcomm__moe_meta_width(h);
    int64_t *per_expert = hcomm__moe_alloc_i64((size_t)h->num_local);
    if (per_expert == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for counts");
    for (int s = 0; s < h->size; s++) {
        const int64_t *m = meta + s * w;
        h->recv_rows[s] = m[META_ROWS];
        for (int l = 0; l < h->num_local; l++) {
            h->rpair_rows[s] += local_count(h, m, l);
            per_expert[l] += local_count(h, m, l);
        }
        hcomm__moe_add_stats(h, m);
    }
    hcomm__moe_scan(h->recv_rows, h->recv_off, h->size);
    h->r = hcomm__moe_scan(h->rpair_rows, h->rpair_off, h->size);
    h->expert_off[h->num_local] = hcomm__moe_scan(per_expert, h->expert_off, h->num_local);
    free(per_expert);
    h->rpair_row = hcomm__moe_alloc_i64((size_t)h->r);
    h->out_pair = hcomm__moe_alloc_i64((size_t)h->r);
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
    hcomm_result_t res = hcomm__coll_all_to_all_checked(
        h->group, send, recv, (size_t)hcomm__moe_meta_width(h) * sizeof(int64_t));
    return hcomm__moe_mismatch(fn, res,
                               " in the count exchange over ep_group, whose rows hold %d + "
                               "num_experts int64: do the ranks pass the same num_experts (%d on "
                               "rank %d)?",
                               META_COUNTS, h->size * h->num_local, h->group->rank);
}

/* Byte counts and offsets of the first token exchange: each peer's rows, then their headers
 * (the peer's k int32 each). v is [4][size]: send counts, send offsets, recv counts, recv. */
static void token_bytes(const hcomm_moe_handle_t *h, const int64_t *meta, size_t rb, size_t *v) {
    size_t p = (size_t)h->size, soff = 0, roff = 0;
    int w = hcomm__moe_meta_width(h);
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

/* Row i of source s into one expert-major row per local expert its header hdr (ks int32, any
 * alignment) names; next[l] is the next row of local expert l for this source, *q the next raw
 * slot. A header that disagrees with the counts is an error. stream: streaming stores
 * (hcomm__moe_streams). */
static hcomm_result_t place_row(const char *fn, hcomm_moe_handle_t *h, int s, int64_t i,
                                const char *hdr, int ks, const void *row, size_t rb, int64_t *next,
                                int64_t *q, bool stream) {
    for (int j = 0; j < ks; j++) {
        int32_t l;
        memcpy(&l, hdr + sizeof l * (size_t)j, sizeof l);
        if (l < 0)
            continue;
        if (l >= h->num_local || *q >= h->rpair_off[s] + h->rpair_rows[s])
            return hcomm__err(HCOMM_ERR_INTERNAL, fn,
                              "rank %d sent a row header that disagrees with its counts", s);
        int64_t k = next[l]++;
        char *dst = (char *)h->recv + (size_t)k * rb;
        if (stream)
            hcomm__copy_stream(dst, row, rb);
        else
            hcomm__moe_copy_row(dst, row, rb);
        h->out_pair[k] = *q;
        h->rpair_row[(*q)++] = h->recv_off[s] + i;
    }
    return HCOMM_OK;
}

/* Expands source s's rows (at msg, their headers after them) into expert-major rows. */
static hcomm_result_t expand_source(const char *fn, hcomm_moe_handle_t *h, int s, int ks,
                                    const char *msg, size_t rb, int64_t *next, int64_t *q) {
    const char *hdr = msg + (size_t)h->recv_rows[s] * rb;
    for (int64_t i = 0; i < h->recv_rows[s]; i++)
        HCOMM__TRY(place_row(fn, h, s, i, hdr + sizeof(int32_t) * (size_t)(i * ks), ks,
                             msg + (size_t)i * rb, rb, next, q, false));
    return HCOMM_OK;
}

/* next[l] = the first expert-major row of (local expert l, source s). */
static void first_rows(const hcomm_moe_handle_t *h, const int64_t *meta, int s, int64_t *next) {
    int w = hcomm__moe_meta_width(h);
    for (int l = 0; l < h->num_local; l++) {
        next[l] = h->expert_off[l];
        for (int s2 = 0; s2 < s; s2++)
            next[l] += local_count(h, meta + s2 * w, l);
    }
}

/* Expert-major placement of every source's rows (local expert, then source, then token) into
 * h->recv: source s's recv_rows[s] rows start at raw + roff[s], then their headers (its k
 * local expert ids per row, -1 for slots elsewhere). */
static hcomm_result_t expand_all(const char *fn, hcomm_moe_handle_t *h, const int64_t *meta,
                                 const char *raw, const size_t *roff, size_t rb) {
    int w = hcomm__moe_meta_width(h);
    int64_t *next = hcomm__moe_alloc_i64((size_t)h->num_local);
    hcomm_result_t res = HCOMM_OK;
    if (next == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for counts");
    for (int s = 0; s < h->size && res == HCOMM_OK; s++) {
        int64_t q = h->rpair_off[s];
        first_rows(h, meta, s, next);
        res = expand_source(fn, h, s, (int)meta[s * w + META_K], raw + roff[s], rb, next, &q);
    }
    free(next);
    return res;
}

/* The hierarchical exchange's receiver in a first dispatch: the flat path's expansion. */
static hcomm_result_t expand_sink(const char *fn, hcomm_moe_handle_t *h, const char *raw,
                                  const size_t *roff, size_t rb, void *meta) {
    return expand_all(fn, h, meta, raw, roff, rb);
}

/* Where source s's rows for this rank are and how they expand (from its meta row). */
typedef struct source {
    hcomm__remote_t tokens, send_tok, hdr;
    int64_t first, rows;
    int k;
} source_t;

static source_t source_of(hcomm_moe_handle_t *h, int s, const int64_t *m) {
    hcomm__exported_t e[3];
    memcpy(e, m + META_TOKENS, sizeof e);
    return (source_t){hcomm__coll_remote(h->group, s, &e[0]),
                      hcomm__coll_remote(h->group, s, &e[1]),
                      hcomm__coll_remote(h->group, s, &e[2]),
                      m[META_FIRST],
                      h->recv_rows[s],
                      (int)m[META_K]};
}

/* Scratch of one source's pull: its row tokens and headers, and one row, where they cannot be
 * loaded in place. */
typedef struct pull_tmp {
    int64_t *tok;
    int32_t *hdr;
    char *row;
} pull_tmp_t;

/* Source s's rows loaded where they lie and expanded as expand_source does; next[l] is the
 * next row of local expert l for this source. */
static hcomm_result_t pull_source(const char *fn, hcomm_moe_handle_t *h, int s, const source_t *src,
                                  size_t rb, int64_t *next, const pull_tmp_t *tmp) {
    hcomm_comm_t *g = h->group;
    const void *tok_at, *hdr_at;
    size_t nk = (size_t)(src->rows * src->k);
    HCOMM__TRY(hcomm__coll_load(g, fn, s, &src->send_tok, sizeof(int64_t) * (size_t)src->first,
                                tmp->tok, sizeof(int64_t) * (size_t)src->rows, &tok_at));
    HCOMM__TRY(hcomm__coll_load(g, fn, s, &src->hdr,
                                sizeof(int32_t) * (size_t)(src->first * src->k), tmp->hdr,
                                sizeof(int32_t) * nk, &hdr_at));
    const int64_t *tok = tok_at;
    const char *hdr = hdr_at;
    int64_t q = h->rpair_off[s];
    bool stream = hcomm__moe_streams(h->recv, rb, h->r);
    for (int64_t i = 0; i < src->rows; i++) {
        const void *row;
        HCOMM__TRY(
            hcomm__coll_load(g, fn, s, &src->tokens, (size_t)tok[i] * rb, tmp->row, rb, &row));
        HCOMM__TRY(place_row(fn, h, s, i, hdr + sizeof(int32_t) * (size_t)(i * src->k), src->k, row,
                             rb, next, &q, stream));
    }
    return HCOMM_OK;
}

/* Every source's rows for this rank, read where they lie (no token all_to_allv). */
static hcomm_result_t pull_all(const char *fn, hcomm_moe_handle_t *h, const int64_t *meta,
                               size_t rb) {
    int w = hcomm__moe_meta_width(h);
    int64_t most = 0, kmax = 1;
    for (int s = 0; s < h->size; s++) {
        most = h->recv_rows[s] > most ? h->recv_rows[s] : most;
        kmax = meta[s * w + META_K] > kmax ? meta[s * w + META_K] : kmax;
    }
    int64_t *next = hcomm__moe_alloc_i64((size_t)h->num_local);
    pull_tmp_t tmp = {hcomm__moe_alloc_i64((size_t)most),
                      malloc(sizeof(int32_t) * (size_t)(most * kmax) + 1), malloc(rb + 1)};
    hcomm_result_t res = HCOMM_OK;
    if (!next || !tmp.tok || !tmp.hdr || !tmp.row)
        res = hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %lld rows' headers",
                         (long long)most);
    for (int d = 0; d < h->size && res == HCOMM_OK; d++) {
        int s = (h->group->rank + d) % h->size; /* staggered: not every rank reads rank 0 first */
        first_rows(h, meta, s, next);
        source_t src = source_of(h, s, meta + s * w);
        res = pull_source(fn, h, s, &src, rb, next, &tmp);
    }
    hcomm__stream_fence();
    free(next);
    free(tmp.tok);
    free(tmp.hdr);
    free(tmp.row);
    return res;
}

/* h->recv for h->r rows: from the pool, or the plan's buffer. */
static hcomm_result_t recv_buffer(const char *fn, hcomm_moe_handle_t *h, size_t rb) {
    if (h->plan == NULL)
        return hcomm__moe_pool_get(h->pool, fn, (size_t)h->r * rb, &h->recv);
    if (h->r > h->plan->max_rows) /* the plan's own limits make this impossible */
        return hcomm__err(HCOMM_ERR_INTERNAL, fn, "%lld rows exceed the plan's %lld",
                          (long long)h->r, (long long)h->plan->max_rows);
    return HCOMM_OK;
}

/* The token exchange on one node (h->pull): each rank reads its rows where they lie. Every rank
 * joins the end of the reads, also after a failure here (prev: plan_recv's), so no rank
 * frees what its peers read or leaves them waiting. */
static hcomm_result_t pull_tokens(const char *fn, hcomm_moe_handle_t *h, const int64_t *meta,
                                  const int32_t *ids, hcomm_result_t prev) {
    size_t rb = (size_t)h->h * hcomm__dtype_size(h->dtype);
    hcomm_result_t res = prev;
    if (res == HCOMM_OK)
        res = remote_rows(fn, h, ids, meta);
    if (res == HCOMM_OK)
        res = recv_buffer(fn, h, rb);
    if (res == HCOMM_OK)
        res = pull_all(fn, h, meta, rb);
    return hcomm__coll_reads_done(h->group, fn, res);
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
    HCOMM__TRY_GOTO(recv_buffer(fn, h, rb), res, done);
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
        hcomm__coll_all_to_allv(h->group, sbuf, v, v + p, raw, v + 2 * p, v + 3 * p, true), res,
        done);
    res = expand_all(fn, h, meta, raw, v + 3 * p, rb);
done:
    free(v);
    hcomm__moe_pool_put(h->pool, sbuf);
    hcomm__moe_pool_put(h->pool, raw);
    return res;
}

/* Expert-TP, sequence-parallel tokens: the rows of every member of the etp group, from this
 * rank's rows per (local expert, source) in meta (prev: this rank's EP exchange result). */
static hcomm_result_t etp_step(const char *fn, hcomm_moe_handle_t *h, hcomm_result_t prev,
                               const int64_t *meta) {
    int w = hcomm__moe_meta_width(h);
    int64_t *cnt = NULL;
    if (prev == HCOMM_OK) {
        cnt = hcomm__moe_alloc_i64((size_t)(h->num_local * h->size));
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
        return hcomm__moe_dispatch_padded(a, h, local);
    int w = hcomm__moe_meta_width(h);
    int64_t *meta_send = hcomm__moe_alloc_i64((size_t)(h->size * w)),
            *meta_recv = hcomm__moe_alloc_i64((size_t)(h->size * w));
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
    hcomm__moe_fill_meta(h, local, meta_send, w);
    if (local == HCOMM_OK) /* rows per node for each relay, rows crossing nodes */
        hcomm__moe_hier_meta(h, a->ids, meta_send, w);
    h->pull = local == HCOMM_OK && !h->hier && h->etp == NULL && hcomm__coll_reads_ok(h->group);
    if (h->pull) {
        hcomm__moe_pool_share(h->pool, hcomm__coll_wants_shared(h->group));
        export_rows(h, a->tokens->data, hdr, meta_send, w);
    }
    HCOMM__TRY_GOTO(exchange_meta(a->fn, h, meta_send, meta_recv), res, done);
    if (local != HCOMM_OK) { /* the message from the failed check is still the last error */
        res = local;
        goto done;
    }
    /* the same verdict on every rank: each compares every peer's row with its own */
    HCOMM__TRY_GOTO(hcomm__moe_check_peers(a->fn, h, meta_recv), res, done);
    res = plan_recv(a->fn, h, meta_recv);
    if (h->pull)
        res = pull_tokens(a->fn, h, meta_recv, a->ids, res);
    else if (res == HCOMM_OK)
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
    hcomm_result_t local = hcomm__moe_check_dispatch(a, o);
    bool ok = local == HCOMM_OK;
    hcomm_moe_handle_t *h = hcomm__moe_handle_alloc(g, a->num_experts / g->size,
                                                    ok ? a->tokens->shape[0] : 0, ok ? a->k : 1);
    if (h == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, a->fn, "out of memory for the routing handle");
    h->topk = a->topk;
    h->no_y = o != NULL && o->no_weight_grads != 0;
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
