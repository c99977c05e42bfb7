/* The model of hcomm-train: parameters, and each unit's forward and backward with the hcomm
 * calls that join the shards (TP region mappings, MoE dispatch/combine). */
#include "model.h"

#include "../ckpt.h"
#include "../data.h"
#include "attn.h"
#include "nn.h"
#include "sp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers */

/* A zeroed heap array for the parameters, which live as long as the model. */
static real_t *zeros_alloc(int64_t count) {
    real_t *p = train_alloc((size_t)count * sizeof(real_t));
    memset(p, 0, (size_t)count * sizeof(real_t));
    return p;
}

/* --dtype bf16 stores weights and activations in bf16 and computes in f32 (what a bf16
 * matmul with f32 accumulation does: products of bf16 values are exact in f32): x keeps f32
 * elements, rounded to the bf16 values a bf16 buffer would hold. A no-op for f32 and f64. */
static void bf16_store(const model_t *m, real_t *x, int64_t count) {
    for (int64_t i = 0; m->bf16 && i < count; i++)
        x[i] = (real_t)bf16_value(bf16_bits((float)x[i]));
}

/* ---------------------------------------------------------------- parameters */

/* Tensor ids seed each tensor's own random stream, so a rank that keeps only some tensors
 * still draws exactly what the 1-rank model draws for them. */
enum {
    ID_EMB_CUR = 1,
    ID_EMB_PREV,
    ID_W1,
    ID_W2,
    ID_ROUTER,
    ID_HEAD,
    ID_WQ,
    ID_WK,
    ID_WV,
    ID_WO,
    ID_EXPERT0 = 100
};

/* Layer l's random streams are its layer-0 ids plus l * LAYER_IDS, so --layers 1 draws what
 * the one-layer model always drew. */
#define LAYER_IDS 100000

/* Keeps part @p part of @p parts along @p how of the full [rows, cols] tensor @p full. */
static void shard_copy(real_t *dst, const real_t *full, int64_t rows, int64_t cols, shard_t how,
                       int part, int parts) {
    const int64_t r = how == SHARD_ROWS ? rows / parts : rows;
    const int64_t c = how == SHARD_COLS ? cols / parts : cols;
    const int64_t r0 = how == SHARD_ROWS ? part * r : 0, c0 = how == SHARD_COLS ? part * c : 0;
    for (int64_t i = 0; i < r; i++)
        memcpy(dst + i * c, full + (r0 + i) * cols + c0, (size_t)c * sizeof(real_t));
}

/* With bf16: the weights the units compute with, the master weights rounded to bf16. */
static void param_round(const model_t *m, param_t *p) {
    for (int64_t k = 0; m->bf16 && k < p->rows * p->cols; k++)
        p->w[k] = (real_t)bf16_value(bf16_bits((float)p->master[k]));
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
    p->master = zeros_alloc(p->rows * p->cols);
    p->w = m->bf16 ? zeros_alloc(p->rows * p->cols) : p->master;
    p->g = zeros_alloc(p->rows * p->cols);
    p->v = zeros_alloc(p->rows * p->cols);
    if (m->ck != NULL) { /* main() checked that the checkpoint holds real_t values */
        const ckpt_tensor_t *t = &m->ck->t[gi];
        shard_copy(p->master, t->w, rows, cols, how, part, parts);
        shard_copy(p->v, t->v, rows, cols, how, part, parts);
    } else {
        real_t *full = zeros_alloc(rows * cols);
        rng_t r;
        rng_seed(&r, seed, (uint64_t)id);
        for (int64_t i = 0; std != 0.0 && i < rows * cols; i++)
            full[i] = std * rng_normal(&r);
        shard_copy(p->master, full, rows, cols, how, part, parts);
        free(full);
    }
    param_round(m, p);
    m->params[m->nparams++] = p;
}

