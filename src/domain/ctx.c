/* The domain manager: one collective call splits the world into every parallel group of the
 * job (layout from rankgen.c), and accessors hand them out. */
#include "transport/transport.h"
#include "domain/rankgen.h"
#include "hcomm/fault.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct hcomm_ctx {
    hcomm_comm_t *world;
    hcomm__layout_t layout;
    int world_rank;
    int coords[HCOMM__NUM_AXES];             /* this rank on the dense grid, by axis */
    int expert_coords[HCOMM__NUM_AXES];      /* this rank on the expert grid, by axis */
    hcomm_comm_t *groups[HCOMM_GROUP_COUNT]; /* NULL: not a member (embedding only) */
    hcomm_comm_t *owned_world; /* hcomm_ctx_rebuild's world of the kept replicas, or NULL */
};

/* What the domain layer keeps on a communicator it builds a context on. */
typedef struct domain_state {
    bool has_ctx; /* a context is built on it (one at a time) */
} domain_state_t;

static domain_state_t *domain_state(hcomm_comm_t *c) {
    return hcomm__layer_state(&c->layer[HCOMM__LAYER_DOMAIN], &c->layer_free[HCOMM__LAYER_DOMAIN],
                              sizeof(domain_state_t), calloc, free);
}

/* A second context on the same communicator would split it again and leave two sets of groups
 * whose collectives could be confused, so it is refused. Each rank owns its own communicator
 * object, so the flag needs no lock. */
static hcomm_result_t claim_world(const char *fn, hcomm_comm_t *world) {
    domain_state_t *d = domain_state(world);
    if (!d)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory");
    if (d->has_ctx)
        return hcomm__err(HCOMM_ERR_STATE, fn,
                          "world already holds a context; call hcomm_ctx_destroy first");
    d->has_ctx = true;
    return HCOMM_OK;
}

static void release_world(hcomm_comm_t *world) {
    domain_state_t *d = world->layer[HCOMM__LAYER_DOMAIN];
    if (d)
        d->has_ctx = false;
}

/* FNV-1a of the effective order, cut to 62 bits so it can be negated in an int64. */
static int64_t order_hash(const char *order) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)order; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (int64_t)(h >> 2);
}

/* Every rank must pass the same cfg, or ranks would disagree about the groups they form.
 * Compares validity, the resolved sizes (so dp = 0 and its default agree) and the order; one
 * MAX all-reduce over (v, -v) gives each field's max and min. It runs even when this rank's
 * cfg is invalid, so that no rank returns early while the others wait. l is NULL then. */
static hcomm_result_t check_same_config(const char *fn, hcomm_comm_t *world,
                                        const hcomm_parallel_config_t *cfg,
                                        const hcomm__layout_t *l) {
    enum { N = 10 };
    static const char *const names[N] = {"validity", "tp",  "pp",          "dp",    "cp",
                                         "ep",       "etp", "num_experts", "order", "dp_shard"};
    const hcomm_parallel_config_t *c = l ? &l->cfg : cfg;
    const char *order = l ? l->order : cfg->order ? cfg->order : hcomm__default_order;
    const int64_t v[N] = {
        l != NULL,         c->tp,      c->pp, c->dp, c->cp, c->ep, c->etp, c->num_experts,
        order_hash(order), c->dp_shard};
    int64_t buf[2 * N];
    for (int i = 0; i < N; i++) {
        buf[i] = v[i];
        buf[N + i] = -v[i];
    }
    HCOMM__TRY(hcomm_all_reduce(world, buf, buf, 2 * N, HCOMM_I64, HCOMM_MAX));
    if (buf[0] != -buf[N])
        return hcomm__err(HCOMM_ERR_MISMATCH, fn, "cfg is invalid on another rank of world");
    for (int i = 1; i < N; i++)
        if (buf[i] != -buf[N + i])
            return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                              "cfg.%s differs across the ranks of world (this rank: %lld); every "
                              "rank must pass the same config",
                              names[i], (long long)v[i]);
    return HCOMM_OK;
}

static hcomm_result_t destroy_groups(hcomm_ctx_t *ctx) {
    hcomm_result_t first = HCOMM_OK;
    for (int k = HCOMM_GROUP_COUNT - 1; k >= 0; k--) {
        hcomm_result_t r = hcomm_comm_destroy(ctx->groups[k]);
        ctx->groups[k] = NULL;
        if (first == HCOMM_OK)
            first = r;
    }
    return first;
}

/* Collective: ranks of one group share color = group index and are ordered by key =
 * position, so member i of the new communicator is member i of the planned group. */
static hcomm_result_t split_group(hcomm_ctx_t *ctx, hcomm_group_kind_t kind) {
    int group = 0, pos = 0;
    hcomm__layout_locate(&ctx->layout, kind, ctx->world_rank, &group, &pos);
    return hcomm_comm_split(ctx->world, pos >= 0 ? group : -1, pos, &ctx->groups[kind]);
}

