/* --zero 1|2|3: the parameters, gradients and momentum of hcomm-train held by shard plans
 * (hcomm/zero.h), one per unit and gradient group (dense over DP_SHARD, experts over
 * EDP_SHARD; with --dp-shard < --dp the rest of DP replicates, HSDP). A unit's parameters
 * point into its plan's gathered buffer while it runs (ZeRO-3 gathers them just before, with
 * the next unit prefetched, and releases them after); its gradients accumulate in the plan's
 * full gradients, reduce_scattered (nonblocking, added into the shard) after each of its
 * backward passes; SGD with momentum then steps the shards, and ZeRO-1/2 gather the result.
 * Included by train.c (static functions, like the rest of real/). */

/* One unit's plans: [0] dense, [1] expert. */
/* Returns from the enclosing function when call fails (it has reported the failure). */
#define ZERO_TRY(call)                                                                             \
    do {                                                                                           \
        hcomm_result_t zr_ = (call);                                                               \
        if (zr_ != HCOMM_OK)                                                                       \
            return zr_;                                                                            \
    } while (0)

typedef struct zunit {
    hcomm_zero_plan_t *plan[2];
    int *idx[2]; /* the plan's parameter j is m->params[idx[k][j]] */
    int n[2], nb[2];
    real_t **mom[2]; /* [nb] momentum shard of each bucket */
} zunit_t;

typedef struct train_zero {
    int stage;
    zunit_t *u; /* [model_units] (plans NULL for units of other stages) */
    size_t mom_bytes, peak, unsharded;
    int pending; /* the unit whose reduce_scatter was issued last in backward, or -1 */
} train_zero_t;

/* This rank's bytes of parameters, gradients and momentum without sharding (with bf16, the
 * rounded copy too). */
static size_t zero_unsharded_bytes(const model_t *m) {
    size_t n = 0;
    for (int i = 0; i < m->nparams; i++)
        n += (size_t)(m->params[i]->rows * m->params[i]->cols);
    return n * sizeof(real_t) * (size_t)(m->bf16 ? 4 : 3);
}

static void zero_sample_memory(const model_t *m, train_rt_t *rt) {
    train_zero_t *z = rt->zero;
    size_t live = z->mom_bytes, bytes = 0;
    for (int u = 0; u < model_units(m->L); u++)
        for (int k = 0; k < 2; k++)
            if (z->u[u].plan[k] && hcomm_zero_memory(z->u[u].plan[k], &bytes, NULL) == HCOMM_OK)
                live += bytes;
    for (int i = 0; m->bf16 && i < m->nparams; i++)
        live += (size_t)(m->params[i]->rows * m->params[i]->cols) * sizeof(real_t);
    if (live > z->peak)
        z->peak = live;
}

/* Points the unit's parameters (and, in backward, gradients) into its plans' buffers. */
static hcomm_result_t zero_point(model_t *m, train_rt_t *rt, zunit_t *zu, int grads) {
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < zu->n[k]; j++) {
            param_t *p = m->params[zu->idx[k][j]];
            void *d = NULL;
            TRAIN_TRY(rt, hcomm_zero_param(zu->plan[k], j, &d));
            p->master = d;
            if (!m->bf16)
                p->w = d;
            param_round(m, p);
            if (grads) {
                TRAIN_TRY(rt, hcomm_zero_grad(zu->plan[k], j, &d));
                p->g = d;
            }
        }
    return HCOMM_OK;
}

static hcomm_result_t zero_plan_unit(model_t *m, train_rt_t *rt, hcomm_comm_t *const g[4], int u,
                                     size_t cap) {
    zunit_t *zu = &rt->zero->u[u];
    hcomm_tensor_t *t = train_alloc((size_t)m->nparams * sizeof *t + 1);
    for (int k = 0; k < 2; k++) {
        zu->idx[k] = train_alloc((size_t)m->nparams * sizeof(int) + 1);
        for (int i = 0; i < m->nparams; i++) {
            param_t *p = m->params[i];
            if (param_unit(m, p) == u && p->expert == k) {
                t[zu->n[k]] = train_view2(p->master, p->rows, p->cols);
                zu->idx[k][zu->n[k]++] = i;
            }
        }
        if (zu->n[k] == 0)
            continue;
        hcomm_zero_config_t c = {rt->zero->stage, cap, HCOMM_SUM, HCOMM_ZERO_PARAM_DTYPE, 1};
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_zero_create(g[2 * k], g[2 * k + 1], t, zu->n[k], &c,
                                                       &zu->plan[k])));
        TRAIN_TRY(rt, hcomm_zero_num_buckets(zu->plan[k], &zu->nb[k]));
        zu->mom[k] = train_alloc((size_t)zu->nb[k] * sizeof(real_t *) + 1);
        for (int b = 0; b < zu->nb[k]; b++) {
            hcomm_zero_shard_t sh;
            TRAIN_TRY(rt, hcomm_zero_shard(zu->plan[k], b, &sh));
            zu->mom[k][b] = train_alloc(sh.count * sizeof(real_t) + 1);
            memset(zu->mom[k][b], 0, sh.count * sizeof(real_t));
            rt->zero->mom_bytes += sh.count * sizeof(real_t);
        }
    }
    free(t);
    return HCOMM_OK;
}

