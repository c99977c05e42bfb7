/* MoE dispatch/combine with expert-TP over sequence-parallel tokens (options.etp_group).
 * HCOMM_TEST_MPI
 * The world is ep x etp (etp fastest: world rank = ep_rank * etp + etp_rank); every rank holds
 * its own shard of tokens. The sequence-parallel dispatch must receive exactly the rows the
 * replicated mode (no etp_group) receives on the same EP rank from the members' tokens
 * concatenated, and combine, its backward passes and the weight gradients must give the
 * replicated mode's bits for this rank's tokens and match a serial reference. Experts are the
 * identity split by columns across the expert-TP members (member i keeps the columns c with
 * c % etp == i, zeros elsewhere), so the members' partial outputs sum to x exactly. */
#include "harness.h"

#include "algo/coll.h"

#include <math.h>
#include <stdbool.h>

typedef struct shape {
    int ep, etp;
} shape_t;

typedef struct ctx {
    hcomm_comm_t *world, *ep, *etp;
    int rank, s, i, ep_n, etp_n, e_all, variant;
} ctx_t;

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

/* Tokens of EP rank s, member i: none on world rank 1 (variant 0). */
static int64_t n_tok(const ctx_t *c, int s, int i) {
    int r = s * c->etp_n + i;
    if (c->variant == 0 && r == 1)
        return 0;
    return (r * 5 + 3 + c->variant) % 7 + 2;
}

static int32_t id_of(const ctx_t *c, int64_t g, int j) {
    uint32_t h = mix((uint32_t)g * 31u + (uint32_t)j);
    return h % 7 == 0 ? -1 : (int32_t)(h % (uint32_t)c->e_all);
}

static float weight_of(int64_t g, int j) {
    return (float)(mix((uint32_t)g * 7u + (uint32_t)j + 99u) % 1000u + 1u) / 1024.0f;
}

static double tok_val(int64_t g, int64_t col) {
    return (double)((g * 13 + col * 7) % 17) - 8;
}

static double grad_val(int64_t g, int64_t col) {
    return (double)((g * 5 + col * 3) % 11) - 5;
}

static double round_dt(hcomm_dtype_t dt, double v) {
    double b[1];
    t_set_val(dt, b, 0, v);
    return t_get_val(dt, b, 0);
}

static hcomm_tensor_t make2(hcomm_dtype_t dt, int64_t rows, int64_t cols) {
    hcomm_tensor_t t;
    int64_t shape[2] = {rows, cols};
    hcomm_tensor_init(&t, calloc((size_t)(rows * cols) * 8 + 8, 1), dt, 2, shape);
    return t;
}

static size_t nbytes(const hcomm_tensor_t *t) {
    size_t es = t->dtype == HCOMM_F64 ? 8 : t->dtype == HCOMM_F32 ? 4 : 2;
    return (size_t)(t->shape[0] * t->shape[1]) * es;
}

/* The tokens of EP rank s's members first..last-1, concatenated: rows, ids and weights. */
typedef struct batch {
    int64_t n, *g; /* global token index of each row */
    hcomm_tensor_t x;
    int32_t *ids;
    float *w;
} batch_t;

static batch_t make_batch(const ctx_t *c, int first, int last, int k, hcomm_dtype_t dt, int64_t h) {
    batch_t b = {0};
    for (int i = first; i < last; i++)
        b.n += n_tok(c, c->s, i);
    b.g = calloc((size_t)b.n + 1, sizeof *b.g);
    b.x = make2(dt, b.n, h);
    b.ids = calloc((size_t)(b.n * k) + 1, sizeof *b.ids);
    b.w = calloc((size_t)(b.n * k) + 1, sizeof *b.w);
    int64_t t = 0;
    for (int i = first; i < last; i++)
        for (int64_t q = 0; q < n_tok(c, c->s, i); q++, t++) {
            b.g[t] = (c->s * c->etp_n + i) * 1000 + q;
            for (int64_t col = 0; col < h; col++)
                t_set_val(dt, b.x.data, (size_t)(t * h + col), tok_val(b.g[t], col));
            for (int j = 0; j < k; j++) {
                b.ids[t * k + j] = id_of(c, b.g[t], j);
                b.w[t * k + j] = weight_of(b.g[t], j);
            }
        }
    return b;
}

