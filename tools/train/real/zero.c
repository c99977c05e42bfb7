/* --zero 1|2|3: the parameters, gradients and momentum of hcomm-train held by shard plans
 * (hcomm/zero.h), one per piece of a unit (model.h: attention, MLP, router, each expert, the
 * embedding, the head) and so of one gradient group (dense over DP_SHARD, experts over
 * EDP_SHARD; with --dp-shard < --dp the rest of DP replicates, HSDP). A piece's parameters
 * point into its plan's gathered buffer while it is used (ZeRO-3 gathers them just before,
 * with the next piece prefetched, and releases them after, so only about two pieces are live
 * at once); its gradients accumulate in the plan's full gradients, reduce_scattered
 * (nonblocking, added into the shard) after each of its backward passes; SGD with momentum
 * then steps the shards, and ZeRO-1/2 gather the result. Included by train.c (static
 * functions, like the rest of real/). */

/* Returns from the enclosing function when call fails (it has reported the failure). */
#define ZERO_TRY(call)                                                                             \
    do {                                                                                           \
        hcomm_result_t zr_ = (call);                                                               \
        if (zr_ != HCOMM_OK)                                                                       \
            return zr_;                                                                            \
    } while (0)

/* One piece of a unit (zero_piece_of): parameters the model code uses together, one plan
 * (dense or expert, never both). */
typedef struct zpiece {
    hcomm_zero_plan_t *plan; /* NULL: the piece has no parameters */
    int *idx;                /* the plan's parameter j is m->params[idx[j]] */
    int n, nb;
    real_t **mom; /* [nb] momentum shard of each bucket */
} zpiece_t;

typedef struct zunit {
    zpiece_t *pc; /* [npc]; NULL for units of other stages */
    int npc;
    int open; /* the piece whose parameters the unit uses now, or -1 */
} zunit_t;

typedef struct train_zero {
    int stage;
    model_t *m; /* the model the pieces point into (zero_piece gets rt only) */
    zunit_t *u; /* [model_units] */
    size_t mom_bytes, peak, unsharded;
    hcomm_zero_plan_t *pending; /* the piece whose reduce_scatter was issued last, or NULL */
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
        for (int s = 0; s < z->u[u].npc; s++)
            if (z->u[u].pc[s].plan &&
                hcomm_zero_memory(z->u[u].pc[s].plan, &bytes, NULL) == HCOMM_OK)
                live += bytes;
    for (int i = 0; m->bf16 && i < m->nparams; i++)
        live += (size_t)(m->params[i]->rows * m->params[i]->cols) * sizeof(real_t);
    if (live > z->peak)
        z->peak = live;
}

/* Points the piece's parameters (and, in backward, gradients) into its plan's buffers. */
static hcomm_result_t zero_point(model_t *m, train_rt_t *rt, zpiece_t *pc, int grads) {
    for (int j = 0; j < pc->n; j++) {
        param_t *p = m->params[pc->idx[j]];
        void *d = NULL;
        TRAIN_TRY(rt, hcomm_zero_param(pc->plan, j, &d));
        p->master = d;
        if (!m->bf16)
            p->w = d;
        param_round(m, p);
        if (grads) {
            TRAIN_TRY(rt, hcomm_zero_grad(pc->plan, j, &d));
            p->g = d;
        }
    }
    return HCOMM_OK;
}

/* Pieces of unit u: the TP block's attention and MLP, the MoE layer's router and each local
 * expert, the embedding or the head whole. Gathered one at a time, a unit's parameters are
 * never all live at once. */
static int zero_pieces(const model_t *m, int u) {
    const int kind = unit_kind(u, m->L);
    return kind == UNIT_TP ? 2 : kind == UNIT_MOE ? 1 + m->E_local : 1;
}

