/* MoE: round trips over k and H, statistics, the collective calls per dispatch, and the
 * preallocated plan. HCOMM_TEST_MPI
 * Token t of rank s has the global index g = s * 1000 + t; its ids, weights and values are
 * functions of g, so every rank computes what every other rank sends. Weights are powers of
 * two and values small integers: combine(dispatch(x)) with identity experts is x * sum(w)
 * exactly in every float dtype, and is compared bitwise. */
#include "harness.h"

#include "algo/coll.h"

#include <math.h>

#define MAX_WORLD 8

typedef struct rt_case {
    int k, e_all, t_max; /* t_max: tokens of the rank with the most */
    int64_t h;
    hcomm_dtype_t dt;
    bool zero_rank; /* rank 1 has T = 0 */
} rt_case_t;

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

static int64_t n_of(const rt_case_t *c, int s) {
    if (c->zero_rank && s == 1)
        return 0;
    return c->t_max - (s % 3); /* unequal T across ranks */
}

static int32_t id_of(const rt_case_t *c, int64_t g, int j) {
    return (int32_t)((mix((uint32_t)g) + (uint32_t)j * 5u) % (uint32_t)c->e_all);
}

static float w_of(int j) {
    return ldexpf(1.0f, -(j % 4)); /* 1, 1/2, 1/4, 1/8 */
}

static double x_of(int64_t g, int64_t col) {
    return (double)((g * 7 + col * 3) % 15) - 7;
}

static hcomm_tensor_t make2(hcomm_dtype_t dt, int64_t rows, int64_t cols) {
    hcomm_tensor_t t;
    int64_t shape[2] = {rows, cols};
    hcomm_tensor_init(&t, calloc((size_t)(rows * cols) * 8 + 8, 1), dt, 2, shape);
    return t;
}

/* This rank's tokens, ids and weights. */
typedef struct batch {
    int64_t n;
    hcomm_tensor_t x;
    int32_t *ids;
    float *w;
} batch_t;

static batch_t make_batch(const rt_case_t *c, int rank) {
    batch_t b = {n_of(c, rank), {0}, NULL, NULL};
    b.x = make2(c->dt, b.n, c->h);
    b.ids = malloc(sizeof(int32_t) * (size_t)(b.n * c->k + 1));
    b.w = malloc(sizeof(float) * (size_t)(b.n * c->k + 1));
    for (int64_t t = 0; t < b.n; t++) {
        for (int j = 0; j < c->k; j++) {
            b.ids[t * c->k + j] = id_of(c, rank * 1000 + t, j);
            b.w[t * c->k + j] = w_of(j);
        }
        for (int64_t col = 0; col < c->h; col++)
            t_set_val(c->dt, b.x.data, (size_t)(t * c->h + col), x_of(rank * 1000 + t, col));
    }
    return b;
}

static void free_batch(batch_t *b) {
    free(b->x.data);
    free(b->ids);
    free(b->w);
}

/* out == x * sum(w) bitwise (exact in every float dtype for these values). */
static void expect_round_trip(const rt_case_t *c, const batch_t *b, const hcomm_tensor_t *out,
                              int rank) {
    double ws = 0;
    for (int j = 0; j < c->k; j++)
        ws += w_of(j);
    hcomm_tensor_t want = make2(c->dt, b->n, c->h);
    for (int64_t i = 0; i < b->n * c->h; i++)
        t_set_val(c->dt, want.data, (size_t)i, t_get_val(c->dt, b->x.data, (size_t)i) * ws);
    size_t es = c->dt == HCOMM_F64 ? 8 : c->dt == HCOMM_F32 ? 4 : 2;
    int64_t bad = -1;
    for (int64_t i = 0; i < b->n * c->h && bad < 0; i++)
        if (memcmp((char *)out->data + i * (int64_t)es, (char *)want.data + i * (int64_t)es, es))
            bad = i;
    T_CHECK(bad < 0, "k=%d E=%d H=%lld dt=%d rank %d: out[%lld] = %g, expected %g", c->k, c->e_all,
            (long long)c->h, (int)c->dt, rank, (long long)bad,
            bad < 0 ? 0 : t_get_val(c->dt, out->data, (size_t)bad),
            bad < 0 ? 0 : t_get_val(c->dt, want.data, (size_t)bad));
    free(want.data);
}