static void free_batch(batch_t *b) {
    free(b->g);
    free(b->x.data);
    free(b->ids);
    free(b->w);
}

/* The rows of this rank's etp member shard of y: columns c % etp == i. */
static hcomm_tensor_t shard_of(const hcomm_tensor_t *recv, const ctx_t *c) {
    hcomm_tensor_t y = make2(recv->dtype, recv->shape[0], recv->shape[1]);
    for (int64_t r = 0; r < recv->shape[0]; r++)
        for (int64_t col = 0; col < recv->shape[1]; col++)
            if (col % c->etp_n == c->i) {
                size_t e = (size_t)(r * recv->shape[1] + col);
                t_set_val(recv->dtype, y.data, e, t_get_val(recv->dtype, recv->data, e));
            }
    return y;
}

static bool same(const hcomm_tensor_t *a, const hcomm_tensor_t *b) {
    return a->shape[0] == b->shape[0] && a->shape[1] == b->shape[1] &&
           memcmp(a->data, b->data, nbytes(a)) == 0;
}

/* Rows [off, off + n) of a [*, h] buffer equal b's n rows. */
static bool same_rows(const hcomm_tensor_t *a, int64_t off, const hcomm_tensor_t *b) {
    size_t rb = nbytes(b) / (size_t)(b->shape[0] ? b->shape[0] : 1);
    return memcmp((const char *)a->data + (size_t)off * rb, b->data, nbytes(b)) == 0;
}

static void check_forward(const ctx_t *c, const batch_t *mine, const hcomm_tensor_t *out, int k) {
    hcomm_dtype_t dt = out->dtype;
    int64_t h = out->shape[1];
    for (int64_t t = 0; t < mine->n; t++)
        for (int64_t col = 0; col < h; col++) {
            double x = tok_val(mine->g[t], col);
            float a32 = 0;
            double a64 = 0;
            for (int j = 0; j < k; j++)
                if (mine->ids[t * k + j] >= 0) {
                    a32 += mine->w[t * k + j] * (float)x;
                    a64 += (double)mine->w[t * k + j] * x;
                }
            double want = round_dt(dt, dt == HCOMM_F64 ? a64 : (double)a32),
                   got = t_get_val(dt, out->data, (size_t)(t * h + col));
            T_CHECK(got == want, "ep %d etp %d rank %d: out[%lld][%lld]=%g, expected x*sum(w)=%g",
                    c->ep_n, c->etp_n, c->rank, (long long)t, (long long)col, got, want);
        }
}

/* grad_recv of member i: row of local expert l (global e) = recv * (e + 1) * (i + 1). */
static hcomm_tensor_t grad_rows(const ctx_t *c, const hcomm_tensor_t *recv, const int64_t *off) {
    hcomm_tensor_t g = make2(recv->dtype, recv->shape[0], recv->shape[1]);
    int num_local = c->e_all / c->ep_n;
    for (int l = 0; l < num_local; l++)
        for (int64_t r = off[l]; r < off[l + 1]; r++)
            for (int64_t col = 0; col < recv->shape[1]; col++) {
                size_t e = (size_t)(r * recv->shape[1] + col);
                double v =
                    t_get_val(recv->dtype, recv->data, e) * (c->s * num_local + l + 1) * (c->i + 1);
                t_set_val(recv->dtype, g.data, e, v);
            }
    return g;
}

static void check_dispatch_bwd(const ctx_t *c, const batch_t *mine, const hcomm_tensor_t *gt,
                               int k) {
    hcomm_dtype_t dt = gt->dtype;
    int64_t h = gt->shape[1];
    double sum_i = c->etp_n * (c->etp_n + 1) / 2.0;
    for (int64_t t = 0; t < mine->n; t++)
        for (int64_t col = 0; col < h; col++) {
            double x = tok_val(mine->g[t], col);
            float a32 = 0;
            double a64 = 0;
            for (int j = 0; j < k; j++) {
                int32_t e = mine->ids[t * k + j];
                if (e < 0)
                    continue;
                double v = round_dt(dt, x * (e + 1) * sum_i); /* the reduce_scatter's rounding */
                a32 += (float)v;
                a64 += v;
            }
            double want = round_dt(dt, dt == HCOMM_F64 ? a64 : (double)a32),
                   got = t_get_val(dt, gt->data, (size_t)(t * h + col));
            T_CHECK(got == want, "ep %d etp %d rank %d: grad_tokens[%lld][%lld]=%g, expected %g",
                    c->ep_n, c->etp_n, c->rank, (long long)t, (long long)col, got, want);
        }
}

