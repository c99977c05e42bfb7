/* The domain manager (hcomm_ctx_*): for every factorization of the world into tp/pp/dp, and
 * some with cp, ep and other orders, each group built by hcomm_ctx_create() has the members
 * and member order hcomm_plan_groups() lists, and an all-reduce of world ranks over it sums
 * its members; plus pipeline neighbours, embedding membership and error handling.
 * HCOMM_TEST_MPI: also runs under mpirun -np 2, 3 and 4. */
#include "harness.h"

#include <stdbool.h>

#define MAX_CASES 256

typedef struct plan_case {
    hcomm_parallel_config_t cfg;
} plan_case_t;

static const char *kind_str(hcomm_group_kind_t kind) {
    const char *name = "?";
    hcomm_group_kind_name(kind, &name);
    return name;
}

static void add_case(plan_case_t *cases, int *n, int tp, int pp, int dp, int cp, int ep, int etp,
                     const char *order) {
    if (*n < MAX_CASES)
        cases[(*n)++].cfg = (hcomm_parallel_config_t){tp, pp, dp, cp, ep, etp, 0, order};
}

/* Every tp * pp * dp = world (default order and a pp-inside order), every split with cp > 1,
 * and expert parallelism with etp = tp and etp = 1. */
static int make_cases(int world, plan_case_t *cases) {
    int n = 0;
    for (int tp = 1; tp <= world; tp++)
        for (int pp = 1; tp * pp <= world; pp++) {
            if (world % (tp * pp) != 0)
                continue;
            int dp = world / (tp * pp);
            add_case(cases, &n, tp, pp, dp, 1, 1, 0, NULL);
            add_case(cases, &n, tp, pp, 0, 1, 1, 0, "pp-dp-tp");
            for (int cp = 2; cp <= dp; cp++)
                if (dp % cp == 0)
                    add_case(cases, &n, tp, pp, dp / cp, cp, 1, 0, "tp-cp-dp-pp");
            for (int ep = 2; ep <= dp; ep++)
                if (dp % ep == 0)
                    add_case(cases, &n, tp, pp, dp, 1, ep, 0, NULL);
            for (int ep = 2; ep <= dp * tp; ep++)
                if ((dp * tp) % ep == 0)
                    add_case(cases, &n, tp, pp, dp, 1, ep, 1, "tp-cp-ep-dp-pp");
        }
    return n;
}

/* The planned group holding rank: its index in list, position in *pos; -1 if none. */
static int find_group(const hcomm_group_list_t *l, int rank, int *pos) {
    for (int g = 0; g < l->num_groups; g++)
        for (int m = 0; m < l->group_size; m++)
            if (l->ranks[(size_t)g * (size_t)l->group_size + (size_t)m] == rank) {
                *pos = m;
                return g;
            }
    *pos = -1;
    return -1;
}

/* One kind: membership, order, rank, and a sum over the group equal to its members' sum. */
static void check_kind(const hcomm_ctx_t *ctx, const hcomm_parallel_config_t *cfg, int world,
                       int rank, hcomm_group_kind_t kind) {
    hcomm_group_list_t l;
    T_OK(hcomm_plan_groups(cfg, world, kind, &l));
    int pos = -1, g = find_group(&l, rank, &pos);
    hcomm_comm_t *comm = NULL;
    if (g < 0) { /* only a middle pipeline stage is in no (embedding) group */
        T_CHECK(kind == HCOMM_GROUP_EMBEDDING, "rank %d is in no %s group", rank, kind_str(kind));
        T_ERR(hcomm_ctx_group(ctx, kind, &comm), HCOMM_ERR_GROUP);
        int r = -1, s = -1;
        T_ERR(hcomm_ctx_rank(ctx, kind, &r, &s), HCOMM_ERR_GROUP);
        hcomm_group_list_free(&l);
        return;
    }
    const int *want = l.ranks + (size_t)g * (size_t)l.group_size;
    T_OK(hcomm_ctx_group(ctx, kind, &comm));
    int size = -1, me = -1, gr = -1, gs = -1, members[64] = {0};
    T_OK(hcomm_comm_size(comm, &size));
    T_OK(hcomm_comm_rank(comm, &me));
    T_OK(hcomm_ctx_rank(ctx, kind, &gr, &gs));
    T_CHECK(size == l.group_size && me == pos && gr == pos && gs == size,
            "%s group of rank %d: size %d rank %d (ctx_rank %d/%d), planned %d at %d",
            kind_str(kind), rank, size, me, gr, gs, l.group_size, pos);
    if (size == l.group_size && size <= 64) {
        T_OK(hcomm_comm_members(comm, members, 64));
        for (int m = 0; m < size; m++)
            T_CHECK(members[m] == want[m], "%s group of rank %d: member %d is %d, planned %d",
                    kind_str(kind), rank, m, members[m], want[m]);
    }
    int64_t sum = 0, got = rank;
    for (int m = 0; m < l.group_size; m++)
        sum += want[m];
    T_OK(hcomm_all_reduce(comm, &got, &got, 1, HCOMM_I64, HCOMM_SUM));
    T_CHECK(got == sum, "%s group of rank %d: sum of ranks %lld, expected %lld", kind_str(kind),
            rank, (long long)got, (long long)sum);
    hcomm_group_list_free(&l);
}