/* Whether unit u lives on this rank's stage (in one of its chunks). */
static int has_unit(const model_t *m, int u) {
    int in = 0;
    for (int v = 0; v < m->vstages; v++)
        in |= m->chunk_lo[v] <= u && u < m->chunk_hi[v];
    return in;
}

/* Layer l's attention: Wq, Wk, Wv column-parallel (TP rank t keeps heads t*H/tp...), Wo
 * row-parallel, bo on every rank. Wo starts small (0.2/sqrt(C)): the model has no
 * normalization, and a larger Wo made --layers 2 diverge at --lr 0.3 within 10 steps. */
static void init_attn(model_t *m, const train_opts_t *o, const train_rt_t *rt, int l) {
    layer_t *ly = &m->layers[l];
    const int C = m->C, gi = gi_layer(m->E, l), id = l * LAYER_IDS;
    const double std = 1.0 / sqrt((double)C);
    param_t *w[3] = {&ly->wq, &ly->wk, &ly->wv};
    for (int i = 0; i < 3; i++)
        param_init(m, w[i], o->seed, id + ID_WQ + i, gi + GL_WQ + i, C, C, std, SHARD_COLS,
                   rt->tp_rank, rt->tp_size);
    param_init(m, &ly->wo, o->seed, id + ID_WO, gi + GL_WO, C, C, 0.2 * std, SHARD_ROWS,
               rt->tp_rank, rt->tp_size);
    param_init(m, &ly->bo, o->seed, 0, gi + GL_BO, 1, C, 0.0, SHARD_NONE, 0, 1);
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
        init_attn(m, o, rt, l);
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
    /* EP rank p owns experts [p*E/P, (p+1)*E/P), the layout hcomm_moe_dispatch_topk routes to. */
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

static void model_init(model_t *m, const train_opts_t *o, int vocab, const train_rt_t *rt,
                       const struct ckpt *ck) {
    memset(m, 0, sizeof *m);
    m->ck = ck;
    m->bf16 = rt->bf16;
    m->K = o->topk;
    m->capacity_factor = o->capacity_factor;
    m->C = o->hidden;
    m->V = vocab;
    m->F = 4 * o->hidden;
    m->Fe = 2 * o->hidden;
    m->E = o->experts;
    m->L = o->layers;
    m->Fs = m->F / rt->tp_size;
    m->Fes = m->Fe / rt->etp_size;
    m->heads = o->heads;
    m->Hl = o->heads / rt->tp_size;
    m->D = o->hidden / o->heads;
    /* The units split evenly into P * V chunks; chunk v of stage s is the model's v*P + s. */
    m->vstages = o->virtual_stages;
    m->chunk_lo = train_alloc(2 * (size_t)m->vstages * sizeof(int));
    m->chunk_hi = m->chunk_lo + m->vstages;
    for (int v = 0; v < m->vstages; v++) {
        const int chunk = v * rt->pp_size + rt->stage, n = rt->pp_size * m->vstages;
        m->chunk_lo[v] = chunk * model_units(m->L) / n;
        m->chunk_hi[v] = (chunk + 1) * model_units(m->L) / n;
    }
    int max_params = 4 + m->L * (GL_EXPERT0 + 4 * m->E);
    m->params = train_alloc((size_t)max_params * sizeof(param_t *));
    m->layers = train_alloc((size_t)m->L * sizeof(layer_t));
    memset(m->layers, 0, (size_t)m->L * sizeof(layer_t));
    init_dense_units(m, o, rt);
    for (int l = 0; l < m->L; l++)
        if (has_unit(m, 2 + 2 * l))
            init_moe_unit(m, o, rt, l);
    model_set_owners(m, rt);
    m->ck = NULL;
}

/* One copy of each shard goes into a checkpoint: DP (or expert-DP) replica 0's, and of an
 * unsharded tensor, TP rank 0's. */
static void model_set_owners(model_t *m, const train_rt_t *rt) {
    for (int i = 0; i < m->nparams; i++) {
        param_t *p = m->params[i];
        p->owner =
            (p->expert ? rt->edp_rank : rt->dp_rank) == 0 && (p->sharded || rt->tp_rank == 0);
    }
}

static void model_free(model_t *m) {
    for (int i = 0; i < m->nparams; i++) {
        if (m->params[i]->w != m->params[i]->master)
            free(m->params[i]->w);
        free(m->params[i]->master);
        free(m->params[i]->g);
        free(m->params[i]->v);
    }
    free(m->params);
    for (int l = 0; l < m->L; l++)
        free(m->layers[l].experts);
    free(m->layers);
    free(m->chunk_lo);
    memset(m, 0, sizeof *m);
}

static void model_zero_grads(model_t *m) {
    for (int i = 0; i < m->nparams; i++)
        memset(m->params[i]->g, 0,
               (size_t)(m->params[i]->rows * m->params[i]->cols) * sizeof(real_t));
}

static void model_sgd(model_t *m, double lr, double momentum) {
    const real_t rate = (real_t)lr, mom = (real_t)momentum;
    for (int i = 0; i < m->nparams; i++) {
        param_t *p = m->params[i];
        for (int64_t k = 0; k < p->rows * p->cols; k++) {
            p->v[k] = mom * p->v[k] + p->g[k];
            p->master[k] -= rate * p->v[k];
        }
        param_round(m, p);
    }
}

/* ---------------------------------------------------------------- unit 0: embedding */

static void embed_forward(const model_t *m, const mb_cache_t *c, real_t *h) {
    const int C = m->C;
    for (int64_t i = 0; i < c->n; i++) {
        const real_t *a = m->emb_cur.w + (int64_t)c->cur[i] * C;
        const real_t *b = m->emb_prev.w + (int64_t)c->prev[i] * C;
        for (int k = 0; k < C; k++)
            h[i * C + k] = a[k] + b[k];
    }
    bf16_store(m, h, c->n * C);
}

static void embed_backward(model_t *m, const mb_cache_t *c, const real_t *dh) {
    const int C = m->C;
    for (int64_t i = 0; i < c->n; i++) {
        nn_add(m->emb_cur.g + (int64_t)c->cur[i] * C, dh + i * C, C);
        nn_add(m->emb_prev.g + (int64_t)c->prev[i] * C, dh + i * C, C);
    }
}

/* ---------------------------------------------------------------- unit 1: TP block */

/* h = x + reduce_from(gelu(copy_to(x) W1 + b1) W2) + b2 (Megatron-LM's parallel MLP). */
static hcomm_result_t tp_forward(const model_t *m, train_rt_t *rt, mb_cache_t *c, real_t *h) {
    hcomm_result_t r = zero_piece(rt, 1 + 2 * c->layer, PIECE_ATTN, 1);
    if (r == HCOMM_OK)
        r = attn_forward(m, rt, c, h); /* the block's attention sublayer first */
    if (r == HCOMM_OK)
        r = zero_piece(rt, 1 + 2 * c->layer, PIECE_MLP, 1);
    if (r != HCOMM_OK)
        return r;
    const layer_t *ly = &m->layers[c->layer];
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = mb_rows(c), C = m->C, Fs = m->Fs;
    arena_t *a = &rt->arena;
    lc->tp_x = arena_reals(a, n * C);
    lc->tp_z = arena_reals(a, n * Fs);
    lc->tp_g = arena_reals(a, n * Fs);
    real_t *y = arena_reals(a, n * C), *s = arena_reals(a, c->n * C);
    TRAIN_TRY(rt, sp_enter_fwd(rt, sp_rows_of(c), h, lc->tp_x, C));
    nn_linear_fwd(lc->tp_x, ly->w1.w, ly->b1.w, lc->tp_z, n, C, Fs);
    bf16_store(m, lc->tp_z, n * Fs);
    nn_gelu_fwd(lc->tp_z, lc->tp_g, n * Fs);
    bf16_store(m, lc->tp_g, n * Fs);
    nn_linear_fwd(lc->tp_g, ly->w2.w, NULL, y, n, Fs, C); /* partial sum over my shard */
    TRAIN_TRY(rt, sp_exit_fwd(rt, sp_rows_of(c), y, s, C));
    for (int64_t i = 0; i < c->n; i++) /* h holds the block's input rows of this rank */
        for (int64_t k = 0; k < C; k++)
            h[i * C + k] = s[i * C + k] + (h[i * C + k] + ly->b2.w[k]);
    bf16_store(m, h, c->n * C);
    return HCOMM_OK;
}

static hcomm_result_t tp_backward(model_t *m, train_rt_t *rt, mb_cache_t *c, real_t *dh) {
    layer_t *ly = &m->layers[c->layer];
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = mb_rows(c), C = m->C, Fs = m->Fs;
    arena_t *a = &rt->arena;
    real_t *dy = arena_reals(a, n * C), *dz = arena_reals(a, n * Fs);
    real_t *dxp = arena_reals(a, n * C), *dx = arena_reals(a, c->n * C);
    hcomm_result_t r = zero_piece(rt, 1 + 2 * c->layer, PIECE_MLP, 0);
    if (r != HCOMM_OK)
        return r;
    TRAIN_TRY(rt, sp_exit_bwd(rt, sp_rows_of(c), dh, dy, C));
    for (int64_t i = 0; i < c->n; i++)
        nn_add(ly->b2.g, dh + i * C, C);
    nn_linear_bwd_params(lc->tp_g, dy, ly->w2.g, NULL, n, Fs, C);
    nn_linear_bwd_input(dy, ly->w2.w, dz, arena_reals(a, Fs * C), n, Fs, C);
    bf16_store(m, dz, n * Fs);
    nn_gelu_bwd(lc->tp_z, dz, dz, n * Fs);
    bf16_store(m, dz, n * Fs);
    nn_linear_bwd_params(lc->tp_x, dz, ly->w1.g, ly->b1.g, n, C, Fs);
    nn_linear_bwd_input(dz, ly->w1.w, dxp, arena_reals(a, C * Fs), n, C, Fs);
    TRAIN_TRY(rt, sp_enter_bwd(rt, sp_rows_of(c), dxp, dx, C));
    nn_add(dh, dx, c->n * C); /* the residual plus the block's input gradient */
    bf16_store(m, dh, c->n * C);
    r = zero_piece(rt, 1 + 2 * c->layer, PIECE_ATTN, 0);
    return r == HCOMM_OK ? attn_backward(m, rt, c, dh) : r;
}

/* ---------------------------------------------------------------- unit 2: MoE */

/* Router: probabilities p = softmax(x Wr) and each token's top-k experts, most likely first
 * (the lowest index on exact ties). Their probabilities, not renormalized, weight the experts'
 * outputs, so top-1 is h = x + p_e * expert_e(x). */
static void router_forward(const model_t *m, mb_cache_t *c) {
    const layer_t *ly = &m->layers[c->layer];
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, E = m->E, K = m->K;
    nn_linear_fwd(lc->moe_x, ly->router.w, NULL, lc->moe_p, n, m->C, E);
    nn_softmax_rows(lc->moe_p, n, E);
    for (int64_t i = 0; i < n; i++) {
        const real_t *p = lc->moe_p + i * E;
        int32_t *ids = lc->moe_e + i * K;
        for (int64_t s = 0; s < K; s++) {
            int32_t best = -1;
            for (int32_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t q = 0; q < s; q++)
                    taken |= ids[q] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            ids[s] = best;
            lc->moe_w[i * K + s] = (float)p[best];
        }
    }
}

/* Each local expert's FFN on its block of the received rows (grouped by expert):
 * o = gelu(r W1e + b1e) W2e (+ b2e once, on expert-TP rank 0: the shards are summed later). */
static hcomm_result_t experts_forward(const model_t *m, train_rt_t *rt, mb_cache_t *c,
                                      const real_t *rows) {
    const layer_t *ly = &m->layers[c->layer];
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t C = m->C, Fes = m->Fes;
    int64_t off = 0;
    for (int j = 0; j < m->E_local; j++) {
        const expert_t *ex = &ly->experts[j];
        const int64_t nj = lc->moe_count[j];
        hcomm_result_t r = zero_piece(rt, 2 + 2 * c->layer, PIECE_EXPERT0 + j, 1);
        if (r != HCOMM_OK)
            return r;
        nn_linear_fwd(rows + off * C, ex->w1.w, ex->b1.w, lc->moe_z + off * Fes, nj, C, Fes);
        bf16_store(m, lc->moe_z + off * Fes, nj * Fes);
        nn_gelu_fwd(lc->moe_z + off * Fes, lc->moe_g + off * Fes, nj * Fes);
        bf16_store(m, lc->moe_g + off * Fes, nj * Fes);
        nn_linear_fwd(lc->moe_g + off * Fes, ex->w2.w, rt->etp_rank == 0 ? ex->b2.w : NULL,
                      lc->moe_o + off * C, nj, Fes, C);
        off += nj;
    }
    return HCOMM_OK;
}

/* Dispatches the tokens over EP (hcomm_moe_dispatch_topk: top-k, dropless or with
 * --capacity-factor), runs the local experts, sums their expert-TP shards on the expert's
 * rank (as Megatron-Core does before its combine) and combines them back into y [n, C]: with
 * top-1 the expert's output (the gate is applied outside, in real_t), with top-k the sum of
 * the k outputs weighted by their f32 probabilities. The routing stays in c for the backward. */
static hcomm_result_t moe_dispatch_experts(const model_t *m, train_rt_t *rt, mb_cache_t *c) {
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, C = m->C;
    const hcomm_moe_options_t opt = {m->capacity_factor, HCOMM_MOE_DROP_POSITION,
                                     c->sp ? rt->etp : NULL, HCOMM_MOE_PATH_AUTO};
    hcomm_tensor_t x_t = comm_in(rt, lc->moe_x, n, C), recv = {0};
    TRAIN_TRY(rt,
              TRAIN_COMM(rt, hcomm_moe_dispatch_topk(
                                 rt->ep, &x_t, lc->moe_e, m->K > 1 ? lc->moe_w : NULL, m->K, m->E,
                                 m->capacity_factor > 0 || c->sp ? &opt : NULL, &lc->moe_h)));
    lc->moe_count = arena_alloc(&rt->arena, (size_t)m->E_local * sizeof(int64_t));
    TRAIN_TRY(rt, hcomm_moe_received(lc->moe_h, &recv, lc->moe_count));
    int64_t total = 0;
    for (int j = 0; j < m->E_local; j++)
        total += lc->moe_count[j];
    if (recv.ndim != 2 || recv.shape[1] != C || recv.shape[0] != total || recv.dtype != x_t.dtype)
        return train_fail(rt, "hcomm_moe_received: rows [R, C] with R = sum of the counts",
                          HCOMM_ERR_INTERNAL);
    lc->moe_rows = total;
    lc->moe_z = arena_reals(&rt->arena, total * m->Fes);
    lc->moe_g = arena_reals(&rt->arena, total * m->Fes);
    lc->moe_o = arena_reals(&rt->arena, 2 * total * C); /* shard outputs, then their sum */
    lc->moe_r = recv.data;
    if (rt->bf16) { /* the experts compute in f32 on the bf16 rows */
        lc->moe_r = arena_reals(&rt->arena, total * C);
        comm_out_done(&recv, lc->moe_r);
    }
    hcomm_result_t r = experts_forward(m, rt, c, lc->moe_r);
    if (r != HCOMM_OK)
        return r;
    real_t *sum = lc->moe_o + total * C;
    hcomm_tensor_t o_t = comm_in(rt, lc->moe_o, total, C), s_t = comm_out(rt, sum, total, C);
    if (c->sp) /* combine sums the members' partial outputs itself (reduce_scatterv) */
        s_t = o_t;
    else
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_from_fwd(rt->etp, &o_t, &s_t)));
    hcomm_tensor_t y_t = comm_out(rt, lc->moe_y, n, C);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_moe_combine_topk(lc->moe_h, &s_t, &y_t)));
    comm_out_done(&y_t, lc->moe_y);
    return HCOMM_OK;
}

