/* Hierarchical (per node) MoE dispatch against the flat one. HCOMM_TEST_MPI
 * On declared multi-node topologies (hcomm_comm_set_topo, or HCOMM_TOPO for the whole job as
 * test_moe_hier.sh runs it), a dispatch on the hierarchical path must receive bitwise the rows
 * of the flat path, and combine, the backward passes, redispatch and the statistics must give
 * bitwise the same results; its counter must show each token crossing to each remote node at
 * most once (exactly the distinct remote nodes of its kept slots), against one row per remote
 * rank on the flat path. The automatic choice takes the hierarchical path on more than one
 * node and the flat one on one node. */
#include "harness.h"

#include "algo/coll.h"

#include <stdbool.h>

#define MAX_RANKS 8

typedef struct topo {
    const char *spec; /* NULL: HCOMM_TOPO's (or one node) */
    int nnodes, sizes[MAX_RANKS];
} topo_t;

typedef struct ctx {
    hcomm_comm_t *g;
    int p, rank, e_all, nnodes, node[MAX_RANKS];
} ctx_t;

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
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

static bool same(const hcomm_tensor_t *a, const hcomm_tensor_t *b) {
    return a->shape[0] == b->shape[0] && a->shape[1] == b->shape[1] &&
           memcmp(a->data, b->data, nbytes(a)) == 0;
}

/* A case: k slots, H columns, dtype, T on this rank (variant 1: rank 1 has none), capacity. */
typedef struct tcase {
    int k;
    int64_t h;
    hcomm_dtype_t dt;
    int variant;
    double cf;
} tcase_t;

static int64_t n_tok(const ctx_t *c, const tcase_t *tc) {
    if (tc->variant == 1 && c->rank == 1)
        return 0;
    return (c->rank * 7 + 5 + tc->variant) % 9 + 3;
}

/* Routing skewed toward a few experts so that tokens often hit several ranks of one node. */
static int32_t id_of(const ctx_t *c, int64_t g, int j, int variant) {
    uint32_t h = mix((uint32_t)g * 31u + (uint32_t)j * 7u + (uint32_t)variant);
    if (h % 9 == 0)
        return -1;
    return (int32_t)(h % (uint32_t)c->e_all);
}

/* The reference counters: remote nodes (hier) and remote ranks (flat) of t's kept slots. */
static void expect_rows(const ctx_t *c, const int32_t *ids, int64_t n, int k, int64_t *by_node,
                        int64_t *by_rank) {
    int num_local = c->e_all / c->p;
    *by_node = *by_rank = 0;
    for (int64_t t = 0; t < n; t++) {
        bool node_hit[MAX_RANKS] = {0}, rank_hit[MAX_RANKS] = {0};
        for (int j = 0; j < k; j++) {
            int32_t e = ids[t * k + j];
            if (e < 0)
                continue;
            int q = e / num_local;
            if (c->node[q] == c->node[c->rank])
                continue;
            *by_node += !node_hit[c->node[q]];
            *by_rank += !rank_hit[q];
            node_hit[c->node[q]] = rank_hit[q] = true;
        }
    }
}

