/* Top-k MoE dispatch / combine / backward against a serial reference. HCOMM_TEST_MPI
 * Tokens carry global indices g, and every value (token row, its k expert ids and weights) is
 * a function of g, so each rank computes what every rank sends and the single-rank result of
 * the same MoE layer with expert e computing (e + 1) * x. Values are small integers, so the
 * expert outputs are exact in every dtype and only the weighted sums round; the reference
 * rounds them the way the library documents (f32 accumulation in slot order, f64 for f64). */
#include "harness.h"

#include <math.h>
#include <stdbool.h>
#include <time.h>

#define MAX_WORLD 8
#define LAYOUT_G 48 /* global batch of the EP-layout comparison */
#define LAYOUT_H 5

enum { M_RANDOM, M_ONE_EXPERT, M_SAME_RANK, M_LAYOUT };

typedef struct tcase {
    int k, num_local, mode, variant;
    hcomm_dtype_t dt;
    int64_t h;
    double cf; /* > 0: capacity mode */
    int policy;
    int fwd_only; /* options->no_weight_grads */
} tcase_t;

typedef struct world {
    int p, rank, e_all;
} world_t;

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

/* Tokens of rank s: T = 0 on rank 1 in M_RANDOM; variant changes ranks other than 0. */
static int64_t n_tok(const tcase_t *c, const world_t *w, int s) {
    if (c->mode == M_LAYOUT)
        return LAYOUT_G / w->p;
    if (c->mode == M_RANDOM && s == 1)
        return 0;
    return (s * 5 + 3) % 11 + 2 + (s > 0 ? c->variant * 3 : 0);
}

static int64_t base_of(const tcase_t *c, const world_t *w, int s) {
    if (c->mode == M_LAYOUT)
        return s * n_tok(c, w, s);
    return s * 1000 + (s > 0 ? c->variant * 100 : 0);
}

static int32_t id_of(const tcase_t *c, const world_t *w, int64_t g, int j) {
    uint32_t hsh = mix((uint32_t)g * 31u + (uint32_t)j);
    switch (c->mode) {
    case M_ONE_EXPERT:
        return w->e_all - 1;
    case M_SAME_RANK: /* every slot on one rank, experts repeated when k > num_local */
        return (int32_t)((g % w->p) * (w->e_all / w->p) + hsh % (uint32_t)(w->e_all / w->p));
    default:
        return hsh % 7 == 0 ? -1 : (int32_t)(hsh % (uint32_t)w->e_all);
    }
}

static float weight_of(int64_t g, int j) {
    return (float)(mix((uint32_t)g * 7u + (uint32_t)j + 99u) % 1000u + 1u) / 1024.0f;
}

static double tok_val(int64_t g, int64_t col, hcomm_dtype_t dt) {
    int v = (int)((g * 13 + col * 7) % 17) - 8;
    return dt == HCOMM_U8 ? v + 8 : v;
}

static double grad_val(int64_t g, int64_t col) {
    return (double)((g * 5 + col * 3) % 11) - 5;
}

static hcomm_tensor_t make2(hcomm_dtype_t dt, int64_t rows, int64_t cols) {
    hcomm_tensor_t t;
    int64_t shape[2] = {rows, cols};
    hcomm_tensor_init(&t, calloc((size_t)(rows * cols) * 8 + 8, 1), dt, 2, shape);
    return t;
}

static size_t bytes_of(const hcomm_tensor_t *t) {
    size_t dsz[] = {4, 8, 2, 2, 1, 1, 4, 8};
    return (size_t)(t->shape[0] * t->shape[1]) * dsz[t->dtype];
}

/* ---- the serial reference ---- */

typedef struct ranked {
    float w;
    int64_t slot;
} ranked_t;