/* The gate of token i's top-1 expert, in real_t. */
static real_t top1_gate(const model_t *m, const layer_cache_t *lc, int64_t i) {
    return lc->moe_p[i * m->E + lc->moe_e[i]];
}

/* h = x + y, y the combined expert outputs (top-1: times the gate). */
static hcomm_result_t moe_forward(const model_t *m, train_rt_t *rt, mb_cache_t *c, real_t *h) {
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, C = m->C;
    arena_t *a = &rt->arena;
    lc->moe_x = arena_reals(a, n * C);
    lc->moe_p = arena_reals(a, n * m->E);
    lc->moe_y = arena_reals(a, n * C);
    lc->moe_e = arena_alloc(a, (size_t)(n * m->K) * sizeof(int32_t));
    lc->moe_w = arena_alloc(a, (size_t)(n * m->K) * sizeof(float));
    hcomm_tensor_t h_t = comm_in(rt, h, n, C), x_t = comm_out(rt, lc->moe_x, n, C);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_copy_to_fwd(rt->etp, &h_t, &x_t)));
    comm_out_done(&x_t, lc->moe_x);
    hcomm_result_t r = zero_piece(rt, 2 + 2 * c->layer, PIECE_ROUTER, 1);
    if (r != HCOMM_OK)
        return r;
    router_forward(m, c);
    r = moe_dispatch_experts(m, rt, c);
    if (r != HCOMM_OK)
        return r;
    for (int64_t i = 0; i < n; i++) {
        const real_t gate = m->K == 1 ? top1_gate(m, lc, i) : 1;
        for (int64_t k = 0; k < C; k++)
            h[i * C + k] = lc->moe_x[i * C + k] + gate * lc->moe_y[i * C + k];
    }
    bf16_store(m, h, n * C);
    return HCOMM_OK;
}