/* The piece of unit u that holds p (model.h's PIECE_ numbers). */
static int zero_piece_of(const model_t *m, const param_t *p, int u) {
    const int kind = unit_kind(u, m->L);
    if (kind != UNIT_TP && kind != UNIT_MOE)
        return 0;
    const layer_t *y = &m->layers[(u - 1) / 2];
    if (kind == UNIT_TP)
        return p == &y->w1 || p == &y->b1 || p == &y->w2 || p == &y->b2 ? PIECE_MLP : PIECE_ATTN;
    if (!p->expert)
        return PIECE_ROUTER;
    return PIECE_EXPERT0 +
           (int)(((const char *)p - (const char *)y->experts) / (ptrdiff_t)sizeof(expert_t));
}

/* The i-th piece unit u uses in a forward (fwd) or backward pass, in the model code's order
 * (the TP block's backward runs its MLP before its attention); also the inverse map. */
static int zero_nth(const model_t *m, int u, int fwd, int i) {
    return !fwd && unit_kind(u, m->L) == UNIT_TP ? 1 - i : i;
}

/* The plan of piece s of unit u, built from the unit's parameters of that piece. */
static hcomm_result_t zero_plan_piece(model_t *m, train_rt_t *rt, hcomm_comm_t *const g[4], int u,
                                      int s, size_t cap, hcomm_tensor_t *t) {
    zpiece_t *pc = &rt->zero->u[u].pc[s];
    int k = 0;
    pc->idx = train_alloc((size_t)m->nparams * sizeof(int) + 1);
    for (int i = 0; i < m->nparams; i++) {
        param_t *p = m->params[i];
        if (param_unit(m, p) == u && zero_piece_of(m, p, u) == s) {
            t[pc->n] = train_view2(p->master, p->rows, p->cols);
            pc->idx[pc->n++] = i;
            k = p->expert;
        }
    }
    if (pc->n == 0)
        return HCOMM_OK;
    hcomm_zero_config_t c = {rt->zero->stage, cap, HCOMM_SUM, HCOMM_ZERO_PARAM_DTYPE, 1};
    TRAIN_TRY(rt,
              TRAIN_COMM(rt, hcomm_zero_create(g[2 * k], g[2 * k + 1], t, pc->n, &c, &pc->plan)));
    TRAIN_TRY(rt, hcomm_zero_num_buckets(pc->plan, &pc->nb));
    pc->mom = train_alloc((size_t)pc->nb * sizeof(real_t *) + 1);
    for (int b = 0; b < pc->nb; b++) {
        hcomm_zero_shard_t sh;
        TRAIN_TRY(rt, hcomm_zero_shard(pc->plan, b, &sh));
        pc->mom[b] = train_alloc(sh.count * sizeof(real_t) + 1);
        memset(pc->mom[b], 0, sh.count * sizeof(real_t));
        rt->zero->mom_bytes += sh.count * sizeof(real_t);
    }
    return HCOMM_OK;
}