static int by_weight(const void *a, const void *b) {
    const ranked_t *x = a, *y = b;
    if (x->w != y->w)
        return x->w > y->w ? -1 : 1;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

static int64_t t_max_of(const tcase_t *c, const world_t *w) {
    int64_t m = 0;
    for (int s = 0; s < w->p; s++)
        m = n_tok(c, w, s) > m ? n_tok(c, w, s) : m;
    return m;
}

static int64_t capacity_of(const tcase_t *c, const world_t *w) {
    if (c->cf <= 0)
        return -1;
    int64_t tm = t_max_of(c, w);
    double cap = ceil((double)tm * c->k / w->e_all * c->cf);
    return cap < (double)(tm * c->k) ? (int64_t)cap : tm * c->k;
}

/* keep[t * k + j] for rank s; dropped[e] counts its drops. */
static void ref_keep(const tcase_t *c, const world_t *w, int s, uint8_t *keep, int64_t *dropped) {
    int64_t n = n_tok(c, w, s), b = base_of(c, w, s), cap = capacity_of(c, w);
    ranked_t *rk = malloc(sizeof *rk * (size_t)(n * c->k + 1));
    for (int64_t q = 0; q < n * c->k; q++)
        keep[q] = id_of(c, w, b + q / c->k, (int)(q % c->k)) >= 0;
    for (int e = 0; e < w->e_all; e++) {
        int64_t cnt = 0;
        for (int64_t q = 0; q < n * c->k; q++)
            if (id_of(c, w, b + q / c->k, (int)(q % c->k)) == e)
                rk[cnt++] = (ranked_t){weight_of(b + q / c->k, (int)(q % c->k)), q};
        if (dropped)
            dropped[e] = cap >= 0 && cnt > cap ? cnt - cap : 0;
        if (cap < 0 || cnt <= cap)
            continue;
        if (c->policy == HCOMM_MOE_DROP_PROBS)
            qsort(rk, (size_t)cnt, sizeof *rk, by_weight);
        for (int64_t i = cap; i < cnt; i++)
            keep[rk[i].slot] = 0;
    }
    free(rk);
}

/* The rows rank w->rank receives: global token and slot of each, expert-major. */
typedef struct routing {
    int64_t n, *g, *e, *j, per_expert[64];
} routing_t;

static void ref_routing(const tcase_t *c, const world_t *w, routing_t *rt) {
    int nl = w->e_all / w->p;
    uint8_t *keep[MAX_WORLD];
    int64_t total = 0;
    for (int s = 0; s < w->p; s++) {
        keep[s] = malloc((size_t)(n_tok(c, w, s) * c->k) + 1);
        ref_keep(c, w, s, keep[s], NULL);
        total += n_tok(c, w, s) * c->k;
    }
    rt->g = malloc(sizeof(int64_t) * (size_t)(total + 1));
    rt->e = malloc(sizeof(int64_t) * (size_t)(total + 1));
    rt->j = malloc(sizeof(int64_t) * (size_t)(total + 1));
    rt->n = 0;
    for (int l = 0; l < nl; l++) {
        int e = w->rank * nl + l;
        rt->per_expert[l] = 0;
        for (int s = 0; s < w->p; s++)
            for (int64_t q = 0; q < n_tok(c, w, s) * c->k; q++) {
                int64_t g = base_of(c, w, s) + q / c->k;
                if (keep[s][q] && id_of(c, w, g, (int)(q % c->k)) == e) {
                    rt->g[rt->n] = g;
                    rt->j[rt->n] = q % c->k;
                    rt->e[rt->n++] = e;
                    rt->per_expert[l]++;
                }
            }
    }
    for (int s = 0; s < w->p; s++)
        free(keep[s]);
}

/* out[t] = sum over kept slots of (weighted ? w : 1) * (e + 1) * x, as the library sums. */
static void ref_combine(const tcase_t *c, const world_t *w, bool weighted, hcomm_tensor_t *out) {
    int64_t n = n_tok(c, w, w->rank), b = base_of(c, w, w->rank);
    uint8_t *keep = malloc((size_t)(n * c->k) + 1);
    ref_keep(c, w, w->rank, keep, NULL);
    for (int64_t t = 0; t < n; t++)
        for (int64_t col = 0; col < c->h; col++) {
            float a32 = 0;
            double a64 = 0;
            bool first = true;
            for (int j = 0; j < c->k; j++) {
                if (!keep[t * c->k + j])
                    continue;
                double y = (id_of(c, w, b + t, j) + 1) * tok_val(b + t, col, c->dt);
                float wt = weighted ? weight_of(b + t, j) : 1.0f;
                float v32 = wt * (float)y;
                double v64 = (double)wt * y;
                a32 = first ? v32 : a32 + v32;
                a64 = first ? v64 : a64 + v64;
                first = false;
            }
            t_set_val(c->dt, out->data, (size_t)(t * c->h + col), c->dt == HCOMM_F64 ? a64 : a32);
        }
    free(keep);
}

/* ---- checks on one rank ---- */

#define CASE_FMT "k=%d L=%d mode=%d var=%d dt=%d H=%lld cf=%g pol=%d P=%d rank=%d"
#define CASE_ARGS(c, w)                                                                            \
    (c)->k, (c)->num_local, (c)->mode, (c)->variant, (int)(c)->dt, (long long)(c)->h, (c)->cf,     \
        (c)->policy, (w)->p, (w)->rank

/* Compares two tensors bitwise; prints the first differing element of both. */
static void expect_same(const hcomm_tensor_t *got, const hcomm_tensor_t *want, const char *what,
                        const tcase_t *c, const world_t *w) {
    size_t n = (size_t)(got->shape[0] * got->shape[1]), es = n ? bytes_of(got) / n : 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp((char *)got->data + i * es, (char *)want->data + i * es, es) != 0) {
            T_CHECK(false, "%s [%zu]: %.9g, expected %.9g (" CASE_FMT ")", what, i,
                    t_get_val(got->dtype, got->data, i), t_get_val(want->dtype, want->data, i),
                    CASE_ARGS(c, w));
            return;
        }
    T_CHECK(true, "%s", what);
}

