/* hcomm-bench moe_dispatch_combine: one top-k dispatch and combine of T tokens [T, H] per rank
 * (bf16 by default; H, k, E from --moe-hidden/--moe-topk/--moe-experts, 7168, 8 and 256 as in
 * DeepSeek-V3), with T = the size / (H * element size). The experts are the identity and the
 * weights 1/k, so the combined output equals the tokens: #wrong counts elements that differ.
 *   auto      hcomm_moe_dispatch_topk + hcomm_moe_combine_topk, forward only (options->
 *             no_weight_grads: combine keeps no y for a backward), with the rows read where they
 *             lie on one node and hierarchical dispatch when the topology puts the ranks on
 *             several nodes, e.g. HCOMM_TOPO=nodes=2x4 -t 8
 *   baseline  what a plain implementation does: sort the (token, slot) rows by expert, send the
 *             counts and then every row with the native all_to_allv, send them back the same
 *             way, and sum each token's slots weighted (f32 accumulation).
 * size(B) is the tokens of one rank; busbw uses all_to_all's factor (p-1)/p.
 * The bound under each size: the least memory traffic one rank's dispatch + combine must cause,
 * row bytes x T x (d + 2k + 1), d the distinct ranks a token goes to on average: each token
 * read once per destination rank, its k expanded rows written once, read once by combine, and
 * the combined token written once; at the memcpy rate measured beside it (a copied byte is
 * read once and written once), over auto's out-of-place time. */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct moe {
    int64_t T;
    int H, k, E;
    int32_t *ids;
    float *w;
    int64_t *perm;             /* baseline: slot of each sorted row */
    size_t *sc, *sd, *rc, *rd; /* baseline: per-rank bytes of rows */
    int64_t *cnt_s, *cnt_r;    /* baseline: rows per rank */
    size_t *one, *offs;        /* baseline: 8-byte counts exchange */
    char *rows, *back, *recvd; /* baseline: sorted rows, the rows back, received rows */
    size_t recv_cap;
    float *acc;
    /* measured once per size (moe_probe), printed by moe_note */
    double perm_gbs, unperm_gbs, copy_gbs;
    double dests; /* distinct destination ranks per token, on average (route) */
    uint64_t calls, agreements;
} moe_t;

static void moe_shape(bench_case_t *c, size_t req) {
    size_t row = (size_t)c->o->moe_hidden * c->es;
    size_t T = req / row > 0 || req == 0 ? req / row : 1;
    c->count = T * (size_t)c->o->moe_hidden;
    c->bytes = c->count * c->es;
}

static size_t moe_capacity(const bench_case_t *c) {
    return c->bytes;
}

static double moe_in(int r, size_t g) {
    return bench_pattern(r, g, 61);
}

static int experts_of(const bench_case_t *c) {
    int E = c->o->moe_experts / c->size * c->size; /* a multiple of the group, as dispatch needs */
    return E > 0 ? E : c->size;
}

/* Token t of rank r picks k distinct experts spread over the ranks (a deterministic hash). */
/* Distinct ranks among token t's experts (experts_of: E is a multiple of the p ranks). */
static int ranks_of(const moe_t *m, int64_t t, int p) {
    int n = 0, per = m->E / p;
    for (int j = 0; j < m->k; j++) {
        int r = m->ids[t * m->k + j] / per, seen = 0;
        for (int i = 0; i < j; i++)
            seen |= m->ids[t * m->k + i] / per == r;
        n += !seen;
    }
    return n;
}

static void route(moe_t *m, int rank, int p) {
    int stride = m->E / m->k > 0 ? m->E / m->k : 1;
    for (int64_t t = 0; t < m->T; t++) {
        uint64_t h =
            ((uint64_t)rank * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)t * 0xBF58476D1CE4E5B9ull);
        h ^= h >> 29;
        int start = (int)(h % (uint64_t)m->E);
        for (int j = 0; j < m->k; j++) {
            int e = (start + j * stride) % m->E;
            m->ids[t * m->k + j] = j < m->E ? e : -1;
            m->w[t * m->k + j] = 1.0f / (float)m->k;
        }
    }
    double dests = 0;
    for (int64_t t = 0; t < m->T; t++)
        dests += ranks_of(m, t, p);
    m->dests = m->T > 0 ? dests / (double)m->T : 0;
}

