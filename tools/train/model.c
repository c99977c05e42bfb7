/* The model of hcomm-train: parameters, and each unit's forward and backward with the hcomm
 * calls that join the shards (TP region mappings, MoE dispatch/combine). */
#include "model.h"

#include "ckpt.h"
#include "data.h"
#include "nn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- runtime helpers */

double train_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

hcomm_result_t train_comm_done(train_rt_t *rt, hcomm_result_t r) {
    rt->comm_s += train_now() - rt->mark;
    return r;
}

hcomm_result_t train_fail(const train_rt_t *rt, const char *what, hcomm_result_t r) {
    if (r != HCOMM_ERR_ABORTED)
        fprintf(stderr, "hcomm-train: rank %d: %s failed: %s (%s)\n", rt->world_rank, what,
                hcomm_result_name(r), hcomm_last_error());
    return r;
}

hcomm_result_t train_fail_call(const train_rt_t *rt, const char *call, hcomm_result_t r) {
    /* call is the C text, maybe wrapped: "TRAIN_COMM(rt, hcomm_pp_recv(rt->pp, ...))"; the
     * user needs only the name of the hcomm function. */
    char name[64] = "an hcomm call";
    const char *p = strstr(call, "hcomm_");
    if (p != NULL) {
        size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_");
        if (n < sizeof name)
            snprintf(name, sizeof name, "%.*s", (int)n, p);
    }
    return train_fail(rt, name, r);
}

/* A zeroed heap array for the parameters, which live as long as the model. */
static double *zeros_alloc(int64_t count) {
    double *p = train_alloc((size_t)count * sizeof(double));
    memset(p, 0, (size_t)count * sizeof(double));
    return p;
}

hcomm_tensor_t train_view2(double *data, int64_t rows, int64_t cols) {
    hcomm_tensor_t t = {0};
    t.data = data;
    t.dtype = HCOMM_F64;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    return t;
}

/* ---------------------------------------------------------------- parameters */

/* Tensor ids seed each tensor's own random stream, so a rank that keeps only some tensors
 * still draws exactly what the 1-rank model draws for them. */
enum { ID_EMB_CUR = 1, ID_EMB_PREV, ID_W1, ID_W2, ID_ROUTER, ID_HEAD, ID_EXPERT0 = 100 };

/* Indices in model_tensors(): the embeddings, then per layer the TP block's four, the router
 * and 4 per expert, then the head's two. Layer l's random streams are its layer-0 ids plus
 * l * LAYER_IDS, so --layers 1 draws what the one-layer model always drew. */
enum { GI_EMB_CUR, GI_EMB_PREV, GI_LAYER0 };
enum { GL_W1, GL_B1, GL_W2, GL_B2, GL_ROUTER, GL_EXPERT0 };
#define LAYER_IDS 100000

static int gi_layer(int E, int l) {
    return GI_LAYER0 + l * (GL_EXPERT0 + 4 * E);
}

int model_num_tensors(const train_opts_t *o) {
    return gi_layer(o->experts, o->layers) + 2;
}

int model_tensors(const train_opts_t *o, int vocab, model_tensor_t *out) {
    const int64_t C = o->hidden, F = 4 * C, Fe = 2 * C, V = vocab;
    const int E = o->experts;
    static const char *const lnames[] = {"tp.w1", "tp.b1", "tp.w2", "tp.b2", "router"};
    const int64_t lshapes[][2] = {{C, F}, {1, F}, {F, C}, {1, C}, {C, E}};
    const int64_t eshapes[][2] = {{C, Fe}, {1, Fe}, {Fe, C}, {1, C}};
    static const char *const enames[] = {"w1", "b1", "w2", "b2"};
    int n = 0;
    for (int i = 0; i < 2; i++, n++) {
        snprintf(out[n].name, sizeof out[n].name, "%s", i == 0 ? "emb_cur" : "emb_prev");
        out[n].rows = V;
        out[n].cols = C;
    }
    for (int l = 0; l < o->layers; l++) {
        for (int i = 0; i < GL_EXPERT0; i++, n++) {
            snprintf(out[n].name, sizeof out[n].name, "layer%d.%s", l, lnames[i]);
            out[n].rows = lshapes[i][0];
            out[n].cols = lshapes[i][1];
        }
        for (int e = 0; e < E; e++) {
            for (int k = 0; k < 4; k++, n++) {
                snprintf(out[n].name, sizeof out[n].name, "layer%d.expert%d.%s", l, e, enames[k]);
                out[n].rows = eshapes[k][0];
                out[n].cols = eshapes[k][1];
            }
        }
    }
    snprintf(out[n].name, sizeof out[n].name, "head.w");
    out[n].rows = C;
    out[n++].cols = V;
    snprintf(out[n].name, sizeof out[n].name, "head.b");
    out[n].rows = 1;
    out[n++].cols = V;
    return n;
}