/* The global statistics of a dropless dispatch, from every rank's ids. */
static void expect_stats(hcomm_moe_handle_t *hd, const rt_case_t *c, int p) {
    int64_t got[256], want[256] = {0}, dropped = -1, sum = 0, max = 0;
    double imb = -1;
    T_OK(hcomm_moe_stats(hd, got, &imb, &dropped));
    for (int s = 0; s < p; s++)
        for (int64_t t = 0; t < n_of(c, s); t++)
            for (int j = 0; j < c->k; j++)
                want[id_of(c, s * 1000 + t, j)]++;
    for (int e = 0; e < c->e_all; e++) {
        T_CHECK(got[e] == want[e], "stats: expert %d has %lld slots, expected %lld", e,
                (long long)got[e], (long long)want[e]);
        sum += want[e];
        max = want[e] > max ? want[e] : max;
    }
    double want_imb = sum ? (double)max * c->e_all / (double)sum : 0;
    T_CHECK(imb == want_imb, "stats: imbalance %g, expected %g", imb, want_imb);
    T_EQ_INT(dropped, 0);
}

/* Dispatch, identity experts, combine; dispatch_bwd of the same rows gives x * (number of
 * slots) and counts the collective calls of one dropless dispatch: one count exchange and
 * one token exchange, no signature agreement before them. */
static void round_trip(hcomm_comm_t *g, const rt_case_t *c) {
    int p = t_size(g), rank = t_rank(g);
    batch_t b = make_batch(c, rank);
    hcomm_moe_handle_t *hd = NULL;
    hcomm_tensor_t recv, out = make2(c->dt, b.n, c->h);
    uint64_t calls0, agree0, calls1, agree1;
    hcomm__coll_counts(g, &calls0, &agree0);
    T_OK(hcomm_moe_dispatch_topk(g, &b.x, b.ids, b.w, c->k, c->e_all, NULL, &hd));
    hcomm__coll_counts(g, &calls1, &agree1);
    T_CHECK(calls1 - calls0 == 2 && agree1 == agree0,
            "a dropless dispatch made %llu collective calls and %llu agreements, expected 2 and 0",
            (unsigned long long)(calls1 - calls0), (unsigned long long)(agree1 - agree0));
    if (hd == NULL)
        goto done;
    expect_stats(hd, c, p);
    T_OK(hcomm_moe_received(hd, &recv, NULL));
    T_OK(hcomm_moe_combine_topk(hd, &recv, &out));
    expect_round_trip(c, &b, &out, rank);
    T_OK(hcomm_moe_dispatch_topk_bwd(hd, &recv, &out));
    for (int64_t i = 0; i < b.n * c->h; i++) {
        double got = t_get_val(c->dt, out.data, (size_t)i),
               want = t_get_val(c->dt, b.x.data, (size_t)i) * c->k;
        if (got != want) {
            T_CHECK(false, "dispatch_topk_bwd k=%d H=%lld [%lld] = %g, expected %g", c->k,
                    (long long)c->h, (long long)i, got, want);
            break;
        }
    }
done:
    T_OK(hcomm_moe_handle_free(hd));
    free(out.data);
    free_batch(&b);
}

/* k in {1, 2, 3, 8, 16}; H in {1, 100, 2880, 3584} (the wide rows with few tokens); T = 0 on
 * rank 1; E = 1 on one rank; every float dtype. */