static hcomm_result_t moe_probe(bench_case_t *c, moe_t *m);

static hcomm_result_t moe_setup(bench_case_t *c) {
    moe_t *m = calloc(1, sizeof *m);
    if (!m)
        return HCOMM_ERR_NOMEM;
    c->extra = m;
    m->H = c->o->moe_hidden;
    m->T = (int64_t)(c->count / (size_t)m->H);
    m->E = experts_of(c);
    m->k = c->o->moe_topk < m->E ? c->o->moe_topk : m->E;
    size_t slots = (size_t)m->T * (size_t)m->k, p = (size_t)c->size, row = (size_t)m->H * c->es;
    m->ids = malloc(sizeof *m->ids * slots);
    m->w = malloc(sizeof *m->w * slots);
    m->perm = malloc(sizeof *m->perm * slots);
    m->sc = calloc(p, sizeof(size_t));
    m->sd = calloc(p, sizeof(size_t));
    m->rc = calloc(p, sizeof(size_t));
    m->rd = calloc(p, sizeof(size_t));
    m->cnt_s = calloc(p, sizeof(int64_t));
    m->cnt_r = calloc(p, sizeof(int64_t));
    m->one = calloc(p, sizeof(size_t));
    m->offs = calloc(p, sizeof(size_t));
    m->rows = malloc(slots * row + 1);
    m->back = malloc(slots * row + 1);
    m->acc = malloc(sizeof(float) * (size_t)m->T * (size_t)m->H + 1);
    if (!m->ids || !m->w || !m->perm || !m->sc || !m->sd || !m->rc || !m->rd || !m->cnt_s ||
        !m->cnt_r || !m->one || !m->offs || !m->rows || !m->back || !m->acc)
        return HCOMM_ERR_NOMEM;
    for (size_t q = 0; q < p; q++) {
        m->one[q] = sizeof(int64_t);
        m->offs[q] = q * sizeof(int64_t);
    }
    route(m, c->rank, c->size);
    return moe_probe(c, m);
}

static void moe_teardown(bench_case_t *c) {
    moe_t *m = c->extra;
    if (!m)
        return;
    free(m->ids), free(m->w), free(m->perm), free(m->sc), free(m->sd), free(m->rc), free(m->rd);
    free(m->cnt_s), free(m->cnt_r), free(m->one), free(m->offs), free(m->rows), free(m->back);
    free(m->recvd), free(m->acc), free(m);
    c->extra = NULL;
}

static void moe_fill(bench_case_t *c) {
    for (size_t i = 0; i < c->count; i++) {
        bench_put(c->dt, c->send, i, moe_in(c->rank, i));
        bench_put(c->dt, c->recv, i, 120.0);
    }
}

static long moe_wrong(const bench_case_t *c) {
    long w = 0;
    for (size_t i = 0; i < c->count; i++) {
        double got = bench_get(c->dt, c->recv, i), want = moe_in(c->rank, i);
        w += fabs(got - want) > 1e-2 * fabs(want) + 1e-6;
    }
    return w;
}

static hcomm_result_t tensor2(const bench_case_t *c, void *data, int64_t rows, int64_t cols,
                              hcomm_tensor_t *t) {
    int64_t shape[2] = {rows, cols};
    return hcomm_tensor_init(t, data, c->dt, 2, shape);
}

static hcomm_result_t moe_run(bench_case_t *c) {
    moe_t *m = c->extra;
    hcomm_tensor_t tok, out, got;
    BENCH_TRY(tensor2(c, c->send, m->T, m->H, &tok));
    BENCH_TRY(tensor2(c, c->recv, m->T, m->H, &out));
    hcomm_moe_handle_t *h = NULL;
    /* forward only, as the baseline: combine keeps no copy of the expert outputs */
    hcomm_moe_options_t fwd = {.no_weight_grads = 1};
    BENCH_TRY(hcomm_moe_dispatch_topk(c->w, &tok, m->ids, m->w, m->k, m->E, &fwd, &h));
    hcomm_result_t r = hcomm_moe_received(h, &got, NULL);
    if (r == HCOMM_OK) /* the experts are the identity: their output is what came in */
        r = hcomm_moe_combine_topk(h, &got, &out);
    hcomm_moe_handle_free(h);
    return r;
}

