/* Megatron-Core rank layout: config validation, the dense and expert grids, and the mapping
 * between world ranks and (group, position) for every group kind. See rankgen.h. */
#include "domain/rankgen.h"

#include <limits.h>
#include <string.h>

const char hcomm__default_order[] = "tp-cp-ep-dp-pp";

static const char *const axis_names[HCOMM__NUM_AXES] = {"tp", "cp", "ep", "dp", "pp"};

/* Megatron's RankGenerator appends omitted (size-1) axes in the order of its name_to_size
 * dict; only size-1 axes are appended, so this fixes nothing but the canonical form. */
static const hcomm__axis_t append_order[HCOMM__NUM_AXES] = {
    HCOMM__AXIS_TP, HCOMM__AXIS_PP, HCOMM__AXIS_DP, HCOMM__AXIS_EP, HCOMM__AXIS_CP};

/* The whole dp axis: its shard digit (AXIS_DP on a grid) and its replica digit. */
#define DP_BOTH ((1u << HCOMM__AXIS_DP) | (1u << HCOMM__AXIS_DPR))

/* Which grid and which axes make up each group kind (the "token" of Megatron's get_ranks). */
static const struct {
    bool expert;
    unsigned mask;
} kind_axes[HCOMM_GROUP_COUNT] = {
    [HCOMM_GROUP_TP] = {false, 1u << HCOMM__AXIS_TP},
    [HCOMM_GROUP_PP] = {false, 1u << HCOMM__AXIS_PP},
    [HCOMM_GROUP_DP] = {false, DP_BOTH},
    [HCOMM_GROUP_CP] = {false, 1u << HCOMM__AXIS_CP},
    [HCOMM_GROUP_DP_CP] = {false, DP_BOTH | (1u << HCOMM__AXIS_CP)},
    [HCOMM_GROUP_TP_PP] = {false, (1u << HCOMM__AXIS_TP) | (1u << HCOMM__AXIS_PP)},
    [HCOMM_GROUP_EP] = {true, 1u << HCOMM__AXIS_EP},
    [HCOMM_GROUP_ETP] = {true, 1u << HCOMM__AXIS_TP},
    [HCOMM_GROUP_EDP] = {true, DP_BOTH},
    [HCOMM_GROUP_EMBEDDING] = {false, 1u << HCOMM__AXIS_PP},
    [HCOMM_GROUP_DP_SHARD] = {false, (1u << HCOMM__AXIS_DP) | (1u << HCOMM__AXIS_CP)},
    [HCOMM_GROUP_DP_REPLICATE] = {false, 1u << HCOMM__AXIS_DPR},
    [HCOMM_GROUP_EDP_SHARD] = {true, 1u << HCOMM__AXIS_DP},
    [HCOMM_GROUP_EDP_REPLICATE] = {true, 1u << HCOMM__AXIS_DPR},
};

/* a * b for a, b >= 1, saturating instead of overflowing. */
static long long mul_sat(long long a, long long b) {
    return a > LLONG_MAX / b ? LLONG_MAX : a * b;
}

static hcomm_result_t check_signs(const char *fn, const hcomm_parallel_config_t *cfg,
                                  int world_size) {
    if (world_size < 1)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "world_size=%d must be >= 1", world_size);
    const struct {
        const char *name;
        int value;
    } fields[] = {{"tp", cfg->tp},
                  {"pp", cfg->pp},
                  {"dp", cfg->dp},
                  {"cp", cfg->cp},
                  {"ep", cfg->ep},
                  {"etp", cfg->etp},
                  {"num_experts", cfg->num_experts},
                  {"dp_shard", cfg->dp_shard}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i].value < 0)
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s=%d is negative (0 means default)",
                              fields[i].name, fields[i].value);
    return HCOMM_OK;
}

/* Fills in tp, pp, cp, ep, etp defaults, then dp = world / (tp * pp * cp) if dp is 0, and
 * checks that the dense sizes multiply to the world. */