static hcomm_result_t zero_plan_unit(model_t *m, train_rt_t *rt, hcomm_comm_t *const g[4], int u,
                                     size_t cap) {
    zunit_t *zu = &rt->zero->u[u];
    zu->npc = zero_pieces(m, u);
    zu->pc = train_alloc((size_t)zu->npc * sizeof(zpiece_t));
    memset(zu->pc, 0, (size_t)zu->npc * sizeof(zpiece_t));
    hcomm_tensor_t *t = train_alloc((size_t)m->nparams * sizeof *t + 1);
    hcomm_result_t r = HCOMM_OK;
    for (int s = 0; s < zu->npc && r == HCOMM_OK; s++)
        r = zero_plan_piece(m, rt, g, u, s, cap, t);
    free(t);
    return r;
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
    rt->zero->m = m;
    rt->zero->unsharded = zero_unsharded_bytes(m);
    const int U = model_units(m->L);
    rt->zero->u = train_alloc((size_t)U * sizeof(zunit_t));
    memset(rt->zero->u, 0, (size_t)U * sizeof(zunit_t));
    for (int u = 0; u < U; u++)
        rt->zero->u[u].open = -1;
    /* Buckets of at most 1/32 of this rank's parameters (a larger tensor gets its own). */
    size_t cap = rt->zero->unsharded / (size_t)(m->bf16 ? 4 : 3) / 32;
    for (int u = 0; u < U; u++)
        if (has_unit(m, u))
            ZERO_TRY(zero_plan_unit(m, rt, g, u, cap > 64 ? cap : 64));
    zero_drop_model_buffers(m);
    for (int u = 0; u < U && o->zero < 3; u++) /* ZeRO-1/2: gathered for good */
        for (int s = 0; s < rt->zero->u[u].npc; s++)
            if (rt->zero->u[u].pc[s].plan)
                ZERO_TRY(zero_point(m, rt, &rt->zero->u[u].pc[s], 0));
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
    for (int u = 0; z && u < units; u++) {
        for (int s = 0; s < z->u[u].npc; s++) {
            zpiece_t *pc = &z->u[u].pc[s];
            for (int b = 0; b < pc->nb; b++)
                free(pc->mom[b]);
            free(pc->mom);
            free(pc->idx);
            hcomm_zero_destroy(&pc->plan);
        }
        free(z->u[u].pc);
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

/* ZeRO-3: starts the gather of the piece used after piece s of unit u (the next of the unit
 * in the pass's order, else the first of the next unit, if this rank has it). */
static hcomm_result_t zero_prefetch(const model_t *m, train_rt_t *rt, int u, int s, int fwd) {
    train_zero_t *z = rt->zero;
    int i = zero_nth(m, u, fwd, s) + 1;
    if (i >= z->u[u].npc) {
        u += fwd ? 1 : -1;
        i = 0;
    }
    if (z->stage < 3 || u < 0 || u >= model_units(m->L) || i >= z->u[u].npc)
        return HCOMM_OK;
    hcomm_zero_plan_t *plan = z->u[u].pc[zero_nth(m, u, fwd, i)].plan;
    if (plan)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_zero_iall_gather_params(plan, HCOMM_ZERO_ALL, NULL, 0)));
    return HCOMM_OK;
}

/* Before piece s of unit u is used (forward if fwd, else backward): its reduce_scatter of the
 * previous micro-batch done, its parameters gathered (ZeRO-3; the next piece prefetched) and
 * pointed to, and in backward its gradients. */
static hcomm_result_t zero_open(train_rt_t *rt, int u, int s, int fwd) {
    train_zero_t *z = rt->zero;
    zpiece_t *pc = &z->u[u].pc[s];
    z->u[u].open = s;
    double t0 = train_now();
    hcomm_result_t r = HCOMM_OK;
    /* The gather before the wait: it takes over the prefetch in flight, whereas after a wait
     * had completed that prefetch it would gather the bucket once more. */
    if (pc->plan && z->stage == 3)
        r = TRAIN_COMM(rt, hcomm_zero_all_gather_params(pc->plan, HCOMM_ZERO_ALL, NULL, 0));
    if (pc->plan && r == HCOMM_OK)
        r = TRAIN_COMM(rt, hcomm_zero_wait(pc->plan, HCOMM_ZERO_ALL, NULL));
    ZERO_TRY(zero_timed(rt, t0, r, "hcomm_zero_all_gather_params"));
    ZERO_TRY(zero_prefetch(z->m, rt, u, s, fwd));
    if (pc->plan)
        ZERO_TRY(zero_point(z->m, rt, pc, !fwd));
    zero_sample_memory(z->m, rt);
    return HCOMM_OK;
}

/* One piece's reduce_scatter stays in flight while the next piece's backward runs; the one
 * before it is waited for, so that full gradients (freed when their reduce_scatter ends) are
 * held for at most two pieces, not for every piece until the last micro-batch. */
