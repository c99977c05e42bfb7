/* In-job recovery (--max-failures; hcomm/fault.h). Each step starts from a copy of this rank's
 * master weights, momentum and sampler state; at its end every live rank agrees (a
 * fault-tolerant AND) that it went well. When a rank was lost, the survivors revoke their
 * groups (so no peer waits on them), shrink the world, rebuild the domains with the replicas
 * that kept every member, drop the others' survivors, put the copy back and redo the step
 * with dp lowered: the same global batch over fewer replicas, so the losses go on as those of
 * a run resumed at that step with the smaller --dp. Nothing is read from disk: the replicas
 * hold the same state, and tp, pp and cp stay, so every survivor keeps its own shards. Under
 * HSDP (--zero with --dp-shard < --dp) a replica is a shard group: the copy is this rank's
 * parameter and momentum shards, and the plans are built again on the new groups.
 * Included by train.c (one translation unit per precision). */

typedef struct recover {
    int failures;      /* lost ranks survived so far */
    size_t total;      /* values of this rank's parameters (--zero: of its shards) */
    real_t *saved;     /* master weights, then momentum, of every parameter (--zero: of every
                          bucket's shard), before the step */
    rng_t data_rng;    /* the sampler before the step */
    train_opts_t opts; /* the run's flags, --dp lowered by each recovery */
    train_job_t job;   /* the run's job, with opts */
    double lost_at;    /* when this step's agreement began */
} recover_t;

/* What a step's agreement decided. */
enum { STEP_OK, STEP_REDO, STEP_LEAVE, STEP_FAIL };

static void recover_init(recover_t *rec, const train_job_t *job, const model_t *m, train_rt_t *rt) {
    memset(rec, 0, sizeof *rec);
    if (rt->zero)
        rec->total = zero_state_values(rt);
    else
        for (int i = 0; i < m->nparams; i++)
            rec->total += (size_t)(m->params[i]->rows * m->params[i]->cols);
    rec->saved = train_alloc(2 * rec->total * sizeof(real_t) + 1);
    rec->opts = *job->opts;
    rec->job = *job;
    rec->job.opts = &rec->opts;
}

/* Copies every parameter's master weights and momentum to or from rec->saved. */
static void recover_copy(recover_t *rec, model_t *m, int save) {
    real_t *w = rec->saved, *v = rec->saved + rec->total;
    for (int i = 0; i < m->nparams; i++) {
        param_t *p = m->params[i];
        size_t n = (size_t)(p->rows * p->cols), bytes = n * sizeof(real_t);
        memcpy(save ? w : p->master, save ? p->master : w, bytes);
        memcpy(save ? v : p->v, save ? p->v : v, bytes);
        if (!save)
            param_round(m, p);
        w += n;
        v += n;
    }
}

static void recover_save(train_rt_t *rt, model_t *m, const train_state_t *st) {
    recover_t *rec = rt->rec;
    if (rt->zero)
        zero_state_copy(rt, rec->saved, 1);
    else
        recover_copy(rec, m, 1);
    rec->data_rng = st->data_rng;
}

/* The first failure this rank saw in the step, printed now that it is not a lost rank's. */
static hcomm_result_t step_failed(train_rt_t *rt, hcomm_result_t r) {
    if (rt->step_error[0] != '\0')
        fprintf(stderr, "hcomm-train: rank %d: %s\n", rt->world_rank, rt->step_error);
    return r != HCOMM_OK ? r : HCOMM_ERR_ABORTED;
}