/* The layout call against loops over the same ids. */
static void check_layout(const tcase_t *c, const world_t *w, const int32_t *ids, int64_t n) {
    int64_t per_rank[MAX_WORLD], per_expert[64],
        *perm = malloc(sizeof(int64_t) * (size_t)(n * c->k + 1));
    T_OK(hcomm_moe_layout(ids, n, c->k, w->e_all, w->p, per_rank, per_expert, perm));
    int nl = w->e_all / w->p;
    int64_t q = 0;
    for (int s = 0; s < w->p; s++) {
        int64_t want = 0;
        for (int64_t t = 0; t < n; t++) {
            bool hit = false;
            for (int j = 0; j < c->k; j++)
                hit |= ids[t * c->k + j] >= 0 && ids[t * c->k + j] / nl == s;
            want += hit;
        }
        T_CHECK(per_rank[s] == want, "tokens_per_rank[%d] = %lld, expected %lld (" CASE_FMT ")", s,
                (long long)per_rank[s], (long long)want, CASE_ARGS(c, w));
    }
    for (int e = 0; e < w->e_all; e++) {
        int64_t want = 0;
        for (int64_t x = 0; x < n * c->k; x++)
            if (ids[x] == e) {
                T_CHECK(perm[q] == x, "perm[%lld] = %lld, expected %lld", (long long)q,
                        (long long)perm[q], (long long)x);
                q++;
                want++;
            }
        T_EQ_INT(per_expert[e], want);
    }
    free(perm);
}