static void check_weight_grads(const ctx_t *c, const batch_t *mine, const float *gw, int k,
                               int64_t h, hcomm_dtype_t dt) {
    for (int64_t t = 0; t < mine->n; t++)
        for (int j = 0; j < k; j++) {
            float a32 = 0;
            double a64 = 0;
            for (int64_t col = 0; mine->ids[t * k + j] >= 0 && col < h; col++) {
                double g = round_dt(dt, grad_val(mine->g[t], col)), x = tok_val(mine->g[t], col);
                a32 += (float)g * (float)x;
                a64 += g * x;
            }
            float want = dt == HCOMM_F64 ? (float)a64 : a32;
            T_CHECK(gw[t * k + j] == want, "rank %d: grad_weights[%lld][%d]=%g, expected %g",
                    c->rank, (long long)t, j, (double)gw[t * k + j], (double)want);
        }
}

static hcomm_tensor_t grad_out_of(const batch_t *b, hcomm_dtype_t dt, int64_t h) {
    hcomm_tensor_t g = make2(dt, b->n, h);
    for (int64_t t = 0; t < b->n; t++)
        for (int64_t col = 0; col < h; col++)
            t_set_val(dt, g.data, (size_t)(t * h + col), grad_val(b->g[t], col));
    return g;
}