/* Gradient through the router from the gradients of the gates dgate [n, k]: the softmax
 * Jacobian of each chosen entry, d logit_ij = sum over slots s of dgate_is * p_ie_s *
 * ([j == e_s] - p_ij). Adds d x into dx. */
static void router_backward(model_t *m, train_rt_t *rt, const mb_cache_t *c, const real_t *dgate,
                            real_t *dx) {
    layer_t *ly = &m->layers[c->layer];
    const layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, C = m->C, E = m->E, K = m->K;
    real_t *dl = arena_reals(&rt->arena, n * E), *dxr = arena_reals(&rt->arena, n * C);
    for (int64_t i = 0; i < n; i++) {
        const real_t *p = lc->moe_p + i * E;
        for (int64_t j = 0; j < E; j++) {
            real_t d = 0;
            for (int64_t s = 0; s < K; s++) {
                const int32_t e = lc->moe_e[i * K + s];
                d += dgate[i * K + s] * p[e] * ((j == e) - p[j]);
            }
            dl[i * E + j] = d;
        }
    }
    nn_linear_bwd_params(lc->moe_x, dl, ly->router.g, NULL, n, C, E);
    nn_linear_bwd_input(dl, ly->router.w, dxr, arena_reals(&rt->arena, C * E), n, C, E);
    nn_add(dx, dxr, n * C);
}