static void run_case(const ctx_t *c, const tcase_t *tc) {
    int64_t n = n_tok(c, tc), h = tc->h;
    int k = tc->k;
    hcomm_tensor_t x = make2(tc->dt, n, h);
    int32_t *ids = calloc((size_t)(n * k) + 1, sizeof *ids);
    float *w = calloc((size_t)(n * k) + 1, sizeof *w);
    for (int64_t t = 0; t < n; t++) {
        int64_t g = c->rank * 1000 + t;
        for (int64_t col = 0; col < h; col++)
            t_set_val(tc->dt, x.data, (size_t)(t * h + col), (double)((g * 13 + col * 7) % 17) - 8);
        for (int j = 0; j < k; j++) {
            ids[t * k + j] = id_of(c, g, j, tc->variant);
            w[t * k + j] = (float)(mix((uint32_t)g * 5u + (uint32_t)j) % 1000u + 1u) / 1000.0f;
        }
    }
    hcomm_moe_options_t flat = {0}, hier = {0}, autop = {0};
    flat.path = HCOMM_MOE_PATH_FLAT;
    hier.path = HCOMM_MOE_PATH_HIER;
    flat.capacity_factor = hier.capacity_factor = autop.capacity_factor = tc->cf;
    hcomm_moe_handle_t *hf = NULL, *hh = NULL, *ha = NULL;
    uint64_t c0, a0, c1, a1, c2, a2;
    hcomm__coll_counts(c->g, &c0, &a0);
    T_OK(hcomm_moe_dispatch_topk(c->g, &x, ids, w, k, c->e_all, &flat, &hf));
    hcomm__coll_counts(c->g, &c1, &a1);
    T_OK(hcomm_moe_dispatch_topk(c->g, &x, ids, w, k, c->e_all, &hier, &hh));
    hcomm__coll_counts(c->g, &c2, &a2);
    uint64_t extra = tc->cf > 0; /* capacity: the all_reduce of the largest T */
    T_CHECK(c1 - c0 == 2 + extra && c2 - c1 == 3 + extra && a2 == a0,
            "dispatch calls: flat %llu, hierarchical %llu, agreements %llu; expected %llu, %llu "
            "(one count exchange, one or two token exchanges) and 0",
            (unsigned long long)(c1 - c0), (unsigned long long)(c2 - c1),
            (unsigned long long)(a2 - a0), (unsigned long long)(2 + extra),
            (unsigned long long)(3 + extra));
    T_OK(hcomm_moe_dispatch_topk(c->g, &x, ids, w, k, c->e_all, &autop, &ha));
    if (!hf || !hh || !ha)
        goto out;
    hcomm_moe_route_info_t inf, inh, ina;
    T_OK(hcomm_moe_route_info(hf, &inf));
    T_OK(hcomm_moe_route_info(hh, &inh));
    T_OK(hcomm_moe_route_info(ha, &ina));
    T_EQ_INT(inf.hierarchical, 0);
    T_EQ_INT(inh.hierarchical, 1);
    T_EQ_INT(ina.hierarchical, c->nnodes > 1);
    T_EQ_INT(inf.token_exchanges, 1);
    T_EQ_INT(inh.token_exchanges, 2);
    T_EQ_INT(inh.nnodes, c->nnodes);
    int64_t by_node, by_rank;
    if (tc->cf <= 0) { /* dropless: every non-empty slot is kept */
        expect_rows(c, ids, n, k, &by_node, &by_rank);
        T_CHECK(inh.internode_rows == by_node,
                "rank %d: hierarchical dispatch sent %lld rows to other nodes, expected one per "
                "(token, remote node) = %lld",
                c->rank, (long long)inh.internode_rows, (long long)by_node);
        T_CHECK(inf.internode_rows == by_rank,
                "rank %d: flat dispatch sent %lld rows to other nodes, expected %lld", c->rank,
                (long long)inf.internode_rows, (long long)by_rank);
    }
    T_CHECK(inh.internode_rows <= inf.internode_rows, "rank %d: hier %lld > flat %lld rows",
            c->rank, (long long)inh.internode_rows, (long long)inf.internode_rows);
    hcomm_tensor_t rf, rh, ra;
    int num_local = c->e_all / c->p;
    int64_t of[MAX_RANKS * 4 + 1], oh[MAX_RANKS * 4 + 1], sf[64], sh[64];
    double imf, imh;
    int64_t df, dh;
    T_OK(hcomm_moe_received(hf, &rf, NULL));
    T_OK(hcomm_moe_received(hh, &rh, NULL));
    T_OK(hcomm_moe_received(ha, &ra, NULL));
    T_OK(hcomm_moe_expert_offsets(hf, of));
    T_OK(hcomm_moe_expert_offsets(hh, oh));
    T_OK(hcomm_moe_stats(hf, sf, &imf, &df));
    T_OK(hcomm_moe_stats(hh, sh, &imh, &dh));
    T_CHECK(same(&rf, &rh) && same(&rf, &ra),
            "rank %d (%d nodes, k=%d, H=%lld): received rows differ between the paths", c->rank,
            c->nnodes, k, (long long)h);
    T_CHECK(memcmp(of, oh, sizeof(int64_t) * (size_t)(num_local + 1)) == 0 &&
                memcmp(sf, sh, sizeof(int64_t) * (size_t)c->e_all) == 0 && imf == imh && df == dh,
            "rank %d: offsets or statistics differ between the paths", c->rank);
    /* expert e computes (e + 1) * x; the same input to both handles */
    hcomm_tensor_t y = make2(tc->dt, rf.shape[0], h);
    for (int l = 0; l < num_local; l++)
        for (int64_t r = of[l]; r < of[l + 1]; r++)
            for (int64_t col = 0; col < h; col++) {
                size_t e = (size_t)(r * h + col);
                t_set_val(tc->dt, y.data, e,
                          t_get_val(tc->dt, rf.data, e) * (c->rank * num_local + l + 1));
            }
    hcomm_tensor_t of_ = make2(tc->dt, n, h), oh_ = make2(tc->dt, n, h);
    T_OK(hcomm_moe_combine_topk(hf, &y, &of_));
    T_OK(hcomm_moe_combine_topk(hh, &y, &oh_));
    T_CHECK(same(&of_, &oh_), "rank %d (%d nodes, k=%d): combine differs between the paths",
            c->rank, c->nnodes, k);
    hcomm_tensor_t gtf = make2(tc->dt, n, h), gth = make2(tc->dt, n, h);
    T_OK(hcomm_moe_dispatch_topk_bwd(hf, &y, &gtf));
    T_OK(hcomm_moe_dispatch_topk_bwd(hh, &y, &gth));
    T_CHECK(same(&gtf, &gth), "rank %d: dispatch backward differs between the paths", c->rank);
    hcomm_tensor_t gef = make2(tc->dt, rf.shape[0], h), geh = make2(tc->dt, rf.shape[0], h);
    float *gwf = calloc((size_t)(n * k) + 1, sizeof(float)),
          *gwh = calloc((size_t)(n * k) + 1, sizeof(float));
    T_OK(hcomm_moe_combine_topk_bwd(hf, &x, &gef, gwf));
    T_OK(hcomm_moe_combine_topk_bwd(hh, &x, &geh, gwh));
    T_CHECK(same(&gef, &geh) && memcmp(gwf, gwh, sizeof(float) * (size_t)(n * k)) == 0,
            "rank %d: combine backward differs between the paths", c->rank);
    hcomm_tensor_t again = make2(tc->dt, rh.shape[0], h);
    T_OK(hcomm_moe_redispatch(hh, &x, &again));
    T_CHECK(same(&again, &rh), "rank %d: redispatch differs from the dispatch", c->rank);
    /* redispatch of another width and dtype: the same rows from both paths */
    hcomm_tensor_t z = make2(HCOMM_F64, n, 3), zf = make2(HCOMM_F64, rf.shape[0], 3),
                   zh = make2(HCOMM_F64, rf.shape[0], 3);
    for (int64_t i = 0; i < n * 3; i++)
        t_set_val(HCOMM_F64, z.data, (size_t)i, (double)(c->rank * 1000 + i) + 0.25);
    T_OK(hcomm_moe_redispatch(hf, &z, &zf));
    T_OK(hcomm_moe_redispatch(hh, &z, &zh));
    T_CHECK(same(&zf, &zh), "rank %d: redispatch of [T, 3] f64 differs between the paths", c->rank);
    free(z.data);
    free(zf.data);
    free(zh.data);
    void *bufs[] = {y.data,   of_.data, oh_.data, gtf.data, gth.data,
                    gef.data, geh.data, gwf,      gwh,      again.data};
    for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++)
        free(bufs[b]);