/* One round trip, sequence-parallel against replicated, forward and backward. */
static void run_case(const ctx_t *c, hcomm_dtype_t dt, int k, int64_t h) {
    batch_t mine = make_batch(c, c->i, c->i + 1, k, dt, h),
            cat = make_batch(c, 0, c->etp_n, k, dt, h);
    int64_t off = 0;
    for (int i = 0; i < c->i; i++)
        off += n_tok(c, c->s, i);
    hcomm_moe_options_t sp = {0};
    sp.etp_group = c->etp;
    hcomm_moe_handle_t *hs = NULL, *hr = NULL;
    uint64_t e0, ea0, t0, ta0, e1, ea1, t1, ta1;
    hcomm__coll_counts(c->ep, &e0, &ea0);
    hcomm__coll_counts(c->etp, &t0, &ta0);
    hcomm_result_t r1 =
        hcomm_moe_dispatch_topk(c->ep, &mine.x, mine.ids, mine.w, k, c->e_all, &sp, &hs);
    hcomm__coll_counts(c->ep, &e1, &ea1);
    hcomm__coll_counts(c->etp, &t1, &ta1);
    int nodes = 1;
    T_OK(hcomm_comm_node(c->ep, &nodes, NULL, NULL, NULL));
    uint64_t ep_calls = nodes > 1 ? 3 : 2; /* one count exchange, one or two token exchanges */
    T_CHECK(e1 - e0 == ep_calls && ea1 == ea0 && (c->etp_n == 1 || t1 - t0 == 2),
            "rank %d: dispatch made %llu calls (%llu agreements) on ep_group and %llu on "
            "etp_group; expected %llu, 0 and 2 (counts, then rows)",
            c->rank, (unsigned long long)(e1 - e0), (unsigned long long)(ea1 - ea0),
            (unsigned long long)(t1 - t0), (unsigned long long)ep_calls);
    hcomm_result_t r2 =
        hcomm_moe_dispatch_topk(c->ep, &cat.x, cat.ids, cat.w, k, c->e_all, NULL, &hr);
    T_CHECK(r1 == HCOMM_OK && r2 == HCOMM_OK, "dispatch: %s / %s (%s)", hcomm_result_name(r1),
            hcomm_result_name(r2), hcomm_last_error());
    if (r1 != HCOMM_OK || r2 != HCOMM_OK)
        goto out;
    hcomm_moe_route_info_t info;
    T_OK(hcomm_moe_route_info(hs, &info));
    T_EQ_INT(info.hierarchical, nodes > 1);
    hcomm_tensor_t rs, rr;
    int num_local = c->e_all / c->ep_n;
    int64_t off_s[16], off_r[16], cnt_s[16];
    T_OK(hcomm_moe_received(hs, &rs, cnt_s));
    T_OK(hcomm_moe_received(hr, &rr, NULL));
    T_OK(hcomm_moe_expert_offsets(hs, off_s));
    T_OK(hcomm_moe_expert_offsets(hr, off_r));
    T_CHECK(same(&rs, &rr),
            "ep %d etp %d rank %d: gathered rows [%lld] differ from the "
            "replicated dispatch's [%lld]",
            c->ep_n, c->etp_n, c->rank, (long long)rs.shape[0], (long long)rr.shape[0]);
    for (int l = 0; l <= num_local; l++)
        T_EQ_INT(off_s[l], off_r[l]);
    for (int l = 0; l < num_local; l++)
        T_EQ_INT(cnt_s[l], off_s[l + 1] - off_s[l]);
    /* statistics over every member's tokens, as the replicated dispatch of all of them (they
     * counted this member's EP group only) */
    int64_t st_s[64], st_r[64], d_s = -1, d_r = -2;
    double im_s = -1, im_r = -2;
    T_OK(hcomm_moe_stats(hs, st_s, &im_s, &d_s));
    T_OK(hcomm_moe_stats(hr, st_r, &im_r, &d_r));
    for (int e = 0; e < c->e_all; e++)
        T_CHECK(st_s[e] == st_r[e],
                "ep %d etp %d rank %d: stats tokens_per_expert[%d]=%lld, the "
                "replicated dispatch's %lld",
                c->ep_n, c->etp_n, c->rank, e, (long long)st_s[e], (long long)st_r[e]);
    T_CHECK(im_s == im_r && d_s == d_r, "rank %d: imbalance %g dropped %lld, replicated %g %lld",
            c->rank, im_s, (long long)d_s, im_r, (long long)d_r);
    /* forward: member shards of the identity, summed by the reduce_scatter */
    hcomm_tensor_t y = shard_of(&rs, c), out_s = make2(dt, mine.n, h), out_r = make2(dt, cat.n, h);
    T_OK(hcomm_moe_combine_topk(hs, &y, &out_s));
    T_OK(hcomm_moe_combine_topk(hr, &rr, &out_r));
    check_forward(c, &mine, &out_s, k);
    T_CHECK(same_rows(&out_r, off, &out_s), "rank %d: combine differs from the replicated one",
            c->rank);
    /* dispatch backward */
    hcomm_tensor_t gr = grad_rows(c, &rs, off_s), gt = make2(dt, mine.n, h);
    T_OK(hcomm_moe_dispatch_topk_bwd(hs, &gr, &gt));
    check_dispatch_bwd(c, &mine, &gt, k);
    /* combine backward */
    hcomm_tensor_t go_s = grad_out_of(&mine, dt, h), go_r = grad_out_of(&cat, dt, h),
                   ge_s = make2(dt, rs.shape[0], h), ge_r = make2(dt, rr.shape[0], h);
    float *gw_s = calloc((size_t)(mine.n * k) + 1, sizeof(float)),
          *gw_r = calloc((size_t)(cat.n * k) + 1, sizeof(float));
    T_OK(hcomm_moe_combine_topk_bwd(hs, &go_s, &ge_s, gw_s));
    T_OK(hcomm_moe_combine_topk_bwd(hr, &go_r, &ge_r, gw_r));
    T_CHECK(same(&ge_s, &ge_r), "rank %d: grad_expert_out differs from the replicated one",
            c->rank);
    check_weight_grads(c, &mine, gw_s, k, h, dt);
    T_CHECK(memcmp(gw_s, gw_r + off * k, sizeof(float) * (size_t)(mine.n * k)) == 0,
            "rank %d: grad_weights differ from the replicated ones", c->rank);
    /* redispatch with the stored routing gives the same rows */
    hcomm_tensor_t again = make2(dt, rs.shape[0], h);
    T_OK(hcomm_moe_redispatch(hs, &mine.x, &again));
    T_CHECK(same(&again, &rs), "rank %d: redispatch differs from dispatch", c->rank);
    void *bufs[] = {y.data,    out_s.data, out_r.data, gr.data, gt.data, go_s.data,
                    go_r.data, ge_s.data,  ge_r.data,  gw_s,    gw_r,    again.data};
    for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++)
        free(bufs[b]);
