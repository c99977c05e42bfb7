/* The body of every rank of hcomm-train.
 *
 * Schedule (GPipe, Huang et al. 2019): each step every stage runs all its micro-batches
 * forward, then all backward in reverse order; activations go to the next stage and
 * gradients to the previous one with hcomm_pp_send/recv. Then dense gradients are summed over
 * DP x CP and expert gradients over expert-DP, and every rank applies SGD with momentum to its
 * shards. The loss is the mean over every token of the global batch, so the gradient of each
 * token's loss is scaled by 1 / (batch * seq) and the reductions are plain sums: any layout
 * computes the update of the 1-rank run.
 */
#include "train.h"

#include "model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TAG_ACT = 1, TAG_GRAD = 2 };

/* Progress figures world rank 0 keeps between reports. */
typedef struct report {
    FILE *metrics;
    double first_loss, last_loss;
    double t0;                   /* start of training on rank 0 */
    double mark_t;               /* time of the previous report */
    int mark_step;               /* steps done at the previous report */
    double mark_comm, mark_wall; /* summed rank seconds at the previous report */
    double step_t;               /* end of the previous step */
    double step_comm, step_wall; /* summed rank seconds at the end of the previous step */
} report_t;

/* ---------------------------------------------------------------- groups */

static hcomm_result_t rt_group(train_rt_t *rt, hcomm_ctx_t *ctx, hcomm_group_kind_t kind,
                               hcomm_comm_t **comm, int *rank, int *size) {
    TRAIN_TRY(rt, hcomm_ctx_group(ctx, kind, comm));
    TRAIN_TRY(rt, hcomm_ctx_rank(ctx, kind, rank, size));
    return HCOMM_OK;
}

/* The expert layer sums its expert-TP shards of rows its TP peers hold too, which needs the
 * expert-TP group to be the TP group (etp = tp): check the domain manager agrees. */
static hcomm_result_t rt_check_etp(train_rt_t *rt) {
    int n = rt->tp_size, *a = train_alloc(2 * (size_t)n * sizeof(int)), same = 1;
    hcomm_result_t r = HCOMM_OK;
    if (rt->etp_size != n || rt->etp_rank != rt->tp_rank)
        same = 0;
    if (same)
        r = hcomm_comm_members(rt->tp, a, n);
    if (same && r == HCOMM_OK)
        r = hcomm_comm_members(rt->etp, a + n, n);
    if (same && r == HCOMM_OK)
        same = memcmp(a, a + n, (size_t)n * sizeof(int)) == 0;
    free(a);
    if (r != HCOMM_OK)
        return train_fail(rt, "hcomm_comm_members", r);
    if (!same)
        return train_fail(rt, "checking that the expert-TP group equals the TP group",
                          HCOMM_ERR_GROUP);
    return HCOMM_OK;
}

static hcomm_result_t rt_setup(train_rt_t *rt, const train_opts_t *o, hcomm_ctx_t **ctx) {
    hcomm_parallel_config_t cfg = {0};
    cfg.tp = o->tp;
    cfg.pp = o->pp;
    cfg.dp = o->dp;
    cfg.cp = 1;
    cfg.ep = o->ep;
    cfg.etp = o->tp;
    cfg.num_experts = o->experts;
    int unused;
    TRAIN_TRY(rt, hcomm_comm_rank(rt->world, &rt->world_rank));
    TRAIN_TRY(rt, hcomm_comm_size(rt->world, &rt->world_size));
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_ctx_create(rt->world, &cfg, ctx)));
    hcomm_result_t r = rt_group(rt, *ctx, HCOMM_GROUP_TP, &rt->tp, &rt->tp_rank, &rt->tp_size);
    if (r == HCOMM_OK)
        r = rt_group(rt, *ctx, HCOMM_GROUP_PP, &rt->pp, &rt->stage, &rt->pp_size);
    if (r == HCOMM_OK)
        r = rt_group(rt, *ctx, HCOMM_GROUP_DP_CP, &rt->dp_cp, &rt->dp_rank, &rt->dp_size);
    if (r == HCOMM_OK)
        r = rt_group(rt, *ctx, HCOMM_GROUP_EP, &rt->ep, &rt->ep_rank, &rt->ep_size);
    if (r == HCOMM_OK)
        r = rt_group(rt, *ctx, HCOMM_GROUP_ETP, &rt->etp, &rt->etp_rank, &rt->etp_size);
    if (r == HCOMM_OK)
        r = rt_group(rt, *ctx, HCOMM_GROUP_EDP, &rt->edp, &unused, &rt->edp_size);
    if (r == HCOMM_OK)
        TRAIN_TRY(rt, hcomm_ctx_pp_neighbors(*ctx, &rt->prev, &rt->next));
    if (r == HCOMM_OK)
        r = rt_check_etp(rt);
    return r;
}