/* Backward of the local experts on the rows grouped as in the forward: d_o [R, C] holds the
 * gradient of their outputs; d_rows [R, C] gets that of their inputs (partial over the
 * expert-TP shards). */
static hcomm_result_t experts_backward(model_t *m, train_rt_t *rt, mb_cache_t *c,
                                       const real_t *rows, const real_t *d_o, real_t *d_rows) {
    layer_t *ly = &m->layers[c->layer];
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t C = m->C, Fes = m->Fes;
    real_t *dz = arena_reals(&rt->arena, lc->moe_rows * Fes);
    real_t *wt = arena_reals(&rt->arena, C * Fes);
    int64_t off = 0;
    for (int j = 0; j < m->E_local; j++) {
        expert_t *ex = &ly->experts[j];
        const int64_t nj = lc->moe_count[j];
        hcomm_result_t r = zero_piece(rt, 2 + 2 * c->layer, PIECE_EXPERT0 + j, 0);
        if (r != HCOMM_OK)
            return r;
        const real_t *o = d_o + off * C;
        real_t *z = dz + off * Fes;
        nn_linear_bwd_params(lc->moe_g + off * Fes, o, ex->w2.g, ex->b2.g, nj, Fes, C);
        nn_linear_bwd_input(o, ex->w2.w, z, wt, nj, Fes, C);
        bf16_store(m, z, nj * Fes);
        nn_gelu_bwd(lc->moe_z + off * Fes, z, z, nj * Fes);
        bf16_store(m, z, nj * Fes);
        nn_linear_bwd_params(rows + off * C, z, ex->w1.g, ex->b1.g, nj, C, Fes);
        nn_linear_bwd_input(z, ex->w1.w, d_rows + off * C, wt, nj, C, Fes);
        off += nj;
    }
    return HCOMM_OK;
}