static void check_received(hcomm_moe_handle_t *hd, const tcase_t *c, const world_t *w,
                           const routing_t *rt) {
    hcomm_tensor_t recv;
    int64_t tpe[64], off[65];
    T_OK(hcomm_moe_received(hd, &recv, tpe));
    T_OK(hcomm_moe_expert_offsets(hd, off));
    T_CHECK(recv.shape[0] == rt->n, "R = %lld, expected %lld (" CASE_FMT ")",
            (long long)recv.shape[0], (long long)rt->n, CASE_ARGS(c, w));
    if (recv.shape[0] != rt->n)
        return;
    int64_t sum = 0;
    for (int l = 0; l < w->e_all / w->p; l++) {
        T_EQ_INT(tpe[l], rt->per_expert[l]);
        T_EQ_INT(off[l], sum);
        sum += rt->per_expert[l];
    }
    T_EQ_INT(off[w->e_all / w->p], rt->n);
    hcomm_tensor_t want = make2(c->dt, rt->n, c->h);
    for (int64_t r = 0; r < rt->n; r++)
        for (int64_t col = 0; col < c->h; col++)
            t_set_val(c->dt, want.data, (size_t)(r * c->h + col), tok_val(rt->g[r], col, c->dt));
    expect_same(&recv, &want, "received", c, w);
    free(want.data);
}

/* The expert step: row r of expert e becomes (e + 1) * x. */
static hcomm_tensor_t run_experts(const hcomm_tensor_t *recv, const routing_t *rt) {
    hcomm_tensor_t y = make2(recv->dtype, recv->shape[0], recv->shape[1]);
    for (int64_t r = 0; r < recv->shape[0]; r++)
        for (int64_t col = 0; col < recv->shape[1]; col++) {
            size_t i = (size_t)(r * recv->shape[1] + col);
            t_set_val(y.dtype, y.data, i,
                      (double)(rt->e[r] + 1) * t_get_val(y.dtype, recv->data, i));
        }
    return y;
}

/* combine_bwd: grad_expert_out row (g, j) = w * grad_out[g] rounded once; grad_w = <g, y>. */
static void check_combine_bwd(hcomm_moe_handle_t *hd, const tcase_t *c, const world_t *w,
                              const routing_t *rt) {
    int64_t n = n_tok(c, w, w->rank), b = base_of(c, w, w->rank);
    hcomm_tensor_t gout = make2(c->dt, n, c->h), gexp = make2(c->dt, rt->n, c->h),
                   want = make2(c->dt, rt->n, c->h);
    float *gw = calloc((size_t)(n * c->k + 1), sizeof(float));
    for (int64_t t = 0; t < n; t++)
        for (int64_t col = 0; col < c->h; col++)
            t_set_val(c->dt, gout.data, (size_t)(t * c->h + col), grad_val(b + t, col));
    T_OK(hcomm_moe_combine_topk_bwd(hd, &gout, &gexp, gw));
    for (int64_t r = 0; r < rt->n; r++) {
        int64_t g = rt->g[r];
        int j = (int)rt->j[r];
        float wt = weight_of(g, j);
        for (int64_t col = 0; col < c->h; col++) {
            double gv = grad_val(g, col);
            t_set_val(c->dt, want.data, (size_t)(r * c->h + col),
                      c->dt == HCOMM_F64 ? (double)wt * gv : (double)(wt * (float)gv));
        }
    }
    expect_same(&gexp, &want, "combine_topk_bwd grad_expert_out", c, w);
    uint8_t *keep = malloc((size_t)(n * c->k) + 1);
    ref_keep(c, w, w->rank, keep, NULL);
    for (int64_t q = 0; q < n * c->k; q++) {
        double acc = 0; /* the products and sums are small integers: exact in any order */
        for (int64_t col = 0; keep[q] && col < c->h; col++)
            acc += grad_val(b + q / c->k, col) * (id_of(c, w, b + q / c->k, (int)(q % c->k)) + 1) *
                   tok_val(b + q / c->k, col, c->dt);
        T_CHECK(gw[q] == (float)acc, "grad_weights[%lld] = %g, expected %g (" CASE_FMT ")",
                (long long)q, (double)gw[q], acc, CASE_ARGS(c, w));
    }
    free(keep);
    free(gw);
    free(gout.data);
    free(gexp.data);
    free(want.data);
}