static void test_round_trips(hcomm_comm_t *g) {
    int p = t_size(g);
    static const int ks[] = {1, 2, 3, 8, 16};
    static const int64_t hs[] = {1, 100, 2880, 3584};
    for (int ki = 0; ki < 5; ki++)
        for (int hi = 0; hi < 4; hi++) {
            rt_case_t c = {ks[ki], 2 * p, hs[hi] > 100 ? 3 : 9, hs[hi], HCOMM_BF16, true};
            round_trip(g, &c);
        }
    static const hcomm_dtype_t dts[] = {HCOMM_F32, HCOMM_F64, HCOMM_F16};
    for (int d = 0; d < 3; d++) {
        rt_case_t c = {3, 3 * p, 7, 5, dts[d], false};
        round_trip(g, &c);
    }
    if (p == 1) {
        rt_case_t e1 = {2, 1, 6, 4, HCOMM_F32, false};
        round_trip(g, &e1);
    }
    rt_case_t one = {4, 8 * p, 5, 3, HCOMM_F32, false}; /* E > slots: experts receive nothing */
    round_trip(g, &one);
}

/* Capacity mode: the dispatch adds one all_reduce (the largest T), still no agreement; the
 * global dropped count is the sum of every rank's drops. */
static void test_capacity_stats(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g);
    rt_case_t c = {2, 4 * p, 8, 3, HCOMM_F32, false};
    batch_t b = make_batch(&c, rank);
    hcomm_moe_options_t opt = {0.5, HCOMM_MOE_DROP_POSITION};
    hcomm_moe_handle_t *hd = NULL;
    uint64_t c0, a0, c1, a1;
    hcomm__coll_counts(g, &c0, &a0);
    T_OK(hcomm_moe_dispatch_topk(g, &b.x, b.ids, b.w, c.k, c.e_all, &opt, &hd));
    hcomm__coll_counts(g, &c1, &a1);
    T_CHECK(c1 - c0 == 3 && a1 == a0, "a capacity dispatch made %llu calls, %llu agreements",
            (unsigned long long)(c1 - c0), (unsigned long long)(a1 - a0));
    int64_t cap = (int64_t)ceil(8.0 * 2 / c.e_all * 0.5), want = 0, dropped = -1;
    for (int s = 0; s < p; s++) {
        int64_t cnt[64] = {0};
        for (int64_t t = 0; t < n_of(&c, s); t++)
            for (int j = 0; j < c.k; j++)
                cnt[id_of(&c, s * 1000 + t, j)]++;
        for (int e = 0; e < c.e_all; e++)
            want += cnt[e] > cap ? cnt[e] - cap : 0;
    }
    T_OK(hcomm_moe_stats(hd, NULL, NULL, &dropped));
    T_EQ_INT(dropped, want);
    T_OK(hcomm_moe_handle_free(hd));
    free_batch(&b);
}

/* Each drop policy on T = 8, E = 4, k = 2, capacity factor 0.5 (capacity 2 per expert and
 * rank): drops per expert and the combine output against a serial reference of the kept
 * slots (position: the first two in token order; probs: the two highest weights, the
 * earlier slot on a tie). Worlds whose size divides 4. */
