/* The Megatron-Core rank layout (hcomm_plan_groups, hcomm_parallel_config_resolve): exact
 * group lists for worked examples, a brute-force reference over many random configurations,
 * every validation error, and the O(world) cost at 65,536 ranks. No communication. */
#include "harness.h"

#include <stdbool.h>
#include <time.h>

enum { TP, CP, EP, DP, PP, NAXES };
static const char *const axis_name[NAXES] = {"tp", "cp", "ep", "dp", "pp"};

static hcomm_parallel_config_t config(int tp, int pp, int dp, int cp, int ep, int etp,
                                      const char *order) {
    hcomm_parallel_config_t c = {tp, pp, dp, cp, ep, etp, 0, order};
    return c;
}

static const char *kind_str(hcomm_group_kind_t kind) {
    const char *name = "?";
    hcomm_group_kind_name(kind, &name);
    return name;
}

/* Expects the groups of kind to be exactly want[num_groups][group_size]. */
static void expect_groups(const hcomm_parallel_config_t *c, int world, hcomm_group_kind_t kind,
                          int num_groups, int group_size, const int *want) {
    hcomm_group_list_t got;
    hcomm_result_t r = hcomm_plan_groups(c, world, kind, &got);
    T_CHECK(r == HCOMM_OK, "plan %s (world %d): %s", kind_str(kind), world, hcomm_last_error());
    if (r != HCOMM_OK)
        return;
    T_CHECK(got.num_groups == num_groups && got.group_size == group_size,
            "%s: got %d groups of %d, expected %d of %d", kind_str(kind), got.num_groups,
            got.group_size, num_groups, group_size);
    if (got.num_groups == num_groups && got.group_size == group_size)
        for (int i = 0; i < num_groups * group_size; i++)
            if (got.ranks[i] != want[i]) {
                T_CHECK(0, "%s: group %d member %d is %d, expected %d", kind_str(kind),
                        i / group_size, i % group_size, got.ranks[i], want[i]);
                break;
            }
    hcomm_group_list_free(&got);
}

/* Groups of one rank each, in rank order (the kind of a size-1 axis). */
static void expect_singletons(const hcomm_parallel_config_t *c, int world,
                              hcomm_group_kind_t kind) {
    int want[64];
    for (int r = 0; r < world; r++)
        want[r] = r;
    expect_groups(c, world, kind, world, 1, want);
}

/* The example: world 32, tp 4, pp 2, dp 4, default order tp-cp-ep-dp-pp. */
static void test_brief_example(void) {
    hcomm_parallel_config_t c = config(4, 2, 4, 0, 0, 0, NULL);
    int tp[32], pp[32], tp_pp[32], emb[32];
    for (int r = 0; r < 32; r++)
        tp[r] = r;
    for (int g = 0; g < 16; g++) {
        pp[2 * g] = emb[2 * g] = g;
        pp[2 * g + 1] = emb[2 * g + 1] = g + 16;
    }
    for (int g = 0; g < 4; g++)
        for (int m = 0; m < 8; m++)
            tp_pp[8 * g + m] = 4 * g + (m % 4) + 16 * (m / 4);
    const int dp[32] = {0,  4,  8,  12, 1,  5,  9,  13, 2,  6,  10, 14, 3,  7,  11, 15,
                        16, 20, 24, 28, 17, 21, 25, 29, 18, 22, 26, 30, 19, 23, 27, 31};
    expect_groups(&c, 32, HCOMM_GROUP_TP, 8, 4, tp);
    expect_groups(&c, 32, HCOMM_GROUP_DP, 8, 4, dp);
    expect_groups(&c, 32, HCOMM_GROUP_PP, 16, 2, pp);
    expect_groups(&c, 32, HCOMM_GROUP_DP_CP, 8, 4, dp);
    expect_groups(&c, 32, HCOMM_GROUP_TP_PP, 4, 8, tp_pp);
    expect_groups(&c, 32, HCOMM_GROUP_EMBEDDING, 16, 2, emb);
    expect_singletons(&c, 32, HCOMM_GROUP_CP);
    expect_singletons(&c, 32, HCOMM_GROUP_EP);
    expect_groups(&c, 32, HCOMM_GROUP_ETP, 8, 4, tp); /* etp defaults to tp */
    expect_groups(&c, 32, HCOMM_GROUP_EDP, 8, 4, dp); /* edp = 32/(4*1*2) = dp */
    /* Spelling out the default order, or leaving its size-1 axes out, changes nothing. */
    hcomm_parallel_config_t c2 = config(4, 2, 0, 1, 1, 4, "tp-dp-pp");
    expect_groups(&c2, 32, HCOMM_GROUP_DP, 8, 4, dp);
    expect_groups(&c2, 32, HCOMM_GROUP_PP, 16, 2, pp);
}