static hcomm_result_t build_ctx(const char *fn, hcomm_comm_t *world,
                                const hcomm_parallel_config_t *cfg, hcomm_ctx_t **out) {
    int rank = 0, size = 0;
    HCOMM__TRY(hcomm_comm_rank(world, &rank));
    HCOMM__TRY(hcomm_comm_size(world, &size));
    hcomm__layout_t layout;
    hcomm_result_t valid = hcomm__layout_init(fn, cfg, size, &layout);
    hcomm_result_t agree = check_same_config(fn, world, cfg, valid == HCOMM_OK ? &layout : NULL);
    if (valid != HCOMM_OK) /* re-records the message, which the agreement step may replace */
        return hcomm__layout_init(fn, cfg, size, &layout);
    HCOMM__TRY(agree);
    hcomm_ctx_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "cannot allocate the context");
    ctx->world = world;
    ctx->layout = layout;
    ctx->world_rank = rank;
    hcomm__layout_coords(&layout, false, rank, ctx->coords);
    hcomm__layout_coords(&layout, true, rank, ctx->expert_coords);
    hcomm_result_t res = HCOMM_OK;
    for (int k = 0; k < HCOMM_GROUP_COUNT; k++)
        HCOMM__TRY_GOTO(split_group(ctx, (hcomm_group_kind_t)k), res, fail);
    *out = ctx;
    return HCOMM_OK;
fail:
    destroy_groups(ctx);
    free(ctx);
    return res;
}

hcomm_result_t hcomm_ctx_create(hcomm_comm_t *world, const hcomm_parallel_config_t *cfg,
                                hcomm_ctx_t **out) {
    HCOMM__CHECK_NULL(out);
    *out = NULL;
    HCOMM__CHECK_NULL(world);
    HCOMM__CHECK_NULL(cfg);
    HCOMM__TRY(claim_world(__func__, world));
    hcomm_result_t res = build_ctx(__func__, world, cfg, out);
    if (res != HCOMM_OK)
        release_world(world);
    return res;
}

hcomm_result_t hcomm_ctx_destroy(hcomm_ctx_t *ctx) {
    if (!ctx)
        return HCOMM_OK;
    hcomm_result_t res = destroy_groups(ctx);
    release_world(ctx->world);
    hcomm_comm_destroy(ctx->owned_world);
    free(ctx);
    return res;
}

hcomm_result_t hcomm_ctx_revoke(hcomm_ctx_t *ctx) {
    HCOMM__CHECK_NULL(ctx);
    for (int k = 0; k < HCOMM_GROUP_COUNT; k++)
        if (ctx->groups[k])
            hcomm_comm_revoke(ctx->groups[k]);
    return hcomm_comm_revoke(ctx->world);
}

/* --- rebuilding on the survivors --- */

/* The data-parallel replica a rank of ctx belongs to: one DP rank's slice of the grid where
 * every DP rank holds the whole state (dp_shard = dp, the default), one shard group (HSDP). */
static int replica_of(const hcomm_ctx_t *ctx, int dp_index) {
    const hcomm_parallel_config_t *c = &ctx->layout.cfg;
    return c->dp_shard == c->dp ? dp_index : dp_index / c->dp_shard;
}

static int replicas(const hcomm_ctx_t *ctx) {
    const hcomm_parallel_config_t *c = &ctx->layout.cfg;
    return c->dp_shard == c->dp ? c->dp : c->dp / c->dp_shard;
}

/* Which replicas every survivor of shrunk still has whole (keep[r]), from each survivor's
 * replica, gathered over shrunk; *kept counts them. */
static hcomm_result_t whole_replicas(hcomm_ctx_t *ctx, hcomm_comm_t *shrunk, bool *keep,
                                     int *kept) {
    int n = shrunk->size, nrep = replicas(ctx), mine = replica_of(ctx, ctx->coords[HCOMM__AXIS_DP]);
    int *all = malloc(sizeof *all * (size_t)n), *count = calloc((size_t)nrep, sizeof *count);
    hcomm_result_t r = all && count
                           ? hcomm_all_gather(shrunk, &mine, all, sizeof mine)
                           : hcomm__err(HCOMM_ERR_NOMEM, "hcomm_ctx_rebuild", "out of memory");
    for (int i = 0; r == HCOMM_OK && i < n; i++)
        count[all[i]]++;
    *kept = 0;
    for (int i = 0; r == HCOMM_OK && i < nrep; i++)
        *kept += keep[i] = count[i] == ctx->world->size / nrep;
    free(all);
    free(count);
    return r;
}