static void test_drop_policies(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g);
    if (4 % p != 0)
        return;
    rt_case_t c = {2, 4, 8, 3, HCOMM_F32, false};
    c.t_max = 8 + rank % 3; /* n_of(c, rank) = 8 */
    for (int pol = 0; pol <= 1; pol++) {
        batch_t b = make_batch(&c, rank);
        for (int64_t i = 0; i < 16; i++) /* weights 1, 1/2, 1/4 or 1/8 in a scrambled order */
            b.w[i] = ldexpf(1.0f, -(int)(mix((uint32_t)(rank * 100 + i)) % 4));
        uint8_t keep[16];
        int64_t want_drop[4] = {0}, got_drop[4];
        for (int e = 0; e < 4; e++) { /* the reference: rank the expert's slots, keep two */
            int64_t sl[16], n = 0;
            for (int64_t i = 0; i < 16; i++)
                if (b.ids[i] == e)
                    sl[n++] = i;
            for (int64_t x = 0; pol == 1 && x < n; x++) /* insertion sort: weight desc, stable */
                for (int64_t y = x; y > 0 && b.w[sl[y]] > b.w[sl[y - 1]]; y--) {
                    int64_t t = sl[y];
                    sl[y] = sl[y - 1];
                    sl[y - 1] = t;
                }
            for (int64_t x = 0; x < n; x++)
                keep[sl[x]] = x < 2;
            want_drop[e] = n > 2 ? n - 2 : 0;
        }
        hcomm_moe_options_t opt = {0.5, (hcomm_moe_drop_t)pol};
        hcomm_moe_handle_t *hd = NULL;
        hcomm_tensor_t recv, out = make2(c.dt, 8, c.h);
        T_OK(hcomm_moe_dispatch_topk(g, &b.x, b.ids, b.w, 2, 4, &opt, &hd));
        if (hd != NULL) {
            int64_t cap = 0;
            T_OK(hcomm_moe_dropped(hd, got_drop, NULL, &cap));
            T_EQ_INT(cap, 2);
            for (int e = 0; e < 4; e++)
                T_CHECK(got_drop[e] == want_drop[e], "policy %d expert %d: %lld dropped, want %lld",
                        pol, e, (long long)got_drop[e], (long long)want_drop[e]);
            T_OK(hcomm_moe_received(hd, &recv, NULL));
            T_OK(hcomm_moe_combine_topk(hd, &recv, &out));
            for (int64_t t = 0; t < 8; t++)
                for (int64_t col = 0; col < c.h; col++) {
                    float acc = 0; /* exact: small integers times powers of two */
                    for (int j = 0; j < 2; j++)
                        acc += keep[t * 2 + j] ? b.w[t * 2 + j] * (float)x_of(rank * 1000 + t, col)
                                               : 0.0f;
                    float got = ((float *)out.data)[t * c.h + col];
                    T_CHECK(got == acc, "policy %d rank %d out[%lld][%lld] = %g, want %g", pol,
                            rank, (long long)t, (long long)col, (double)got, (double)acc);
                }
        }
        T_OK(hcomm_moe_handle_free(hd));
        free(out.data);
        free_batch(&b);
    }
}

/* ---- the plan ---- */

static void expect_text(const char *want) {
    T_CHECK(strstr(hcomm_last_error(), want) != NULL, "last error '%s' lacks '%s'",
            hcomm_last_error(), want);
}

/* A plan's dispatch receives and combines what dispatch_topk does, in two calls; a batch past
 * max_tokens_per_rank fails on its rank and the peers, and the plan still works after. */
