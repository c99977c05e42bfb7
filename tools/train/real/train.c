/* The body of every rank of hcomm-train.
 *
 * Schedule (--schedule): GPipe, 1F1B or interleaved 1F1B (see schedule_ops); activations go
 * to the next model chunk and gradients to the previous one with nonblocking
 * hcomm_pp_isend/irecv, every receive posted when the step starts (see pipe_t). Dense gradients are
 * summed over DP x CP and expert gradients over expert-DP, bucket by bucket during the last
 * backward (--dp-overlap) or after it, and every rank applies SGD with momentum to its shards. The
 * loss is the mean over every token of the global batch, so the gradient of each token's loss is
 * scaled by 1 / (batch * seq) and the reductions are plain sums: any layout computes the update of
 * the 1-rank run.
 */
#include "../train.h"

#include "../ckpt.h"
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Progress figures world rank 0 keeps between reports. */
typedef struct report {
    FILE *metrics;
    double first_loss, last_loss, last_val;
    int first_step;              /* the step this run starts at (> 0 when resumed) */
    double t0;                   /* start of training on rank 0 */
    double mark_t;               /* time of the previous report */
    int mark_step;               /* steps done at the previous report */
    double mark_comm, mark_wall; /* summed rank seconds at the previous report */
    double step_t;               /* end of the previous step */
    double step_comm, step_wall; /* summed rank seconds at the end of the previous step */
    double step_pp, step_dp;     /* ... of PP transfers and of DP reduction waits */
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

static hcomm_result_t rt_take_groups(train_rt_t *rt, const train_opts_t *o, hcomm_ctx_t *ctx);

static hcomm_result_t rt_setup(train_rt_t *rt, const train_opts_t *o, hcomm_ctx_t **ctx) {
    hcomm_parallel_config_t cfg = {0};
    cfg.tp = o->tp;
    cfg.pp = o->pp;
    cfg.dp = o->dp;
    cfg.cp = o->cp;
    cfg.ep = o->ep;
    cfg.etp = o->tp;
    cfg.num_experts = o->experts;
    cfg.dp_shard = o->zero > 0 ? o->dp_shard : 0;
    TRAIN_TRY(rt, hcomm_comm_rank(rt->world, &rt->world_rank));
    TRAIN_TRY(rt, hcomm_comm_size(rt->world, &rt->world_size));
    /* Before the groups are split, so every group inherits it. */
    TRAIN_TRY(rt, hcomm_comm_set_deterministic(rt->world, o->deterministic));
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_ctx_create(rt->world, &cfg, ctx)));
    rt->ctx = *ctx;
    return rt_take_groups(rt, o, *ctx);
}

/* rt's groups and coordinates from ctx. */
static hcomm_result_t rt_take_groups(train_rt_t *rt, const train_opts_t *o, hcomm_ctx_t *ctx) {
    hcomm_result_t r = rt_group(rt, ctx, HCOMM_GROUP_TP, &rt->tp, &rt->tp_rank, &rt->tp_size);
    if (r == HCOMM_OK)
        r = rt_group(rt, ctx, HCOMM_GROUP_PP, &rt->pp, &rt->stage, &rt->pp_size);
    if (r == HCOMM_OK)
        r = rt_group(rt, ctx, HCOMM_GROUP_DP_CP, &rt->dp_cp, &rt->dp_rank, &rt->dp_size);
    if (r == HCOMM_OK)
        r = rt_group(rt, ctx, HCOMM_GROUP_EP, &rt->ep, &rt->ep_rank, &rt->ep_size);
    if (r == HCOMM_OK)
        r = rt_group(rt, ctx, HCOMM_GROUP_ETP, &rt->etp, &rt->etp_rank, &rt->etp_size);
    if (r == HCOMM_OK)
        r = rt_group(rt, ctx, HCOMM_GROUP_EDP, &rt->edp, &rt->edp_rank, &rt->edp_size);
    if (r == HCOMM_OK)
        r = rt_check_etp(rt);
    if (r == HCOMM_OK)
        r = attn_setup(rt, o, ctx);
    return r;
}

/* ---------------------------------------------------------------- one step */

/* Token ids of micro-batch m of this DP rank: DP rank d takes sequences
 * [d*batch/dp, (d+1)*batch/dp) of the global batch, and micro-batch m the m-th slice of that;
 * of each sequence, this CP rank takes its seq/cp positions (attn_token_pos). */
static void mb_tokens(const train_job_t *job, train_rt_t *rt, const int64_t *starts, int m,
                      mb_cache_t *c) {
    const train_opts_t *o = job->opts;
    const int per_mb = o->batch / o->dp / o->micro_batches, seq = o->seq / o->cp;
    const int first = rt->data_rank * (o->batch / o->dp) + m * per_mb;
    c->n = (int64_t)per_mb * seq;
    c->nseq = per_mb;
    c->seq_len = seq;
    c->cur = arena_alloc(&rt->arena, (size_t)c->n * sizeof(int32_t));
    c->prev = arena_alloc(&rt->arena, (size_t)c->n * sizeof(int32_t));
    c->tgt = arena_alloc(&rt->arena, (size_t)c->n * sizeof(int32_t));
    for (int b = 0; b < per_mb; b++) {
        for (int t = 0; t < seq; t++) {
            const int64_t i = (int64_t)b * seq + t, s = starts[first + b] + attn_token_pos(rt, t);
            c->cur[i] = job->corpus->ids[s];
            c->prev[i] = job->corpus->ids[s - 1];
            c->tgt[i] = job->corpus->ids[s + 1];
        }
    }
    if (rt->sp && rt->tp_size > 1) { /* this TP rank's rows outside the TP block (sp.h) */
        const int64_t share = c->n / rt->tp_size, first_row = rt->tp_rank * share;
        c->sp = 1;
        c->n = share;
        c->cur += first_row;
        c->prev += first_row;
        c->tgt += first_row;
    }
}

/* --- DP gradient reduction overlapped with backward (--dp-overlap 1) --- */