/* ---------------------------------------------------------------- one step */

/* Token ids of micro-batch m of this DP rank: DP rank d takes sequences
 * [d*batch/dp, (d+1)*batch/dp) of the global batch, and micro-batch m the m-th slice of that. */
static void mb_tokens(const train_job_t *job, train_rt_t *rt, const int64_t *starts, int m,
                      mb_cache_t *c) {
    const train_opts_t *o = job->opts;
    const int per_mb = o->batch / o->dp / o->micro_batches, seq = o->seq;
    const int first = rt->dp_rank * (o->batch / o->dp) + m * per_mb;
    c->n = (int64_t)per_mb * seq;
    c->cur = arena_alloc(&rt->arena, (size_t)c->n * sizeof(int32_t));
    c->prev = arena_alloc(&rt->arena, (size_t)c->n * sizeof(int32_t));
    c->tgt = arena_alloc(&rt->arena, (size_t)c->n * sizeof(int32_t));
    for (int b = 0; b < per_mb; b++) {
        for (int t = 0; t < seq; t++) {
            const int64_t i = (int64_t)b * seq + t, s = starts[first + b] + t;
            c->cur[i] = job->corpus->ids[s];
            c->prev[i] = job->corpus->ids[s - 1];
            c->tgt[i] = job->corpus->ids[s + 1];
        }
    }
}

/* Forward of micro-batch c through this stage's units, between the neighbouring stages. */
static hcomm_result_t stage_forward(const model_t *m, train_rt_t *rt, mb_cache_t *c, double *h) {
    hcomm_tensor_t h_t = train_view2(h, c->n, m->C);
    if (rt->prev >= 0)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_pp_recv(rt->pp, &h_t, rt->prev, TAG_ACT)));
    for (int u = m->unit_lo; u < m->unit_hi; u++) {
        hcomm_result_t r = unit_forward(u, m, rt, c, h);
        if (r != HCOMM_OK)
            return r;
    }
    if (rt->next >= 0)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_pp_send(rt->pp, &h_t, rt->next, TAG_ACT)));
    return HCOMM_OK;
}

static hcomm_result_t stage_backward(model_t *m, train_rt_t *rt, mb_cache_t *c, double *dh,
                                     double scale) {
    hcomm_tensor_t dh_t = train_view2(dh, c->n, m->C);
    if (rt->next >= 0)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_pp_recv(rt->pp, &dh_t, rt->next, TAG_GRAD)));
    for (int u = m->unit_hi - 1; u >= m->unit_lo; u--) {
        hcomm_result_t r = unit_backward(u, m, rt, c, dh, scale);
        if (r != HCOMM_OK)
            return r;
    }
    if (rt->prev >= 0)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_pp_send(rt->pp, &dh_t, rt->prev, TAG_GRAD)));
    return HCOMM_OK;
}

/* Sums gradients over the data-parallel groups: dense ones over DP x CP, expert ones over
 * expert-DP (every member of either group holds the same list of tensors). */