/* --- the plain baseline --- */

/* Counting sort of the (token, slot) rows by expert, stable; counts rows per rank. */
static hcomm_result_t sort_by_expert(const bench_case_t *c, moe_t *m) {
    int per_rank = m->E / c->size;
    int64_t slots = m->T * m->k, *start = calloc((size_t)m->E + 1, sizeof(int64_t));
    if (!start)
        return HCOMM_ERR_NOMEM;
    for (int64_t s = 0; s < slots; s++)
        start[m->ids[s] + 1]++;
    for (int e = 0; e < m->E; e++)
        start[e + 1] += start[e];
    for (int q = 0; q < c->size; q++)
        m->cnt_s[q] = start[(q + 1) * per_rank] - start[q * per_rank];
    for (int64_t s = 0; s < slots; s++)
        m->perm[start[m->ids[s]]++] = s;
    free(start);
    return HCOMM_OK;
}

static float to_f32(hcomm_dtype_t dt, const void *row, int j) {
    switch (dt) {
    case HCOMM_BF16:
        return hcomm__bench_half_to_f32(((const uint16_t *)row)[j], HCOMM_BF16);
    case HCOMM_F16:
        return hcomm__bench_half_to_f32(((const uint16_t *)row)[j], HCOMM_F16);
    case HCOMM_F32:
        return ((const float *)row)[j];
    default:
        return (float)bench_get(dt, row, (size_t)j);
    }
}

/* out[t] = sum over slots in sorted order of w * row, accumulated in f32, rounded once. */
static void weighted_sum(bench_case_t *c, moe_t *m) {
    size_t row = (size_t)m->H * c->es, n = (size_t)m->T * (size_t)m->H;
    memset(m->acc, 0, sizeof(float) * n);
    for (int64_t i = 0; i < m->T * m->k; i++) {
        int64_t s = m->perm[i];
        float w = m->w[s], *acc = m->acc + (size_t)(s / m->k) * (size_t)m->H;
        const char *src = m->back + (size_t)i * row;
        for (int j = 0; j < m->H; j++)
            acc[j] += w * to_f32(c->dt, src, j);
    }
    for (size_t i = 0; i < n; i++)
        bench_put(c->dt, c->recv, i, m->acc[i]);
}

static hcomm_result_t exchange_counts(bench_case_t *c, moe_t *m, size_t *recv_rows) {
    size_t row = (size_t)m->H * c->es;
    BENCH_TRY(hcomm_all_to_allv(c->w, m->cnt_s, m->one, m->offs, m->cnt_r, m->one, m->offs));
    *recv_rows = 0;
    for (int q = 0; q < c->size; q++) {
        m->sc[q] = (size_t)m->cnt_s[q] * row;
        m->sd[q] = q ? m->sd[q - 1] + m->sc[q - 1] : 0;
        m->rc[q] = (size_t)m->cnt_r[q] * row;
        m->rd[q] = q ? m->rd[q - 1] + m->rc[q - 1] : 0;
        *recv_rows += (size_t)m->cnt_r[q];
    }
    if (*recv_rows * row > m->recv_cap) {
        free(m->recvd);
        m->recv_cap = *recv_rows * row;
        m->recvd = malloc(m->recv_cap);
        if (!m->recvd)
            return m->recv_cap = 0, HCOMM_ERR_NOMEM;
    }
    return HCOMM_OK;
}

static hcomm_result_t moe_baseline(bench_case_t *c) {
    moe_t *m = c->extra;
    size_t row = (size_t)m->H * c->es, recv_rows = 0;
    BENCH_TRY(sort_by_expert(c, m));
    for (int64_t i = 0; i < m->T * m->k; i++)
        memcpy(m->rows + (size_t)i * row, (const char *)c->send + (size_t)(m->perm[i] / m->k) * row,
               row);
    BENCH_TRY(exchange_counts(c, m, &recv_rows));
    BENCH_TRY(hcomm_all_to_allv(c->w, m->rows, m->sc, m->sd, m->recvd, m->rc, m->rd));
    /* identity experts; the rows go back as they came */
    BENCH_TRY(hcomm_all_to_allv(c->w, m->recvd, m->rc, m->rd, m->back, m->sc, m->sd));
    weighted_sum(c, m);
    return HCOMM_OK;
}