out:
    hcomm_moe_handle_free(hs);
    hcomm_moe_handle_free(hr);
    free_batch(&mine);
    free_batch(&cat);
}

/* A bad id on world rank 0: it fails with its own error, everyone else (its EP peers in the
 * count exchange, the others in the expert-TP gather) with HCOMM_ERR_PEER; then a bad shape in
 * combine on the last rank, failing the others alike; the groups stay usable. */
static void test_errors(const ctx_t *c) {
    hcomm_tensor_t x = make2(HCOMM_F32, 2, 3);
    int32_t ids[4] = {0, -1, c->e_all - 1, 0}, bad[4] = {0, c->e_all, 0, 0};
    hcomm_moe_options_t sp = {0};
    sp.etp_group = c->etp;
    hcomm_moe_handle_t *hd = NULL;
    hcomm_result_t r =
        hcomm_moe_dispatch_topk(c->ep, &x, c->rank == 0 ? bad : ids, NULL, 2, c->e_all, &sp, &hd);
    hcomm_result_t want = c->rank == 0 ? HCOMM_ERR_INVALID_ARG : HCOMM_ERR_PEER;
    T_CHECK(r == want, "rank %d: dispatch with a bad id on rank 0 gave %s (%s), expected %s",
            c->rank, hcomm_result_name(r), hcomm_last_error(), hcomm_result_name(want));
    T_CHECK(hd == NULL, "handle set after a failed dispatch");
    T_OK(hcomm_moe_dispatch_topk(c->ep, &x, ids, NULL, 2, c->e_all, &sp, &hd));
    hcomm_tensor_t recv;
    T_OK(hcomm_moe_received(hd, &recv, NULL));
    int last = c->ep_n * c->etp_n - 1;
    hcomm_tensor_t out = make2(HCOMM_F32, c->rank == last ? 3 : 2, 3);
    r = hcomm_moe_combine_topk(hd, &recv, &out);
    want = c->rank == last ? HCOMM_ERR_SHAPE : HCOMM_ERR_PEER;
    if (c->ep_n * c->etp_n > 1)
        T_CHECK(r == want, "rank %d: combine with a bad shape on rank %d gave %s (%s), expected %s",
                c->rank, last, hcomm_result_name(r), hcomm_last_error(), hcomm_result_name(want));
    hcomm_tensor_t ge = make2(HCOMM_F32, recv.shape[0], 3), go = make2(HCOMM_F32, 2, 3);
    r = hcomm_moe_combine_topk_bwd(hd, c->rank == last ? &out : &go, &ge, NULL);
    if (c->ep_n * c->etp_n > 1)
        T_CHECK(r == want, "rank %d: combine_bwd with a bad shape on rank %d gave %s (%s)", c->rank,
                last, hcomm_result_name(r), hcomm_last_error());
    T_OK(hcomm_moe_combine_topk(hd, &recv, &go)); /* still usable */
    hcomm_moe_options_t same_group = {0};
    same_group.etp_group = c->ep;
    hcomm_moe_handle_t *h2 = NULL;
    T_ERR(hcomm_moe_dispatch_topk(c->ep, &x, ids, NULL, 2, c->e_all, &same_group, &h2),
          HCOMM_ERR_INVALID_ARG);
    hcomm_moe_handle_free(hd);
    free(x.data);
    free(out.data);
    free(ge.data);
    free(go.data);
}

/* One dispatch with options o on ep; every rank must fail with want, leaving no handle. */
static void expect_dispatch_fails(const ctx_t *c, hcomm_comm_t *ep, const hcomm_moe_options_t *o,
                                  hcomm_result_t want, const char *what) {
    hcomm_tensor_t x = make2(HCOMM_F32, 2, 3);
    int32_t ids[2] = {0, c->e_all - 1};
    hcomm_moe_handle_t *h = NULL;
    hcomm_result_t r = hcomm_moe_dispatch_topk(ep, &x, ids, NULL, 1, c->e_all, o, &h);
    T_CHECK(r == want && h == NULL, "ep %d etp %d rank %d: %s gave %s (%s), expected %s", c->ep_n,
            c->etp_n, c->rank, what, hcomm_result_name(r), hcomm_last_error(),
            hcomm_result_name(want));
    hcomm_moe_handle_free(h);
    free(x.data);
}