static bool is_float(hcomm_dtype_t dt) {
    return dt == HCOMM_F32 || dt == HCOMM_F64 || dt == HCOMM_F16 || dt == HCOMM_BF16;
}

/* Forward and backward of the layer, each against the serial reference; out (may be NULL)
 * gets a copy of the combine output. */
static void expect_text(const char *want);

/* A handle dispatched with no_weight_grads: combine kept no y, so grad_weights fails with
 * HCOMM_ERR_STATE saying why, and the rest of combine's backward still works. */
static void check_no_y(hcomm_moe_handle_t *hd, const tcase_t *c, const world_t *w,
                       const routing_t *rt) {
    int64_t n = n_tok(c, w, w->rank);
    hcomm_tensor_t gout = make2(c->dt, n, c->h), gexp = make2(c->dt, rt->n, c->h);
    float *gw = malloc(sizeof(float) * (size_t)(n * c->k + 1));
    T_ERR(hcomm_moe_combine_topk_bwd(hd, &gout, &gexp, gw), HCOMM_ERR_STATE);
    expect_text("no_weight_grads");
    T_OK(hcomm_moe_combine_topk_bwd(hd, &gout, &gexp, NULL));
    free(gw);
    free(gout.data);
    free(gexp.data);
}

static void check_passes(hcomm_moe_handle_t *hd, const tcase_t *c, const world_t *w,
                         const routing_t *rt, const hcomm_tensor_t *tokens, void *out_copy) {
    int64_t n = n_tok(c, w, w->rank);
    hcomm_tensor_t recv, again = make2(c->dt, rt->n, c->h);
    T_OK(hcomm_moe_received(hd, &recv, NULL));
    T_OK(hcomm_moe_redispatch(hd, tokens, &again)); /* same routing, no count exchange */
    expect_same(&again, &recv, "redispatch", c, w);
    free(again.data);
    if (!is_float(c->dt)) {
        hcomm_tensor_t out = make2(c->dt, n, c->h);
        T_ERR(hcomm_moe_combine_topk(hd, &recv, &out), HCOMM_ERR_DTYPE);
        free(out.data);
        return;
    }
    hcomm_tensor_t y = run_experts(&recv, rt), out = make2(c->dt, n, c->h),
                   want = make2(c->dt, n, c->h);
    T_OK(hcomm_moe_combine_topk(hd, &y, &out));
    ref_combine(c, w, true, &want);
    expect_same(&out, &want, "combine_topk", c, w);
    if (out_copy)
        memcpy(out_copy, out.data, bytes_of(&out));
    T_OK(hcomm_moe_dispatch_topk_bwd(hd, &y, &out)); /* grad of the tokens: sum of the k rows */
    ref_combine(c, w, false, &want);
    expect_same(&out, &want, "dispatch_topk_bwd", c, w);
    if (c->fwd_only)
        check_no_y(hd, c, w, rt);
    else
        check_combine_bwd(hd, c, w, rt);
    free(y.data);
    free(out.data);
    free(want.data);
}