/* --- what the table's times do not show (issue figures: the permutation against memcpy, and the
 * collective calls of one dispatch) --- */

/* The collective calls one dispatch makes on the EP group, and the signature agreements among
 * them (hcomm's counters; a dropless dispatch: one count and one token exchange, none). */
static hcomm_result_t count_dispatch(bench_case_t *c, moe_t *m) {
    hcomm_tensor_t tok;
    BENCH_TRY(tensor2(c, c->send, m->T, m->H, &tok));
    uint64_t calls0, agree0, calls1, agree1;
    hcomm_moe_handle_t *h = NULL;
    hcomm__bench_counts(c->w, &calls0, &agree0);
    BENCH_TRY(hcomm_moe_dispatch_topk(c->w, &tok, m->ids, m->w, m->k, m->E, NULL, &h));
    hcomm__bench_counts(c->w, &calls1, &agree1);
    hcomm_moe_handle_free(h);
    m->calls = calls1 - calls0;
    m->agreements = agree1 - agree0;
    return HCOMM_OK;
}

/* GB/s of dispatch's local permutation (the T * k rows gathered into expert order), of its
 * inverse (combine's scatter back) and of memcpy of the same bytes, every rank at once after a
 * barrier, interleaved, best of 15 (5 from 64 MiB): with more ranks than cores a rank is
 * preempted in most repetitions, and the best one is the undisturbed copy. */
static hcomm_result_t time_permutation(bench_case_t *c, moe_t *m) {
    int64_t slots = m->T * m->k;
    size_t row = (size_t)m->H * c->es, bytes = (size_t)slots * row;
    int64_t *tok = malloc(sizeof *tok * (size_t)(slots + 1));
    /* every rank joins the barrier, so a rank out of memory fails alone instead of leaving
     * its peers waiting */
    hcomm_result_t mine = tok ? sort_by_expert(c, m) : HCOMM_ERR_NOMEM;
    hcomm_result_t r = hcomm_barrier(c->w);
    if (mine != HCOMM_OK || r != HCOMM_OK) {
        free(tok);
        return mine != HCOMM_OK ? mine : r;
    }
    for (int64_t i = 0; i < slots; i++)
        tok[i] = m->perm[i];
    memset(m->back, 3, bytes); /* the slot rows, one per (token, slot) */
    double best[3] = {1e30, 1e30, 1e30};
    int reps = bytes >= ((size_t)64 << 20) ? 5 : 15;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = hcomm__bench_now();
        hcomm__bench_moe_gather_rows(m->rows, m->back, tok, slots, row);
        double t1 = hcomm__bench_now();
        hcomm__bench_moe_scatter_rows(m->back, m->rows, tok, slots, row);
        double t2 = hcomm__bench_now();
        memcpy(m->back, m->rows, bytes);
        double t3 = hcomm__bench_now(), t[3] = {t1 - t0, t2 - t1, t3 - t2};
        for (int i = 0; i < 3; i++)
            best[i] = t[i] < best[i] ? t[i] : best[i];
    }
    free(tok);
    m->perm_gbs = (double)bytes / best[0] / 1e9;
    m->unperm_gbs = (double)bytes / best[1] / 1e9;
    m->copy_gbs = (double)bytes / best[2] / 1e9;
    return HCOMM_OK;
}

static hcomm_result_t moe_probe(bench_case_t *c, moe_t *m) {
    BENCH_TRY(count_dispatch(c, m));
    return time_permutation(c, m);
}

/* The bound's seconds (see the top of this file): its bytes at the memcpy rate. */
static double bound_s(const bench_case_t *c, const moe_t *m, double *bytes) {
    double row = (double)m->H * (double)c->es;
    *bytes = row * (double)m->T * (m->dests + 2.0 * m->k + 1.0);
    return *bytes / (2.0 * m->copy_gbs * 1e9);
}