/* Expert-TP groups that do not fit the EP groups fail on every rank instead of filing rows
 * under experts that are not theirs (they did, silently): the world as etp_group (its members
 * sit at different places of one EP group), EP groups whose member order differs between etp
 * members, and EP ranks that disagree on having an etp_group (etp group 0 passes none). */
static hcomm_result_t test_bad_groups(const ctx_t *c) {
    if (c->ep_n < 2 || c->etp_n < 2)
        return HCOMM_OK;
    hcomm_moe_options_t o = {0};
    o.etp_group = c->world;
    expect_dispatch_fails(c, c->ep, &o, HCOMM_ERR_INVALID_ARG, "etp_group = the world");
    hcomm_comm_t *twisted = NULL; /* member 1's EP groups rotated by one place */
    T_TRY(hcomm_comm_split(c->world, c->i, c->i == 1 ? (c->s + 1) % c->ep_n : c->s, &twisted));
    o.etp_group = c->etp;
    expect_dispatch_fails(c, twisted, &o, HCOMM_ERR_INVALID_ARG, "misaligned ep groups");
    hcomm_comm_destroy(twisted);
    o.etp_group = c->s == 0 ? NULL : c->etp;
    expect_dispatch_fails(c, c->ep, &o, HCOMM_ERR_MISMATCH, "etp_group only on some EP ranks");
    return HCOMM_OK;
}

/* num_experts invalid on world rank 0 alone (0 is no positive multiple of any size): rank 0 fails
 * with HCOMM_ERR_INVALID_ARG, every other rank with HCOMM_ERR_PEER (its EP peers in their first
 * exchange, the others in the expert-TP step), dropless and with a capacity; before, rank 0
 * returned without a message and its peers paired with its next call. A dispatch after it works on
 * every rank. */
static void test_bad_experts_on_one(const ctx_t *c) {
    hcomm_tensor_t x = make2(HCOMM_F32, 2, 3);
    int32_t ids[2] = {0, c->e_all - 1};
    for (int cap = 0; cap < 2; cap++) {
        hcomm_moe_options_t o = {0};
        o.etp_group = c->etp;
        o.capacity_factor = cap ? 1.0 : 0.0;
        hcomm_moe_handle_t *h = NULL;
        hcomm_result_t r =
            hcomm_moe_dispatch_topk(c->ep, &x, ids, NULL, 1, c->rank == 0 ? 0 : c->e_all, &o, &h);
        hcomm_result_t want = c->rank == 0 ? HCOMM_ERR_INVALID_ARG : HCOMM_ERR_PEER;
        T_CHECK(r == want && h == NULL,
                "ep %d etp %d rank %d: num_experts=0 on rank 0 (capacity %d) gave %s (%s), "
                "expected %s",
                c->ep_n, c->etp_n, c->rank, cap, hcomm_result_name(r), hcomm_last_error(),
                hcomm_result_name(want));
        hcomm_moe_handle_free(h);
        h = NULL;
        T_OK(hcomm_moe_dispatch_topk(c->ep, &x, ids, NULL, 1, c->e_all, &o, &h));
        hcomm_moe_handle_free(h);
    }
    free(x.data);
}

/* Disagreements the underlying collectives catch are worded for the user: num_experts differing
 * across an EP group names num_experts (it named a byte count alone), and widths differing
 * across an expert-TP group name etp_group (the ranks were etp_group's, unsaid); a rank whose
 * EP peer failed so first may report that (HCOMM_ERR_PEER, quoting it). */