static hcomm_result_t zero_settle(train_rt_t *rt, hcomm_zero_plan_t *plan) {
    hcomm_zero_plan_t *prev = rt->zero->pending;
    rt->zero->pending = plan;
    if (!prev || prev == plan)
        return HCOMM_OK;
    double t0 = train_now();
    return zero_timed(rt, t0, TRAIN_COMM(rt, hcomm_zero_wait(prev, HCOMM_ZERO_ALL, NULL)),
                      "hcomm_zero_wait");
}

/* After the open piece of unit u was used: in backward its gradients are reduce_scattered
 * (nonblocking, added into the shards); ZeRO-3 then frees its gathered parameters. */
static hcomm_result_t zero_close(train_rt_t *rt, int u, int fwd) {
    train_zero_t *z = rt->zero;
    const int s = z->u[u].open;
    z->u[u].open = -1;
    hcomm_zero_plan_t *plan = s >= 0 ? z->u[u].pc[s].plan : NULL;
    if (!plan)
        return HCOMM_OK;
    zero_sample_memory(z->m, rt);
    if (!fwd)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_zero_ireduce_scatter_grads(plan, HCOMM_ZERO_ALL)));
    if (z->stage == 3)
        TRAIN_TRY(rt, hcomm_zero_release(plan, HCOMM_ZERO_ALL));
    return fwd ? HCOMM_OK : zero_settle(rt, plan);
}

/* The model code's hook (model.h): piece s of unit u is used next; the piece in use before
 * it is closed. A no-op without --zero and for the piece already open. */
static hcomm_result_t zero_piece(train_rt_t *rt, int u, int s, int fwd) {
    if (!rt->zero || rt->zero->u[u].open == s)
        return HCOMM_OK;
    ZERO_TRY(zero_close(rt, u, fwd));
    return zero_open(rt, u, s, fwd);
}

/* Before unit u runs: its first piece in the pass's order opened. */
static hcomm_result_t zero_unit_begin(model_t *m, train_rt_t *rt, int u, int fwd) {
    return zero_piece(rt, u, zero_nth(m, u, fwd, 0), fwd);
}

/* After unit u ran: its last piece closed. */
static hcomm_result_t zero_unit_end(model_t *m, train_rt_t *rt, int u, int fwd) {
    (void)m;
    return rt->zero ? zero_close(rt, u, fwd) : HCOMM_OK;
}

/* Gathers every piece's parameters and points the model at them: ZeRO-1/2 after each step,
 * and every stage before the replica check at the end. */
static hcomm_result_t zero_gather_everything(model_t *m, train_rt_t *rt, int in_step) {
    for (int u = 0; u < model_units(m->L); u++)
        for (int s = 0; s < rt->zero->u[u].npc; s++) {
            zpiece_t *pc = &rt->zero->u[u].pc[s];
            if (!pc->plan)
                continue;
            double t0 = train_now();
            ZERO_TRY(zero_timed(
                rt, t0,
                TRAIN_COMM(rt, hcomm_zero_all_gather_params(pc->plan, HCOMM_ZERO_ALL, NULL, 0)),
                "hcomm_zero_all_gather_params"));
            ZERO_TRY(zero_point(m, rt, pc, 0));
        }
    if (in_step) /* the end's gather for the replica check is no part of a step */
        zero_sample_memory(m, rt);
    return HCOMM_OK;
}

/* Calls fn(shard, its momentum, arg) on every bucket of every plan, in plan order. */
typedef void (*zshard_fn)(const hcomm_zero_shard_t *sh, real_t *mom, void *arg);

static hcomm_result_t zero_each_shard(train_rt_t *rt, zshard_fn fn, void *arg) {
    const train_zero_t *z = rt->zero;
    for (int u = 0; z && u < model_units(z->m->L); u++)
        for (int s = 0; s < z->u[u].npc; s++)
            for (int b = 0; b < z->u[u].pc[s].nb; b++) {
                hcomm_zero_shard_t sh;
                TRAIN_TRY(rt, hcomm_zero_shard(z->u[u].pc[s].plan, b, &sh));
                fn(&sh, z->u[u].pc[s].mom[b], arg);
            }
    return HCOMM_OK;
}