static hcomm_result_t reduce_grads(model_t *m, train_rt_t *rt) {
    hcomm_tensor_t *dense = arena_alloc(&rt->arena, (size_t)m->nparams * sizeof(hcomm_tensor_t));
    hcomm_tensor_t *expert = arena_alloc(&rt->arena, (size_t)m->nparams * sizeof(hcomm_tensor_t));
    int nd = 0, ne = 0;
    for (int i = 0; i < m->nparams; i++) {
        const param_t *p = m->params[i];
        hcomm_tensor_t *t = p->expert ? &expert[ne++] : &dense[nd++];
        *t = train_view2(p->g, p->rows, p->cols);
    }
    hcomm_result_t r =
        TRAIN_COMM(rt, hcomm_dp_all_reduce_grads(rt->dp_cp, dense, nd, HCOMM_SUM, 0));
    if (r == HCOMM_OK && ne > 0)
        r = TRAIN_COMM(rt, hcomm_dp_all_reduce_grads(rt->edp, expert, ne, HCOMM_SUM, 0));
    return r == HCOMM_OK ? r : train_fail(rt, "hcomm_dp_all_reduce_grads", r);
}

/* Forward and backward of every micro-batch; returns this rank's share of the loss sum
 * (the loss of its tokens on the last stage's TP rank 0, else 0) in *loss. */
static hcomm_result_t step_grads(const train_job_t *job, model_t *m, train_rt_t *rt,
                                 const int64_t *starts, double *loss) {
    const train_opts_t *o = job->opts;
    const int M = o->micro_batches;
    const double scale = 1.0 / ((double)o->batch * o->seq);
    mb_cache_t *cs = arena_alloc(&rt->arena, (size_t)M * sizeof *cs);
    memset(cs, 0, (size_t)M * sizeof *cs);
    double *h = NULL;
    hcomm_result_t r = HCOMM_OK;
    *loss = 0.0;
    for (int k = 0; k < M && r == HCOMM_OK; k++) {
        mb_tokens(job, rt, starts, k, &cs[k]);
        if (h == NULL)
            h = arena_doubles(&rt->arena, cs[k].n * m->C);
        r = stage_forward(m, rt, &cs[k], h);
    }
    for (int k = M - 1; k >= 0 && r == HCOMM_OK; k--) {
        memset(h, 0, (size_t)(cs[k].n * m->C) * sizeof(double));
        r = stage_backward(m, rt, &cs[k], h, scale);
        if (rt->next < 0 && rt->tp_rank == 0)
            *loss += cs[k].loss;
    }
    for (int k = 0; k < M; k++)
        mb_cache_clear(&cs[k]);
    return r;
}

/* ---------------------------------------------------------------- replica check */

enum { REPLICA_TP, REPLICA_DENSE, REPLICA_EXPERT };

/* FNV-1a over the bytes of the weights that the group of @p kind holds in copies: the
 * unsharded ones across TP, the dense ones across DP x CP, the expert ones across expert-DP. */
static uint64_t replica_hash(const model_t *m, int kind) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < m->nparams; i++) {
        const param_t *p = m->params[i];
        int in = kind == REPLICA_TP ? !p->sharded : (kind == REPLICA_EXPERT) == p->expert;
        const unsigned char *b = (const unsigned char *)p->w;
        for (size_t k = 0; in && k < (size_t)(p->rows * p->cols) * sizeof(double); k++)
            h = (h ^ b[k]) * 0x100000001b3ull;
    }
    return h;
}

static hcomm_result_t replica_check(train_rt_t *rt, hcomm_comm_t *group, int size, uint64_t h,
                                    const char *what) {
    uint64_t *all = arena_alloc(&rt->arena, (size_t)size * sizeof h);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_all_gather(group, &h, all, sizeof h)));
    for (int i = 1; i < size; i++) {
        if (all[i] != all[0]) {
            fprintf(stderr, "hcomm-train: rank %d: the %s differ between members 0 and %d\n",
                    rt->world_rank, what, i);
            return HCOMM_ERR_INTERNAL;
        }
    }
    return HCOMM_OK;
}

/* After training, every copy of a weight must still be bitwise identical: the TP ranks'
 * replicated weights, the DP replicas and the expert-DP replicas. All-reduces that are
 * deterministic and identical on every member keep them so; a drift would show here. */