static void test_mismatch_words(const ctx_t *c) {
    hcomm_tensor_t x = make2(HCOMM_F32, 2, 3);
    int32_t ids[2] = {0, c->e_all - 1};
    hcomm_moe_options_t o = {0};
    o.etp_group = c->etp;
    hcomm_moe_handle_t *h = NULL;
    hcomm_result_t r;
    if (c->ep_n > 1) {
        r = hcomm_moe_dispatch_topk(c->ep, &x, ids, NULL, 1, c->s == 0 ? c->e_all : 2 * c->e_all,
                                    &o, &h);
        T_CHECK(r == HCOMM_ERR_MISMATCH && strstr(hcomm_last_error(), "num_experts") != NULL,
                "rank %d: num_experts differing gave %s (%s)", c->rank, hcomm_result_name(r),
                hcomm_last_error());
    }
    if (c->etp_n > 1) { /* H differing across etp members: both values and both ranks */
        hcomm_tensor_t xh = make2(HCOMM_F32, 2, c->i == 0 ? 3 : 4);
        r = hcomm_moe_dispatch_topk(c->ep, &xh, ids, NULL, 1, c->e_all, &o, &h);
        T_CHECK(r == HCOMM_ERR_MISMATCH &&
                    strstr(hcomm_last_error(), "f32 [*, 3] on rank 0 of etp_group but f32 [*, 4]"),
                "rank %d: H differing across etp_group gave %s (%s)", c->rank, hcomm_result_name(r),
                hcomm_last_error());
        free(xh.data);
    }
    T_OK(hcomm_moe_dispatch_topk(c->ep, &x, ids, NULL, 1, c->e_all, &o, &h));
    hcomm_tensor_t recv;
    T_OK(hcomm_moe_received(h, &recv, NULL));
    int64_t w = c->i == 0 ? 3 : 4;
    hcomm_tensor_t y = make2(HCOMM_F32, recv.shape[0], w), out = make2(HCOMM_F32, 2, w);
    r = hcomm_moe_combine_topk(h, &y, &out);
    if (c->etp_n > 1)
        T_CHECK((r == HCOMM_ERR_MISMATCH || r == HCOMM_ERR_PEER) &&
                    strstr(hcomm_last_error(), "etp_group") != NULL,
                "rank %d: combine widths differing across etp_group gave %s (%s)", c->rank,
                hcomm_result_name(r), hcomm_last_error());
    hcomm_moe_handle_free(h);
    free(x.data);
    free(y.data);
    free(out.data);
}

static hcomm_result_t etp_world(hcomm_comm_t *world, void *arg) {
    ctx_t c = {0};
    int w = t_size(world);
    shape_t sh =
        arg ? *(const shape_t *)arg : (shape_t){w % 2 == 0 ? w / 2 : 1, w % 2 == 0 ? 2 : w};
    c.world = world;
    c.rank = t_rank(world);
    c.ep_n = sh.ep;
    c.etp_n = sh.etp;
    c.s = c.rank / sh.etp;
    c.i = c.rank % sh.etp;
    c.e_all = 2 * sh.ep;
    T_TRY(hcomm_comm_split(world, c.i, c.s, &c.ep));
    T_TRY(hcomm_comm_split(world, c.s, c.i, &c.etp));
    hcomm_dtype_t dts[] = {HCOMM_F32, HCOMM_BF16, HCOMM_F64};
    int ks[] = {1, 2, 3};
    int64_t hs[] = {1, 5, 33};
    for (int v = 0; v < 2; v++)
        for (int d = 0; d < 3; d++)
            for (int q = 0; q < 3; q++) {
                c.variant = v;
                run_case(&c, dts[d], ks[q], hs[(d + q + v) % 3]);
            }
    if (c.ep_n % 2 == 0) { /* the EP group over two declared nodes: hierarchical EP exchange */
        char spec[32];
        snprintf(spec, sizeof spec, "nodes=2x%d", c.ep_n / 2);
        T_TRY(hcomm_comm_set_topo(c.ep, spec));
        for (int q = 0; q < 3; q++) {
            c.variant = q % 2;
            run_case(&c, dts[q], ks[q], hs[q]);
        }
    }
    test_bad_groups(&c);
    test_mismatch_words(&c);
    test_bad_experts_on_one(&c);
    test_errors(&c);
    hcomm_comm_destroy(c.ep);
    hcomm_comm_destroy(c.etp);
    return HCOMM_OK;
}

int main(void) {
    if (strcmp(t_backend(), "mpi") == 0) {
        T_OK(hcomm_launch("mpi", 0, etp_world, NULL));
        return t_finish("test_moe_etp");
    }
    shape_t shapes[] = {{2, 2}, {1, 2}, {2, 3}, {4, 2}, {3, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        T_OK(hcomm_launch("local", shapes[i].ep * shapes[i].etp, etp_world, &shapes[i]));
    return t_finish("test_moe_etp");
}