/* The model's own buffers go: the plans hold the parameters (with bf16 the rounded copy
 * stays), the gradients and the momentum. */
static void zero_drop_model_buffers(model_t *m) {
    for (int i = 0; i < m->nparams; i++) {
        param_t *p = m->params[i];
        free(p->master);
        free(p->g);
        free(p->v);
        p->master = p->g = p->v = NULL;
        if (!m->bf16)
            p->w = NULL;
    }
}

/* Groups: dense shard and replicate, expert shard and replicate (NULL: one replica). */
static hcomm_result_t zero_groups(train_rt_t *rt, hcomm_ctx_t *ctx, hcomm_comm_t *g[4]) {
    const hcomm_group_kind_t kinds[4] = {HCOMM_GROUP_DP_SHARD, HCOMM_GROUP_DP_REPLICATE,
                                         HCOMM_GROUP_EDP_SHARD, HCOMM_GROUP_EDP_REPLICATE};
    for (int k = 0; k < 4; k++) {
        int rank = 0, size = 0;
        TRAIN_TRY(rt, hcomm_ctx_group(ctx, kinds[k], &g[k]));
        TRAIN_TRY(rt, hcomm_ctx_rank(ctx, kinds[k], &rank, &size));
        if (k % 2 == 1 && size == 1)
            g[k] = NULL;
    }
    return HCOMM_OK;
}

static hcomm_result_t zero_setup(model_t *m, train_rt_t *rt, const train_opts_t *o,
                                 hcomm_ctx_t *ctx) {
    hcomm_comm_t *g[4];
    ZERO_TRY(zero_groups(rt, ctx, g));
    rt->zero = train_alloc(sizeof *rt->zero);
    memset(rt->zero, 0, sizeof *rt->zero);
    rt->zero->stage = o->zero;
    rt->zero->pending = -1;
    rt->zero->unsharded = zero_unsharded_bytes(m);
    const int U = model_units(m->L);
    rt->zero->u = train_alloc((size_t)U * sizeof(zunit_t));
    memset(rt->zero->u, 0, (size_t)U * sizeof(zunit_t));
    /* Buckets of at most 1/32 of this rank's parameters (a larger tensor gets its own). */
    size_t cap = rt->zero->unsharded / (size_t)(m->bf16 ? 4 : 3) / 32;
    for (int u = 0; u < U; u++)
        if (has_unit(m, u))
            ZERO_TRY(zero_plan_unit(m, rt, g, u, cap > 64 ? cap : 64));
    zero_drop_model_buffers(m);
    for (int u = 0; u < U && o->zero < 3; u++) /* ZeRO-1/2: gathered for good */
        if (has_unit(m, u))
            ZERO_TRY(zero_point(m, rt, &rt->zero->u[u], 0));
    zero_sample_memory(m, rt);
    return HCOMM_OK;
}

/* Frees the plans; the model's pointers into them are cleared first (model_free frees what
 * they point to). */
static void zero_free(model_t *m, train_rt_t *rt, int units) {
    train_zero_t *z = rt->zero;
    for (int i = 0; z && i < m->nparams; i++) {
        param_t *p = m->params[i];
        if (!m->bf16)
            p->w = NULL;
        p->master = p->g = NULL;
    }
    for (int u = 0; z && u < units; u++)
        for (int k = 0; k < 2; k++) {
            for (int b = 0; b < z->u[u].nb[k]; b++)
                free(z->u[u].mom[k][b]);
            free(z->u[u].mom[k]);
            free(z->u[u].idx[k]);
            hcomm_zero_destroy(&z->u[u].plan[k]);
        }
    if (z)
        free(z->u);
    free(z);
    rt->zero = NULL;
}