static void test_plan_dispatch(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g);
    rt_case_t c = {3, 2 * p, 6, 4, HCOMM_BF16, true};
    for (int cap_mode = 0; cap_mode <= 1; cap_mode++) {
        batch_t b = make_batch(&c, rank);
        hcomm_moe_options_t opt = {cap_mode ? 0.75 : 0, HCOMM_MOE_DROP_PROBS};
        hcomm_moe_plan_desc_t d = {
            6, c.h, c.k, c.e_all, c.dt, opt.capacity_factor, opt.drop_policy};
        hcomm_moe_plan_t *pl = NULL;
        hcomm_moe_handle_t *ref = NULL, *hd = NULL;
        T_OK(hcomm_moe_plan_create(g, &d, &pl));
        /* the reference: capacity from the largest T, which is max_tokens_per_rank here */
        T_OK(hcomm_moe_dispatch_topk(g, &b.x, b.ids, b.w, c.k, c.e_all, &opt, &ref));
        for (int rep = 0; rep < 2 && pl && ref; rep++) {
            uint64_t c0, a0, c1, a1;
            hcomm__coll_counts(g, &c0, &a0);
            T_OK(hcomm_moe_plan_dispatch(pl, &b.x, b.ids, b.w, &hd));
            hcomm__coll_counts(g, &c1, &a1);
            T_CHECK(c1 - c0 == 2 && a1 == a0, "a plan dispatch made %llu calls, %llu agreements",
                    (unsigned long long)(c1 - c0), (unsigned long long)(a1 - a0));
            T_OK(hcomm_moe_handle_free(hd)); /* the plan's: a no-op */
            hcomm_tensor_t r1, r2, o1 = make2(c.dt, b.n, c.h), o2 = make2(c.dt, b.n, c.h);
            T_OK(hcomm_moe_received(ref, &r1, NULL));
            T_OK(hcomm_moe_received(hd, &r2, NULL));
            T_CHECK(r1.shape[0] == r2.shape[0] &&
                        !memcmp(r1.data, r2.data, (size_t)(r1.shape[0] * c.h) * 2),
                    "plan dispatch received other rows (R %lld vs %lld)", (long long)r2.shape[0],
                    (long long)r1.shape[0]);
            T_OK(hcomm_moe_combine_topk(ref, &r1, &o1));
            T_OK(hcomm_moe_combine_topk(hd, &r2, &o2));
            T_CHECK(!memcmp(o1.data, o2.data, (size_t)(b.n * c.h) * 2),
                    "plan combine differs from dispatch_topk's");
            free(o1.data);
            free(o2.data);
        }
        /* one rank past the maximum: its own error, HCOMM_ERR_PEER elsewhere */
        batch_t big = b;
        hcomm_tensor_t x7 = make2(c.dt, 7, c.h);
        int32_t ids7[21] = {0};
        if (rank == p - 1) {
            big.x = x7;
            big.ids = ids7;
        }
        hcomm_result_t r = hcomm_moe_plan_dispatch(pl, &big.x, big.ids, NULL, &hd);
        if (rank == p - 1) {
            T_CHECK(r == HCOMM_ERR_SHAPE, "T past the maximum gave %s", hcomm_result_name(r));
            expect_text("hcomm_moe_plan_dispatch: tokens->shape[0]=7 exceeds the plan's "
                        "max_tokens_per_rank=6");
        } else {
            T_CHECK(r == HCOMM_ERR_PEER, "rank %d got %s, expected HCOMM_ERR_PEER", rank,
                    hcomm_result_name(r));
        }
        T_OK(hcomm_moe_plan_dispatch(pl, &b.x, b.ids, b.w, &hd)); /* still usable */
        free(x7.data);
        T_OK(hcomm_moe_handle_free(ref));
        T_OK(hcomm_moe_plan_free(pl));
        free_batch(&b);
    }
}

static bool zero_row(const char *row, size_t rb) {
    for (size_t i = 0; i < rb; i++)
        if (row[i])
            return false;
    return true;
}

/* Pad-to-capacity: R = E * capacity rows, [local expert][source][capacity]; without its zero
 * rows the same rows as the plan without padding; combine and both backward passes give the
 * same bits; one collective call per dispatch. Both drop policies, T = 0 on rank 1. */