/* The gradient dy of the combined output y and that of the gates, dgate [n, k]: with top-1,
 * dy = gate * dh and dgate = <dh, y> in real_t; with top-k, dy = dh and combine's backward
 * gives dgate_s = <dh, y_s> (f32: the library's weights are f32). Runs combine's backward into
 * d_o [R, C]. */
static hcomm_result_t moe_combine_bwd(model_t *m, train_rt_t *rt, mb_cache_t *c, const real_t *dh,
                                      real_t *d_o, real_t *dgate) {
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, C = m->C, K = m->K;
    real_t *dy = arena_reals(&rt->arena, n * C);
    float *gw = K > 1 ? arena_alloc(&rt->arena, (size_t)(n * K) * sizeof(float)) : NULL;
    for (int64_t i = 0; i < n; i++) {
        const real_t gate = K == 1 ? top1_gate(m, lc, i) : 1;
        real_t dg = 0;
        for (int64_t k = 0; k < C; k++) {
            dy[i * C + k] = gate * dh[i * C + k];
            dg += dh[i * C + k] * lc->moe_y[i * C + k];
        }
        if (K == 1)
            dgate[i] = dg;
    }
    hcomm_tensor_t dy_t = comm_in(rt, dy, n, C), d_o_t = comm_out(rt, d_o, lc->moe_rows, C);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_moe_combine_topk_bwd(lc->moe_h, &dy_t, &d_o_t, gw)));
    comm_out_done(&d_o_t, d_o);
    for (int64_t i = 0; gw != NULL && i < n * K; i++)
        dgate[i] = (real_t)gw[i];
    return HCOMM_OK;
}