/* Keeps part @p part of @p parts along @p how of the full [rows, cols] tensor @p full. */
static void shard_copy(double *dst, const double *full, int64_t rows, int64_t cols, shard_t how,
                       int part, int parts) {
    const int64_t r = how == SHARD_ROWS ? rows / parts : rows;
    const int64_t c = how == SHARD_COLS ? cols / parts : cols;
    const int64_t r0 = how == SHARD_ROWS ? part * r : 0, c0 = how == SHARD_COLS ? part * c : 0;
    for (int64_t i = 0; i < r; i++)
        memcpy(dst + i * c, full + (r0 + i) * cols + c0, (size_t)c * sizeof(double));
}

/* Draws the full [rows, cols] tensor N(0, std^2) (zeros when std is 0), or takes it and its
 * momentum from the checkpoint m->ck, and keeps part @p part of @p parts along @p how. */
static void param_init(model_t *m, param_t *p, uint64_t seed, int id, int gi, int64_t rows,
                       int64_t cols, double std, shard_t how, int part, int parts) {
    p->sharded = how != SHARD_NONE;
    p->gi = gi;
    p->how = how;
    p->part = part;
    p->parts = parts;
    p->rows = how == SHARD_ROWS ? rows / parts : rows;
    p->cols = how == SHARD_COLS ? cols / parts : cols;
    p->w = zeros_alloc(p->rows * p->cols);
    p->g = zeros_alloc(p->rows * p->cols);
    p->v = zeros_alloc(p->rows * p->cols);
    if (m->ck != NULL) {
        const ckpt_tensor_t *t = &m->ck->t[gi];
        shard_copy(p->w, t->w, rows, cols, how, part, parts);
        shard_copy(p->v, t->v, rows, cols, how, part, parts);
    } else {
        double *full = zeros_alloc(rows * cols);
        rng_t r;
        rng_seed(&r, seed, (uint64_t)id);
        for (int64_t i = 0; std != 0.0 && i < rows * cols; i++)
            full[i] = std * rng_normal(&r);
        shard_copy(p->w, full, rows, cols, how, part, parts);
        free(full);
    }
    m->params[m->nparams++] = p;
}

int64_t model_full_size(const train_opts_t *o, int vocab) {
    int64_t C = o->hidden, F = 4 * C, Fe = 2 * C, V = vocab, E = o->experts;
    return 2 * V * C +
           o->layers * ((C * F + F + F * C + C) + C * E + E * (C * Fe + Fe + Fe * C + C)) + C * V +
           V;
}

/* Whether unit u lives on this rank's stage. */
static int has_unit(const model_t *m, int u) {
    return m->unit_lo <= u && u < m->unit_hi;
}