out:
    hcomm_moe_handle_free(hf);
    hcomm_moe_handle_free(hh);
    hcomm_moe_handle_free(ha);
    free(x.data);
    free(ids);
    free(w);
}

/* A plan's dispatch takes the automatic path too. */
static void test_plan(const ctx_t *c) {
    hcomm_moe_plan_desc_t d = {.max_tokens_per_rank = 16,
                               .hidden = 3,
                               .k = 2,
                               .num_experts = c->e_all,
                               .dtype = HCOMM_F32};
    hcomm_moe_plan_t *pl = NULL;
    T_OK(hcomm_moe_plan_create(c->g, &d, &pl));
    if (pl == NULL)
        return;
    hcomm_tensor_t x = make2(HCOMM_F32, 5, 3);
    int32_t ids[10];
    for (int i = 0; i < 10; i++)
        ids[i] = id_of(c, c->rank * 100 + i / 2, i % 2, 0);
    for (int i = 0; i < 15; i++)
        t_set_val(HCOMM_F32, x.data, (size_t)i, c->rank * 15 + i);
    hcomm_moe_handle_t *hp = NULL, *hf = NULL;
    hcomm_moe_options_t flat = {0};
    flat.path = HCOMM_MOE_PATH_FLAT;
    T_OK(hcomm_moe_plan_dispatch(pl, &x, ids, NULL, &hp));
    T_OK(hcomm_moe_dispatch_topk(c->g, &x, ids, NULL, 2, c->e_all, &flat, &hf));
    if (hp && hf) {
        hcomm_tensor_t rp, rf;
        hcomm_moe_route_info_t in;
        T_OK(hcomm_moe_received(hp, &rp, NULL));
        T_OK(hcomm_moe_received(hf, &rf, NULL));
        T_OK(hcomm_moe_route_info(hp, &in));
        T_EQ_INT(in.hierarchical, c->nnodes > 1);
        T_CHECK(same(&rp, &rf), "rank %d: the plan's rows differ from the flat dispatch's",
                c->rank);
    }
    /* A NULL handle or plan pointer on rank 0 alone: rank 0 fails with HCOMM_ERR_NULL, the
     * others with HCOMM_ERR_PEER (rank 0 returned at once, and its peers paired with its next
     * call); then every rank goes on. */
    hcomm_result_t want = c->rank == 0 ? HCOMM_ERR_NULL : HCOMM_ERR_PEER, r;
    r = hcomm_moe_plan_dispatch(pl, &x, ids, NULL, c->rank == 0 ? NULL : &hp);
    T_CHECK(r == want, "rank %d: plan_dispatch with a NULL handle on rank 0 gave %s (%s)", c->rank,
            hcomm_result_name(r), hcomm_last_error());
    hcomm_moe_handle_free(hf);
    hf = NULL;
    r = hcomm_moe_dispatch_topk(c->g, &x, ids, NULL, 2, c->e_all, &flat, c->rank == 0 ? NULL : &hf);
    T_CHECK(r == want, "rank %d: dispatch_topk with a NULL handle on rank 0 gave %s (%s)", c->rank,
            hcomm_result_name(r), hcomm_last_error());
    hcomm_moe_plan_t *pl2 = NULL;
    r = hcomm_moe_plan_create(c->g, &d, c->rank == 0 ? NULL : &pl2);
    T_CHECK(r == want && pl2 == NULL,
            "rank %d: plan_create with a NULL plan on rank 0 gave %s (%s)", c->rank,
            hcomm_result_name(r), hcomm_last_error());
    hcomm_moe_plan_free(pl2);
    T_OK(hcomm_moe_plan_dispatch(pl, &x, ids, NULL, &hp));
    hcomm_moe_handle_free(hf);
    hcomm_moe_plan_free(pl);
    free(x.data);
}