static void run_case(hcomm_comm_t *grp, const tcase_t *c, void *out_copy) {
    world_t w = {t_size(grp), t_rank(grp), 0};
    w.e_all = c->mode == M_LAYOUT ? 8 : c->num_local * w.p;
    int64_t n = n_tok(c, &w, w.rank), b = base_of(c, &w, w.rank);
    hcomm_tensor_t tokens = make2(c->dt, n, c->h);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n * c->k + 1));
    float *wts = malloc(sizeof(float) * (size_t)(n * c->k + 1));
    for (int64_t t = 0; t < n; t++) {
        for (int j = 0; j < c->k; j++) {
            ids[t * c->k + j] = id_of(c, &w, b + t, j);
            wts[t * c->k + j] = weight_of(b + t, j);
        }
        for (int64_t col = 0; col < c->h; col++)
            t_set_val(c->dt, tokens.data, (size_t)(t * c->h + col), tok_val(b + t, col, c->dt));
    }
    check_layout(c, &w, ids, n);
    routing_t rt;
    ref_routing(c, &w, &rt);
    hcomm_moe_options_t opt = {c->cf, (hcomm_moe_drop_t)c->policy};
    opt.no_weight_grads = c->fwd_only;
    hcomm_moe_handle_t *hd = NULL;
    T_OK(hcomm_moe_dispatch_topk(grp, &tokens, ids, wts, c->k, w.e_all, &opt, &hd));
    if (hd != NULL) {
        int64_t dropped[64], want[64], total = 0, cap = 0;
        T_OK(hcomm_moe_dropped(hd, dropped, &total, &cap));
        T_EQ_INT(cap, capacity_of(c, &w));
        uint8_t *keep = malloc((size_t)(n * c->k) + 1);
        ref_keep(c, &w, w.rank, keep, want);
        for (int e = 0; e < w.e_all; e++) {
            T_EQ_INT(dropped[e], want[e]);
            total -= want[e];
        }
        T_EQ_INT(total, 0);
        free(keep);
        check_received(hd, c, &w, &rt);
        check_passes(hd, c, &w, &rt, &tokens, out_copy);
    }
    T_OK(hcomm_moe_handle_free(hd));
    free(rt.g);
    free(rt.e);
    free(rt.j);
    free(ids);
    free(wts);
    free(tokens.data);
}

/* ---- the tests ---- */

/* k = 1, 2, 4 with repeated experts on one rank, skew, T = 0, every dtype. */
static void test_reference(hcomm_comm_t *g) {
    static const int ks[] = {1, 2, 4};
    for (int ki = 0; ki < 3; ki++)
        for (int mode = M_RANDOM; mode <= M_SAME_RANK; mode++)
            for (int l = 1; l <= 3; l += 2) {
                tcase_t c = {ks[ki], l, mode, 0, HCOMM_F32, 3 + ki, 0, 0};
                run_case(g, &c, NULL);
            }
    for (int dt = 0; dt < HCOMM_DTYPE_COUNT; dt++) {
        tcase_t c = {2, 2, M_RANDOM, 0, (hcomm_dtype_t)dt, 4, 0, 0};
        run_case(g, &c, NULL);
    }
    tcase_t wide = {4, 1, M_RANDOM, 0, HCOMM_BF16, 100, 0, 0};
    run_case(g, &wide, NULL);
}

/* Capacity: unequal T across ranks; both policies; drop counts against the reference. */
static void test_capacity(hcomm_comm_t *g) {
    for (int pol = 0; pol <= 1; pol++)
        for (int mode = M_RANDOM; mode <= M_ONE_EXPERT; mode++) {
            tcase_t c = {2, 2, mode, 0, HCOMM_F32, 3, 0.5, pol};
            run_case(g, &c, NULL);
            c.cf = 1.25;
            c.dt = HCOMM_BF16;
            run_case(g, &c, NULL);
        }
}

/* Rank 0's combine output is bitwise the same when the other ranks' batches change. */
static void test_batch_invariance(hcomm_comm_t *g) {
    if (t_size(g) < 2)
        return;
    tcase_t c = {4, 2, M_RANDOM, 0, HCOMM_BF16, 6, 0, 0};
    world_t w = {t_size(g), t_rank(g), 0};
    size_t bytes = (size_t)(n_tok(&c, &w, 0) * c.h) * 2;
    char *a = calloc(bytes + 1, 1), *b = calloc(bytes + 1, 1);
    run_case(g, &c, t_rank(g) == 0 ? a : NULL);
    c.variant = 2;
    run_case(g, &c, t_rank(g) == 0 ? b : NULL);
    T_CHECK(memcmp(a, b, bytes) == 0, "rank 0's combine output changed with the other batches");
    free(a);
    free(b);
}