/* "rank 5" (or "ranks 5, 6"): the world ranks of rt->world's members known lost. */
static void lost_names(train_rt_t *rt, char *buf, size_t cap) {
    int lost[16], n = 0, members[4096];
    hcomm_comm_lost(rt->world, lost, 16, &n);
    hcomm_comm_members(rt->world, members, 4096);
    size_t len = (size_t)snprintf(buf, cap, "rank%s", n == 1 ? "" : "s");
    for (int i = 0; i < n && i < 16 && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s %d", i ? "," : "", members[lost[i]]);
}

/* Takes the new context's groups, as rt_setup does for the first one. */
static hcomm_result_t regroup(train_rt_t *rt, recover_t *rec, hcomm_ctx_t *next) {
    hcomm_parallel_config_t cfg;
    TRAIN_TRY(rt, hcomm_ctx_config(next, &cfg));
    rec->opts.dp = cfg.dp;
    rt->ctx = next;
    TRAIN_TRY(rt, hcomm_ctx_world(next, &rt->world));
    TRAIN_TRY(rt, hcomm_comm_rank(rt->world, &rt->world_rank));
    TRAIN_TRY(rt, hcomm_comm_size(rt->world, &rt->world_size));
    return rt_take_groups(rt, &rec->opts, next);
}

/* The new world's rank 0 reports from here on: it opens --metrics to append if the old one
 * was lost. */
static void take_reports(train_rt_t *rt, report_t *rep, int was_zero, int step) {
    if (rt->world_rank != 0 || was_zero)
        return;
    const train_opts_t *o = rt->rec->job.opts;
    if (o->metrics != NULL)
        rep->metrics = fopen(o->metrics, "a");
    rep->t0 = rep->mark_t = rep->step_t = train_now();
    rep->first_step = rep->mark_step = step;
}

/* Shrink, rebuild, drop the old groups; STEP_REDO with rt on the new context, STEP_LEAVE where
 * this rank's replica was dropped. */
static int rebuild(train_rt_t *rt, model_t *m, train_state_t *st, report_t *rep, int step,
                   hcomm_result_t *r) {
    recover_t *rec = rt->rec;
    const train_opts_t *o = &rec->opts;
    char who[160];
    lost_names(rt, who, sizeof who);
    hcomm_comm_t *shrunk = NULL;
    hcomm_ctx_t *next = NULL;
    int was_zero = rt->world_rank == 0, old_dp = o->dp;
    *r = hcomm_comm_shrink(rt->world, &shrunk);
    if (*r == HCOMM_OK)
        *r = hcomm_ctx_rebuild(rt->ctx, shrunk, &next);
    if (*r != HCOMM_OK) {
        train_fail(rt, "recovering from a lost rank", *r);
        return STEP_FAIL;
    }
    reducers_free(rt);
    zero_free(m, rt, model_units(m->L)); /* its plans wait on the old groups */
    attn_teardown(rt, 0);
    hcomm_ctx_destroy(rt->ctx);
    hcomm_comm_destroy(shrunk);
    rt->ctx = NULL;
    if (next == NULL) {
        printf("hcomm-train: rank %d leaves: its data-parallel replica lost %s at step %d\n",
               rt->world_rank, who, step);
        fflush(stdout);
        return STEP_LEAVE;
    }
    *r = regroup(rt, rec, next);
    if (*r == HCOMM_OK && o->dp_overlap && o->zero == 0)
        *r = reducers_setup(m, rt);
    if (*r != HCOMM_OK)
        return STEP_FAIL;
    model_set_owners(m, rt);
    if (o->zero > 0)
        *r = zero_rebuild(m, rt, o, next, rec->saved);
    else
        recover_copy(rec, m, 0);
    if (*r != HCOMM_OK)
        return STEP_FAIL;
    st->data_rng = rec->data_rng;
    rec->failures++;
    take_reports(rt, rep, was_zero, step);
    if (rt->world_rank == 0) {
        printf("%s lost at step %d (%s; noticed after %.2f s); continuing with dp=%d (was %d) "
               "after %.2f s\n",
               who, step, rt->step_error[0] ? rt->step_error : "found by the step's agreement",
               rt->step_error_wait, o->dp, old_dp, train_now() - rec->lost_at);
        fflush(stdout);
    }
    return STEP_REDO;
}

/* The step's end: every live rank agrees whether it went well. */
static int recover_step(train_rt_t *rt, model_t *m, train_state_t *st, report_t *rep, int step,
                        hcomm_result_t *r) {
    recover_t *rec = rt->rec;
    int ok = *r == HCOMM_OK;
    rec->lost_at = train_now();
    if (!ok)
        hcomm_ctx_revoke(rt->ctx); /* peers may wait on this rank in any group */
    hcomm_result_t a = hcomm_comm_agree(rt->world, &ok);
    if (a == HCOMM_OK && ok)
        return STEP_OK;
    if (a == HCOMM_OK) { /* no rank lost: a failure of another kind */
        *r = step_failed(rt, *r);
        return STEP_FAIL;
    }
    if (a != HCOMM_ERR_PEER_LOST || rec->failures >= rec->opts.max_failures) {
        fprintf(stderr, "hcomm-train: rank %d: %s%s\n", rt->world_rank, hcomm_last_error(),
                a == HCOMM_ERR_PEER_LOST ? "; --max-failures reached" : "");
        *r = a;
        return STEP_FAIL;
    }
    hcomm_ctx_revoke(rt->ctx);
    int fate = rebuild(rt, m, st, rep, step, r);
    rt->step_error[0] = '\0';
    return fate;
}