/* SGD with momentum on one bucket's shard: the arithmetic of model_sgd, element by element.
 * arg: the learning rate and the momentum. */
static void zero_sgd_shard(const hcomm_zero_shard_t *sh, real_t *v, void *arg) {
    const double *lr_mom = arg;
    const real_t rate = (real_t)lr_mom[0], mom = (real_t)lr_mom[1];
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
        for (int s = 0; s < z->u[u].npc && r == HCOMM_OK; s++)
            if (z->u[u].pc[s].plan)
                r = TRAIN_COMM(rt, hcomm_zero_wait(z->u[u].pc[s].plan, HCOMM_ZERO_ALL, NULL));
    ZERO_TRY(zero_timed(rt, t0, r, "hcomm_zero_wait"));
    z->pending = NULL;
    double lr_mom[2] = {lr, momentum};
    ZERO_TRY(zero_each_shard(rt, zero_sgd_shard, lr_mom));
    for (int u = 0; u < model_units(m->L); u++)
        for (int s = 0; s < z->u[u].npc; s++)
            if (z->u[u].pc[s].plan)
                TRAIN_TRY(rt, hcomm_zero_clear_grads(z->u[u].pc[s].plan));
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

/* --- in-job recovery under HSDP (recover.c): a lost shard group is dropped whole, and every
 * survivor keeps its shard index in a shard group of the same size --- */

static void count_shard(const hcomm_zero_shard_t *sh, real_t *mom, void *arg) {
    (void)mom;
    *(size_t *)arg += sh->count;
}

/* Values of this rank's parameter shards (and as many of momentum) over every plan. */
static size_t zero_state_values(train_rt_t *rt) {
    size_t n = 0;
    zero_each_shard(rt, count_shard, &n);
    return n;
}

/* arg: the cursor into the copy, then whether to save (1) or restore (0). */
typedef struct zcopy {
    real_t *at;
    int save;
} zcopy_t;

static void copy_shard(const hcomm_zero_shard_t *sh, real_t *mom, void *arg) {
    zcopy_t *c = arg;
    size_t bytes = sh->count * sizeof(real_t);
    memcpy(c->save ? c->at : sh->params, c->save ? sh->params : c->at, bytes);
    memcpy(c->save ? c->at + sh->count : mom, c->save ? mom : c->at + sh->count, bytes);
    c->at += 2 * sh->count;
}

/* Copies every bucket's parameter shard, then its momentum, to (save) or from buf. */
static void zero_state_copy(train_rt_t *rt, real_t *buf, int save) {
    zcopy_t c = {buf, save};
    zero_each_shard(rt, copy_shard, &c);
}

/* The plans again, on next's groups, holding the shards and momentum of saved: built from
 * zeroed parameters (ZeRO-3 holds no full copy to build them from), then given the saved
 * shards, which ZeRO-1/2 gather at once. */
static hcomm_result_t zero_rebuild(model_t *m, train_rt_t *rt, const train_opts_t *o,
                                   hcomm_ctx_t *next, real_t *saved) {
    for (int i = 0; i < m->nparams; i++) {
        param_t *p = m->params[i];
        p->master = train_alloc((size_t)(p->rows * p->cols) * sizeof(real_t) + 1);
        memset(p->master, 0, (size_t)(p->rows * p->cols) * sizeof(real_t));
        if (!m->bf16)
            p->w = p->master;
    }
    ZERO_TRY(zero_setup(m, rt, o, next));
    zero_state_copy(rt, saved, 0);
    return o->zero < 3 ? zero_gather_everything(m, rt, 1) : HCOMM_OK;
}