static hcomm_result_t resolve_dense(const char *fn, hcomm_parallel_config_t *c, int world) {
    c->tp = c->tp ? c->tp : 1;
    c->pp = c->pp ? c->pp : 1;
    c->cp = c->cp ? c->cp : 1;
    c->ep = c->ep ? c->ep : 1;
    c->etp = c->etp ? c->etp : c->tp;
    long long model = mul_sat(mul_sat(c->tp, c->pp), c->cp);
    if (c->dp == 0) {
        if (world % model != 0)
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                              "world_size=%d is not divisible by tp*pp*cp=%lld (tp=%d, pp=%d, "
                              "cp=%d), so dp cannot default to world_size/(tp*pp*cp)",
                              world, model, c->tp, c->pp, c->cp);
        c->dp = (int)(world / model);
        return HCOMM_OK;
    }
    long long total = mul_sat(model, c->dp);
    if (total != world)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "tp*cp*dp*pp = %d*%d*%d*%d = %lld does not equal world_size=%d", c->tp,
                          c->cp, c->dp, c->pp, total, world);
    return HCOMM_OK;
}

/* Megatron folds cp into the expert data-parallel size: edp = world / (etp * ep * pp). */
static hcomm_result_t resolve_expert(const char *fn, const hcomm_parallel_config_t *c, int world,
                                     int *edp) {
    long long etp_ep_pp = mul_sat(mul_sat(c->etp, c->ep), c->pp);
    if (world % etp_ep_pp != 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "world_size=%d is not divisible by etp*ep*pp=%lld (etp=%d, ep=%d, "
                          "pp=%d)",
                          world, etp_ep_pp, c->etp, c->ep, c->pp);
    if (c->num_experts % c->ep != 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "num_experts=%d is not divisible by ep=%d",
                          c->num_experts, c->ep);
    *edp = (int)(world / etp_ep_pp);
    return HCOMM_OK;
}

/* HSDP: dp = dp_shard * dp_replicate, and expert layers keep the replica count, so it must
 * divide edp too. */
static hcomm_result_t resolve_shard(const char *fn, hcomm__layout_t *l) {
    hcomm_parallel_config_t *c = &l->cfg;
    c->dp_shard = c->dp_shard ? c->dp_shard : c->dp;
    if (c->dp % c->dp_shard != 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "dp_shard=%d does not divide dp=%d",
                          c->dp_shard, c->dp);
    l->dp_replicate = c->dp / c->dp_shard;
    if (l->edp % l->dp_replicate != 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "dp_replicate=%d (dp=%d / dp_shard=%d) does not divide the expert data "
                          "parallel size edp=%d (world/(etp*ep*pp)), so expert parameters cannot "
                          "keep the same replicas",
                          l->dp_replicate, c->dp, c->dp_shard, l->edp);
    return HCOMM_OK;
}

static int axis_of_token(const char *tok, size_t len) {
    for (int a = 0; a < HCOMM__NUM_AXES; a++)
        if (len == 2 && memcmp(tok, axis_names[a], 2) == 0)
            return a;
    return -1;
}

/* Parses "tp-cp-ep-dp-pp"-style orders into axis_at[0..4]: the given axes first, then the
 * omitted ones appended as Megatron does. *ngiven is the number of axes the string named. */
static hcomm_result_t parse_order(const char *fn, const char *order, int axis_at[HCOMM__NUM_AXES],
                                  int *ngiven) {
    bool seen[HCOMM__NUM_AXES] = {false};
    int n = 0;
    const char *tok = order;
    for (;;) {
        size_t len = strcspn(tok, "-");
        int a = axis_of_token(tok, len);
        if (a < 0)
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                              "order=\"%.64s\" has unknown axis '%.*s' (expected tp, cp, ep, dp "
                              "or pp, separated by '-')",
                              order, (int)(len > 16 ? 16 : len), tok);
        if (seen[a])
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "order=\"%.64s\" names axis '%s' twice",
                              order, axis_names[a]);
        seen[a] = true;
        axis_at[n++] = a;
        if (tok[len] == '\0')
            break;
        tok += len + 1;
    }
    *ngiven = n;
    for (int i = 0; i < HCOMM__NUM_AXES; i++)
        if (!seen[append_order[i]])
            axis_at[n++] = (int)append_order[i];
    return HCOMM_OK;
}

/* An axis left out of the order must have size 1 on this grid; names[] gives the sizes'
 * names in messages (the expert grid calls tp "etp" and dp "edp"). */
static hcomm_result_t check_omitted(const char *fn, const char *order,
                                    const int axis_at[HCOMM__NUM_AXES], int ngiven,
                                    const int size_of[HCOMM__NUM_AXES],
                                    const char *const names[HCOMM__NUM_AXES]) {
    for (int i = ngiven; i < HCOMM__NUM_AXES; i++) {
        int a = axis_at[i];
        if (size_of[a] > 1)
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                              "%s=%d > 1 but axis '%s' is missing from order=\"%s\"", names[a],
                              size_of[a], axis_names[a], order);
    }
    return HCOMM_OK;
}