/* Records the seconds a blocking zero call waited as DP wait (exposed communication). */
static hcomm_result_t zero_timed(train_rt_t *rt, double t0, hcomm_result_t r, const char *what) {
    rt->dp_s += train_now() - t0;
    return r == HCOMM_OK ? r : train_fail(rt, what, r);
}

/* Starts the gather of unit u's parameters (ZeRO-3 prefetch), if u is on this rank. */
static hcomm_result_t zero_prefetch(const model_t *m, train_rt_t *rt, int u) {
    if (rt->zero->stage < 3 || u < 0 || u >= model_units(m->L))
        return HCOMM_OK;
    zunit_t *zu = &rt->zero->u[u];
    for (int k = 0; k < 2; k++)
        if (zu->plan[k])
            TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_zero_iall_gather_params(zu->plan[k], HCOMM_ZERO_ALL,
                                                                       NULL, 0)));
    return HCOMM_OK;
}

/* Before unit u runs (forward if fwd, else backward): its reduce_scatter of the previous
 * micro-batch done, its parameters gathered (ZeRO-3; the next unit prefetched) and pointed
 * to, and in backward its gradients. */
static hcomm_result_t zero_unit_begin(model_t *m, train_rt_t *rt, int u, int fwd) {
    if (!rt->zero)
        return HCOMM_OK;
    zunit_t *zu = &rt->zero->u[u];
    double t0 = train_now();
    hcomm_result_t r = HCOMM_OK;
    for (int k = 0; k < 2 && r == HCOMM_OK; k++)
        if (zu->plan[k]) {
            r = TRAIN_COMM(rt, hcomm_zero_wait(zu->plan[k], HCOMM_ZERO_ALL, NULL));
            if (r == HCOMM_OK && rt->zero->stage == 3)
                r = TRAIN_COMM(rt,
                               hcomm_zero_all_gather_params(zu->plan[k], HCOMM_ZERO_ALL, NULL, 0));
        }
    ZERO_TRY(zero_timed(rt, t0, r, "hcomm_zero_all_gather_params"));
    ZERO_TRY(zero_prefetch(m, rt, fwd ? u + 1 : u - 1));
    ZERO_TRY(zero_point(m, rt, zu, !fwd));
    zero_sample_memory(m, rt);
    return HCOMM_OK;
}

/* One unit's reduce_scatter stays in flight while the next unit's backward runs; the one
 * before it is waited for, so that full gradients (freed when their reduce_scatter ends) are
 * held for at most two units, not for every unit until the last micro-batch. */
static hcomm_result_t zero_settle(train_rt_t *rt, int u) {
    int prev = rt->zero->pending;
    rt->zero->pending = u;
    if (prev < 0 || prev == u)
        return HCOMM_OK;
    double t0 = train_now();
    hcomm_result_t r = HCOMM_OK;
    for (int k = 0; k < 2 && r == HCOMM_OK; k++)
        if (rt->zero->u[prev].plan[k])
            r = TRAIN_COMM(rt, hcomm_zero_wait(rt->zero->u[prev].plan[k], HCOMM_ZERO_ALL, NULL));
    return zero_timed(rt, t0, r, "hcomm_zero_wait");
}

/* After unit u ran: in backward its gradients are reduce_scattered (nonblocking, added into
 * the shards); ZeRO-3 then frees its gathered parameters. */
static hcomm_result_t zero_unit_end(model_t *m, train_rt_t *rt, int u, int fwd) {
    if (!rt->zero)
        return HCOMM_OK;
    zunit_t *zu = &rt->zero->u[u];
    zero_sample_memory(m, rt);
    for (int k = 0; k < 2; k++) {
        if (!zu->plan[k])
            continue;
        if (!fwd)
            TRAIN_TRY(
                rt, TRAIN_COMM(rt, hcomm_zero_ireduce_scatter_grads(zu->plan[k], HCOMM_ZERO_ALL)));
        if (rt->zero->stage == 3)
            TRAIN_TRY(rt, hcomm_zero_release(zu->plan[k], HCOMM_ZERO_ALL));
    }
    return fwd ? HCOMM_OK : zero_settle(rt, u);
}