static void test_plan_pad(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g);
    rt_case_t c = {2, 2 * p, 8, 4, HCOMM_F32, true};
    size_t rb = (size_t)c.h * 4;
    for (int pol = 0; pol <= 1; pol++) {
        batch_t b = make_batch(&c, rank);
        for (int64_t i = 0; i < b.n * c.k; i++) /* distinct weights for the probs policy */
            b.w[i] = ldexpf(1.0f, -(int)(mix((uint32_t)(rank * 1000 + i)) % 4));
        hcomm_moe_plan_desc_t d = {8, c.h, c.k, c.e_all, c.dt, 0.5, (hcomm_moe_drop_t)pol, 0};
        hcomm_moe_plan_t *plain = NULL, *padded = NULL;
        hcomm_moe_handle_t *h1 = NULL, *h2 = NULL;
        T_OK(hcomm_moe_plan_create(g, &d, &plain));
        d.pad_to_capacity = 1;
        T_OK(hcomm_moe_plan_create(g, &d, &padded));
        T_OK(hcomm_moe_plan_dispatch(plain, &b.x, b.ids, b.w, &h1));
        uint64_t c0, a0, c1, a1;
        hcomm__coll_counts(g, &c0, &a0);
        T_OK(hcomm_moe_plan_dispatch(padded, &b.x, b.ids, b.w, &h2));
        hcomm__coll_counts(g, &c1, &a1);
        T_CHECK(c1 - c0 == 1 && a1 == a0, "a padded dispatch made %llu calls, %llu agreements",
                (unsigned long long)(c1 - c0), (unsigned long long)(a1 - a0));
        if (h1 == NULL || h2 == NULL)
            goto next;
        hcomm_tensor_t r1, r2;
        int64_t cap = -1, tpe[64], off[65], d1 = -1, d2 = -2;
        T_OK(hcomm_moe_received(h1, &r1, NULL));
        T_OK(hcomm_moe_received(h2, &r2, tpe));
        T_OK(hcomm_moe_expert_offsets(h2, off));
        T_OK(hcomm_moe_dropped(h2, NULL, NULL, &cap));
        T_EQ_INT(cap, (int64_t)ceil(8.0 * c.k / c.e_all * 0.5));
        T_EQ_INT(r2.shape[0], c.e_all * cap);
        T_EQ_INT(tpe[0], p * cap);
        T_EQ_INT(off[1], p * cap);
        int64_t kept = 0;
        bool same = true;
        for (int64_t i = 0; i < r2.shape[0]; i++) {
            const char *row = (const char *)r2.data + (size_t)i * rb;
            if (zero_row(row, rb))
                continue;
            same &= kept < r1.shape[0] && !memcmp(row, (char *)r1.data + (size_t)kept * rb, rb);
            kept++;
        }
        T_CHECK(same && kept == r1.shape[0], "padded rows (%lld kept) differ from the plain %lld",
                (long long)kept, (long long)r1.shape[0]);
        T_OK(hcomm_moe_stats(h1, NULL, NULL, &d1));
        T_OK(hcomm_moe_stats(h2, NULL, NULL, &d2));
        T_EQ_INT(d1, d2);
        hcomm_tensor_t o1 = make2(c.dt, b.n, c.h), o2 = make2(c.dt, b.n, c.h);
        T_OK(hcomm_moe_combine_topk(h1, &r1, &o1));
        T_OK(hcomm_moe_combine_topk(h2, &r2, &o2));
        T_CHECK(!memcmp(o1.data, o2.data, (size_t)b.n * rb), "padded combine differs");
        T_OK(hcomm_moe_dispatch_topk_bwd(h1, &r1, &o1));
        T_OK(hcomm_moe_dispatch_topk_bwd(h2, &r2, &o2));
        T_CHECK(!memcmp(o1.data, o2.data, (size_t)b.n * rb), "padded dispatch_topk_bwd differs");
        hcomm_tensor_t g1 = make2(c.dt, r1.shape[0], c.h), g2 = make2(c.dt, r2.shape[0], c.h);
        float *w1 = calloc((size_t)(b.n * c.k + 1), 4), *w2 = calloc((size_t)(b.n * c.k + 1), 4);
        T_OK(hcomm_moe_combine_topk_bwd(h1, &b.x, &g1, w1));
        T_OK(hcomm_moe_combine_topk_bwd(h2, &b.x, &g2, w2));
        T_CHECK(!memcmp(w1, w2, sizeof(float) * (size_t)(b.n * c.k)), "padded grad_weights differ");
        T_OK(hcomm_moe_redispatch(h2, &b.x, &g2));
        T_CHECK(!memcmp(g2.data, r2.data, (size_t)r2.shape[0] * rb), "padded redispatch differs");
        free(w1);
        free(w2);
        free(g1.data);
        free(g2.data);
        free(o1.data);
        free(o2.data);
    next:
        T_OK(hcomm_moe_plan_free(plain));
        T_OK(hcomm_moe_plan_free(padded));
        free_batch(&b);
    }
    /* one rank past max_tokens_per_rank: its status rides in the fixed blocks */
    hcomm_moe_plan_desc_t d = {8, c.h, c.k, c.e_all, c.dt, 0.5, HCOMM_MOE_DROP_POSITION, 1};
    hcomm_moe_plan_t *pl = NULL;
    hcomm_moe_handle_t *hd = NULL;
    hcomm_tensor_t x9 = make2(c.dt, rank == p - 1 ? 9 : 2, c.h);
    int32_t ids9[18] = {0};
    T_OK(hcomm_moe_plan_create(g, &d, &pl));
    hcomm_result_t r = hcomm_moe_plan_dispatch(pl, &x9, ids9, NULL, &hd);
    T_CHECK(r == (rank == p - 1 ? HCOMM_ERR_SHAPE
                  : p > 1       ? HCOMM_ERR_PEER
                                : HCOMM_OK),
            "padded dispatch past the maximum: rank %d got %s", rank, hcomm_result_name(r));
    x9.shape[0] = 2;
    T_OK(hcomm_moe_plan_dispatch(pl, &x9, ids9, NULL, &hd)); /* the group still works */
    T_OK(hcomm_moe_plan_free(pl));
    free(x9.data);
    hcomm_moe_plan_desc_t bad = {8, 4, 2, 2 * p, HCOMM_F32, 0, HCOMM_MOE_DROP_POSITION, 1};
    pl = NULL;
    T_ERR(hcomm_moe_plan_create(g, &bad, &pl), HCOMM_ERR_INVALID_ARG);
    expect_text("desc->pad_to_capacity=1 needs desc->capacity_factor > 0");
}