/* Pipeline neighbours are the adjacent stages of this rank's PP group. */
static void check_pp_neighbors(const hcomm_ctx_t *ctx, int pp) {
    int stage = -1, size = -1, prev = -2, next = -2;
    T_OK(hcomm_ctx_rank(ctx, HCOMM_GROUP_PP, &stage, &size));
    T_OK(hcomm_ctx_pp_neighbors(ctx, &prev, &next));
    T_EQ_INT(size, pp);
    T_EQ_INT(prev, stage > 0 ? stage - 1 : -1);
    T_EQ_INT(next, stage < pp - 1 ? stage + 1 : -1);
}

static void check_case(hcomm_comm_t *world, int n, int rank, const hcomm_parallel_config_t *cfg) {
    hcomm_ctx_t *ctx = NULL;
    hcomm_result_t r = hcomm_ctx_create(world, cfg, &ctx);
    T_CHECK(r == HCOMM_OK, "world %d tp %d pp %d dp %d cp %d ep %d etp %d order %s: %s", n, cfg->tp,
            cfg->pp, cfg->dp, cfg->cp, cfg->ep, cfg->etp, cfg->order ? cfg->order : "(default)",
            hcomm_last_error());
    if (r != HCOMM_OK)
        return;
    for (int k = 0; k < HCOMM_GROUP_COUNT; k++)
        check_kind(ctx, cfg, n, rank, (hcomm_group_kind_t)k);
    hcomm_parallel_config_t got, want;
    T_OK(hcomm_ctx_config(ctx, &got));
    T_OK(hcomm_parallel_config_resolve(cfg, n, &want));
    T_CHECK(got.tp == want.tp && got.pp == want.pp && got.dp == want.dp && got.cp == want.cp &&
                got.ep == want.ep && got.etp == want.etp && strcmp(got.order, want.order) == 0,
            "ctx_config: tp %d pp %d dp %d cp %d ep %d etp %d order %s", got.tp, got.pp, got.dp,
            got.cp, got.ep, got.etp, got.order);
    check_pp_neighbors(ctx, want.pp);
    T_OK(hcomm_ctx_destroy(ctx));
}

static hcomm_result_t layouts_rank(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int n = 0, rank = 0;
    T_OK(hcomm_comm_size(world, &n));
    T_OK(hcomm_comm_rank(world, &rank));
    plan_case_t cases[MAX_CASES];
    int ncases = make_cases(n, cases);
    for (int i = 0; i < ncases; i++)
        check_case(world, n, rank, &cases[i].cfg);
    return HCOMM_OK;
}

/* Creating twice on one world is refused; after destroy it works again; a context on
 * another communicator may live beside it. */
static void check_one_live_context(hcomm_comm_t *world, int n) {
    hcomm_parallel_config_t cfg = {0, 0, 0, 0, 0, 0, 0, NULL};
    hcomm_ctx_t *a = NULL, *b = (hcomm_ctx_t *)&cfg, *c = NULL;
    T_OK(hcomm_ctx_create(world, &cfg, &a));
    T_ERR(hcomm_ctx_create(world, &cfg, &b), HCOMM_ERR_STATE);
    T_CHECK(b == NULL, "failed create left *out set");
    hcomm_comm_t *dup = NULL;
    int rank = 0;
    T_OK(hcomm_comm_rank(world, &rank));
    T_OK(hcomm_comm_split(world, 0, rank, &dup));
    T_OK(hcomm_ctx_create(dup, &cfg, &c));
    int dsize = 0, dp = 0, drank = 0;
    T_OK(hcomm_ctx_rank(c, HCOMM_GROUP_DP, &drank, &dsize));
    T_OK(hcomm_ctx_rank(a, HCOMM_GROUP_DP, &dp, &dsize));
    T_EQ_INT(dsize, n);
    T_EQ_INT(drank, dp);
    T_OK(hcomm_ctx_destroy(c));
    T_OK(hcomm_comm_destroy(dup));
    T_OK(hcomm_ctx_destroy(a));
    T_OK(hcomm_ctx_create(world, &cfg, &a)); /* destroyed: the world is free again */
    T_OK(hcomm_ctx_destroy(a));
}