static void init_dense_units(model_t *m, const train_opts_t *o, const train_rt_t *rt) {
    const int C = m->C, F = m->F, V = m->V;
    const uint64_t s = o->seed;
    if (has_unit(m, 0)) {
        param_init(m, &m->emb_cur, s, ID_EMB_CUR, GI_EMB_CUR, V, C, 0.5, SHARD_NONE, 0, 1);
        param_init(m, &m->emb_prev, s, ID_EMB_PREV, GI_EMB_PREV, V, C, 0.5, SHARD_NONE, 0, 1);
    }
    for (int l = 0; l < m->L; l++) {
        if (!has_unit(m, 1 + 2 * l))
            continue;
        layer_t *ly = &m->layers[l];
        const int gi = gi_layer(m->E, l), id = l * LAYER_IDS;
        /* Column-parallel W1 (and b1), row-parallel W2: rank t keeps hidden units t*Fs... */
        param_init(m, &ly->w1, s, id + ID_W1, gi + GL_W1, C, F, 1.0 / sqrt((double)C), SHARD_COLS,
                   rt->tp_rank, rt->tp_size);
        param_init(m, &ly->b1, s, 0, gi + GL_B1, 1, F, 0.0, SHARD_COLS, rt->tp_rank, rt->tp_size);
        param_init(m, &ly->w2, s, id + ID_W2, gi + GL_W2, F, C, 0.5 / sqrt((double)F), SHARD_ROWS,
                   rt->tp_rank, rt->tp_size);
        param_init(m, &ly->b2, s, 0, gi + GL_B2, 1, C, 0.0, SHARD_NONE, 0, 1);
    }
    if (has_unit(m, 1 + 2 * m->L)) {
        const int gi = gi_layer(m->E, m->L);
        param_init(m, &m->head_w, s, ID_HEAD, gi, C, V, 0.2 / sqrt((double)C), SHARD_NONE, 0, 1);
        param_init(m, &m->head_b, s, 0, gi + 1, 1, V, 0.0, SHARD_NONE, 0, 1);
    }
}

static void init_moe_unit(model_t *m, const train_opts_t *o, const train_rt_t *rt, int l) {
    const int C = m->C, Fe = m->Fe, gl = gi_layer(m->E, l), idl = l * LAYER_IDS;
    const uint64_t s = o->seed;
    layer_t *ly = &m->layers[l];
    param_init(m, &ly->router, s, idl + ID_ROUTER, gl + GL_ROUTER, C, m->E, 1.0 / sqrt((double)C),
               SHARD_NONE, 0, 1);
    /* EP rank p owns experts [p*E/P, (p+1)*E/P), the layout hcomm_moe_dispatch routes to. */
    m->E_local = m->E / rt->ep_size;
    m->expert_lo = rt->ep_rank * m->E_local;
    ly->experts = train_alloc((size_t)m->E_local * sizeof(expert_t));
    memset(ly->experts, 0, (size_t)m->E_local * sizeof(expert_t));
    for (int j = 0; j < m->E_local; j++) {
        expert_t *ex = &ly->experts[j];
        int id = idl + ID_EXPERT0 + 2 * (m->expert_lo + j);
        int gi = gl + GL_EXPERT0 + 4 * (m->expert_lo + j);
        param_init(m, &ex->w1, s, id, gi, C, Fe, 1.0 / sqrt((double)C), SHARD_COLS, rt->etp_rank,
                   rt->etp_size);
        param_init(m, &ex->b1, s, 0, gi + 1, 1, Fe, 0.0, SHARD_COLS, rt->etp_rank, rt->etp_size);
        param_init(m, &ex->w2, s, id + 1, gi + 2, Fe, C, 0.5 / sqrt((double)Fe), SHARD_ROWS,
                   rt->etp_rank, rt->etp_size);
        param_init(m, &ex->b2, s, 0, gi + 3, 1, C, 0.0, SHARD_NONE, 0, 1);
        ex->w1.expert = ex->b1.expert = ex->w2.expert = ex->b2.expert = 1;
    }
}