/* The unit (0 embed, 1+2l TP block of layer l, 2+2l MoE of layer l, 1+2L head) that holds p. */
static int param_unit(const model_t *m, const param_t *p) {
    if (p == &m->emb_cur || p == &m->emb_prev)
        return 0;
    for (int l = 0; l < m->L; l++) {
        const layer_t *y = &m->layers[l];
        if (p == &y->w1 || p == &y->b1 || p == &y->w2 || p == &y->b2 || p == &y->wq ||
            p == &y->wk || p == &y->wv || p == &y->wo || p == &y->bo)
            return 1 + 2 * l;
        if (p == &y->router || (y->experts && (const void *)p >= (const void *)y->experts &&
                                (const void *)p < (const void *)(y->experts + m->E_local)))
            return 2 + 2 * l;
    }
    return 1 + 2 * m->L;
}

/* Unit u's gradients are final (its backward of the last micro-batch ran): their buckets may
 * start reducing while earlier units still compute. */
static hcomm_result_t grads_ready(model_t *m, train_rt_t *rt, int u) {
    for (int i = 0; rt->red_index && i < m->nparams; i++) {
        const param_t *p = m->params[i];
        if (param_unit(m, p) != u)
            continue;
        hcomm_dp_reducer_t *red = p->expert ? rt->red_expert : rt->red_dense;
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_dp_reducer_mark_ready(red, rt->red_index[i])));
    }
    return HCOMM_OK;
}

/* Sums gradients over the data-parallel groups: dense ones over DP x CP, expert ones over
 * expert-DP (every member of either group holds the same list of tensors). */
/* The dense and expert gradient lists, in parameter order (the same on every group member). */
static void grad_lists(const model_t *m, hcomm_tensor_t *dense, int *nd, hcomm_tensor_t *expert,
                       int *ne, int *index) {
    *nd = *ne = 0;
    for (int i = 0; i < m->nparams; i++) {
        const param_t *p = m->params[i];
        int *n = p->expert ? ne : nd;
        if (index)
            index[i] = *n;
        (p->expert ? expert : dense)[(*n)++] = train_view2(p->g, p->rows, p->cols);
    }
}

/* --dp-overlap 1: one reducer per gradient group, registered once (collective). */
static hcomm_result_t reducers_setup(model_t *m, train_rt_t *rt) {
    hcomm_tensor_t *dense = train_alloc((size_t)m->nparams * 2 * sizeof(hcomm_tensor_t) + 1);
    hcomm_tensor_t *expert = dense + m->nparams;
    int nd, ne;
    rt->red_index = train_alloc((size_t)m->nparams * sizeof(int) + 1);
    grad_lists(m, dense, &nd, expert, &ne, rt->red_index);
    hcomm_result_t r =
        TRAIN_COMM(rt, hcomm_dp_reducer_create(rt->dp_cp, dense, nd, HCOMM_SUM, 0, &rt->red_dense));
    if (r == HCOMM_OK)
        r = TRAIN_COMM(rt,
                       hcomm_dp_reducer_create(rt->edp, expert, ne, HCOMM_SUM, 0, &rt->red_expert));
    free(dense);
    return r == HCOMM_OK ? r : train_fail(rt, "hcomm_dp_reducer_create", r);
}

static void reducers_free(train_rt_t *rt) {
    hcomm_dp_reducer_destroy(rt->red_dense);
    hcomm_dp_reducer_destroy(rt->red_expert);
    free(rt->red_index);
    rt->red_dense = rt->red_expert = NULL;
    rt->red_index = NULL;
}

/* Waits for the buckets the backward pass started: the DP time it did not hide. */
static hcomm_result_t finish_reducers(train_rt_t *rt) {
    double t = train_now();
    hcomm_result_t r = TRAIN_COMM(rt, hcomm_dp_reducer_finish(rt->red_dense, NULL));
    if (r == HCOMM_OK)
        r = TRAIN_COMM(rt, hcomm_dp_reducer_finish(rt->red_expert, NULL));
    rt->dp_s += train_now() - t;
    return r == HCOMM_OK ? r : train_fail(rt, "hcomm_dp_reducer_finish", r);
}

static hcomm_result_t reduce_grads(model_t *m, train_rt_t *rt) {
    if (rt->red_dense)
        return finish_reducers(rt);
    double t0 = train_now();
    hcomm_tensor_t *dense = arena_alloc(&rt->arena, (size_t)m->nparams * sizeof(hcomm_tensor_t));
    hcomm_tensor_t *expert = arena_alloc(&rt->arena, (size_t)m->nparams * sizeof(hcomm_tensor_t));
    int nd = 0, ne = 0;
    grad_lists(m, dense, &nd, expert, &ne, NULL);
    hcomm_result_t r =
        TRAIN_COMM(rt, hcomm_dp_all_reduce_grads(rt->dp_cp, dense, nd, HCOMM_SUM, 0));
    if (r == HCOMM_OK && ne > 0)
        r = TRAIN_COMM(rt, hcomm_dp_all_reduce_grads(rt->edp, expert, ne, HCOMM_SUM, 0));
    rt->dp_s += train_now() - t0;
    return r == HCOMM_OK ? r : train_fail(rt, "hcomm_dp_all_reduce_grads", r);
}

#include "zero.c"

/* ---------------------------------------------------------------- pipeline schedules */

/* One pass of the schedule: forward (F) or backward (B) of this rank's model chunk v on
 * micro-batch mb. */
typedef struct op {
    int fwd, v, mb;
} op_t;

/* The k-th forward (or backward) pass of a rank, Megatron-LM's interleaved order
 * (get_model_chunk_id): passes go in groups of P micro-batches, chunk by chunk (backward:
 * last chunk first). With V = 1 it is micro-batch k on the one chunk. */
static op_t nth_pass(int fwd, int k, int P, int V) {
    op_t op = {fwd, (k % (P * V)) / P, (k / (P * V)) * P + k % P};
    if (!fwd)
        op.v = V - 1 - op.v;
    return op;
}