hcomm_result_t hcomm_ctx_rebuild(hcomm_ctx_t *ctx, hcomm_comm_t *shrunk, hcomm_ctx_t **out) {
    HCOMM__CHECK_NULL(out);
    *out = NULL;
    HCOMM__CHECK_NULL(ctx);
    HCOMM__CHECK_NULL(shrunk);
    int nrep = replicas(ctx), kept = 0;
    bool *keep = calloc((size_t)nrep, sizeof *keep);
    if (!keep)
        return hcomm__err(HCOMM_ERR_NOMEM, __func__, "out of memory");
    hcomm_result_t r = whole_replicas(ctx, shrunk, keep, &kept);
    bool mine = r == HCOMM_OK && keep[replica_of(ctx, ctx->coords[HCOMM__AXIS_DP])];
    free(keep);
    HCOMM__TRY(r);
    if (kept == 0)
        return hcomm__err(HCOMM_ERR_STATE, __func__,
                          "the %d survivors hold no whole data-parallel replica of %d ranks "
                          "(each of the %d replicas lost a member); restart from a checkpoint",
                          shrunk->size, ctx->world->size / nrep, nrep);
    hcomm_parallel_config_t cfg;
    HCOMM__TRY(hcomm_ctx_config(ctx, &cfg));
    bool replicated = cfg.dp_shard == cfg.dp;
    cfg.dp = replicated ? kept : kept * cfg.dp_shard;
    cfg.dp_shard = replicated ? 0 : cfg.dp_shard;
    hcomm_comm_t *world = NULL;
    HCOMM__TRY(hcomm_comm_split(shrunk, mine ? 0 : -1, ctx->world_rank, &world));
    if (!world)
        return HCOMM_OK; /* this rank's replica was dropped: *out stays NULL */
    r = hcomm_ctx_create(world, &cfg, out);
    if (r != HCOMM_OK) {
        hcomm_comm_destroy(world);
        return r;
    }
    (*out)->owned_world = world;
    return HCOMM_OK;
}

/* The group of kind, or HCOMM_ERR_GROUP for a middle pipeline stage's embedding group. */
static hcomm_result_t member_group(const char *fn, const hcomm_ctx_t *ctx, hcomm_group_kind_t kind,
                                   hcomm_comm_t **group) {
    HCOMM__TRY(hcomm__kind_check(fn, kind));
    if (!ctx->groups[kind])
        return hcomm__err(HCOMM_ERR_GROUP, fn,
                          "world rank %d is in no embedding group: it is pipeline stage %d of "
                          "pp=%d, neither the first nor the last",
                          ctx->world_rank, ctx->coords[HCOMM__AXIS_PP], ctx->layout.cfg.pp);
    *group = ctx->groups[kind];
    return HCOMM_OK;
}

hcomm_result_t hcomm_ctx_group(const hcomm_ctx_t *ctx, hcomm_group_kind_t kind,
                               hcomm_comm_t **group) {
    HCOMM__CHECK_NULL(ctx);
    HCOMM__CHECK_NULL(group);
    return member_group(__func__, ctx, kind, group);
}

hcomm_result_t hcomm_ctx_config(const hcomm_ctx_t *ctx, hcomm_parallel_config_t *cfg) {
    HCOMM__CHECK_NULL(ctx);
    HCOMM__CHECK_NULL(cfg);
    *cfg = ctx->layout.cfg;
    cfg->order = ctx->layout.order; /* owned by ctx, unlike the caller's string */
    return HCOMM_OK;
}

hcomm_result_t hcomm_ctx_world(const hcomm_ctx_t *ctx, hcomm_comm_t **world) {
    HCOMM__CHECK_NULL(ctx);
    HCOMM__CHECK_NULL(world);
    *world = ctx->world;
    return HCOMM_OK;
}

hcomm_result_t hcomm_ctx_rank(const hcomm_ctx_t *ctx, hcomm_group_kind_t kind, int *rank,
                              int *size) {
    HCOMM__CHECK_NULL(ctx);
    HCOMM__CHECK_NULL(rank);
    HCOMM__CHECK_NULL(size);
    hcomm_comm_t *group = NULL;
    HCOMM__TRY(member_group(__func__, ctx, kind, &group));
    HCOMM__TRY(hcomm_comm_rank(group, rank));
    return hcomm_comm_size(group, size);
}

hcomm_result_t hcomm_ctx_pp_neighbors(const hcomm_ctx_t *ctx, int *prev, int *next) {
    HCOMM__CHECK_NULL(ctx);
    HCOMM__CHECK_NULL(prev);
    HCOMM__CHECK_NULL(next);
    /* Member i of the PP group is stage i, which is this rank's pp coordinate. */
    int stage = ctx->coords[HCOMM__AXIS_PP], pp = ctx->layout.cfg.pp;
    *prev = stage > 0 ? stage - 1 : -1;
    *next = stage < pp - 1 ? stage + 1 : -1;
    return HCOMM_OK;
}