void model_init(model_t *m, const train_opts_t *o, int vocab, const train_rt_t *rt,
                const struct ckpt *ck) {
    memset(m, 0, sizeof *m);
    m->ck = ck;
    m->C = o->hidden;
    m->V = vocab;
    m->F = 4 * o->hidden;
    m->Fe = 2 * o->hidden;
    m->E = o->experts;
    m->L = o->layers;
    m->Fs = m->F / rt->tp_size;
    m->Fes = m->Fe / rt->etp_size;
    m->unit_lo = rt->stage * model_units(m->L) / rt->pp_size;
    m->unit_hi = (rt->stage + 1) * model_units(m->L) / rt->pp_size;
    int max_params = 4 + m->L * (5 + 4 * m->E);
    m->params = train_alloc((size_t)max_params * sizeof(param_t *));
    m->layers = train_alloc((size_t)m->L * sizeof(layer_t));
    memset(m->layers, 0, (size_t)m->L * sizeof(layer_t));
    init_dense_units(m, o, rt);
    for (int l = 0; l < m->L; l++)
        if (has_unit(m, 2 + 2 * l))
            init_moe_unit(m, o, rt, l);
    /* One copy of each shard goes into a checkpoint: DP (or expert-DP) replica 0's, and of an
     * unsharded tensor, TP rank 0's. */
    for (int i = 0; i < m->nparams; i++) {
        param_t *p = m->params[i];
        p->owner =
            (p->expert ? rt->edp_rank : rt->dp_rank) == 0 && (p->sharded || rt->tp_rank == 0);
    }
    m->ck = NULL;
}

void model_free(model_t *m) {
    for (int i = 0; i < m->nparams; i++) {
        free(m->params[i]->w);
        free(m->params[i]->g);
        free(m->params[i]->v);
    }
    free(m->params);
    for (int l = 0; l < m->L; l++)
        free(m->layers[l].experts);
    free(m->layers);
    memset(m, 0, sizeof *m);
}

void model_zero_grads(model_t *m) {
    for (int i = 0; i < m->nparams; i++)
        memset(m->params[i]->g, 0,
               (size_t)(m->params[i]->rows * m->params[i]->cols) * sizeof(double));
}

void model_sgd(model_t *m, double lr, double momentum) {
    for (int i = 0; i < m->nparams; i++) {
        param_t *p = m->params[i];
        for (int64_t k = 0; k < p->rows * p->cols; k++) {
            p->v[k] = momentum * p->v[k] + p->g[k];
            p->w[k] -= lr * p->v[k];
        }
    }
}

/* ---------------------------------------------------------------- unit 0: embedding */

static void embed_forward(const model_t *m, const mb_cache_t *c, double *h) {
    const int C = m->C;
    for (int64_t i = 0; i < c->n; i++) {
        const double *a = m->emb_cur.w + (int64_t)c->cur[i] * C;
        const double *b = m->emb_prev.w + (int64_t)c->prev[i] * C;
        for (int k = 0; k < C; k++)
            h[i * C + k] = a[k] + b[k];
    }
}

static void embed_backward(model_t *m, const mb_cache_t *c, const double *dh) {
    const int C = m->C;
    for (int64_t i = 0; i < c->n; i++) {
        nn_add(m->emb_cur.g + (int64_t)c->cur[i] * C, dh + i * C, C);
        nn_add(m->emb_prev.g + (int64_t)c->prev[i] * C, dh + i * C, C);
    }
}

/* ---------------------------------------------------------------- unit 1: TP block */