/* The passes of one step on this rank, in order, into ops [2 * M * V]; returns their number.
 * GPipe (Huang et al. 2019): every forward, then every backward in reverse. 1F1B
 * (PipeDream-Flush, Narayanan et al. 2021): stage s runs P-s-1 warm-up forwards, then
 * alternates one forward and one backward, then drains the backwards, so at most P-s
 * micro-batches hold activations. Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM's
 * forward_backward_pipelining_with_interleaving): the same with V chunks per rank, warm-up
 * (P-s-1)*2 + (V-1)*P passes (all of them when M = P). Each chunk's backwards run in
 * micro-batch order (GPipe: reverse order), so a layout reproduces the 1-rank run. */
static int schedule_ops(const train_opts_t *o, const train_rt_t *rt, op_t *ops) {
    const int M = o->micro_batches, P = rt->pp_size, s = rt->stage, V = o->virtual_stages;
    const int total = M * V;
    int n = 0, warm = total;
    if (strcmp(o->schedule, "gpipe") == 0) {
        for (int k = 0; k < M; k++)
            ops[n++] = nth_pass(1, k, P, V);
        for (int k = M - 1; k >= 0; k--)
            ops[n++] = nth_pass(0, k, P, V);
        return n;
    }
    if (strcmp(o->schedule, "interleaved") == 0 && M != P)
        warm = (P - s - 1) * 2 + (V - 1) * P;
    else if (strcmp(o->schedule, "1f1b") == 0)
        warm = P - s - 1;
    warm = warm < total ? warm : total;
    for (int k = 0; k < warm; k++)
        ops[n++] = nth_pass(1, k, P, V);
    for (int k = 0; k < total - warm; k++) {
        ops[n++] = nth_pass(1, warm + k, P, V);
        ops[n++] = nth_pass(0, k, P, V);
    }
    for (int k = total - warm; k < total; k++)
        ops[n++] = nth_pass(0, k, P, V);
    return n;
}

/* One step's PP transfers. Chunk v of stage s is the model's chunk v*P + s; its input comes
 * from the previous chunk on stage s-1 (on stage 0: the last stage's chunk v-1, the ring
 * from the last stage to the first), its output goes to the next. Every receive the step
 * needs is posted when it starts, each into its own buffer with its own tag (kind, receiving
 * chunk, micro-batch), so no message waits unexpected and the order peers send in does not
 * matter; each send is posted as soon as its data is ready, from a copy (the work buffer moves
 * on), and the step waits for all of them at its end. */
enum { PIPE_ACT, PIPE_GRAD };
typedef struct pipe {
    int P, V, M, chunks;    /* stages, chunks per stage, micro-batches, chunks in all */
    hcomm_tensor_t *in;     /* [2][V][M] receive tensors (bf16 with --dtype bf16) */
    hcomm_pp_req_t **recv;  /* [2][V][M] posted receives; NULL: none, or already waited */
    hcomm_pp_req_t **sends; /* [2 * V * M] posted sends */
    int nsends;
} pipe_t;

static int pipe_slot(const pipe_t *p, int kind, int v, int mb) {
    return (kind * p->V + v) * p->M + mb;
}

/* Tag of the message of @p kind for the model's chunk @p chunk, micro-batch @p mb. */
static int pipe_tag(const pipe_t *p, int kind, int chunk, int mb) {
    return 16 + (kind * p->chunks + chunk) * p->M + mb;
}

/* Posts the step's receives of n rows each: activations for every chunk but the model's
 * first, and with @p backward gradients for every chunk but its last. */
static hcomm_result_t pipe_open(pipe_t *p, train_rt_t *rt, int V, int M, int64_t n, int C,
                                int backward) {
    const int P = rt->pp_size, slots = 2 * V * M;
    *p = (pipe_t){P, V, M, P * V, NULL, NULL, NULL, 0};
    p->in = arena_alloc(&rt->arena, (size_t)slots * sizeof *p->in);
    p->recv = arena_alloc(&rt->arena, (size_t)slots * sizeof *p->recv);
    p->sends = arena_alloc(&rt->arena, (size_t)slots * sizeof *p->sends);
    memset(p->recv, 0, (size_t)slots * sizeof *p->recv);
    for (int kind = 0; kind < 2; kind++) {
        for (int v = 0; v < V; v++) {
            const int chunk = v * P + rt->stage;
            const int has = kind == PIPE_ACT ? chunk > 0 : backward && chunk < p->chunks - 1;
            const int peer = (rt->stage + (kind == PIPE_ACT ? P - 1 : 1)) % P;
            for (int mb = 0; has && mb < M; mb++) {
                const int i = pipe_slot(p, kind, v, mb);
                p->in[i] = comm_out(rt, arena_reals(&rt->arena, n * C), n, C);
                TRAIN_TRY(
                    rt, TRAIN_COMM(rt, hcomm_pp_irecv(rt->pp, &p->in[i], peer,
                                                      pipe_tag(p, kind, chunk, mb), &p->recv[i])));
            }
        }
    }
    return HCOMM_OK;
}

/* Waits for the message of @p kind for chunk v, micro-batch mb, and widens it into x. */
static hcomm_result_t pipe_take(pipe_t *p, train_rt_t *rt, int kind, int v, int mb, real_t *x) {
    const int i = pipe_slot(p, kind, v, mb);
    hcomm_pp_req_t *req = p->recv[i];
    p->recv[i] = NULL;
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_pp_wait(req)));
    comm_out_done(&p->in[i], x);
    return HCOMM_OK;
}

/* Posts a copy of x [n, C] as the message of @p kind from chunk v to its neighbour chunk. */
static hcomm_result_t pipe_give(pipe_t *p, train_rt_t *rt, int kind, int v, int mb, real_t *x,
                                int64_t n, int C) {
    const int P = p->P, chunk = v * P + rt->stage, to = chunk + (kind == PIPE_ACT ? 1 : -1);
    hcomm_tensor_t t = comm_in(rt, x, n, C); /* with bf16, a copy already */
    if (!rt->bf16) {
        t.data = arena_reals(&rt->arena, n * C);
        memcpy(t.data, x, (size_t)(n * C) * sizeof(real_t));
    }
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_pp_isend(rt->pp, &t, to % P, pipe_tag(p, kind, to, mb),
                                                &p->sends[p->nsends++])));
    return HCOMM_OK;
}