/* Ranks that disagree on a field all fail, naming it, both values and both ranks. */
static void test_plan_mismatch(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g);
    hcomm_moe_plan_desc_t d = {4, 8, 2, 2 * p, HCOMM_BF16, 0, HCOMM_MOE_DROP_POSITION, 0};
    hcomm_moe_plan_t *pl = NULL;
    char want[160];
    if (p > 1) {
        hcomm_moe_plan_desc_t mine = d;
        if (rank == p - 1)
            mine.hidden = 6;
        T_ERR(hcomm_moe_plan_create(g, &mine, &pl), HCOMM_ERR_MISMATCH);
        snprintf(want, sizeof want,
                 "hcomm_moe_plan_create: hidden=8 on rank 0 but hidden=6 on rank %d", p - 1);
        T_CHECK(strcmp(hcomm_last_error(), want) == 0, "got '%s', expected '%s'",
                hcomm_last_error(), want);
        mine = d;
        if (rank == p - 1)
            mine.dtype = HCOMM_F32;
        T_ERR(hcomm_moe_plan_create(g, &mine, &pl), HCOMM_ERR_MISMATCH);
        snprintf(want, sizeof want, "dtype=bf16 on rank 0 but dtype=f32 on rank %d", p - 1);
        expect_text(want);
        mine = d;
        if (rank == p - 1)
            mine.max_tokens_per_rank = 5;
        T_ERR(hcomm_moe_plan_create(g, &mine, &pl), HCOMM_ERR_MISMATCH);
        expect_text("max_tokens_per_rank=4 on rank 0 but max_tokens_per_rank=5");
        mine = d;
        if (rank == 0)
            mine.k = 0; /* invalid on one rank: its own error, PEER on the others */
        hcomm_result_t r = hcomm_moe_plan_create(g, &mine, &pl);
        T_CHECK(r == (rank == 0 ? HCOMM_ERR_INVALID_ARG : HCOMM_ERR_PEER), "rank %d got %s", rank,
                hcomm_result_name(r));
    }
    T_CHECK(pl == NULL, "plan set after a failed create");
    d.num_experts = 2 * p + 1;
    T_ERR(hcomm_moe_plan_create(g, &d, &pl), p > 1 ? HCOMM_ERR_INVALID_ARG : HCOMM_OK);
    T_OK(hcomm_moe_plan_free(pl));
}

static hcomm_result_t moe_world(hcomm_comm_t *world, void *arg) {
    (void)arg;
    test_round_trips(world);
    test_capacity_stats(world);
    test_drop_policies(world);
    test_plan_dispatch(world);
    test_plan_mismatch(world);
    test_plan_pad(world);
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(moe_world, NULL, MAX_WORLD);
    return t_finish("test_moe_plan");
}