static hcomm_result_t check_replicas(const model_t *m, train_rt_t *rt) {
    hcomm_result_t r = replica_check(rt, rt->tp, rt->tp_size, replica_hash(m, REPLICA_TP),
                                     "TP-replicated weights");
    if (r == HCOMM_OK)
        r = replica_check(rt, rt->dp_cp, rt->dp_size, replica_hash(m, REPLICA_DENSE),
                          "dense weights of the DP replicas");
    if (r == HCOMM_OK && m->E_local > 0)
        r = replica_check(rt, rt->edp, rt->edp_size, replica_hash(m, REPLICA_EXPERT),
                          "expert weights of the expert-DP replicas");
    arena_reset(&rt->arena);
    return r;
}

/* ---------------------------------------------------------------- reports */

/* "s" after a count other than 1. */
static const char *plural(int n) {
    return n == 1 ? "" : "s";
}

static void report_start(const train_job_t *job, const train_rt_t *rt) {
    const train_opts_t *o = job->opts;
    static const char *names[NUM_UNITS] = {"embed", "TP block", "MoE", "head"};
    printf("hcomm-train: %d rank%s (tp %d x pp %d x dp %d; ep %d, %d expert%s) on %s\n",
           rt->world_size, plural(rt->world_size), o->tp, o->pp, o->dp, o->ep, o->experts,
           plural(o->experts), opts_backend(o));
    printf("hcomm-train: data %s (%zu bytes, vocab %d), %lld parameters, batch %d x %d chars, "
           "%d micro-batch%s\n",
           o->data, job->corpus->len, job->corpus->vocab,
           (long long)model_full_size(o, job->corpus->vocab), o->batch, o->seq, o->micro_batches,
           o->micro_batches == 1 ? "" : "es");
    printf("hcomm-train: stages:");
    for (int s = 0; s < o->pp; s++) {
        printf(" [");
        for (int u = s * NUM_UNITS / o->pp; u < (s + 1) * NUM_UNITS / o->pp; u++)
            printf("%s%s", u == s * NUM_UNITS / o->pp ? "" : ", ", names[u]);
        printf("]");
    }
    printf("\n");
    fflush(stdout);
}

/* Called on world rank 0 after every step with the world sums of {loss, comm s, wall s}. */
static void report_step(report_t *rep, const train_opts_t *o, int step, const double sums[3]) {
    const double now = train_now(), tokens = (double)o->batch * o->seq;
    const double loss = sums[0] / tokens;
    if (step == 0)
        rep->first_loss = loss;
    rep->last_loss = loss;
    if (rep->metrics != NULL) {
        double dt = now - rep->step_t, dw = sums[2] - rep->step_wall;
        fprintf(rep->metrics, "%d,%.10g,%.1f,%.4f,%.3f\n", step, loss, tokens / dt,
                dw > 0 ? (sums[1] - rep->step_comm) / dw : 0.0, now - rep->t0);
    }
    rep->step_t = now;
    rep->step_comm = sums[1];
    rep->step_wall = sums[2];
    if (step % o->log_every != 0 && step != o->steps - 1)
        return;
    const double dt = now - rep->mark_t, dw = sums[2] - rep->mark_wall;
    printf("step %5d | loss %.4f | %8.0f tok/s | comm %4.1f%%\n", step, loss,
           tokens * (step + 1 - rep->mark_step) / dt,
           dw > 0 ? 100.0 * (sums[1] - rep->mark_comm) / dw : 0.0);
    fflush(stdout);
    rep->mark_t = now;
    rep->mark_step = step + 1;
    rep->mark_comm = sums[1];
    rep->mark_wall = sums[2];
}

static void report_end(const report_t *rep, const train_opts_t *o, const double sums[3]) {
    const double t = train_now() - rep->t0;
    printf("done: %d step%s in %.1f s | loss %.4f -> %.4f | %.0f tok/s | comm %.1f%% of rank time "
           "(in hcomm calls, waits included) | replicas bitwise equal\n",
           o->steps, plural(o->steps), t, rep->first_loss, rep->last_loss,
           (double)o->batch * o->seq * o->steps / t, sums[2] > 0 ? 100.0 * sums[1] / sums[2] : 0.0);
    fflush(stdout);
}