/* Outputs of the same global batch at ep 1, 2, 4, 8 (local backend), compared in main. */
static float layout_out[MAX_WORLD + 1][LAYOUT_G * LAYOUT_H];

static void test_layouts(hcomm_comm_t *g) {
    int p = t_size(g);
    if (8 % p != 0)
        return;
    tcase_t c = {4, 0, M_LAYOUT, 0, HCOMM_F32, LAYOUT_H, 0, 0};
    int64_t per = LAYOUT_G / p;
    run_case(g, &c, &layout_out[p][t_rank(g) * per * LAYOUT_H]);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void expect_text(const char *want) {
    T_CHECK(strstr(hcomm_last_error(), want) != NULL, "last error '%s' lacks '%s'",
            hcomm_last_error(), want);
}

/* One rank's bad input: it reports its own error, the others HCOMM_ERR_PEER, long before the
 * 120 s HCOMM_TIMEOUT the tests run with (a generous bound: CI machines are shared, and a
 * waiting peer would fail with HCOMM_ERR_TIMEOUT, which the result check catches anyway). */
static void expect_one_bad(hcomm_result_t got, hcomm_result_t own, int bad, int rank, double t0,
                           const char *text) {
    if (rank == bad) {
        T_CHECK(got == own, "bad rank got %s, expected %s", hcomm_result_name(got),
                hcomm_result_name(own));
        expect_text(text);
    } else {
        T_CHECK(got == HCOMM_ERR_PEER, "rank %d got %s (%s), expected HCOMM_ERR_PEER", rank,
                hcomm_result_name(got), hcomm_last_error());
    }
    T_CHECK(now_s() - t0 < 30.0, "the failure took %.3f s, expected < 30 s", now_s() - t0);
}

static void test_errors(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g), e = 2 * p, bad = p - 1;
    hcomm_tensor_t tok = make2(HCOMM_F32, 3, 2), zero_h = make2(HCOMM_F32, 3, 0);
    int32_t ids[6] = {0, 1, 1, -1, e - 1, 0}, bad_ids[6] = {0, 1, e, 0, 0, 0};
    float wts[6] = {1, 1, 1, 1, 1, 1};
    hcomm_moe_handle_t *hd = NULL;
    hcomm_moe_options_t cap = {1.0, HCOMM_MOE_DROP_PROBS};
    char want[128];
    snprintf(want, sizeof want, "hcomm_moe_dispatch_topk: topk_ids[1][0]=%d outside -1..%d", e,
             e - 1);
    double t0 = now_s();
    hcomm_result_t r =
        hcomm_moe_dispatch_topk(g, &tok, rank == bad ? bad_ids : ids, wts, 2, e, NULL, &hd);
    expect_one_bad(r, HCOMM_ERR_INVALID_ARG, bad, rank, t0, want);
    T_CHECK(hd == NULL, "handle set after a failed dispatch");
    t0 = now_s();
    r = hcomm_moe_dispatch_topk(g, &tok, ids, wts, rank == bad ? 0 : 2, e, &cap, &hd);
    expect_one_bad(r, HCOMM_ERR_INVALID_ARG, bad, rank, t0, "hcomm_moe_dispatch_topk: k=0");
    t0 = now_s();
    r = hcomm_moe_dispatch_topk(g, rank == bad ? &zero_h : &tok, ids, wts, 2, e, NULL, &hd);
    expect_one_bad(r, HCOMM_ERR_SHAPE, bad, rank, t0, "tokens->shape[1]=0 (hidden)");
    if (p > 1) {
        T_ERR(hcomm_moe_dispatch_topk(g, &tok, ids, wts, 2, e + 1, NULL, &hd),
              HCOMM_ERR_INVALID_ARG);
        expect_text("num_experts=");
    }
    hcomm_moe_options_t odd = {1.0, (hcomm_moe_drop_t)7};
    T_ERR(hcomm_moe_dispatch_topk(g, &tok, ids, wts, 2, e, &odd, &hd), HCOMM_ERR_INVALID_ARG);
    expect_text("options->drop_policy=7");
    /* The group still works, and a bad shape in a later pass fails the peers alike. */
    T_OK(hcomm_moe_dispatch_topk(g, &tok, ids, wts, 2, e, NULL, &hd));
    hcomm_tensor_t recv, out = make2(HCOMM_F32, rank == bad ? 4 : 3, 2);
    T_OK(hcomm_moe_received(hd, &recv, NULL));
    t0 = now_s();
    r = hcomm_moe_combine_topk(hd, &recv, &out);
    expect_one_bad(r, HCOMM_ERR_SHAPE, bad, rank, t0, "hcomm_moe_combine_topk: out shape");
    float gw[6];
    hcomm_tensor_t gexp = make2(HCOMM_F32, recv.shape[0], 2);
    T_ERR(hcomm_moe_combine_topk_bwd(hd, &tok, &gexp, gw), HCOMM_ERR_STATE);
    T_OK(hcomm_moe_handle_free(hd));
    int64_t pr[MAX_WORLD], pe[64];
    T_ERR(hcomm_moe_layout(bad_ids, 3, 2, e, p, pr, pe, NULL), HCOMM_ERR_INVALID_ARG);
    snprintf(want, sizeof want, "hcomm_moe_layout: topk_ids[1][0]=%d outside -1..%d", e, e - 1);
    T_CHECK(strcmp(hcomm_last_error(), want) == 0, "got '%s', expected '%s'", hcomm_last_error(),
            want);
    T_ERR(hcomm_moe_layout(ids, 3, 0, e, p, pr, pe, NULL), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_moe_layout(ids, 3, 2, e + 1, 2, pr, pe, NULL), HCOMM_ERR_INVALID_ARG);
    T_OK(hcomm_moe_layout(NULL, 0, 2, e, p, pr, pe, NULL)); /* T = 0 */
    free(tok.data);
    free(zero_h.data);
    free(out.data);
    free(gexp.data);
}