static void test_errors(const ctx_t *c) {
    hcomm_tensor_t x = make2(HCOMM_F32, 2, 2);
    int32_t ids[2] = {0, c->e_all - 1};
    hcomm_moe_options_t bad = {0};
    bad.path = (hcomm_moe_path_t)5;
    hcomm_moe_handle_t *hd = NULL;
    hcomm_result_t r =
        hcomm_moe_dispatch_topk(c->g, &x, ids, NULL, 1, c->e_all, c->rank == 0 ? &bad : NULL, &hd);
    hcomm_result_t want = c->rank == 0 ? HCOMM_ERR_INVALID_ARG : HCOMM_ERR_PEER;
    T_CHECK(r == want, "rank %d: bad path on rank 0 gave %s (%s)", c->rank, hcomm_result_name(r),
            hcomm_last_error());
    if (c->p > 1) { /* one rank forcing the other path: a mismatch on all, no hang */
        hcomm_moe_options_t o = {0};
        o.path = c->rank == 0 ? HCOMM_MOE_PATH_HIER : HCOMM_MOE_PATH_FLAT;
        r = hcomm_moe_dispatch_topk(c->g, &x, ids, NULL, 1, c->e_all, &o, &hd);
        T_CHECK(r == HCOMM_ERR_MISMATCH, "rank %d: paths differing by rank gave %s (%s)", c->rank,
                hcomm_result_name(r), hcomm_last_error());
    }
    free(x.data);
}