/* Completes the step's sends (and, after a failure, whatever was still posted). */
static hcomm_result_t pipe_close(pipe_t *p, train_rt_t *rt, hcomm_result_t r) {
    hcomm_result_t w = TRAIN_COMM(rt, hcomm_pp_wait_all(p->sends, p->nsends));
    p->nsends = 0;
    if (r != HCOMM_OK)
        return r;
    return w == HCOMM_OK ? w : train_fail(rt, "hcomm_pp_wait_all of the PP sends", w);
}

/* Unit range of this rank's chunk v: the model's chunk v*P + s of P*V. */
static void chunk_units(const model_t *m, int v, int *lo, int *hi) {
    *lo = m->chunk_lo[v];
    *hi = m->chunk_hi[v];
}

/* Forward of chunk v on micro-batch c: receive its input, run its units, send its output. */
static hcomm_result_t chunk_forward(model_t *m, train_rt_t *rt, pipe_t *p, mb_cache_t *c, int v,
                                    int mb, real_t *h) {
    const int chunk = v * p->P + rt->stage;
    int lo, hi;
    chunk_units(m, v, &lo, &hi);
    double t = train_now();
    hcomm_result_t r = chunk > 0 ? pipe_take(p, rt, PIPE_ACT, v, mb, h) : HCOMM_OK;
    rt->pp_s += train_now() - t;
    for (int u = lo; u < hi && r == HCOMM_OK; u++) {
        r = zero_unit_begin(m, rt, u, 1);
        r = r == HCOMM_OK ? unit_forward(u, m, rt, c, h) : r;
        r = r == HCOMM_OK ? zero_unit_end(m, rt, u, 1) : r;
    }
    t = train_now();
    if (r == HCOMM_OK && chunk < p->chunks - 1)
        r = pipe_give(p, rt, PIPE_ACT, v, mb, h, c->n, m->C);
    rt->pp_s += train_now() - t;
    return r;
}

/* Backward of chunk v on micro-batch c; @p last: its gradients are final after it (DP
 * overlap starts their buckets). */
static hcomm_result_t chunk_backward(model_t *m, train_rt_t *rt, pipe_t *p, mb_cache_t *c, int v,
                                     int mb, real_t *dh, double scale, int last) {
    const int chunk = v * p->P + rt->stage;
    int lo, hi;
    chunk_units(m, v, &lo, &hi);
    double t = train_now();
    memset(dh, 0, (size_t)(c->n * m->C) * sizeof(real_t));
    hcomm_result_t r = chunk < p->chunks - 1 ? pipe_take(p, rt, PIPE_GRAD, v, mb, dh) : HCOMM_OK;
    rt->pp_s += train_now() - t;
    for (int u = hi - 1; u >= lo && r == HCOMM_OK; u--) {
        r = zero_unit_begin(m, rt, u, 0);
        r = r == HCOMM_OK ? unit_backward(u, m, rt, c, dh, scale) : r;
        r = r == HCOMM_OK ? zero_unit_end(m, rt, u, 0) : r;
        if (r == HCOMM_OK && last)
            r = grads_ready(m, rt, u);
    }
    t = train_now();
    if (r == HCOMM_OK && chunk > 0)
        r = pipe_give(p, rt, PIPE_GRAD, v, mb, dh, c->n, m->C);
    rt->pp_s += train_now() - t;
    return r;
}

/* Runs @p ops on the micro-batches cs (tokens set) between the stages; adds the loss of the
 * micro-batches whose head ran on this rank (TP rank 0 of the last stage) into *loss, after
 * their backward (after their forward when @p train is 0: forward passes only). */
static hcomm_result_t run_ops(model_t *m, train_rt_t *rt, mb_cache_t *cs, int M, const op_t *ops,
                              int nops, int train, double scale, double *loss) {
    const int V = m->vstages, last_chunk = rt->stage == rt->pp_size - 1 ? V - 1 : -1;
    /* The last backward pass of each chunk makes its gradients final. */
    int *final = arena_alloc(&rt->arena, (size_t)V * sizeof(int));
    for (int i = 0; i < nops; i++)
        if (!ops[i].fwd)
            final[ops[i].v] = i;
    pipe_t p;
    real_t *h = arena_reals(&rt->arena, cs[0].n * m->C);
    hcomm_result_t r = pipe_open(&p, rt, V, M, cs[0].n, m->C, train);
    for (int i = 0; i < nops && r == HCOMM_OK; i++) {
        const op_t op = ops[i];
        mb_cache_t *c = &cs[op.mb];
        if (op.fwd)
            r = chunk_forward(m, rt, &p, c, op.v, op.mb, h);
        else
            r = chunk_backward(m, rt, &p, c, op.v, op.mb, h, scale, final[op.v] == i);
        if (r == HCOMM_OK && op.v == last_chunk && op.fwd == !train && (rt->tp_rank == 0 || c->sp))
            *loss += c->loss;
    }
    double t = train_now();
    r = pipe_close(&p, rt, r);
    rt->pp_s += train_now() - t;
    return r;
}

/* Forward and backward of every micro-batch; returns this rank's share of the loss sum
 * (the loss of its tokens on the last stage's TP rank 0, else 0) in *loss. */
static hcomm_result_t step_grads(const train_job_t *job, model_t *m, train_rt_t *rt,
                                 const int64_t *starts, double *loss) {
    const train_opts_t *o = job->opts;
    const int M = o->micro_batches;
    mb_cache_t *cs = arena_alloc(&rt->arena, (size_t)M * sizeof *cs);
    op_t *ops = arena_alloc(&rt->arena, 2 * (size_t)(M * m->vstages) * sizeof *ops);
    memset(cs, 0, (size_t)M * sizeof *cs);
    for (int k = 0; k < M; k++)
        mb_tokens(job, rt, starts, k, &cs[k]);
    *loss = 0.0;
    const int nops = schedule_ops(o, rt, ops);
    hcomm_result_t r = run_ops(m, rt, cs, M, ops, nops, 1, 1.0 / ((double)o->batch * o->seq), loss);
    for (int k = 0; k < M; k++)
        mb_cache_clear(&cs[k]);
    return r;
}