/* Forward and backward five times in a row with one handle per step. */
static void test_repeat(hcomm_comm_t *g) {
    for (int step = 0; step < 5; step++) {
        tcase_t c = {2, 2, M_RANDOM, step % 2, HCOMM_F32, 2, step == 3 ? 1.0 : 0, 0};
        run_case(g, &c, NULL);
    }
}

/* Forward only (no_weight_grads): the same outputs, every float dtype, with and without
 * capacity. */
static void test_forward_only(hcomm_comm_t *g) {
    static const hcomm_dtype_t dts[] = {HCOMM_F32, HCOMM_BF16, HCOMM_F16, HCOMM_F64};
    for (int i = 0; i < 4; i++) {
        tcase_t c = {2 + 2 * (i % 2), 2, M_RANDOM, i % 2, dts[i], 37, i == 1 ? 1.0 : 0, 0, 1};
        run_case(g, &c, NULL);
    }
}

static hcomm_result_t moe_world(hcomm_comm_t *world, void *arg) {
    (void)arg;
    test_reference(world);
    test_capacity(world);
    test_batch_invariance(world);
    test_layouts(world);
    test_errors(world);
    test_repeat(world);
    test_forward_only(world);
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(moe_world, NULL, MAX_WORLD);
    if (strcmp(t_backend(), "local") == 0)
        for (int p = 2; p <= 8; p *= 2)
            T_CHECK(memcmp(layout_out[1], layout_out[p], sizeof layout_out[1]) == 0,
                    "combine output at ep %d differs bitwise from ep 1", p);
    return t_finish("test_moe_topk");
}