/* h = x + reduce_from(gelu(copy_to(x) W1 + b1) W2) + b2 (Megatron-LM's parallel MLP). */
static hcomm_result_t tp_forward(const model_t *m, train_rt_t *rt, mb_cache_t *c, double *h) {
    const layer_t *ly = &m->layers[c->layer];
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, C = m->C, Fs = m->Fs;
    arena_t *a = &rt->arena;
    lc->tp_x = arena_doubles(a, n * C);
    lc->tp_z = arena_doubles(a, n * Fs);
    lc->tp_g = arena_doubles(a, n * Fs);
    double *y = arena_doubles(a, n * C);
    hcomm_tensor_t h_t = train_view2(h, n, C), x_t = train_view2(lc->tp_x, n, C),
                   y_t = train_view2(y, n, C);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_copy_to_fwd(rt->tp, &h_t, &x_t)));
    nn_linear_fwd(lc->tp_x, ly->w1.w, ly->b1.w, lc->tp_z, n, C, Fs);
    nn_gelu_fwd(lc->tp_z, lc->tp_g, n * Fs);
    nn_linear_fwd(lc->tp_g, ly->w2.w, NULL, y, n, Fs, C); /* partial sum over my shard */
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_from_fwd(rt->tp, &y_t, &h_t)));
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < C; k++)
            h[i * C + k] += lc->tp_x[i * C + k] + ly->b2.w[k];
    return HCOMM_OK;
}

static hcomm_result_t tp_backward(model_t *m, train_rt_t *rt, mb_cache_t *c, double *dh) {
    layer_t *ly = &m->layers[c->layer];
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, C = m->C, Fs = m->Fs;
    arena_t *a = &rt->arena;
    double *dy = arena_doubles(a, n * C), *dz = arena_doubles(a, n * Fs);
    double *dxp = arena_doubles(a, n * C), *dx = arena_doubles(a, n * C);
    hcomm_tensor_t dh_t = train_view2(dh, n, C), dy_t = train_view2(dy, n, C);
    hcomm_tensor_t dxp_t = train_view2(dxp, n, C), dx_t = train_view2(dx, n, C);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_from_bwd(rt->tp, &dh_t, &dy_t)));
    for (int64_t i = 0; i < n; i++)
        nn_add(ly->b2.g, dh + i * C, C);
    nn_linear_bwd_params(lc->tp_g, dy, ly->w2.g, NULL, n, Fs, C);
    nn_linear_bwd_input(dy, ly->w2.w, dz, arena_doubles(a, Fs * C), n, Fs, C);
    nn_gelu_bwd(lc->tp_z, dz, dz, n * Fs);
    nn_linear_bwd_params(lc->tp_x, dz, ly->w1.g, ly->b1.g, n, C, Fs);
    nn_linear_bwd_input(dz, ly->w1.w, dxp, arena_doubles(a, C * Fs), n, C, Fs);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_copy_to_bwd(rt->tp, &dxp_t, &dx_t)));
    nn_add(dh, dx, n * C); /* the residual plus the block's input gradient */
    return HCOMM_OK;
}

/* ---------------------------------------------------------------- unit 2: MoE */

/* Router: probabilities, top-1 expert (lowest index on exact ties) and its gate. */
static void router_forward(const model_t *m, mb_cache_t *c) {
    const layer_t *ly = &m->layers[c->layer];
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, E = m->E;
    nn_linear_fwd(lc->moe_x, ly->router.w, NULL, lc->moe_p, n, m->C, E);
    nn_softmax_rows(lc->moe_p, n, E);
    for (int64_t i = 0; i < n; i++) {
        int32_t best = 0;
        for (int32_t e = 1; e < E; e++)
            if (lc->moe_p[i * E + e] > lc->moe_p[i * E + best])
                best = e;
        lc->moe_e[i] = best;
    }
}

/* Each local expert's FFN on its block of the received rows (grouped by expert):
 * o = gelu(r W1e + b1e) W2e (+ b2e once, on expert-TP rank 0: the shards are summed later). */
static void experts_forward(const model_t *m, const train_rt_t *rt, mb_cache_t *c,
                            const double *rows) {
    const layer_t *ly = &m->layers[c->layer];
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t C = m->C, Fes = m->Fes;
    int64_t off = 0;
    for (int j = 0; j < m->E_local; j++) {
        const expert_t *ex = &ly->experts[j];
        const int64_t nj = lc->moe_count[j];
        nn_linear_fwd(rows + off * C, ex->w1.w, ex->b1.w, lc->moe_z + off * Fes, nj, C, Fes);
        nn_gelu_fwd(lc->moe_z + off * Fes, lc->moe_g + off * Fes, nj * Fes);
        nn_linear_fwd(lc->moe_g + off * Fes, ex->w2.w, rt->etp_rank == 0 ? ex->b2.w : NULL,
                      lc->moe_o + off * C, nj, Fes, C);
        off += nj;
    }
}