static hcomm_result_t hier_world(hcomm_comm_t *world, void *arg) {
    const topo_t *tp = arg;
    ctx_t c = {.g = world, .p = t_size(world), .rank = t_rank(world)};
    const char *env = getenv("HCOMM_TOPO"), *spec = tp ? tp->spec : NULL;
    if (tp == NULL && !(env && env[0])) /* mpirun on one host: declare nodes */
        spec = c.p == 2 ? "nodes=2x1" : c.p == 3 ? "nodes=2,1" : c.p == 4 ? "nodes=2x2" : NULL;
    if (spec != NULL)
        T_TRY(hcomm_comm_set_topo(world, spec));
    int nn = 1, node = 0, lr = 0, ls = 1;
    T_TRY(hcomm_comm_node(world, &nn, &node, &lr, &ls));
    c.nnodes = nn;
    /* every rank's node, from each rank's own view */
    int32_t mine = node, all[MAX_RANKS];
    T_TRY(hcomm_all_gather(world, &mine, all, sizeof mine));
    for (int q = 0; q < c.p; q++)
        c.node[q] = all[q];
    hcomm_dtype_t dts[] = {HCOMM_F32, HCOMM_BF16, HCOMM_F64};
    int ks[] = {1, 2, 3, 8};
    int64_t hs[] = {1, 7, 64};
    for (int e = 1; e <= 4; e *= 2) {
        c.e_all = e * c.p;
        for (int q = 0; q < 4; q++)
            for (int v = 0; v < 2; v++) {
                tcase_t tc = {ks[q], hs[(q + v) % 3], dts[(q + v + e) % 3], v, 0};
                run_case(&c, &tc);
            }
    }
    tcase_t capc = {2, 5, HCOMM_F32, 0, 0.75};
    run_case(&c, &capc);
    c.e_all = 2 * c.p;
    test_plan(&c);
    test_errors(&c);
    return HCOMM_OK;
}

int main(void) {
    const char *env = getenv("HCOMM_TOPO");
    bool mpi = strcmp(t_backend(), "mpi") == 0;
    if ((env && env[0]) || mpi) { /* the job's topology: its own size (mpi: the world's) */
        int a = 0, b = 0;
        if (!mpi && sscanf(env, "nodes=%dx%d", &a, &b) != 2)
            a = b = 0; /* launch fails, naming the size */
        T_OK(hcomm_launch(mpi ? "mpi" : "local", mpi ? 0 : a * b, hier_world, NULL));
        return t_finish("test_moe_hier (job topology)");
    }
    topo_t topos[] = {{"nodes=2x2", 2, {2, 2}},       {"nodes=2x4", 2, {4, 4}},
                      {"nodes=4x2", 4, {2, 2, 2, 2}}, {"nodes=3,1,2", 3, {3, 1, 2}},
                      {"nodes=2,1", 2, {2, 1}},       {NULL, 1, {0}}};
    int sizes[] = {4, 8, 8, 6, 3, 4};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        T_OK(hcomm_launch("local", sizes[i], hier_world, &topos[i]));
    return t_finish("test_moe_hier");
}
