/* The shard/replicate split of data parallel (dp = dp_shard x dp_replicate, HSDP): exact group
 * lists for worked examples, a serial reference over random layouts (orders, cp, ep, pp) for
 * world sizes up to 96, every size error naming both numbers, and contexts built over worlds
 * 1..8 whose shard and replicate groups are the planned ones.
 * HCOMM_TEST_MPI: also runs under mpirun -np 2, 3 and 4. */
#include "harness.h"

#include <stdbool.h>

enum { TP, CP, EP, DP, PP, NAXES };
static const char *const axis_name[NAXES] = {"tp", "cp", "ep", "dp", "pp"};

static const char *kind_str(hcomm_group_kind_t kind) {
    const char *name = "?";
    hcomm_group_kind_name(kind, &name);
    return name;
}

static hcomm_parallel_config_t config(int tp, int cp, int dp, int pp, int ep, int dp_shard,
                                      const char *order) {
    hcomm_parallel_config_t c = {tp, pp, dp, cp, ep, 0, 0, order, dp_shard};
    return c;
}

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

/* Worked by hand: rank = tp + tp_size * (cp + ...) with dp index = shard + dp_shard * replica. */
static void test_examples(void) {
    hcomm_parallel_config_t c = config(1, 1, 8, 1, 1, 4, NULL);
    const int s8[8] = {0, 1, 2, 3, 4, 5, 6, 7}, r8[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    expect_groups(&c, 8, HCOMM_GROUP_DP_SHARD, 2, 4, s8);
    expect_groups(&c, 8, HCOMM_GROUP_DP_REPLICATE, 4, 2, r8);
    expect_groups(&c, 8, HCOMM_GROUP_DP, 1, 8, s8); /* the whole dp axis is unchanged */
    /* tp 2: dp index = (rank / 2), shard = its low digit. */
    c = config(2, 1, 4, 1, 1, 2, NULL);
    const int s_tp[8] = {0, 2, 1, 3, 4, 6, 5, 7}, r_tp[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    expect_groups(&c, 8, HCOMM_GROUP_DP_SHARD, 4, 2, s_tp);
    expect_groups(&c, 8, HCOMM_GROUP_DP_REPLICATE, 4, 2, r_tp);
    /* cp 2 (faster than dp): the shard group is dp_shard x cp. */
    c = config(1, 2, 4, 1, 1, 2, "tp-cp-ep-dp-pp");
    expect_groups(&c, 8, HCOMM_GROUP_DP_SHARD, 2, 4, s8);
    expect_groups(&c, 8, HCOMM_GROUP_DP_REPLICATE, 4, 2, r8);
    const int cp8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    expect_groups(&c, 8, HCOMM_GROUP_CP, 4, 2, cp8);
    /* ep 2, dp 8, dp_shard 4: edp 4 keeps the 2 replicas, so experts shard over 2 ranks. */
    c = config(1, 1, 8, 1, 2, 4, NULL);
    const int es[8] = {0, 2, 1, 3, 4, 6, 5, 7}, er[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    expect_groups(&c, 8, HCOMM_GROUP_EDP_SHARD, 4, 2, es);
    expect_groups(&c, 8, HCOMM_GROUP_EDP_REPLICATE, 4, 2, er);
    /* dp_shard 0 is dp: one shard group per dp group, replicate groups of one rank. */
    c = config(2, 1, 0, 2, 1, 0, NULL);
    const int s_def[8] = {0, 2, 1, 3, 4, 6, 5, 7}, one[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    expect_groups(&c, 8, HCOMM_GROUP_DP_SHARD, 4, 2, s_def);
    expect_groups(&c, 8, HCOMM_GROUP_DP_REPLICATE, 8, 1, one);
    hcomm_parallel_config_t res;
    T_OK(hcomm_parallel_config_resolve(&c, 8, &res));
    T_EQ_INT(res.dp_shard, 2);
}

/* ---- serial reference: coordinates by mixed radix, groups as classes of equal coordinates ---- */

#define MAXW 96

typedef struct ref {
    int world, order[NAXES], dense[NAXES], expert[NAXES], dpr;
} ref_t;

/* Coordinates on a grid plus the split dp digit: c[DP] = shard digit, c[NAXES] = replica. */
static void ref_coords(const ref_t *l, const int *sizes, int r, int c[NAXES + 1]) {
    for (int p = 0; p < NAXES; p++) {
        int a = l->order[p];
        c[a] = r % sizes[a];
        r /= sizes[a];
    }
    int shard = sizes[DP] / l->dpr;
    c[NAXES] = c[DP] / shard;
    c[DP] %= shard;
}

/* Groups = ranks equal on every coordinate outside vary (bit NAXES: the replica digit),
 * members ascending, groups by their smallest member (the Megatron order on such grids). */
static int ref_groups(const ref_t *l, bool expert, unsigned vary, int *out, int *gs) {
    int co[MAXW][NAXES + 1], group_of[MAXW], ng = 0, size = 0;
    const int *sizes = expert ? l->expert : l->dense;
    for (int r = 0; r < l->world; r++) {
        ref_coords(l, sizes, r, co[r]);
        group_of[r] = -1;
    }
    for (int r = 0; r < l->world; r++) {
        if (group_of[r] >= 0)
            continue;
        size = 0;
        for (int s = r; s < l->world; s++) {
            bool same = true;
            for (int a = 0; a <= NAXES; a++)
                if (!((vary >> a) & 1u) && co[r][a] != co[s][a])
                    same = false;
            if (same) {
                group_of[s] = ng;
                out[ng * l->world + size++] = s;
            }
        }
        ng++;
    }
    for (int g = 0; g < ng; g++) /* compact [ng][world] rows to [ng][size] */
        memmove(out + g * size, out + g * l->world, sizeof(int) * (size_t)size);
    *gs = size;
    return ng;
}

static unsigned rng = 2024u;
static int rnd(int n) {
    rng = rng * 1103515245u + 12345u;
    return (int)((rng >> 16) % (unsigned)n);
}

static int divisor_of(int n) {
    int d;
    do
        d = 1 + rnd(n);
    while (n % d != 0);
    return d;
}

static void compare_kind(const hcomm_parallel_config_t *c, const ref_t *l, hcomm_group_kind_t kind,
                         bool expert, unsigned vary) {
    static int want[MAXW * MAXW];
    int gs = 0, ng = ref_groups(l, expert, vary, want, &gs);
    expect_groups(c, l->world, kind, ng, gs, want);
}

/* One random layout: sizes whose product is at most MAXW, a random order of all five axes. */
static void random_case(void) {
    int tp = 1 + rnd(3), cp = 1 + rnd(2), pp = 1 + rnd(2), dp = 1 + rnd(8);
    int world = tp * cp * pp * dp, ep = divisor_of(dp * cp), dp_shard = divisor_of(dp);
    int dpr = dp / dp_shard, edp = world / (tp * ep * pp);
    if (edp % dpr != 0)
        return;
    ref_t l = {world, {0}, {tp, cp, 1, dp, pp}, {tp, 1, ep, edp, pp}, dpr};
    char order[32] = "";
    for (int i = 0; i < NAXES; i++)
        l.order[i] = i;
    for (int i = NAXES - 1; i > 0; i--) {
        int j = rnd(i + 1), t = l.order[i];
        l.order[i] = l.order[j];
        l.order[j] = t;
    }
    if (pp > 1) /* Megatron's pipeline checks want pp last when the grids could differ */
        for (int i = 0; i < NAXES - 1; i++)
            if (l.order[i] == PP) {
                l.order[i] = l.order[NAXES - 1];
                l.order[NAXES - 1] = PP;
            }
    for (int i = 0; i < NAXES; i++)
        snprintf(order + strlen(order), sizeof order - strlen(order), "%s%s", i ? "-" : "",
                 axis_name[l.order[i]]);
    hcomm_parallel_config_t c = config(tp, cp, dp, pp, ep, dp_shard, order);
    hcomm_parallel_config_t res;
    if (hcomm_parallel_config_resolve(&c, world, &res) != HCOMM_OK)
        return; /* a pipeline check of the base layout, not this issue's */
    const unsigned rep = 1u << NAXES;
    compare_kind(&c, &l, HCOMM_GROUP_DP_SHARD, false, (1u << DP) | (1u << CP));
    compare_kind(&c, &l, HCOMM_GROUP_DP_REPLICATE, false, rep);
    compare_kind(&c, &l, HCOMM_GROUP_DP, false, (1u << DP) | rep);
    compare_kind(&c, &l, HCOMM_GROUP_DP_CP, false, (1u << DP) | (1u << CP) | rep);
    compare_kind(&c, &l, HCOMM_GROUP_EDP_SHARD, true, 1u << DP);
    compare_kind(&c, &l, HCOMM_GROUP_EDP_REPLICATE, true, rep);
    compare_kind(&c, &l, HCOMM_GROUP_EDP, true, (1u << DP) | rep);
}

static void test_random_against_reference(void) {
    int before = atomic_load(&t_checks);
    for (int i = 0; i < 400; i++)
        random_case();
    T_CHECK(atomic_load(&t_checks) - before > 1000, "only %d checks ran",
            atomic_load(&t_checks) - before);
}

static void expect_invalid(const hcomm_parallel_config_t *c, int world, const char *a,
                           const char *b) {
    hcomm_parallel_config_t res;
    T_ERR(hcomm_parallel_config_resolve(c, world, &res), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), a) && strstr(hcomm_last_error(), b),
            "expected '%s' and '%s' in '%s'", a, b, hcomm_last_error());
}

static void test_bad_sizes(void) {
    hcomm_parallel_config_t c = config(1, 1, 4, 1, 1, 3, NULL);
    expect_invalid(&c, 4, "dp_shard=3", "dp=4");
    c = config(2, 1, 0, 1, 1, 5, NULL);
    expect_invalid(&c, 12, "dp_shard=5", "dp=6");
    c = config(1, 1, 4, 1, 1, 8, NULL);
    expect_invalid(&c, 4, "dp_shard=8", "dp=4");
    c = config(1, 1, 4, 1, 1, -1, NULL);
    expect_invalid(&c, 4, "dp_shard=-1", "negative");
    c = config(1, 1, 4, 1, 4, 2, NULL); /* edp = 1 cannot hold dp_replicate = 2 */
    expect_invalid(&c, 4, "dp_replicate=2", "edp=1");
    hcomm_group_list_t l;
    T_ERR(hcomm_plan_groups(&c, 4, HCOMM_GROUP_DP_SHARD, &l), HCOMM_ERR_INVALID_ARG);
    T_CHECK(l.ranks == NULL && l.num_groups == 0, "a failed plan left a list");
}

/* ---- contexts: the built groups are the planned ones ---- */

static void check_ctx_kind(const hcomm_ctx_t *ctx, const hcomm_parallel_config_t *c, int n,
                           int rank, hcomm_group_kind_t kind) {
    hcomm_group_list_t l;
    T_OK(hcomm_plan_groups(c, n, kind, &l));
    hcomm_comm_t *g = NULL;
    T_OK(hcomm_ctx_group(ctx, kind, &g));
    int members[8] = {0}, size = 0;
    T_OK(hcomm_comm_size(g, &size));
    T_OK(hcomm_comm_members(g, members, 8));
    bool found = false;
    for (int gi = 0; gi < l.num_groups && size == l.group_size; gi++) {
        const int *want = l.ranks + gi * l.group_size;
        if (memcmp(want, members, sizeof(int) * (size_t)size) == 0)
            found = true;
    }
    T_CHECK(found, "rank %d: its %s group of %d is not a planned one", rank, kind_str(kind), size);
    int64_t sum = rank, want_sum = 0;
    for (int m = 0; m < size; m++)
        want_sum += members[m];
    T_OK(hcomm_all_reduce(g, &sum, &sum, 1, HCOMM_I64, HCOMM_SUM));
    T_CHECK(sum == want_sum, "%s: sum %lld, expected %lld", kind_str(kind), (long long)sum,
            (long long)want_sum);
    hcomm_group_list_free(&l);
}

static void check_ctx(hcomm_comm_t *world, int n, int rank, const hcomm_parallel_config_t *c) {
    hcomm_ctx_t *ctx = NULL;
    hcomm_result_t r = hcomm_ctx_create(world, c, &ctx);
    T_CHECK(r == HCOMM_OK, "world %d tp %d dp %d dp_shard %d: %s", n, c->tp, c->dp, c->dp_shard,
            hcomm_last_error());
    if (r != HCOMM_OK)
        return;
    const hcomm_group_kind_t kinds[] = {HCOMM_GROUP_DP_SHARD, HCOMM_GROUP_DP_REPLICATE,
                                        HCOMM_GROUP_EDP_SHARD, HCOMM_GROUP_EDP_REPLICATE};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        check_ctx_kind(ctx, c, n, rank, kinds[k]);
    hcomm_parallel_config_t got;
    T_OK(hcomm_ctx_config(ctx, &got));
    T_EQ_INT(got.dp_shard, c->dp_shard ? c->dp_shard : got.dp);
    int sr = -1, ss = 0, rr = -1, rs = 0, dr = -1, ds = 0;
    T_OK(hcomm_ctx_rank(ctx, HCOMM_GROUP_DP_SHARD, &sr, &ss));
    T_OK(hcomm_ctx_rank(ctx, HCOMM_GROUP_DP_REPLICATE, &rr, &rs));
    T_OK(hcomm_ctx_rank(ctx, HCOMM_GROUP_DP, &dr, &ds));
    T_EQ_INT(ss, got.dp_shard * got.cp); /* Megatron's DP x CP */
    T_EQ_INT(rs, got.dp / got.dp_shard);
    if (got.cp == 1) {
        T_EQ_INT(dr, sr + ss * rr); /* shard index innermost */
        T_EQ_INT(ds, ss * rs);
    }
    T_OK(hcomm_ctx_destroy(ctx));
}

static hcomm_result_t ctx_rank(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int n = t_size(world), rank = t_rank(world);
    for (int tp = 1; tp <= 2; tp++)
        for (int ds = 0; ds <= n / tp; ds++) {
            if (n % tp != 0 || (ds > 0 && (n / tp) % ds != 0))
                continue;
            hcomm_parallel_config_t c = config(tp, 1, 0, 1, 1, ds, NULL);
            check_ctx(world, n, rank, &c);
            if (n % 2 == 0 && ds > 0 && ds % 2 == 0 && tp == 1) { /* with ep 2 and with cp 2 */
                c = config(1, 1, 0, 1, 2, ds, NULL);
                check_ctx(world, n, rank, &c);
                c = config(1, 2, n / 2, 1, 1, ds / 2, NULL);
                check_ctx(world, n, rank, &c);
            }
        }
    if (n > 1) { /* dp_shard differs across ranks: every rank fails, nobody waits */
        hcomm_ctx_t *ctx = NULL;
        hcomm_parallel_config_t c = config(1, 1, 0, 1, 1, rank == 0 ? 1 : n, NULL);
        T_ERR(hcomm_ctx_create(world, &c, &ctx), HCOMM_ERR_MISMATCH);
        T_CHECK(strstr(hcomm_last_error(), "dp_shard") != NULL, "got '%s'", hcomm_last_error());
        T_CHECK(ctx == NULL, "failed create left *out set");
    }
    return HCOMM_OK;
}

int main(void) {
    if (strcmp(t_backend(), "local") == 0) { /* no communication: once is enough */
        test_examples();
        test_random_against_reference();
        test_bad_sizes();
    }
    t_for_each_world(ctx_rank, NULL, 8);
    return t_finish("test_zero_domain");
}