/* Dispatches the tokens over EP, runs the local experts and combines their outputs back into
 * part [n, C] (this expert-TP shard's share); the routing stays in c for the backward. */
static hcomm_result_t moe_dispatch_experts(const model_t *m, train_rt_t *rt, mb_cache_t *c,
                                           double *part) {
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, C = m->C;
    hcomm_tensor_t x_t = train_view2(lc->moe_x, n, C), recv = {0}, part_t = train_view2(part, n, C);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_moe_dispatch(rt->ep, &x_t, lc->moe_e, m->E, &lc->moe_h)));
    lc->moe_count = arena_alloc(&rt->arena, (size_t)m->E_local * sizeof(int64_t));
    TRAIN_TRY(rt, hcomm_moe_received(lc->moe_h, &recv, lc->moe_count));
    int64_t total = 0;
    for (int j = 0; j < m->E_local; j++)
        total += lc->moe_count[j];
    if (recv.ndim != 2 || recv.shape[1] != C || recv.shape[0] != total || recv.dtype != HCOMM_F64)
        return train_fail(rt, "hcomm_moe_received: rows [R, C] with R = sum of the counts",
                          HCOMM_ERR_INTERNAL);
    lc->moe_rows = total;
    lc->moe_z = arena_doubles(&rt->arena, total * m->Fes);
    lc->moe_g = arena_doubles(&rt->arena, total * m->Fes);
    lc->moe_o = arena_doubles(&rt->arena, total * C);
    experts_forward(m, rt, c, recv.data);
    hcomm_tensor_t o_t = train_view2(lc->moe_o, total, C);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_moe_combine(lc->moe_h, &o_t, &part_t)));
    return HCOMM_OK;
}

/* h = x + p[e] * expert_e(x); the experts' shards are summed over the expert-TP group. */
static hcomm_result_t moe_forward(const model_t *m, train_rt_t *rt, mb_cache_t *c, double *h) {
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, C = m->C;
    arena_t *a = &rt->arena;
    lc->moe_x = arena_doubles(a, n * C);
    lc->moe_p = arena_doubles(a, n * m->E);
    lc->moe_y = arena_doubles(a, n * C);
    lc->moe_e = arena_alloc(a, (size_t)n * sizeof(int32_t));
    double *part = arena_doubles(a, n * C);
    hcomm_tensor_t h_t = train_view2(h, n, C), x_t = train_view2(lc->moe_x, n, C);
    hcomm_tensor_t part_t = train_view2(part, n, C), y_t = train_view2(lc->moe_y, n, C);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_copy_to_fwd(rt->etp, &h_t, &x_t)));
    router_forward(m, c);
    hcomm_result_t r = moe_dispatch_experts(m, rt, c, part);
    if (r != HCOMM_OK)
        return r;
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_from_fwd(rt->etp, &part_t, &y_t)));
    for (int64_t i = 0; i < n; i++) {
        const double gate = lc->moe_p[i * m->E + lc->moe_e[i]];
        for (int64_t k = 0; k < C; k++)
            h[i * C + k] = lc->moe_x[i * C + k] + gate * lc->moe_y[i * C + k];
    }
    return HCOMM_OK;
}

/* Gradient through the router: d gate_i = <dh_i, y_i>, and the softmax Jacobian of the
 * chosen entry: d logit_ij = d gate_i * p_ie * ([j == e] - p_ij). Adds d x into dx. */