/* Gathers every unit's parameters and points the model at them: ZeRO-1/2 after each step,
 * and every stage before the replica check at the end. */
static hcomm_result_t zero_gather_everything(model_t *m, train_rt_t *rt, int in_step) {
    double t0 = train_now();
    for (int u = 0; u < model_units(m->L); u++) {
        zunit_t *zu = &rt->zero->u[u];
        for (int k = 0; k < 2; k++)
            if (zu->plan[k])
                ZERO_TRY(zero_timed(rt, t0,
                                    TRAIN_COMM(rt, hcomm_zero_all_gather_params(
                                                       zu->plan[k], HCOMM_ZERO_ALL, NULL, 0)),
                                    "hcomm_zero_all_gather_params"));
        if (zu->plan[0] || zu->plan[1])
            ZERO_TRY(zero_point(m, rt, zu, 0));
        t0 = train_now();
    }
    if (in_step) /* the end's gather for the replica check is no part of a step */
        zero_sample_memory(m, rt);
    return HCOMM_OK;
}

/* SGD with momentum on one bucket's shard: the arithmetic of model_sgd, element by element. */
static void zero_sgd_shard(const hcomm_zero_shard_t *sh, real_t *v, double lr, double momentum) {
    const real_t rate = (real_t)lr, mom = (real_t)momentum;
    real_t *w = sh->params;
    const real_t *g = sh->grads;
    for (size_t e = 0; e < sh->valid; e++) {
        v[e] = mom * v[e] + g[e];
        w[e] -= rate * v[e];
    }
}

/* The optimizer step: every reduce_scatter waited for, the shards stepped and their gradients
 * cleared; ZeRO-1/2 then gather the new parameters (ZeRO-3 gathers them when next used). */
static hcomm_result_t zero_step(model_t *m, train_rt_t *rt, double lr, double momentum) {
    train_zero_t *z = rt->zero;
    double t0 = train_now();
    hcomm_result_t r = HCOMM_OK;
    for (int u = 0; u < model_units(m->L) && r == HCOMM_OK; u++)
        for (int k = 0; k < 2 && r == HCOMM_OK; k++)
            if (z->u[u].plan[k])
                r = TRAIN_COMM(rt, hcomm_zero_wait(z->u[u].plan[k], HCOMM_ZERO_ALL, NULL));
    ZERO_TRY(zero_timed(rt, t0, r, "hcomm_zero_wait"));
    z->pending = -1;
    for (int u = 0; u < model_units(m->L); u++)
        for (int k = 0; k < 2; k++) {
            zunit_t *zu = &z->u[u];
            for (int b = 0; b < zu->nb[k]; b++) {
                hcomm_zero_shard_t sh;
                TRAIN_TRY(rt, hcomm_zero_shard(zu->plan[k], b, &sh));
                zero_sgd_shard(&sh, zu->mom[k][b], lr, momentum);
            }
            if (zu->plan[k])
                TRAIN_TRY(rt, hcomm_zero_clear_grads(zu->plan[k]));
        }
    return z->stage < 3 ? zero_gather_everything(m, rt, 1) : HCOMM_OK;
}

/* The memory line: the most bytes of parameters, gradients and momentum any rank held during
 * a step (the plans' own count: shards, gathered buckets, full gradients, scratch; plus the
 * momentum shards), against the same model unsharded. Collective over the world. */
static hcomm_result_t zero_report_memory(const model_t *m, train_rt_t *rt, const train_opts_t *o) {
    double v[2] = {rt->zero ? (double)rt->zero->peak : (double)zero_unsharded_bytes(m),
                   (double)zero_unsharded_bytes(m)};
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_all_reduce(rt->world, v, v, 2, HCOMM_F64, HCOMM_MAX)));
    if (rt->world_rank == 0) {
        if (o->zero > 0)
            printf("memory: peak live bytes of parameters, gradients and momentum per rank: "
                   "%.0f with --zero %d --dp-shard %d, %.0f unsharded (%.3f of it)\n",
                   v[0], o->zero, o->dp_shard, v[1], v[1] > 0 ? v[0] / v[1] : 0.0);
        else
            printf("memory: peak live bytes of parameters, gradients and momentum per rank: %.0f "
                   "(unsharded, --zero 0)\n",
                   v[1]);
        fflush(stdout);
    }
    return HCOMM_OK;
}