static hcomm_result_t moe_backward(model_t *m, train_rt_t *rt, mb_cache_t *c, real_t *dh) {
    layer_cache_t *lc = &c->lc[c->layer];
    const int64_t n = c->n, C = m->C, R = lc->moe_rows;
    arena_t *a = &rt->arena;
    real_t *d_o = arena_reals(a, R * C), *d_os = arena_reals(a, R * C);
    real_t *d_rows = arena_reals(a, R * C), *dgate = arena_reals(a, n * m->K);
    real_t *dtok = arena_reals(a, n * C), *dx = arena_reals(a, n * C);
    hcomm_result_t r = moe_combine_bwd(m, rt, c, dh, d_o, dgate);
    if (r == HCOMM_OK)
        r = zero_piece(rt, 2 + 2 * c->layer, PIECE_ROUTER, 0);
    if (r != HCOMM_OK)
        return r;
    router_backward(m, rt, c, dgate, dh); /* dh keeps the residual path and gains the router's */
    hcomm_tensor_t d_o_t = train_view2(d_o, R, C), d_os_t = train_view2(d_os, R, C);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_from_bwd(rt->etp, &d_o_t, &d_os_t)));
    r = experts_backward(m, rt, c, lc->moe_r, d_os, d_rows);
    if (r != HCOMM_OK)
        return r;
    hcomm_tensor_t d_rows_t = comm_in(rt, d_rows, R, C), dtok_t = comm_out(rt, dtok, n, C);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_moe_dispatch_topk_bwd(lc->moe_h, &d_rows_t, &dtok_t)));
    hcomm_tensor_t dx_t = comm_out(rt, dx, n, C);
    if (c->sp) /* dispatch's backward summed over the expert-TP group already */
        dx_t = dtok_t;
    else
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_copy_to_bwd(rt->etp, &dtok_t, &dx_t)));
    comm_out_done(&dx_t, dx);
    nn_add(dh, dx, n * C);
    bf16_store(m, dh, n * C);
    return HCOMM_OK;
}