static void router_backward(model_t *m, train_rt_t *rt, const mb_cache_t *c, const double *dh,
                            double *dx) {
    layer_t *ly = &m->layers[c->layer];
    const layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, C = m->C, E = m->E;
    double *dl = arena_doubles(&rt->arena, n * E), *dxr = arena_doubles(&rt->arena, n * C);
    for (int64_t i = 0; i < n; i++) {
        double dgate = 0.0;
        for (int64_t k = 0; k < C; k++)
            dgate += dh[i * C + k] * lc->moe_y[i * C + k];
        const int32_t e = lc->moe_e[i];
        const double *p = lc->moe_p + i * E, pe = p[e];
        for (int64_t j = 0; j < E; j++)
            dl[i * E + j] = dgate * pe * ((j == e) - p[j]);
    }
    nn_linear_bwd_params(lc->moe_x, dl, ly->router.g, NULL, n, C, E);
    nn_linear_bwd_input(dl, ly->router.w, dxr, arena_doubles(&rt->arena, C * E), n, C, E);
    nn_add(dx, dxr, n * C);
}

/* Backward of the local experts on the rows grouped as in the forward: d_o [R, C] holds the
 * gradient of their outputs; d_rows [R, C] gets that of their inputs (partial over the
 * expert-TP shards). */
static void experts_backward(model_t *m, train_rt_t *rt, mb_cache_t *c, const double *rows,
                             const double *d_o, double *d_rows) {
    layer_t *ly = &m->layers[c->layer];
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t C = m->C, Fes = m->Fes;
    double *dz = arena_doubles(&rt->arena, lc->moe_rows * Fes);
    double *wt = arena_doubles(&rt->arena, C * Fes);
    int64_t off = 0;
    for (int j = 0; j < m->E_local; j++) {
        expert_t *ex = &ly->experts[j];
        const int64_t nj = lc->moe_count[j];
        const double *o = d_o + off * C;
        double *z = dz + off * Fes;
        nn_linear_bwd_params(lc->moe_g + off * Fes, o, ex->w2.g, ex->b2.g, nj, Fes, C);
        nn_linear_bwd_input(o, ex->w2.w, z, wt, nj, Fes, C);
        nn_gelu_bwd(lc->moe_z + off * Fes, z, z, nj * Fes);
        nn_linear_bwd_params(rows + off * C, z, ex->w1.g, ex->b1.g, nj, C, Fes);
        nn_linear_bwd_input(z, ex->w1.w, d_rows + off * C, wt, nj, C, Fes);
        off += nj;
    }
}

static hcomm_result_t moe_backward(model_t *m, train_rt_t *rt, mb_cache_t *c, double *dh) {
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, C = m->C, R = lc->moe_rows;
    arena_t *a = &rt->arena;
    double *dy = arena_doubles(a, n * C), *dyr = arena_doubles(a, n * C);
    double *d_o = arena_doubles(a, R * C), *d_rows = arena_doubles(a, R * C);
    double *dtok = arena_doubles(a, n * C), *dx = arena_doubles(a, n * C);
    hcomm_tensor_t recv = {0}, dy_t = train_view2(dy, n, C), dyr_t = train_view2(dyr, n, C);
    hcomm_tensor_t d_o_t = train_view2(d_o, R, C), d_rows_t = train_view2(d_rows, R, C);
    hcomm_tensor_t dtok_t = train_view2(dtok, n, C), dx_t = train_view2(dx, n, C);
    TRAIN_TRY(rt, hcomm_moe_received(lc->moe_h, &recv, NULL));
    /* Gradient of the combined expert output: gate_i * dh_i. reduce_from's backward is the
     * identity; combine's backward routes it to the experts like the dispatch did. */
    for (int64_t i = 0; i < n; i++) {
        const double gate = lc->moe_p[i * m->E + lc->moe_e[i]];
        for (int64_t k = 0; k < C; k++)
            dy[i * C + k] = gate * dh[i * C + k];
    }
    router_backward(m, rt, c, dh, dh); /* dh keeps the residual path and gains the router's */
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_from_bwd(rt->etp, &dy_t, &dyr_t)));
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_moe_combine_bwd(lc->moe_h, &dyr_t, &d_o_t)));
    experts_backward(m, rt, c, recv.data, d_o, d_rows);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_moe_dispatch_bwd(lc->moe_h, &d_rows_t, &dtok_t)));
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_copy_to_bwd(rt->etp, &dtok_t, &dx_t)));
    nn_add(dh, dx, n * C);
    return HCOMM_OK;
}