/* Megatron's initialize_model_parallel docstring: 16 GPUs, tp 2, pp 4 (so dp 2). */
static void test_megatron_docstring_example(void) {
    hcomm_parallel_config_t c = config(2, 4, 0, 0, 0, 0, NULL);
    const int dp[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    const int tp[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const int pp[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    const int emb[8] = {0, 12, 1, 13, 2, 14, 3, 15};
    expect_groups(&c, 16, HCOMM_GROUP_DP, 8, 2, dp);
    expect_groups(&c, 16, HCOMM_GROUP_TP, 8, 2, tp);
    expect_groups(&c, 16, HCOMM_GROUP_PP, 4, 4, pp);
    expect_groups(&c, 16, HCOMM_GROUP_EMBEDDING, 4, 2, emb);
}

/* generate_masked_orthogonal_rank_groups docstring: sizes [tp, dp, pp] = [2, 3, 4], order
 * tp-dp-pp: dp_group[0] = [0, 2, 4], dp_group[1] = [1, 3, 5], dp_group[7] = [19, 21, 23]. */
static void test_megatron_masked_example(void) {
    hcomm_parallel_config_t c = config(2, 4, 3, 1, 1, 0, "tp-dp-pp");
    int dp[24];
    for (int g = 0; g < 8; g++)
        for (int m = 0; m < 3; m++)
            dp[3 * g + m] = (g % 2) + 2 * m + 6 * (g / 2);
    T_EQ_INT(dp[3], 1);
    T_EQ_INT(dp[23], 23);
    T_EQ_INT(dp[21], 19);
    expect_groups(&c, 24, HCOMM_GROUP_DP, 8, 3, dp);
}

/* Order tp-pp-dp puts the pipeline inside the data-parallel replicas. */
static void test_order_tp_pp_dp(void) {
    hcomm_parallel_config_t c = config(2, 2, 4, 0, 0, 0, "tp-pp-dp");
    const int pp[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    const int dp[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    int tp_pp[16], tp[16];
    for (int r = 0; r < 16; r++)
        tp_pp[r] = tp[r] = r;
    expect_groups(&c, 16, HCOMM_GROUP_PP, 8, 2, pp);
    expect_groups(&c, 16, HCOMM_GROUP_DP, 4, 4, dp);
    expect_groups(&c, 16, HCOMM_GROUP_TP_PP, 4, 4, tp_pp);
    expect_groups(&c, 16, HCOMM_GROUP_TP, 8, 2, tp);
    expect_groups(&c, 16, HCOMM_GROUP_EDP, 4, 4, dp);
}

/* cp > 1 and ep > 1 with etp 1 != tp 2: world 16 = tp 2 * cp 2 * dp 2 * pp 2; the expert
 * grid is (etp 1, ep 2, edp 4, pp 2), so rank = ep + 2 * edp + 8 * pp there. */
static void test_cp_ep_etp(void) {
    hcomm_parallel_config_t c = config(2, 2, 2, 2, 2, 1, NULL);
    const int cp[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    const int dp[16] = {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15};
    const int dp_cp[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
    const int tp_pp[16] = {0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15};
    const int pp[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};
    int pairs[16];
    for (int r = 0; r < 16; r++)
        pairs[r] = r;
    expect_groups(&c, 16, HCOMM_GROUP_TP, 8, 2, pairs);
    expect_groups(&c, 16, HCOMM_GROUP_CP, 8, 2, cp);
    expect_groups(&c, 16, HCOMM_GROUP_DP, 8, 2, dp);
    expect_groups(&c, 16, HCOMM_GROUP_DP_CP, 4, 4, dp_cp);
    expect_groups(&c, 16, HCOMM_GROUP_TP_PP, 4, 4, tp_pp);
    expect_groups(&c, 16, HCOMM_GROUP_PP, 8, 2, pp);
    expect_groups(&c, 16, HCOMM_GROUP_EP, 8, 2, pairs);
    expect_singletons(&c, 16, HCOMM_GROUP_ETP);
    expect_groups(&c, 16, HCOMM_GROUP_EDP, 4, 4, dp_cp);
}

/* etp 2 > tp 1: expert grid (etp 2, ep 2, edp 2, pp 2), rank = etp + 2ep + 4edp + 8pp. */
static void test_etp_above_tp(void) {
    hcomm_parallel_config_t c = config(1, 2, 0, 0, 2, 2, NULL);
    int etp[16], dp[16];
    for (int r = 0; r < 16; r++)
        etp[r] = dp[r] = r;
    const int ep[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    const int edp[16] = {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15};
    expect_groups(&c, 16, HCOMM_GROUP_DP, 2, 8, dp);
    expect_groups(&c, 16, HCOMM_GROUP_ETP, 8, 2, etp);
    expect_groups(&c, 16, HCOMM_GROUP_EP, 8, 2, ep);
    expect_groups(&c, 16, HCOMM_GROUP_EDP, 8, 2, edp);
    expect_singletons(&c, 16, HCOMM_GROUP_TP);
}

/* pp == 1: each rank is its own pipeline and its own embedding group. */
static void test_embedding_without_pipeline(void) {
    hcomm_parallel_config_t c = config(2, 1, 0, 0, 0, 0, NULL);
    expect_singletons(&c, 6, HCOMM_GROUP_EMBEDDING);
    expect_singletons(&c, 6, HCOMM_GROUP_PP);
}

/* ---- brute-force reference: coordinates per rank, groups by comparing coordinates ---- */

#define REF_MAXW 128

typedef struct ref_layout {
    int world;
    int order[NAXES]; /* axis at each position, fastest first; omitted axes at the end */
    int ngiven;       /* axes the order string names */
    int dense[NAXES], expert[NAXES]; /* sizes by axis */
} ref_layout_t;

static void ref_coords(const ref_layout_t *l, const int *sizes, int r, int c[NAXES]) {
    for (int p = 0; p < NAXES; p++) {
        int a = l->order[p];
        c[a] = r % sizes[a];
        r /= sizes[a];
    }
}

/* Compares coordinates on the axes in (masked) or out of (!masked) mask, slowest axis
 * first, so that sorting counts them with the first axis of the order fastest. */
static int ref_cmp(const ref_layout_t *l, const int *ca, const int *cb, unsigned mask,
                   bool masked) {
    for (int p = NAXES - 1; p >= 0; p--) {
        int a = l->order[p];
        if ((((mask >> a) & 1u) != 0) != masked || ca[a] == cb[a])
            continue;
        return ca[a] < cb[a] ? -1 : 1;
    }
    return 0;
}

/* All groups of mask on a grid: group = ranks equal on every other axis; members sorted by
 * the masked coordinates, groups by the others (insertion sorts; worlds are small). */
static int ref_groups(const ref_layout_t *l, const int *sizes, unsigned mask, int *out,
                      int *group_size) {
    static int co[REF_MAXW][NAXES];
    bool taken[REF_MAXW] = {false};
    int n = l->world, ngroups = 0, gs = 0;
    for (int r = 0; r < n; r++)
        ref_coords(l, sizes, r, co[r]);
    for (int r = 0; r < n; r++) {
        if (taken[r])
            continue;
        int *g = out + ngroups * n, len = 0; /* room for n members per group while building */
        for (int s = 0; s < n; s++)
            if (ref_cmp(l, co[r], co[s], mask, false) == 0) {
                taken[s] = true;
                int i = len++;
                for (; i > 0 && ref_cmp(l, co[g[i - 1]], co[s], mask, true) > 0; i--)
                    g[i] = g[i - 1];
                g[i] = s;
            }
        gs = len;
        ngroups++;
    }
    /* Compact to [ngroups][gs] and order groups by their other coordinates. */
    static int tmp[REF_MAXW * REF_MAXW];
    for (int gi = 0; gi < ngroups; gi++) {
        int i = gi;
        for (; i > 0 && ref_cmp(l, co[tmp[(i - 1) * gs]], co[out[gi * n]], mask, false) > 0; i--)
            memcpy(tmp + i * gs, tmp + (i - 1) * gs, sizeof(int) * (size_t)gs);
        memcpy(tmp + i * gs, out + gi * n, sizeof(int) * (size_t)gs);
    }
    memcpy(out, tmp, sizeof(int) * (size_t)(ngroups * gs));
    *group_size = gs;
    return ngroups;
}

static const struct {
    bool expert;
    unsigned mask;
} ref_kind[HCOMM_GROUP_COUNT] = {
    [HCOMM_GROUP_TP] = {false, 1u << TP},
    [HCOMM_GROUP_PP] = {false, 1u << PP},
    [HCOMM_GROUP_DP] = {false, 1u << DP},
    [HCOMM_GROUP_CP] = {false, 1u << CP},
    [HCOMM_GROUP_DP_CP] = {false, (1u << DP) | (1u << CP)},
    [HCOMM_GROUP_TP_PP] = {false, (1u << TP) | (1u << PP)},
    [HCOMM_GROUP_EP] = {true, 1u << EP},
    [HCOMM_GROUP_ETP] = {true, 1u << TP},
    [HCOMM_GROUP_EDP] = {true, 1u << DP},
    [HCOMM_GROUP_EMBEDDING] = {false, 1u << PP},
    /* dp_shard defaults to dp: no replicas (test_zero_domain covers HSDP layouts) */
    [HCOMM_GROUP_DP_SHARD] = {false, (1u << DP) | (1u << CP)},
    [HCOMM_GROUP_DP_REPLICATE] = {false, 0},
    [HCOMM_GROUP_EDP_SHARD] = {true, 1u << DP},
    [HCOMM_GROUP_EDP_REPLICATE] = {true, 0},
};

/* Groups of kind by brute force; embedding keeps the first and last of each pipeline. */
static int ref_kind_groups(const ref_layout_t *l, hcomm_group_kind_t kind, int *out, int *gs) {
    const int *sizes = ref_kind[kind].expert ? l->expert : l->dense;
    int ng = ref_groups(l, sizes, ref_kind[kind].mask, out, gs);
    if (kind != HCOMM_GROUP_EMBEDDING || *gs == 1)
        return ng;
    for (int g = 0; g < ng; g++) {
        int first = out[g * *gs], last = out[g * *gs + *gs - 1];
        out[2 * g] = first;
        out[2 * g + 1] = last;
    }
    *gs = 2;
    return ng;
}

/* Megatron's rules, checked the slow way: omitted axes have size 1 on both grids, the expert
 * grid divides the world, dense and expert pipelines are the same groups, and an order not
 * ending in pp keeps edp == dp. */
static bool ref_valid(const ref_layout_t *l, int etp, int ep, int pp, int dp, int experts) {
    for (int p = l->ngiven; p < NAXES; p++)
        if (l->dense[l->order[p]] > 1 || l->expert[l->order[p]] > 1)
            return false;
    if (l->world % (etp * ep * pp) != 0 || experts % ep != 0)
        return false;
    if (l->order[l->ngiven - 1] != PP && pp > 1 && l->expert[DP] != dp)
        return false;
    static int a[REF_MAXW * REF_MAXW], b[REF_MAXW * REF_MAXW];
    int gsa = 0, gsb = 0;
    int na = ref_groups(l, l->dense, 1u << PP, a, &gsa);
    int nb = ref_groups(l, l->expert, 1u << PP, b, &gsb);
    return na == nb && gsa == gsb && memcmp(a, b, sizeof(int) * (size_t)(na * gsa)) == 0;
}

static unsigned rng_state = 12345u;
static int rnd(int n) { /* 0..n-1, a fixed LCG so failures reproduce */
    rng_state = rng_state * 1103515245u + 12345u;
    return (int)((rng_state >> 16) % (unsigned)n);
}

/* A random order: a permutation of the axes, dropping size-1 axes at random and, rarely,
 * an axis of size > 1 (which must then be rejected). */
static void random_order(ref_layout_t *l, char *text) {
    int perm[NAXES] = {TP, CP, EP, DP, PP}, kept[NAXES], dropped[NAXES], nk = 0, nd = 0;
    for (int i = NAXES - 1; i > 0; i--) {
        int j = rnd(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < NAXES; i++) {
        int a = perm[i];
        bool unit = l->dense[a] == 1 && l->expert[a] == 1;
        bool drop = unit ? rnd(2) == 0 : rnd(25) == 0;
        if (drop && !(i == NAXES - 1 && nk == 0))
            dropped[nd++] = a;
        else
            kept[nk++] = a;
    }
    text[0] = '\0';
    for (int i = 0; i < nk; i++) {
        strcat(text, i ? "-" : "");
        strcat(text, axis_name[kept[i]]);
        l->order[i] = kept[i];
    }
    for (int i = 0; i < nd; i++)
        l->order[nk + i] = dropped[i];
    l->ngiven = nk;
}

static void compare_with_reference(const hcomm_parallel_config_t *c, const ref_layout_t *l) {
    static int want[REF_MAXW * REF_MAXW];
    for (int k = 0; k < HCOMM_GROUP_COUNT; k++) {
        int gs = 0, ng = ref_kind_groups(l, (hcomm_group_kind_t)k, want, &gs);
        int before = atomic_load(&t_failures);
        expect_groups(c, l->world, (hcomm_group_kind_t)k, ng, gs, want);
        if (atomic_load(&t_failures) != before)
            fprintf(stderr, "  config: world %d tp %d pp %d dp %d cp %d ep %d etp %d order %s\n",
                    l->world, c->tp, c->pp, c->dp, c->cp, c->ep, c->etp, c->order);
    }
}

static void test_random_against_reference(void) {
    int valid = 0, invalid = 0;
    for (int iter = 0; iter < 5000; iter++) {
        int tp = 1 + rnd(5), cp = 1 + rnd(3), dp = 1 + rnd(5), pp = 1 + rnd(4);
        int world = tp * cp * dp * pp;
        if (world > REF_MAXW)
            continue;
        int ep = 1 + rnd(4), etp_arg = rnd(4), etp = etp_arg ? etp_arg : tp;
        int experts = rnd(4) == 0 ? 1 + rnd(12) : 0;
        ref_layout_t l = {world, {0}, 0, {tp, cp, 1, dp, pp}, {etp, 1, ep, 0, pp}};
        l.expert[DP] = world % (etp * ep * pp) == 0 ? world / (etp * ep * pp) : 1;
        char order[32];
        random_order(&l, order);
        hcomm_parallel_config_t c = config(tp, pp, rnd(2) ? dp : 0, cp, ep, etp_arg, order);
        c.num_experts = experts;
        hcomm_parallel_config_t res;
        if (!ref_valid(&l, etp, ep, pp, dp, experts)) {
            invalid++;
            T_ERR(hcomm_parallel_config_resolve(&c, world, &res), HCOMM_ERR_INVALID_ARG);
            continue;
        }
        valid++;
        T_OK(hcomm_parallel_config_resolve(&c, world, &res));
        T_CHECK(res.dp == dp && res.etp == etp && res.order == c.order,
                "resolve: dp %d (want %d), etp %d (want %d)", res.dp, dp, res.etp, etp);
        compare_with_reference(&c, &l);
    }
    T_CHECK(valid >= 800 && invalid >= 300, "only %d valid and %d invalid configs tried", valid,
            invalid);
}

/* ---- validation ---- */

/* Expects HCOMM_ERR_INVALID_ARG whose message contains each of the given fragments. */
static void expect_invalid(const hcomm_parallel_config_t *c, int world, const char *frag1,
                           const char *frag2) {
    hcomm_parallel_config_t res;
    hcomm_group_list_t list;
    T_ERR(hcomm_parallel_config_resolve(c, world, &res), HCOMM_ERR_INVALID_ARG);
    const char *msg = hcomm_last_error();
    T_CHECK(strstr(msg, "hcomm_parallel_config_resolve") && strstr(msg, frag1) &&
                (!frag2 || strstr(msg, frag2)),
            "message '%s' lacks '%s' / '%s'", msg, frag1, frag2 ? frag2 : "");
    T_ERR(hcomm_plan_groups(c, world, HCOMM_GROUP_TP, &list), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), "hcomm_plan_groups") != NULL, "got '%s'",
            hcomm_last_error());
    T_CHECK(list.ranks == NULL && list.num_groups == 0, "failed plan left a list behind");
}

static void test_validation_errors(void) {
    hcomm_parallel_config_t c = config(0, 0, 0, 0, 0, 0, NULL);
    expect_invalid(&c, 0, "world_size=0", NULL);
    expect_invalid(&c, -3, "world_size=-3", NULL);
    const char *const names[] = {"tp=-1", "pp=-1", "dp=-1", "cp=-1", "ep=-1", "etp=-1"};
    for (int f = 0; f < 6; f++) {
        int v[6] = {0, 0, 0, 0, 0, 0};
        v[f] = -1;
        c = config(v[0], v[1], v[2], v[3], v[4], v[5], NULL);
        expect_invalid(&c, 8, names[f], "negative");
    }
    c = config(0, 0, 0, 0, 0, 0, NULL);
    c.num_experts = -4;
    expect_invalid(&c, 8, "num_experts=-4", NULL);

    c = config(2, 2, 2, 0, 0, 0, NULL);
    expect_invalid(&c, 16, "= 8 does not equal world_size=16", "2*1*2*2");
    c = config(4, 0, 0, 0, 0, 0, NULL);
    expect_invalid(&c, 6, "world_size=6", "tp*pp*cp=4");
    c = config(4, 2, 0, 0, 0, 0, NULL);
    expect_invalid(&c, 2, "world_size=2", "tp*pp*cp=8");
    c = config(65536, 65536, 65536, 65536, 0, 0, NULL); /* product overflows 64 bits */
    expect_invalid(&c, 16, "world_size=16", NULL);

    c = config(2, 2, 0, 0, 0, 0, "tp-xx-pp");
    expect_invalid(&c, 8, "unknown axis 'xx'", "tp-xx-pp");
    c.order = "";
    expect_invalid(&c, 8, "unknown axis ''", NULL);
    c.order = "tp-dp-pp-";
    expect_invalid(&c, 8, "unknown axis ''", NULL);
    c.order = "TP-dp-pp";
    expect_invalid(&c, 8, "unknown axis 'TP'", NULL);
    c.order = "tp-dp-tp-pp";
    expect_invalid(&c, 8, "'tp' twice", NULL);
    c.order = "tp-dp";
    expect_invalid(&c, 8, "pp=2 > 1", "missing from order=\"tp-dp\"");

    c = config(2, 1, 4, 0, 2, 0, "tp-dp-pp"); /* ep > 1 must appear in the order */
    expect_invalid(&c, 8, "ep=2 > 1", "'ep'");
    c = config(1, 1, 4, 0, 0, 2, "dp"); /* etp > 1 needs the tp axis */
    expect_invalid(&c, 4, "etp=2 > 1", "'tp'");
    c = config(4, 2, 1, 0, 0, 2, "tp-pp"); /* edp = 8/(2*1*2) = 2 needs the dp axis */
    expect_invalid(&c, 8, "edp=2 > 1", "'dp'");

    c = config(2, 2, 2, 0, 2, 0, NULL);
    c.num_experts = 3;
    expect_invalid(&c, 8, "num_experts=3", "ep=2");
    c = config(2, 2, 2, 0, 3, 0, NULL);
    expect_invalid(&c, 8, "etp*ep*pp=12", "world_size=8");
    /* Order tp-pp-dp with edp 4 != dp 2: Megatron requires pp last or equal dp sizes. */
    c = config(2, 2, 2, 0, 0, 1, "tp-pp-dp");
    expect_invalid(&c, 8, "edp=4", "dp=2");
    /* edp == dp but pp sits after 4 dense ranks (tp*cp) and 2 expert ranks (etp). */
    c = config(2, 2, 2, 2, 2, 2, "tp-cp-pp-ep-dp");
    expect_invalid(&c, 16, "pipeline groups", "span 4");
}

static void test_resolve_defaults_and_api_errors(void) {
    hcomm_parallel_config_t c = config(0, 0, 0, 0, 0, 0, NULL), r;
    T_OK(hcomm_parallel_config_resolve(&c, 8, &r));
    T_CHECK(r.tp == 1 && r.pp == 1 && r.cp == 1 && r.ep == 1 && r.etp == 1 && r.dp == 8,
            "defaults: tp %d pp %d cp %d ep %d etp %d dp %d", r.tp, r.pp, r.cp, r.ep, r.etp, r.dp);
    T_CHECK(r.order && strcmp(r.order, "tp-cp-ep-dp-pp") == 0, "default order '%s'",
            r.order ? r.order : "(null)");
    c = config(2, 0, 0, 2, 0, 0, "dp-cp-tp");
    T_OK(hcomm_parallel_config_resolve(&c, 12, &r));
    T_CHECK(r.etp == 2 && r.dp == 3 && r.order == c.order, "etp %d dp %d", r.etp, r.dp);

    hcomm_group_list_t list = {3, 3, NULL};
    T_ERR(hcomm_parallel_config_resolve(NULL, 8, &r), HCOMM_ERR_NULL);
    T_ERR(hcomm_parallel_config_resolve(&c, 12, NULL), HCOMM_ERR_NULL);
    T_ERR(hcomm_plan_groups(NULL, 8, HCOMM_GROUP_TP, &list), HCOMM_ERR_NULL);
    T_CHECK(list.num_groups == 0 && list.ranks == NULL, "list not cleared on error");
    T_ERR(hcomm_plan_groups(&c, 12, HCOMM_GROUP_TP, NULL), HCOMM_ERR_NULL);
    T_ERR(hcomm_plan_groups(&c, 12, (hcomm_group_kind_t)99, &list), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), "kind=99") != NULL, "got '%s'", hcomm_last_error());
    T_ERR(hcomm_plan_groups(&c, 12, (hcomm_group_kind_t)-1, &list), HCOMM_ERR_INVALID_ARG);
    T_OK(hcomm_group_list_free(NULL));
    T_OK(hcomm_group_list_free(&list));

    const char *const want[HCOMM_GROUP_COUNT] = {
        "tp",  "pp",  "dp",        "cp",       "dp_cp",        "tp_pp",     "ep",
        "etp", "edp", "embedding", "dp_shard", "dp_replicate", "edp_shard", "edp_replicate"};
    for (int k = 0; k < HCOMM_GROUP_COUNT; k++) {
        const char *name = NULL;
        T_OK(hcomm_group_kind_name((hcomm_group_kind_t)k, &name));
        T_CHECK(name && strcmp(name, want[k]) == 0, "kind %d is '%s'", k, name ? name : "");
    }
    const char *name = NULL;
    T_ERR(hcomm_group_kind_name(HCOMM_GROUP_COUNT, &name), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_group_kind_name(HCOMM_GROUP_TP, NULL), HCOMM_ERR_NULL);
}

/* 65,536 ranks: every kind well under a second in total, and spot values by arithmetic. */
static void test_large_world_is_linear(void) {
    hcomm_parallel_config_t c = config(8, 4, 0, 2, 4, 2, NULL); /* dp 1024, edp 2048 */
    clock_t t0 = clock();
    for (int k = 0; k < HCOMM_GROUP_COUNT; k++) {
        hcomm_group_list_t l;
        T_OK(hcomm_plan_groups(&c, 65536, (hcomm_group_kind_t)k, &l));
        if (k == HCOMM_GROUP_DP) { /* rank = tp + 8cp + 16dp + 16384pp */
            T_EQ_INT(l.group_size, 1024);
            T_EQ_INT(l.num_groups, 64);
            T_EQ_INT(l.ranks[(size_t)17 * 1024 + 5], 1 + 16 * 5 + 16384 * 1);
        }
        if (k == HCOMM_GROUP_EDP) { /* expert rank = etp + 2ep + 8edp + 16384pp */
            T_EQ_INT(l.group_size, 2048);
            T_EQ_INT(l.ranks[(size_t)31 * 2048 + 3], 1 + 2 * 3 + 8 * 3 + 16384 * 3);
        }
        hcomm_group_list_free(&l);
    }
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    T_CHECK(s < 1.0, "planning 10 kinds at world 65536 took %.3f s", s);
}

int main(void) {
    test_brief_example();
    test_megatron_docstring_example();
    test_megatron_masked_example();
    test_order_tp_pp_dp();
    test_cp_ep_etp();
    test_etp_above_tp();
    test_embedding_without_pipeline();
    test_random_against_reference();
    test_validation_errors();
    test_resolve_defaults_and_api_errors();
    test_large_world_is_linear();
    return t_finish("test_rankgen");
}