/* Forward passes only of the micro-batches cs[0..M) (evaluation, sampling): micro-batch by
 * micro-batch, chunk by chunk, so every pass waits only for passes earlier in that order;
 * the loss as in run_ops. */
static hcomm_result_t forward_only(model_t *m, train_rt_t *rt, mb_cache_t *cs, int M,
                                   double *loss) {
    const int V = m->vstages;
    op_t *ops = arena_alloc(&rt->arena, (size_t)(M * V) * sizeof *ops);
    for (int k = 0; k < M * V; k++)
        ops[k] = (op_t){1, k % V, k / V};
    return run_ops(m, rt, cs, M, ops, M * V, 0, 0.0, loss);
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
        for (size_t k = 0; in && k < (size_t)(p->rows * p->cols) * sizeof(real_t); k++)
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

/* ---------------------------------------------------------------- validation */

/* Global batches of held-out text each validation loss averages over. */
enum { EVAL_BATCHES = 4 };

/* Mean loss per token over the fixed validation sequences (forward only, split over the DP
 * ranks and micro-batches as a training batch is), the same value on every rank. */
static hcomm_result_t evaluate(const train_job_t *job, model_t *m, train_rt_t *rt, double *val) {
    const train_opts_t *o = job->opts;
    int64_t *starts = train_alloc((size_t)o->batch * EVAL_BATCHES * sizeof(int64_t));
    val_starts(job->corpus, o->batch * EVAL_BATCHES, o->seq, starts);
    double mine = 0.0, sum = 0.0;
    hcomm_result_t r = HCOMM_OK;
    const int M = o->micro_batches;
    for (int b = 0; b < EVAL_BATCHES && r == HCOMM_OK; b++) {
        mb_cache_t *cs = arena_alloc(&rt->arena, (size_t)M * sizeof *cs);
        memset(cs, 0, (size_t)M * sizeof *cs);
        for (int k = 0; k < M; k++)
            mb_tokens(job, rt, starts + (size_t)b * o->batch, k, &cs[k]);
        r = forward_only(m, rt, cs, M, &mine);
        for (int k = 0; k < M; k++)
            mb_cache_clear(&cs[k]);
        arena_reset(&rt->arena);
    }
    free(starts);
    if (r == HCOMM_OK)
        r = TRAIN_COMM(rt, hcomm_all_reduce(rt->world, &mine, &sum, 1, HCOMM_F64, HCOMM_SUM));
    if (r != HCOMM_OK)
        return train_fail(rt, "the validation loss", r);
    *val = sum / ((double)EVAL_BATCHES * o->batch * o->seq);
    return HCOMM_OK;
}

/* ---------------------------------------------------------------- sampling */

/* Next character from the head's probabilities p[V]: the most likely one (lowest index on
 * ties) when T is 0, else a draw from p^(1/T) renormalized, which is softmax(logits / T). */
static int32_t pick_char(const real_t *p, int V, double T, rng_t *r) {
    int32_t best = 0;
    if (T == 0.0) {
        for (int32_t v = 1; v < V; v++)
            if (p[v] > p[best])
                best = v;
        return best;
    }
    double total = 0.0;
    for (int v = 0; v < V; v++)
        total += pow(p[v], 1.0 / T);
    double u = (double)(rng_next(r) >> 11) * 0x1.0p-53 * total, acc = 0.0;
    for (int32_t v = 0; v < V; v++) {
        acc += pow(p[v], 1.0 / T);
        if (u < acc)
            return v;
        best = p[v] > 0.0 ? v : best;
    }
    return best; /* u landed on the rounding error of the sum: the last possible character */
}

/* Generates o->sample characters after the prompt through the same stages, TP shards and EP
 * experts as training: each step runs one token (the last two characters) forward on every
 * DP replica; the last stage's first rank picks the next character and an all-reduce tells
 * every rank. The model sees two characters, so only the prompt's last two matter. */
static hcomm_result_t generate(const train_job_t *job, model_t *m, train_rt_t *rt, char *out) {
    const train_opts_t *o = job->opts;
    const size_t plen = strlen(o->prompt);
    const int picker = rt->stage == rt->pp_size - 1 && rt->tp_rank == 0 && rt->dp_rank == 0;
    int32_t ids[3] = {0, 0, 0}; /* prev, cur, target (unused) */
    for (size_t i = 0; i < plen; i++) {
        ids[0] = ids[1];
        for (int v = 0; v < job->corpus->vocab; v++)
            if (job->corpus->chars[v] == (uint8_t)o->prompt[i])
                ids[1] = v;
        if (i == 0)
            ids[0] = ids[1];
    }
    rng_t rng;
    rng_seed(&rng, o->seed, 0x5A3F1E);
    for (int i = 0; i < o->sample; i++) {
        mb_cache_t c = {0};
        c.n = c.nseq = c.seq_len = c.solo = 1;
        c.prev = &ids[0];
        c.cur = &ids[1];
        c.tgt = &ids[2];
        double unused = 0.0;
        hcomm_result_t r = forward_only(m, rt, &c, 1, &unused);
        int64_t mine = picker ? pick_char(c.head_p, m->V, o->temperature, &rng) : 0, next = 0;
        mb_cache_clear(&c);
        arena_reset(&rt->arena);
        if (r != HCOMM_OK)
            return r;
        r = hcomm_all_reduce(rt->world, &mine, &next, 1, HCOMM_I64, HCOMM_SUM);
        if (r != HCOMM_OK)
            return train_fail(rt, "hcomm_all_reduce of the sampled character", r);
        ids[0] = ids[1];
        ids[1] = (int32_t)next;
        out[i] = (char)job->corpus->chars[next];
    }
    out[o->sample] = '\0';
    return HCOMM_OK;
}

/* ---------------------------------------------------------------- reports */

/* "s" after a count other than 1. */
static const char *plural(int n) {
    return n == 1 ? "" : "s";
}

static void report_start(const train_job_t *job, const train_rt_t *rt, int first_step) {
    const train_opts_t *o = job->opts;
    static const char *names[] = {"embed", "TP", "MoE", "head"};
    const int U = model_units(o->layers);
    printf("hcomm-train: %d rank%s (tp %d x pp %d x dp %d; ep %d, %d expert%s) on %s\n",
           rt->world_size, plural(rt->world_size), o->tp, o->pp, o->dp, o->ep, o->experts,
           plural(o->experts), opts_backend(o));
    printf("hcomm-train: attention: %d heads over tp %d, key blocks of %d; cp %d (%s", o->heads,
           o->tp, o->attn_block, o->cp, o->cp > 1 ? o->cp_algo : "off");
    if (o->cp > 1 && rt->cp_algo == CP_A2A_P2P)
        printf(": a2a %d x p2p %d", rt->a2a_size, rt->p2p_size);
    printf(")%s\n", o->sequence_parallel ? ", sequence parallel" : "");
    printf("hcomm-train: data %s (%zu bytes: %zu train, %zu held out%s; vocab %d), %lld "
           "parameters, batch %d x %d chars, %d micro-batch%s\n",
           o->data, job->corpus->len, job->corpus->train_len,
           job->corpus->len - job->corpus->train_len, o->val_data ? " from --val-data" : "",
           job->corpus->vocab, (long long)model_full_size(o, job->corpus->vocab), o->batch, o->seq,
           o->micro_batches, o->micro_batches == 1 ? "" : "es");
    /* Each stage's units; with --virtual-stages its chunks are separated by " | ". */
    const int V = o->virtual_stages, n = o->pp * V;
    printf("hcomm-train: stages:");
    for (int s = 0; s < o->pp; s++) {
        printf(" [");
        for (int v = 0; v < V; v++) {
            const int lo = (v * o->pp + s) * U / n, hi = (v * o->pp + s + 1) * U / n;
            for (int u = lo; u < hi; u++) {
                const int k = unit_kind(u, o->layers);
                printf("%s%s", u > lo ? ", " : v > 0 ? " | " : "", names[k]);
                if ((k == UNIT_TP || k == UNIT_MOE) && o->layers > 1)
                    printf(" %d", (u - 1) / 2);
            }
        }
        printf("]");
    }
    printf("\n");
    if (first_step > 0)
        printf("hcomm-train: resumed from %s at step %d of %d\n", o->resume, first_step, o->steps);
    fflush(stdout);
}

/* Called on world rank 0 after every step with the world sums of {loss, comm s, wall s} and
 * the validation loss (NaN when not evaluated at this step). */
static void report_step(report_t *rep, const train_opts_t *o, int step, const double sums[5],
                        double val) {
    const double now = train_now(), tokens = (double)o->batch * o->seq;
    const double loss = sums[0] / tokens;
    rep->last_loss = loss;
    if (rep->metrics != NULL) {
        double dt = now - rep->step_t, dw = sums[2] - rep->step_wall;
        fprintf(rep->metrics, "%d,%.10g,%.1f,%.4f,%.3f,%.4f,%.4f,", step, loss, tokens / dt,
                dw > 0 ? (sums[1] - rep->step_comm) / dw : 0.0, now - rep->t0,
                dw > 0 ? (sums[3] - rep->step_pp) / dw : 0.0,
                dw > 0 ? (sums[4] - rep->step_dp) / dw : 0.0);
        if (val == val)
            fprintf(rep->metrics, "%.10g", val);
        fprintf(rep->metrics, "\n");
        fflush(rep->metrics); /* a rank that dies later leaves every row written */
    }
    rep->step_t = now;
    rep->step_comm = sums[1];
    rep->step_wall = sums[2];
    rep->step_pp = sums[3];
    rep->step_dp = sums[4];
    if (val == val)
        rep->last_val = val;
    if (step % o->log_every != 0 && step != o->steps - 1 && val != val)
        return;
    const double dt = now - rep->mark_t, dw = sums[2] - rep->mark_wall;
    const double elapsed = now - rep->t0, done = step + 1 - rep->first_step;
    char vbuf[32] = "           ";
    if (val == val)
        snprintf(vbuf, sizeof vbuf, "val %.4f", val);
    printf("step %5d | loss %.4f | %-11s | %8.0f tok/s | comm %4.1f%% | %6.1f s, ETA %6.1f s\n",
           step, loss, vbuf, tokens * (step + 1 - rep->mark_step) / dt,
           dw > 0 ? 100.0 * (sums[1] - rep->mark_comm) / dw : 0.0, elapsed,
           elapsed / done * (o->steps - step - 1));
    fflush(stdout);
    rep->mark_t = now;
    rep->mark_step = step + 1;
    rep->mark_comm = sums[1];
    rep->mark_wall = sums[2];
}

static void report_end(const report_t *rep, const train_opts_t *o, const double sums[5]) {
    const double t = train_now() - rep->t0;
    const int steps = o->steps - rep->first_step;
    printf("done: %d step%s in %.1f s | loss %.4f -> %.4f | val loss %.4f | %.0f tok/s | comm "
           "%.1f%% of rank time (in hcomm calls, waits included; PP %.1f%%, DP %.1f%%) | "
           "replicas bitwise equal\n",
           steps, plural(steps), t, rep->first_loss, rep->last_loss, rep->last_val,
           (double)o->batch * o->seq * steps / t, sums[2] > 0 ? 100.0 * sums[1] / sums[2] : 0.0,
           sums[2] > 0 ? 100.0 * sums[3] / sums[2] : 0.0,
           sums[2] > 0 ? 100.0 * sums[4] / sums[2] : 0.0);
    printf("DP: gradient reduction %s backward; exposed wait %.3f ms per step per rank\n",
           o->dp_overlap ? "overlapped with" : "after",
           steps > 0 ? 1e3 * sums[4] / steps / o->tp / o->pp / o->dp : 0.0);
    fflush(stdout);
}

/* ---------------------------------------------------------------- checkpoints */

/* Gathers the full tensors (master weights and momentum) from their owners to world rank 0,
 * which writes the checkpoint of the state after st->step steps into --save. Collective over
 * the world. */
static hcomm_result_t ckpt_save(const train_job_t *job, const model_t *m, train_rt_t *rt,
                                const train_state_t *st) {
    const train_opts_t *o = job->opts;
    model_tensor_t *ts = train_alloc((size_t)model_num_tensors(o) * sizeof *ts);
    const int nt = model_tensors(o, job->corpus->vocab, ts);
    size_t *off = train_alloc((size_t)nt * sizeof *off), total = 0;
    for (int i = 0; i < nt; i++) {
        off[i] = total;
        total += 2 * (size_t)(ts[i].rows * ts[i].cols);
    }
    /* Each element has exactly one owner; the others add zero bits, so an integer sum moves
     * the owner's bits unchanged (the sign of -0.0 included). */
    real_bits_t *full = calloc(total, sizeof(real_bits_t));
    if (full == NULL) {
        fprintf(stderr, "hcomm-train: out of memory for a checkpoint of %zu values\n", total);
        exit(1);
    }
    for (int i = 0; i < m->nparams; i++) {
        const param_t *p = m->params[i];
        if (!p->owner)
            continue;
        const int64_t R = ts[p->gi].rows, C = ts[p->gi].cols;
        const int64_t r0 = p->how == SHARD_ROWS ? p->part * p->rows : 0;
        const int64_t c0 = p->how == SHARD_COLS ? p->part * p->cols : 0;
        for (int64_t r = 0; r < p->rows; r++) {
            memcpy(full + off[p->gi] + (r0 + r) * C + c0, p->master + r * p->cols,
                   (size_t)p->cols * sizeof(real_t));
            memcpy(full + off[p->gi] + R * C + (r0 + r) * C + c0, p->v + r * p->cols,
                   (size_t)p->cols * sizeof(real_t));
        }
    }
    hcomm_result_t r = hcomm_all_reduce(rt->world, full, full, total, REAL_BITS_DTYPE, HCOMM_SUM);
    int64_t ok = 1, all_ok = 0;
    if (r == HCOMM_OK && rt->world_rank == 0)
        ok = ckpt_write(job, st, ts, nt, full) == 0;
    /* Every rank learns whether rank 0 wrote it, so all stop together. */
    if (r == HCOMM_OK)
        r = hcomm_all_reduce(rt->world, &ok, &all_ok, 1, HCOMM_I64, HCOMM_MIN);
    free(full);
    free(off);
    free(ts);
    if (r != HCOMM_OK)
        return train_fail(rt, "gathering a checkpoint", r);
    if (!all_ok) {
        atomic_store(job->explained, 1);
        return HCOMM_ERR_IO;
    }
    if (rt->world_rank == 0) {
        printf("checkpoint: %s/ckpt-%08d.bin (step %d)\n", o->save, st->step, st->step);
        fflush(stdout);
    }
    return HCOMM_OK;
}

/* ---------------------------------------------------------------- the rank body */

/* Loss NaN, infinite or above 3x its first value: the run has diverged. Every rank sees the
 * same all-reduced loss, so every rank stops at the same step; rank 0 says why. */
static int diverged(const train_job_t *job, const train_rt_t *rt, int step, double loss,
                    double first) {
    const train_opts_t *o = job->opts;
    if (isfinite(loss) && loss <= 3.0 * first)
        return 0;
    if (rt->world_rank == 0)
        fprintf(stderr,
                "hcomm-train: step %d: the loss is %g, %s its starting value %.4f: training "
                "diverged; lower the learning rate (--lr %g now, try --lr %g)\n",
                step, loss, isfinite(loss) ? "more than 3x" : "not a finite number, from", first,
                o->lr, o->lr / 10);
    atomic_store(job->explained, 1);
    return 1;
}

/* --inject-failure RANK:STEP: that rank (of the launch's world) stops for good in the middle
 * of the step, after its backward and before the gradient reduction its peers wait in. */
static hcomm_result_t maybe_inject(const train_opts_t *o, train_rt_t *rt, int step) {
    if (step != o->inject_step || rt->launch_rank != o->inject_rank)
        return HCOMM_OK;
    printf("hcomm-train: --inject-failure: rank %d stops for good during step %d\n",
           rt->launch_rank, step);
    fflush(stdout);
    rt->stopped = 1;
    return hcomm_fault_stop(rt->world);
}

#include "recover.c"

/* One step: gradients, their reduction, the update and the summed loss (and the validation
 * loss where due): everything that communicates before the step is reported. */
static hcomm_result_t run_step(const train_job_t *job, model_t *m, train_rt_t *rt,
                               const int64_t *starts, int step, double t0, double sums[5],
                               double *val) {
    const train_opts_t *o = job->opts;
    if (!rt->zero)
        model_zero_grads(m);
    double loss = 0.0;
    hcomm_result_t r = step_grads(job, m, rt, starts, &loss);
    if (r == HCOMM_OK)
        r = maybe_inject(o, rt, step);
    if (r == HCOMM_OK)
        r = rt->zero ? zero_step(m, rt, o->lr, o->momentum) : reduce_grads(m, rt);
    if (r == HCOMM_OK)
        r = sp_reduce_grads(m, rt);
    arena_reset(&rt->arena);
    if (r != HCOMM_OK)
        return r;
    if (!rt->zero)
        model_sgd(m, o->lr, o->momentum);
    double mine[5] = {loss, rt->comm_s, train_now() - t0, rt->pp_s, rt->dp_s};
    r = TRAIN_COMM(rt, hcomm_all_reduce(rt->world, mine, sums, 5, HCOMM_F64, HCOMM_SUM));
    if (r != HCOMM_OK)
        return train_fail(rt, "hcomm_all_reduce of the loss", r);
    if (step % o->eval_every == 0 || step == o->steps - 1)
        r = evaluate(job, m, rt, val);
    return r;
}

static hcomm_result_t train_loop(const train_job_t *job, model_t *m, train_rt_t *rt, report_t *rep,
                                 train_state_t *st) {
    if (rt->rec)
        job = &rt->rec->job; /* its --dp follows the recoveries */
    const train_opts_t *o = job->opts;
    int64_t *starts = train_alloc((size_t)o->batch * sizeof(int64_t));
    hcomm_result_t r = HCOMM_OK;
    double sums[5] = {0}, t0 = train_now();
    for (int step = st->step; step < o->steps && r == HCOMM_OK; step++) {
        if (rt->rec)
            recover_save(rt, m, st);
        /* Every rank draws the whole global batch, so the stream stays the same everywhere. */
        batch_sample(&st->data_rng, job->corpus, o->batch, o->seq, starts);
        double val = NAN;
        r = run_step(job, m, rt, starts, step, t0, sums, &val);
        if (rt->stopped)
            break;
        int fate = rt->rec ? recover_step(rt, m, st, rep, step, &r) : STEP_OK;
        if (fate == STEP_REDO) {
            step--;
            r = HCOMM_OK;
            continue;
        }
        if (fate == STEP_LEAVE) {
            rt->left = 1;
            r = HCOMM_OK;
            break;
        }
        if (r != HCOMM_OK)
            break;
        const double loss = sums[0] / ((double)o->batch * o->seq);
        if (step == 0)
            st->first_loss = loss;
        if (diverged(job, rt, step, loss, st->first_loss)) {
            r = HCOMM_ERR_INVALID_ARG;
            break;
        }
        st->step = step + 1;
        if (rt->world_rank == 0) {
            rep->first_loss = st->first_loss;
            report_step(rep, o, step, sums, val);
        }
        if (o->save != NULL &&
            ((o->save_every > 0 && st->step % o->save_every == 0) || st->step == o->steps))
            r = ckpt_save(job, m, rt, st);
    }
    if (rt->stopped || rt->left) {
        free(starts);
        return r;
    }
    if (r == HCOMM_OK && rt->zero)
        r = zero_gather_everything(m, rt, 0);
    if (r == HCOMM_OK)
        r = check_replicas(m, rt);
    if (r == HCOMM_OK && rt->world_rank == 0)
        report_end(rep, o, sums);
    if (r == HCOMM_OK)
        r = zero_report_memory(m, rt, o);
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
    fprintf(rep->metrics,
            "step,loss,tokens_per_s,comm_share,elapsed_s,pp_share,dp_share,val_loss\n");
    fflush(rep->metrics);
    return HCOMM_OK;
}

/* The sample, printed last so that it is easy to find and compare. */
static hcomm_result_t sample_and_print(const train_job_t *job, model_t *m, train_rt_t *rt) {
    const train_opts_t *o = job->opts;
    if (o->sample == 0)
        return HCOMM_OK;
    char *text = train_alloc((size_t)o->sample + 1);
    hcomm_result_t r = generate(job, m, rt, text);
    if (r == HCOMM_OK && rt->world_rank == 0) {
        printf("sample (%d chars after --prompt, temperature %g, seed %llu):\n%s%s\n", o->sample,
               o->temperature, (unsigned long long)o->seed, o->prompt, text);
        fflush(stdout);
    }
    free(text);
    return r;
}

/* A rank that stopped for good (--inject-failure) or whose replica was dropped ends here,
 * without a collective: its groups are gone or revoked. */
static hcomm_result_t rank_leave(train_rt_t *rt, model_t *m, report_t *rep, hcomm_result_t r) {
    if (rep->metrics != NULL)
        fclose(rep->metrics);
    if (rt->rec)
        free(rt->rec->saved);
    reducers_free(rt);
    zero_free(m, rt, model_units(m->L));
    model_free(m);
    arena_free(&rt->arena);
    return rt->stopped ? r : HCOMM_OK;
}

hcomm_result_t REAL_NAME(train_rank)(hcomm_comm_t *world, void *arg) {
    const train_job_t *job = arg;
    train_rt_t rt = {0};
    hcomm_ctx_t *ctx = NULL;
    model_t m = {0};
    report_t rep = {0};
    train_state_t st = {0};
    rt.world = world;
    rt.bf16 = strcmp(job->opts->dtype, "bf16") == 0;
    rt.sp = job->opts->sequence_parallel;
    rep.last_val = NAN;
    hcomm_result_t r = rt_setup(&rt, job->opts, &ctx);
    rt.launch_rank = rt.world_rank;
    if (r == HCOMM_OK)
        model_init(&m, job->opts, job->corpus->vocab, &rt, job->start);
    if (r == HCOMM_OK && job->opts->zero > 0)
        r = zero_setup(&m, &rt, job->opts, ctx);
    else if (r == HCOMM_OK && job->opts->dp_overlap)
        r = reducers_setup(&m, &rt);
    rng_seed(&st.data_rng, job->opts->seed, 0xDA7A);
    if (job->start != NULL)
        ckpt_state(job->start, &st);
    rep.first_step = rep.mark_step = st.step;
    if (r == HCOMM_OK)
        r = open_metrics(job->opts, &rt, &rep);
    if (r == HCOMM_OK && rt.world_rank == 0)
        report_start(job, &rt, st.step);
    rep.t0 = rep.mark_t = rep.step_t = train_now();
    rt.comm_s = 0.0;
    recover_t rec;
    if (r == HCOMM_OK && job->opts->max_failures > 0) {
        recover_init(&rec, job, &m, &rt);
        rt.rec = &rec;
    }
    if (r == HCOMM_OK)
        r = train_loop(job, &m, &rt, &rep, &st);
    if (rt.stopped || rt.left)
        return rank_leave(&rt, &m, &rep, r);
    ctx = rt.ctx; /* a recovery replaced it */
    if (rep.metrics != NULL && fclose(rep.metrics) != 0 && r == HCOMM_OK) {
        fprintf(stderr, "hcomm-train: writing --metrics %s failed\n", job->opts->metrics);
        r = HCOMM_ERR_IO;
    }
    if (r == HCOMM_OK)
        r = sample_and_print(job, &m, &rt);
    reducers_free(&rt);
    zero_free(&m, &rt, model_units(job->opts->layers));
    model_free(&m);
    arena_free(&rt.arena);
    attn_teardown(&rt, r == HCOMM_OK);
    /* ctx_destroy is collective: skip it after a failure, when peers may be gone. */
    if (r == HCOMM_OK)
        r = hcomm_ctx_destroy(ctx);
    if (r == HCOMM_OK && rt.world_rank == 0) { /* what a relauncher looks for (README) */
        printf("finished %d steps\n", job->opts->steps);
        fflush(stdout);
    }
    if (rt.rec)
        free(rec.saved);
    return r;
}