/* ---------------------------------------------------------------- unit 3: head and loss */

static void head_forward(const model_t *m, train_rt_t *rt, mb_cache_t *c, const double *h) {
    const int64_t n = c->n, C = m->C, V = m->V;
    c->head_x = arena_doubles(&rt->arena, n * C);
    c->head_p = arena_doubles(&rt->arena, n * V);
    memcpy(c->head_x, h, (size_t)(n * C) * sizeof(double));
    nn_linear_fwd(c->head_x, m->head_w.w, m->head_b.w, c->head_p, n, C, V);
    c->loss += nn_softmax_xent_fwd(c->head_p, c->tgt, n, V);
}

static void head_backward(model_t *m, train_rt_t *rt, const mb_cache_t *c, double *dh,
                          double scale) {
    const int64_t n = c->n, C = m->C, V = m->V;
    double *dl = arena_doubles(&rt->arena, n * V);
    nn_softmax_xent_bwd(c->head_p, c->tgt, dl, n, V, scale);
    nn_linear_bwd_params(c->head_x, dl, m->head_w.g, m->head_b.g, n, C, V);
    nn_linear_bwd_input(dl, m->head_w.w, dh, arena_doubles(&rt->arena, C * V), n, C, V);
}

/* ---------------------------------------------------------------- dispatch over units */

/* The layer cache of c, made on the first layer unit of a micro-batch; c->layer names the
 * layer unit u belongs to. */
static void enter_layer(const model_t *m, train_rt_t *rt, mb_cache_t *c, int u) {
    if (c->lc == NULL) {
        c->nl = m->L;
        c->lc = arena_alloc(&rt->arena, (size_t)m->L * sizeof(layer_cache_t));
        memset(c->lc, 0, (size_t)m->L * sizeof(layer_cache_t));
    }
    c->layer = (u - 1) / 2;
}

hcomm_result_t unit_forward(int u, const model_t *m, train_rt_t *rt, mb_cache_t *c, double *h) {
    switch (unit_kind(u, m->L)) {
    case UNIT_EMBED:
        embed_forward(m, c, h);
        return HCOMM_OK;
    case UNIT_TP:
        enter_layer(m, rt, c, u);
        return tp_forward(m, rt, c, h);
    case UNIT_MOE:
        enter_layer(m, rt, c, u);
        return moe_forward(m, rt, c, h);
    default:
        head_forward(m, rt, c, h);
        return HCOMM_OK;
    }
}

hcomm_result_t unit_backward(int u, model_t *m, train_rt_t *rt, mb_cache_t *c, double *dh,
                             double scale) {
    switch (unit_kind(u, m->L)) {
    case UNIT_EMBED:
        embed_backward(m, c, dh);
        return HCOMM_OK;
    case UNIT_TP:
        enter_layer(m, rt, c, u);
        return tp_backward(m, rt, c, dh);
    case UNIT_MOE: {
        enter_layer(m, rt, c, u);
        hcomm_result_t r = moe_backward(m, rt, c, dh);
        hcomm_moe_handle_t *h = c->lc[c->layer].moe_h;
        c->lc[c->layer].moe_h = NULL;
        if (r == HCOMM_OK)
            TRAIN_TRY(rt, hcomm_moe_handle_free(h));
        else
            hcomm_moe_handle_free(h);
        return r;
    }
    default:
        head_backward(m, rt, c, dh, scale);
        return HCOMM_OK;
    }
}

void mb_cache_clear(mb_cache_t *c) {
    for (int l = 0; c->lc != NULL && l < c->nl; l++)
        hcomm_moe_handle_free(c->lc[l].moe_h);
    memset(c, 0, sizeof *c);
}