/* size_of[HCOMM__AXIS_DP] is the whole dp extent; it is split into the shard digit and the
 * replica digit right after it (replicas of extent dpr). */
static void build_grid(const int axis_at[HCOMM__NUM_AXES], const int size_of[HCOMM__NUM_AXES],
                       int dpr, hcomm__grid_t *g) {
    int stride = 1, j = 0;
    for (int i = 0; i < HCOMM__NUM_AXES; i++) {
        int a = axis_at[i];
        g->axis[j] = a;
        g->size[j] = a == HCOMM__AXIS_DP ? size_of[a] / dpr : size_of[a];
        g->stride[j] = stride;
        stride *= g->size[j++];
        if (a != HCOMM__AXIS_DP)
            continue;
        g->axis[j] = HCOMM__AXIS_DPR;
        g->size[j] = dpr;
        g->stride[j] = stride;
        stride *= g->size[j++];
    }
}

static int pp_stride(const hcomm__grid_t *g) {
    for (int i = 0; i < HCOMM__GRID_AXES; i++)
        if (g->axis[i] == HCOMM__AXIS_PP)
            return g->stride[i];
    return 0; /* unreachable: every grid holds all five axes */
}

/* Megatron asserts that dense and expert layers see the same pipeline groups. A pp group
 * index counts the other axes, which is (r mod s) + s * (r / (s * pp)) on any grid where the
 * axes before pp span s ranks; so the groups agree exactly when s agrees (or pp == 1). It also
 * asserts that an order not ending in pp keeps edp == dp. */
static hcomm_result_t check_pipelines(const char *fn, const hcomm__layout_t *l, bool pp_last) {
    const hcomm_parallel_config_t *c = &l->cfg;
    if (c->pp == 1)
        return HCOMM_OK;
    if (!pp_last && l->edp != c->dp)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "order=\"%s\" does not end with pp, so the expert data parallel size "
                          "edp=%d (world/(etp*ep*pp)) must equal dp=%d",
                          l->order, l->edp, c->dp);
    int sd = pp_stride(&l->dense), se = pp_stride(&l->expert);
    if (sd != se)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "pipeline groups of expert layers would differ from dense ones: in "
                          "order=\"%s\" the axes before pp span %d ranks on the dense grid but "
                          "%d on the expert grid (etp=%d, ep=%d vs tp=%d, cp=%d)",
                          l->order, sd, se, c->etp, c->ep, c->tp, c->cp);
    return HCOMM_OK;
}

hcomm_result_t hcomm__layout_init(const char *fn, const hcomm_parallel_config_t *cfg,
                                  int world_size, hcomm__layout_t *out) {
    static const char *const dense_names[HCOMM__NUM_AXES] = {"tp", "cp", "ep", "dp", "pp"};
    static const char *const expert_names[HCOMM__NUM_AXES] = {"etp", "cp", "ep", "edp", "pp"};
    hcomm__layout_t l;
    memset(&l, 0, sizeof l);
    HCOMM__TRY(check_signs(fn, cfg, world_size));
    l.cfg = *cfg;
    l.cfg.order = NULL;
    l.world = world_size;
    HCOMM__TRY(resolve_dense(fn, &l.cfg, world_size));
    HCOMM__TRY(resolve_expert(fn, &l.cfg, world_size, &l.edp));
    HCOMM__TRY(resolve_shard(fn, &l));

    const char *order = cfg->order ? cfg->order : hcomm__default_order;
    int axis_at[HCOMM__NUM_AXES], ngiven = 0;
    HCOMM__TRY(parse_order(fn, order, axis_at, &ngiven));
    /* Sizes by axis id (tp, cp, ep, dp, pp). Dense layers have no ep; experts have no cp. */
    const int dense_size[HCOMM__NUM_AXES] = {l.cfg.tp, l.cfg.cp, 1, l.cfg.dp, l.cfg.pp};
    const int expert_size[HCOMM__NUM_AXES] = {l.cfg.etp, 1, l.cfg.ep, l.edp, l.cfg.pp};
    HCOMM__TRY(check_omitted(fn, order, axis_at, ngiven, dense_size, dense_names));
    HCOMM__TRY(check_omitted(fn, order, axis_at, ngiven, expert_size, expert_names));
    /* A valid order has at most five two-letter axes, so it fits. */
    strncpy(l.order, order, sizeof l.order - 1);
    build_grid(axis_at, dense_size, l.dp_replicate, &l.dense);
    build_grid(axis_at, expert_size, l.dp_replicate, &l.expert);
    HCOMM__TRY(check_pipelines(fn, &l, axis_at[ngiven - 1] == HCOMM__AXIS_PP));
    *out = l;
    return HCOMM_OK;
}