static void moe_note(const bench_case_t *c, double auto_s, char *line, size_t cap) {
    const moe_t *m = c->extra;
    if (!(m->copy_gbs > 0)) { /* no rows to move: nothing was timed */
        snprintf(line, cap, "no rows to permute at this size");
        return;
    }
    double bytes, bound = bound_s(c, m, &bytes);
    int n = snprintf(line, cap,
                     "bound %.1f us (%.1f MB read and written, %.2f ranks a token, at memcpy's "
                     "rate)",
                     bound * 1e6, bytes / 1e6, m->dests);
    if (auto_s > 0 && n > 0 && (size_t)n < cap)
        n += snprintf(line + n, cap - (size_t)n, ", auto %.1f us: bound/auto %.2f", auto_s * 1e6,
                      bound / auto_s);
    if (n > 0 && (size_t)n < cap)
        snprintf(line + n, cap - (size_t)n, "\n#%-28s ", "");
    n = n > 0 && (size_t)n < cap ? (int)strlen(line) : 0;
    snprintf(line + n, cap - (size_t)n,
             "permute %.3f GB/s (%.0f%% of memcpy), unpermute %.3f GB/s (%.0f%%), memcpy %.3f "
             "GB/s: %lld rows of %zu B, every rank at once; one dispatch: %llu collective calls "
             "on the EP group (count and token exchange), %llu signature agreements",
             m->perm_gbs, 100 * m->perm_gbs / m->copy_gbs, m->unperm_gbs,
             100 * m->unperm_gbs / m->copy_gbs, m->copy_gbs, (long long)(m->T * m->k),
             (size_t)m->H * c->es, (unsigned long long)m->calls, (unsigned long long)m->agreements);
}

static void moe_describe(const bench_case_t *c, char *line, size_t cap) {
    int E = experts_of(c), k = c->o->moe_topk < E ? c->o->moe_topk : E, nodes = 1;
    if (hcomm_comm_node(c->w, &nodes, NULL, NULL, NULL) != HCOMM_OK)
        nodes = 1;
    char ek[160];
    int n = snprintf(ek, sizeof ek, "top-%d of %d experts", k, E);
    if (E != c->o->moe_experts) /* said, not silent: dispatch needs E a multiple of the group */
        n += snprintf(ek + n, sizeof ek - (size_t)n,
                      " (--moe-experts %d rounded to a multiple of %d ranks)", c->o->moe_experts,
                      c->size);
    if (k != c->o->moe_topk)
        snprintf(ek + n, sizeof ek - (size_t)n, " (--moe-topk %d capped at the experts)",
                 c->o->moe_topk);
    snprintf(line, cap,
             "tokens [T, %d] per rank, T = size / %zu B; %s, weights 1/%d, identity experts; "
             "forward dispatch + combine per iteration; %s token exchange (%d node%s)",
             c->o->moe_hidden, (size_t)c->o->moe_hidden * c->es, ek, k,
             nodes > 1 ? "hierarchical" : "flat", nodes, nodes > 1 ? "s" : "");
}

/* Dropless: every one of the group's p * T * k slots is received by some rank as one row, so
 * a rank receives T * k rows on average. */
static size_t moe_received(const bench_case_t *c) {
    int E = experts_of(c), k = c->o->moe_topk < E ? c->o->moe_topk : E;
    return c->count / (size_t)c->o->moe_hidden * (size_t)k * (size_t)c->o->moe_hidden * c->es;
}

static double f_a2a(int p) {
    return (double)(p - 1) / p;
}

const bench_op_t bench_moe_op = {.name = "moe_dispatch_combine",
                                 .coll = NULL,
                                 .busbw = f_a2a,
                                 .no_inplace = true,
                                 .primitive = true,
                                 .float_only = true,
                                 .own_variant = "baseline",
                                 .shape = moe_shape,
                                 .capacity = moe_capacity,
                                 .fill = moe_fill,
                                 .run = moe_run,
                                 .wrong = moe_wrong,
                                 .variant = moe_baseline,
                                 .setup = moe_setup,
                                 .teardown = moe_teardown,
                                 .describe = moe_describe,
                                 .received = moe_received,
                                 .note = moe_note};