/* ---------------------------------------------------------------- unit 3: head and loss */

static void head_forward(const model_t *m, train_rt_t *rt, mb_cache_t *c, const real_t *h) {
    const int64_t n = c->n, C = m->C, V = m->V;
    c->head_x = arena_reals(&rt->arena, n * C);
    c->head_p = arena_reals(&rt->arena, n * V);
    memcpy(c->head_x, h, (size_t)(n * C) * sizeof(real_t));
    nn_linear_fwd(c->head_x, m->head_w.w, m->head_b.w, c->head_p, n, C, V);
    c->loss += nn_softmax_xent_fwd(c->head_p, c->tgt, n, V);
}

static void head_backward(model_t *m, train_rt_t *rt, const mb_cache_t *c, real_t *dh,
                          double scale) {
    const int64_t n = c->n, C = m->C, V = m->V;
    real_t *dl = arena_reals(&rt->arena, n * V);
    nn_softmax_xent_bwd(c->head_p, c->tgt, dl, n, V, (real_t)scale);
    nn_linear_bwd_params(c->head_x, dl, m->head_w.g, m->head_b.g, n, C, V);
    nn_linear_bwd_input(dl, m->head_w.w, dh, arena_reals(&rt->arena, C * V), n, C, V);
    bf16_store(m, dh, n * C);
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

static hcomm_result_t unit_forward(int u, const model_t *m, train_rt_t *rt, mb_cache_t *c,
                                   real_t *h) {
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

static hcomm_result_t unit_backward(int u, model_t *m, train_rt_t *rt, mb_cache_t *c, real_t *dh,
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

static void mb_cache_clear(mb_cache_t *c) {
    for (int l = 0; c->lc != NULL && l < c->nl; l++)
        hcomm_moe_handle_free(c->lc[l].moe_h);
    memset(c, 0, sizeof *c);
}

/* With --sequence-parallel: sums over TP the gradients of the dense weights every TP rank
 * keeps whole (embeddings, router, head, the blocks' output biases; sp.h). */
static hcomm_result_t sp_reduce_grads(const model_t *m, train_rt_t *rt) {
    if (!rt->sp || rt->tp_size == 1)
        return HCOMM_OK;
    hcomm_tensor_t *g = arena_alloc(&rt->arena, (size_t)(m->nparams + 1) * sizeof *g);
    int n = 0;
    for (int i = 0; i < m->nparams; i++) {
        const param_t *p = m->params[i];
        if (!p->sharded && !p->expert)
            g[n++] = train_view2(p->g, p->rows, p->cols);
    }
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_dp_all_reduce_grads(rt->tp, g, n, HCOMM_SUM, 0)));
    return HCOMM_OK;
}