/* Megatron's generate_masked_orthogonal_rank_groups, inverted: from a rank to its group
 * index (unmasked digits, first axis fastest) and position (masked digits, likewise). */
static void locate_masked(const hcomm__grid_t *g, unsigned mask, int rank, int *group, int *pos) {
    int gi = 0, gmul = 1, pi = 0, pmul = 1;
    for (int i = 0; i < HCOMM__GRID_AXES; i++) {
        int digit = (rank / g->stride[i]) % g->size[i];
        if (mask & (1u << g->axis[i])) {
            pi += digit * pmul;
            pmul *= g->size[i];
        } else {
            gi += digit * gmul;
            gmul *= g->size[i];
        }
    }
    *group = gi;
    *pos = pi;
}

void hcomm__layout_locate(const hcomm__layout_t *l, hcomm_group_kind_t kind, int rank, int *group,
                          int *pos) {
    const hcomm__grid_t *g = kind_axes[kind].expert ? &l->expert : &l->dense;
    locate_masked(g, kind_axes[kind].mask, rank, group, pos);
    if (kind != HCOMM_GROUP_EMBEDDING)
        return;
    /* Megatron's default_embedding_ranks: first and last stage of each pipeline. */
    int stage = *pos, pp = l->cfg.pp;
    *pos = stage == 0 ? 0 : stage == pp - 1 ? 1 : -1;
}

void hcomm__layout_shape(const hcomm__layout_t *l, hcomm_group_kind_t kind, int *num_groups,
                         int *group_size) {
    int gs = 1;
    if (kind == HCOMM_GROUP_EMBEDDING) {
        gs = l->cfg.pp > 1 ? 2 : 1;
        *num_groups = l->world / l->cfg.pp;
        *group_size = gs;
        return;
    }
    const hcomm__grid_t *g = kind_axes[kind].expert ? &l->expert : &l->dense;
    for (int i = 0; i < HCOMM__GRID_AXES; i++)
        if (kind_axes[kind].mask & (1u << g->axis[i]))
            gs *= g->size[i];
    *num_groups = l->world / gs;
    *group_size = gs;
}

void hcomm__layout_groups(const hcomm__layout_t *l, hcomm_group_kind_t kind, int *ranks) {
    int num_groups = 0, gs = 0;
    hcomm__layout_shape(l, kind, &num_groups, &gs);
    for (int r = 0; r < l->world; r++) {
        int group = 0, pos = 0;
        hcomm__layout_locate(l, kind, r, &group, &pos);
        if (pos >= 0)
            ranks[(size_t)group * (size_t)gs + (size_t)pos] = r;
    }
}

void hcomm__layout_coords(const hcomm__layout_t *l, bool expert, int rank,
                          int coords[HCOMM__NUM_AXES]) {
    const hcomm__grid_t *g = expert ? &l->expert : &l->dense;
    int shard = 0, replica = 0, dp_shard = 1;
    for (int i = 0; i < HCOMM__GRID_AXES; i++) {
        int digit = (rank / g->stride[i]) % g->size[i];
        if (g->axis[i] == HCOMM__AXIS_DPR) {
            replica = digit;
        } else {
            coords[g->axis[i]] = digit;
            if (g->axis[i] == HCOMM__AXIS_DP) {
                shard = digit;
                dp_shard = g->size[i];
            }
        }
    }
    coords[HCOMM__AXIS_DP] = shard + dp_shard * replica;
}

hcomm_result_t hcomm__kind_check(const char *fn, hcomm_group_kind_t kind) {
    if ((int)kind < 0 || (int)kind >= HCOMM_GROUP_COUNT)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "kind=%d is not a valid hcomm_group_kind_t (0..%d)", (int)kind,
                          HCOMM_GROUP_COUNT - 1);
    return HCOMM_OK;
}