/* ---------------------------------------------------------------- the rank body */

static hcomm_result_t train_loop(const train_job_t *job, model_t *m, train_rt_t *rt,
                                 report_t *rep) {
    const train_opts_t *o = job->opts;
    int64_t *starts = train_alloc((size_t)o->batch * sizeof(int64_t));
    rng_t data_rng;
    rng_seed(&data_rng, o->seed, 0xDA7A);
    hcomm_result_t r = HCOMM_OK;
    double sums[3] = {0}, t0 = train_now();
    for (int step = 0; step < o->steps && r == HCOMM_OK; step++) {
        /* Every rank draws the whole global batch, so the stream stays the same everywhere. */
        batch_sample(&data_rng, job->corpus, o->batch, o->seq, starts);
        model_zero_grads(m);
        double loss = 0.0;
        r = step_grads(job, m, rt, starts, &loss);
        if (r == HCOMM_OK)
            r = reduce_grads(m, rt);
        arena_reset(&rt->arena);
        if (r != HCOMM_OK)
            break;
        model_sgd(m, o->lr, o->momentum);
        double mine[3] = {loss, rt->comm_s, train_now() - t0};
        r = TRAIN_COMM(rt, hcomm_all_reduce(rt->world, mine, sums, 3, HCOMM_F64, HCOMM_SUM));
        if (r != HCOMM_OK)
            r = train_fail(rt, "hcomm_all_reduce of the loss", r);
        if (r == HCOMM_OK && rt->world_rank == 0)
            report_step(rep, o, step, sums);
    }
    if (r == HCOMM_OK)
        r = check_replicas(m, rt);
    if (r == HCOMM_OK && rt->world_rank == 0)
        report_end(rep, o, sums);
    free(starts);
    return r;
}

static hcomm_result_t open_metrics(const train_opts_t *o, const train_rt_t *rt, report_t *rep) {
    if (o->metrics == NULL || rt->world_rank != 0)
        return HCOMM_OK;
    rep->metrics = fopen(o->metrics, "w");
    if (rep->metrics == NULL) {
        fprintf(stderr, "hcomm-train: cannot write --metrics %s: %s\n", o->metrics,
                strerror(errno));
        return HCOMM_ERR_IO;
    }
    fprintf(rep->metrics, "step,loss,tokens_per_s,comm_share,elapsed_s\n");
    return HCOMM_OK;
}

hcomm_result_t train_rank(hcomm_comm_t *world, void *arg) {
    const train_job_t *job = arg;
    train_rt_t rt = {0};
    hcomm_ctx_t *ctx = NULL;
    model_t m = {0};
    report_t rep = {0};
    rt.world = world;
    hcomm_result_t r = rt_setup(&rt, job->opts, &ctx);
    if (r == HCOMM_OK)
        model_init(&m, job->opts, job->corpus->vocab, &rt);
    if (r == HCOMM_OK)
        r = open_metrics(job->opts, &rt, &rep);
    if (r == HCOMM_OK && rt.world_rank == 0)
        report_start(job, &rt);
    rep.t0 = rep.mark_t = rep.step_t = train_now();
    rt.comm_s = 0.0;
    if (r == HCOMM_OK)
        r = train_loop(job, &m, &rt, &rep);
    if (rep.metrics != NULL && fclose(rep.metrics) != 0 && r == HCOMM_OK) {
        fprintf(stderr, "hcomm-train: writing --metrics %s failed\n", job->opts->metrics);
        r = HCOMM_ERR_IO;
    }
    model_free(&m);
    arena_free(&rt.arena);
    /* ctx_destroy is collective: skip it after a failure, when peers may be gone. */
    if (r == HCOMM_OK)
        r = hcomm_ctx_destroy(ctx);
    return r;
}