static hcomm_result_t errors_rank(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int n = 0, rank = 0;
    T_OK(hcomm_comm_size(world, &n));
    T_OK(hcomm_comm_rank(world, &rank));
    hcomm_ctx_t *ctx = NULL;
    hcomm_parallel_config_t bad = {2, 1, n, 0, 0, 0, 0, NULL}; /* 2 * n != n */
    T_ERR(hcomm_ctx_create(world, &bad, &ctx), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), "hcomm_ctx_create") &&
                strstr(hcomm_last_error(), "does not equal world_size"),
            "got '%s'", hcomm_last_error());
    T_CHECK(ctx == NULL, "failed create left *out set");
    bad = (hcomm_parallel_config_t){0, 0, 0, 0, 0, 0, 0, "tp-qq"};
    T_ERR(hcomm_ctx_create(world, &bad, &ctx), HCOMM_ERR_INVALID_ARG);
    if (n > 1) { /* ranks disagree: nobody hangs, nobody keeps a context */
        bad = (hcomm_parallel_config_t){rank == 0 ? n : 1, 0, 0, 0, 0, 0, 0, NULL};
        T_ERR(hcomm_ctx_create(world, &bad, &ctx), HCOMM_ERR_MISMATCH);
        bad = (hcomm_parallel_config_t){rank == 0 ? n + 1 : 1, 0, 0, 0, 0, 0, 0, NULL};
        T_ERR(hcomm_ctx_create(world, &bad, &ctx),
              rank == 0 ? HCOMM_ERR_INVALID_ARG : HCOMM_ERR_MISMATCH);
    }
    check_one_live_context(world, n);

    hcomm_parallel_config_t cfg = {0, n, 0, 0, 0, 0, 0, NULL}, got;
    T_ERR(hcomm_ctx_create(NULL, &cfg, &ctx), HCOMM_ERR_NULL);
    T_ERR(hcomm_ctx_create(world, NULL, &ctx), HCOMM_ERR_NULL);
    T_ERR(hcomm_ctx_create(world, &cfg, NULL), HCOMM_ERR_NULL);
    T_OK(hcomm_ctx_create(world, &cfg, &ctx)); /* pp = n: one pipeline through every rank */
    hcomm_comm_t *g = NULL;
    int r = 0, s = 0;
    T_ERR(hcomm_ctx_group(ctx, HCOMM_GROUP_COUNT, &g), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_ctx_group(ctx, (hcomm_group_kind_t)-1, &g), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_ctx_group(NULL, HCOMM_GROUP_TP, &g), HCOMM_ERR_NULL);
    T_ERR(hcomm_ctx_group(ctx, HCOMM_GROUP_TP, NULL), HCOMM_ERR_NULL);
    T_ERR(hcomm_ctx_rank(ctx, HCOMM_GROUP_TP, NULL, &s), HCOMM_ERR_NULL);
    T_ERR(hcomm_ctx_rank(ctx, (hcomm_group_kind_t)42, &r, &s), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_ctx_config(ctx, NULL), HCOMM_ERR_NULL);
    T_ERR(hcomm_ctx_config(NULL, &got), HCOMM_ERR_NULL);
    T_ERR(hcomm_ctx_pp_neighbors(ctx, NULL, &s), HCOMM_ERR_NULL);
    bool middle = rank > 0 && rank < n - 1;
    T_ERR(hcomm_ctx_group(ctx, HCOMM_GROUP_EMBEDDING, &g), middle ? HCOMM_ERR_GROUP : HCOMM_OK);
    if (middle)
        T_CHECK(strstr(hcomm_last_error(), "embedding") != NULL, "got '%s'", hcomm_last_error());
    T_OK(hcomm_ctx_destroy(ctx));
    T_OK(hcomm_ctx_destroy(NULL));
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(layouts_rank, NULL, 8);
    t_for_each_world(errors_rank, NULL, 8);
    return t_finish("test_domain");
}
