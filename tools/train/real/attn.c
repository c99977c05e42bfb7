/* Causal multi-head self-attention and its context parallelism (attn.h). Arrays are row-major
 * real_t; a "core" array holds nb sequences of nq rows of H heads of D values. */
#include "attn.h"

#include "nn.h"
#include "sp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- setup and positions */

static hcomm_result_t attn_group(train_rt_t *rt, hcomm_ctx_t *ctx, hcomm_group_kind_t kind,
                                 hcomm_comm_t **g, int *rank, int *size) {
    TRAIN_TRY(rt, hcomm_ctx_group(ctx, kind, g));
    TRAIN_TRY(rt, hcomm_ctx_rank(ctx, kind, rank, size));
    return HCOMM_OK;
}

static hcomm_result_t attn_setup(train_rt_t *rt, const train_opts_t *o, hcomm_ctx_t *ctx) {
    static const char *const algos[] = {"ring", "allgather", "ulysses", "a2a+p2p"};
    hcomm_comm_t *dp = NULL;
    int dp_size = 0;
    for (int i = 0; i < 4; i++)
        if (strcmp(o->cp_algo, algos[i]) == 0)
            rt->cp_algo = i;
    rt->seq = o->seq;
    rt->attn_block = o->attn_block;
    TRAIN_TRY(rt, attn_group(rt, ctx, HCOMM_GROUP_CP, &rt->cp, &rt->cp_rank, &rt->cp_size));
    TRAIN_TRY(rt, attn_group(rt, ctx, HCOMM_GROUP_DP, &dp, &rt->data_rank, &dp_size));
    rt->a2a_size = rt->cp_size; /* ulysses: the whole CP group */
    rt->a2a_rank = rt->cp_rank;
    rt->p2p_size = 1;
    rt->cp_a2a = rt->cp;
    if (rt->cp_algo != CP_A2A_P2P)
        return HCOMM_OK;
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_cp_hier_create(rt->cp, o->cp_a2a, &rt->cp_hier)));
    TRAIN_TRY(rt, hcomm_cp_hier_groups(rt->cp_hier, &rt->cp_a2a, &rt->cp_p2p, &rt->a2a_size,
                                       &rt->p2p_size));
    TRAIN_TRY(rt, hcomm_comm_rank(rt->cp_a2a, &rt->a2a_rank));
    TRAIN_TRY(rt, hcomm_comm_rank(rt->cp_p2p, &rt->p2p_rank));
    return HCOMM_OK;
}

static void attn_teardown(train_rt_t *rt, int ok) {
    if (ok)
        hcomm_cp_hier_destroy(rt->cp_hier);
    rt->cp_hier = NULL;
}

/* Row t of rank `owner`'s zigzag part of a sequence split over p ranks, each holding len rows:
 * chunks owner and 2p-1-owner of len/2 rows each. */
static int64_t zigzag_pos(int owner, int p, int64_t len, int64_t t) {
    const int64_t c = len / 2;
    return t < c ? owner * c + t : (2 * p - 1 - owner) * c + (t - c);
}

static int64_t attn_token_pos(const train_rt_t *rt, int64_t t) {
    const int64_t local = rt->seq / rt->cp_size;
    switch (rt->cp_size == 1 ? -1 : rt->cp_algo) {
    case CP_RING:
    case CP_ALLGATHER:
        return zigzag_pos(rt->cp_rank, rt->cp_size, local, t);
    case CP_ULYSSES:
        return rt->cp_rank * local + t;
    case CP_A2A_P2P: /* the a2a rank's slice of its p2p rank's zigzag part */
        return zigzag_pos(rt->p2p_rank, rt->p2p_size, local * rt->a2a_size,
                          rt->a2a_rank * local + t);
    default:
        return t;
    }
}

/* ---------------------------------------------------------------- the blockwise kernels */

/* The geometry of one attention: nb sequences of nq query rows, H heads of D values, key
 * blocks of B positions, nblk blocks in a sequence. */
typedef struct core {
    int64_t nb, nq, H, D, B, nblk;
    real_t scale;
} core_t;

/* Index of (sequence b, row i, head h) in a core array of rows rows per sequence. */
static int64_t at(const core_t *g, int64_t rows, int64_t b, int64_t i, int64_t h) {
    return ((b * rows + i) * g->H + h) * g->D;
}

static real_t dot(const real_t *a, const real_t *b, int64_t n) {
    real_t s = 0;
    for (int64_t d = 0; d < n; d++)
        s += a[d] * b[d];
    return s;
}

/* Keys [nk rows] with their positions kpos (ascending within each block; a block's keys lie
 * together); run [t, *end) is the part of block kpos[t] / B. */
typedef struct keys {
    const real_t *k, *v;
    const int64_t *pos;
    int64_t nk;
} keys_t;

static int64_t run_end(const core_t *g, const keys_t *kv, int64_t t) {
    int64_t e = t, j = kv->pos[t] / g->B;
    while (e < kv->nk && kv->pos[e] / g->B == j)
        e++;
    return e;
}

/* Partial softmax of query q (position qp) over the keys [t0, t1) of one block at or before
 * it: part = {max, sum of exp(s - max), sum of exp(s - max) v}; s is scratch of B reals. */
static void block_partial(const core_t *g, const keys_t *kv, int64_t b, int64_t h, const real_t *q,
                          int64_t qp, int64_t t0, int64_t t1, real_t *s, real_t *part) {
    real_t mx = -INFINITY, l = 0, *o = part + 2;
    int64_t n = 0;
    for (int64_t t = t0; t < t1 && kv->pos[t] <= qp; t++, n++) {
        s[n] = dot(q, kv->k + at(g, kv->nk, b, t, h), g->D) * g->scale;
        mx = s[n] > mx ? s[n] : mx;
    }
    memset(o, 0, (size_t)g->D * sizeof *o);
    for (int64_t t = t0; t < t0 + n; t++) {
        const real_t e = exp(s[t - t0] - mx), *v = kv->v + at(g, kv->nk, b, t, h);
        l += e;
        for (int64_t d = 0; d < g->D; d++)
            o[d] += e * v[d];
    }
    part[0] = mx;
    part[1] = l;
}

/* parts [nb][nq][H][nblk][D+2] gets the partial of every (query, head, block of kv) that the
 * query may see; the other blocks' entries are left alone. */
static void attn_partials(const core_t *g, const real_t *q, const int64_t *qpos, const keys_t *kv,
                          real_t *parts, real_t *s) {
    const int64_t w = g->D + 2;
    for (int64_t b = 0; b < g->nb; b++)
        for (int64_t i = 0; i < g->nq; i++)
            for (int64_t h = 0; h < g->H; h++) {
                real_t *pi = parts + ((b * g->nq + i) * g->H + h) * g->nblk * w;
                for (int64_t t = 0; t < kv->nk; t = run_end(g, kv, t)) {
                    if (kv->pos[t] > qpos[i])
                        continue;
                    block_partial(g, kv, b, h, q + at(g, g->nq, b, i, h), qpos[i], t,
                                  run_end(g, kv, t), s, pi + (kv->pos[t] / g->B) * w);
                }
            }
}

/* Merges each query's partials in ascending block order: o = sum / total, lse [nb][nq][H] =
 * max + log(total). Empty blocks have a sum of 0. */
static void attn_merge(const core_t *g, const real_t *parts, real_t *o, real_t *lse) {
    const int64_t w = g->D + 2;
    for (int64_t r = 0; r < g->nb * g->nq * g->H; r++) {
        const real_t *p = parts + r * g->nblk * w;
        real_t M = -INFINITY, L = 0, *out = o + r * g->D;
        memset(out, 0, (size_t)g->D * sizeof *out);
        for (int64_t j = 0; j < g->nblk; j++, p += w) {
            if (p[1] == 0)
                continue;
            const real_t mn = p[0] > M ? p[0] : M, a = exp(M - mn), c = exp(p[0] - mn);
            L = L * a + p[1] * c;
            for (int64_t d = 0; d < g->D; d++)
                out[d] = out[d] * a + p[2 + d] * c;
            M = mn;
        }
        for (int64_t d = 0; d < g->D; d++)
            out[d] /= L;
        lse[r] = M + log(L);
    }
}

/* What the backward of one query row needs. */
typedef struct qrow {
    const real_t *q, *dout;
    real_t lse, delta;
    int64_t pos;
    real_t *dq_parts; /* [nblk][D] */
} qrow_t;

/* Gradients of one query row against one block's keys [t0, t1): p = exp(s - lse),
 * dv += p dout, ds = p (dout . v - delta), dq_part += ds k scale, dk += ds q scale. */
static void block_grads(const core_t *g, const keys_t *kv, int64_t b, int64_t h, const qrow_t *r,
                        int64_t t0, int64_t t1, real_t *dk, real_t *dv) {
    real_t *dq = r->dq_parts + (kv->pos[t0] / g->B) * g->D;
    for (int64_t t = t0; t < t1 && kv->pos[t] <= r->pos; t++) {
        const int64_t o = at(g, kv->nk, b, t, h);
        const real_t *k = kv->k + o, *v = kv->v + o;
        const real_t p = exp(dot(r->q, k, g->D) * g->scale - r->lse);
        const real_t ds = p * (dot(r->dout, v, g->D) - r->delta) * g->scale;
        for (int64_t d = 0; d < g->D; d++) {
            dv[o + d] += p * r->dout[d];
            dq[d] += ds * k[d];
            dk[o + d] += ds * r->q[d];
        }
    }
}

/* The backward against the keys kv: dq_parts [nb][nq][H][nblk][D] and dk, dv (shaped as kv)
 * gain every term the queries may see. */
static void attn_grads(const core_t *g, const real_t *q, const int64_t *qpos, const real_t *dout,
                       const real_t *lse, const real_t *delta, const keys_t *kv, real_t *dq_parts,
                       real_t *dk, real_t *dv) {
    for (int64_t b = 0; b < g->nb; b++)
        for (int64_t i = 0; i < g->nq; i++)
            for (int64_t h = 0; h < g->H; h++) {
                const int64_t r = (b * g->nq + i) * g->H + h;
                const qrow_t row = {q + r * g->D, dout + r * g->D, lse[r],
                                    delta[r],     qpos[i],         dq_parts + r * g->nblk * g->D};
                for (int64_t t = 0; t < kv->nk; t = run_end(g, kv, t))
                    if (kv->pos[t] <= qpos[i])
                        block_grads(g, kv, b, h, &row, t, run_end(g, kv, t), dk, dv);
            }
}

/* dq = the sum of dq_parts over blocks in ascending order. */
static void attn_sum_dq(const core_t *g, const real_t *dq_parts, real_t *dq) {
    for (int64_t r = 0; r < g->nb * g->nq * g->H; r++) {
        real_t *out = dq + r * g->D;
        memset(out, 0, (size_t)g->D * sizeof *out);
        for (int64_t j = 0; j < g->nblk; j++)
            nn_add(out, dq_parts + (r * g->nblk + j) * g->D, g->D);
    }
}

/* ---------------------------------------------------------------- the exchanges */

/* The attention of one TP block on one micro-batch, in core layout (after the Ulysses
 * exchange where there is one). */
typedef struct attn_cache {
    core_t g;
    int mode;          /* CORE_LOCAL, CORE_RING or CORE_GATHER */
    hcomm_comm_t *grp; /* the ring's or the gather's group */
    int grank, gsize;
    int a2a;                         /* the rows went through the Ulysses exchange */
    real_t *x, *q, *k, *v, *o;       /* [n, C] input; [n, Hl*D] this rank's rows */
    real_t *cq, *ck, *cv, *co, *lse; /* core layout */
    int64_t *qpos;
    real_t *kv_all; /* allgather: [2][nb][nq*gsize][H*D], the gathered K and V */
} attn_cache_t;

enum { CORE_LOCAL, CORE_RING, CORE_GATHER };

static int64_t core_size(const core_t *g) {
    return g->nb * g->nq * g->H * g->D;
}

/* Positions of the core rows: the zigzag part of the ring's or gather's rank, else 0.. nq-1. */
static void core_positions(const attn_cache_t *a, int owner, int64_t *pos) {
    for (int64_t t = 0; t < a->g.nq; t++)
        pos[t] = a->mode == CORE_LOCAL ? t : zigzag_pos(owner, a->gsize, a->g.nq, t);
}

/* [2][nb][nq][H*D]: K then V of the core rows (the ring's and the gather's message). */
static hcomm_tensor_t kv_tensor(real_t *data, const core_t *g, int parts, int64_t rows) {
    hcomm_tensor_t t = {0};
    const int64_t shape[4] = {parts, g->nb, rows, g->H * g->D};
    hcomm_tensor_init(&t, data, REAL_DTYPE, 4, shape);
    return t;
}

static hcomm_result_t core_ring_fwd(train_rt_t *rt, attn_cache_t *a, real_t *parts, real_t *s) {
    const core_t *g = &a->g;
    const int64_t sz = core_size(g);
    real_t *mine = arena_reals(&rt->arena, 2 * sz);
    int64_t *kpos = arena_alloc(&rt->arena, (size_t)g->nq * sizeof *kpos);
    memcpy(mine, a->ck, (size_t)sz * sizeof *mine);
    memcpy(mine + sz, a->cv, (size_t)sz * sizeof *mine);
    hcomm_tensor_t cur = kv_tensor(mine, g, 2, g->nq), next;
    hcomm_cp_ring_t *ring = NULL;
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_cp_ring_create(a->grp, &cur, HCOMM_CP_RING_FORWARD, &ring)));
    hcomm_result_t r = HCOMM_OK;
    for (int s_ = 0; s_ < a->gsize && r == HCOMM_OK; s_++) {
        const int more = s_ + 1 < a->gsize; /* the next chunk travels while this one computes */
        r = more ? TRAIN_COMM(rt, hcomm_cp_ring_start(ring, &cur)) : HCOMM_OK;
        core_positions(a, (a->grank - s_ + a->gsize) % a->gsize, kpos);
        const keys_t kv = {cur.data, (real_t *)cur.data + sz, kpos, g->nq};
        if (r == HCOMM_OK)
            attn_partials(g, a->cq, a->qpos, &kv, parts, s);
        if (r == HCOMM_OK && more)
            r = TRAIN_COMM(rt, hcomm_cp_ring_wait(ring, &next));
        if (r == HCOMM_OK && more)
            cur = next;
    }
    hcomm_result_t d = hcomm_cp_ring_destroy(ring);
    TRAIN_TRY(rt, r != HCOMM_OK ? r : d);
    return HCOMM_OK;
}

static hcomm_result_t core_gather_fwd(train_rt_t *rt, attn_cache_t *a, real_t *parts, real_t *s) {
    const core_t *g = &a->g;
    const int64_t sz = core_size(g), all = g->nq * a->gsize;
    real_t *mine = arena_reals(&rt->arena, 2 * sz);
    int64_t *kpos = arena_alloc(&rt->arena, (size_t)all * sizeof *kpos);
    a->kv_all = arena_reals(&rt->arena, 2 * sz * a->gsize);
    memcpy(mine, a->ck, (size_t)sz * sizeof *mine);
    memcpy(mine + sz, a->cv, (size_t)sz * sizeof *mine);
    hcomm_tensor_t in = kv_tensor(mine, g, 2, g->nq), out = kv_tensor(a->kv_all, g, 2, all);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_cp_all_gather(a->grp, &in, &out, 2, HCOMM_CP_ZIGZAG)));
    for (int64_t t = 0; t < all; t++)
        kpos[t] = t;
    const keys_t kv = {a->kv_all, a->kv_all + sz * a->gsize, kpos, all};
    attn_partials(g, a->cq, a->qpos, &kv, parts, s);
    return HCOMM_OK;
}

/* co and lse from cq, ck, cv: every block's partial, then the merge. */
static hcomm_result_t core_forward(train_rt_t *rt, attn_cache_t *a) {
    const core_t *g = &a->g;
    const int64_t np = g->nb * g->nq * g->H * g->nblk * (g->D + 2);
    real_t *parts = arena_reals(&rt->arena, np), *s = arena_reals(&rt->arena, g->B);
    memset(parts, 0, (size_t)np * sizeof *parts);
    hcomm_result_t r = HCOMM_OK;
    if (a->mode == CORE_RING)
        r = core_ring_fwd(rt, a, parts, s);
    else if (a->mode == CORE_GATHER)
        r = core_gather_fwd(rt, a, parts, s);
    else {
        const keys_t kv = {a->ck, a->cv, a->qpos, g->nq};
        attn_partials(g, a->cq, a->qpos, &kv, parts, s);
    }
    if (r == HCOMM_OK)
        attn_merge(g, parts, a->co, a->lse);
    return r;
}

/* Ring backward: [K, V, dK, dV] of each chunk travel together; after the cp-th step a rank
 * holds its own chunk again with every rank's dK, dV terms. */
static hcomm_result_t core_ring_bwd(train_rt_t *rt, attn_cache_t *a, const real_t *cdo,
                                    const real_t *delta, real_t *dq_parts, real_t *dk, real_t *dv) {
    const core_t *g = &a->g;
    const int64_t sz = core_size(g);
    real_t *mine = arena_reals(&rt->arena, 4 * sz);
    int64_t *kpos = arena_alloc(&rt->arena, (size_t)g->nq * sizeof *kpos);
    memcpy(mine, a->ck, (size_t)sz * sizeof *mine);
    memcpy(mine + sz, a->cv, (size_t)sz * sizeof *mine);
    memset(mine + 2 * sz, 0, 2 * (size_t)sz * sizeof *mine);
    hcomm_tensor_t cur = kv_tensor(mine, g, 4, g->nq), next;
    hcomm_cp_ring_t *ring = NULL;
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_cp_ring_create(a->grp, &cur, HCOMM_CP_RING_FORWARD, &ring)));
    hcomm_result_t r = HCOMM_OK;
    for (int s_ = 0; s_ < a->gsize && r == HCOMM_OK; s_++) {
        real_t *c = cur.data;
        core_positions(a, (a->grank - s_ + a->gsize) % a->gsize, kpos);
        const keys_t kv = {c, c + sz, kpos, g->nq};
        attn_grads(g, a->cq, a->qpos, cdo, a->lse, delta, &kv, dq_parts, c + 2 * sz, c + 3 * sz);
        r = TRAIN_COMM(rt, hcomm_cp_ring_step(ring, &cur, &next));
        cur = next;
    }
    if (r == HCOMM_OK) {
        memcpy(dk, (real_t *)cur.data + 2 * sz, (size_t)sz * sizeof *dk);
        memcpy(dv, (real_t *)cur.data + 3 * sz, (size_t)sz * sizeof *dv);
    }
    hcomm_result_t d = hcomm_cp_ring_destroy(ring);
    TRAIN_TRY(rt, r != HCOMM_OK ? r : d);
    return HCOMM_OK;
}

static hcomm_result_t core_gather_bwd(train_rt_t *rt, attn_cache_t *a, const real_t *cdo,
                                      const real_t *delta, real_t *dq_parts, real_t *dk,
                                      real_t *dv) {
    const core_t *g = &a->g;
    const int64_t sz = core_size(g), all = g->nq * a->gsize;
    real_t *dall = arena_reals(&rt->arena, 2 * sz * a->gsize),
           *mine = arena_reals(&rt->arena, 2 * sz);
    int64_t *kpos = arena_alloc(&rt->arena, (size_t)all * sizeof *kpos);
    memset(dall, 0, 2 * (size_t)(sz * a->gsize) * sizeof *dall);
    for (int64_t t = 0; t < all; t++)
        kpos[t] = t;
    const keys_t kv = {a->kv_all, a->kv_all + sz * a->gsize, kpos, all};
    attn_grads(g, a->cq, a->qpos, cdo, a->lse, delta, &kv, dq_parts, dall, dall + sz * a->gsize);
    hcomm_tensor_t in = kv_tensor(dall, g, 2, all), out = kv_tensor(mine, g, 2, g->nq);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_cp_reduce_scatter(a->grp, &in, &out, 2, HCOMM_CP_ZIGZAG)));
    memcpy(dk, mine, (size_t)sz * sizeof *dk);
    memcpy(dv, mine + sz, (size_t)sz * sizeof *dv);
    return HCOMM_OK;
}

/* cdq, cdk, cdv (core layout) from the output gradient cdo. */
static hcomm_result_t core_backward(train_rt_t *rt, attn_cache_t *a, const real_t *cdo, real_t *cdq,
                                    real_t *cdk, real_t *cdv) {
    const core_t *g = &a->g;
    const int64_t rows = g->nb * g->nq * g->H, nqp = rows * g->nblk * g->D;
    real_t *delta = arena_reals(&rt->arena, rows), *dq_parts = arena_reals(&rt->arena, nqp);
    for (int64_t r = 0; r < rows; r++)
        delta[r] = dot(cdo + r * g->D, a->co + r * g->D, g->D);
    memset(dq_parts, 0, (size_t)nqp * sizeof *dq_parts);
    hcomm_result_t r = HCOMM_OK;
    if (a->mode == CORE_RING)
        r = core_ring_bwd(rt, a, cdo, delta, dq_parts, cdk, cdv);
    else if (a->mode == CORE_GATHER)
        r = core_gather_bwd(rt, a, cdo, delta, dq_parts, cdk, cdv);
    else {
        const keys_t kv = {a->ck, a->cv, a->qpos, g->nq};
        memset(cdk, 0, (size_t)core_size(g) * sizeof *cdk);
        memset(cdv, 0, (size_t)core_size(g) * sizeof *cdv);
        attn_grads(g, a->cq, a->qpos, cdo, a->lse, delta, &kv, dq_parts, cdk, cdv);
    }
    if (r == HCOMM_OK)
        attn_sum_dq(g, dq_parts, cdq);
    return r;
}

/* ---------------------------------------------------------------- Ulysses and the layout */

/* [nb, rows, H, D] over data: the Ulysses calls' view of a core array. */
static hcomm_tensor_t heads_tensor(real_t *data, int64_t nb, int64_t rows, int64_t H, int64_t D) {
    hcomm_tensor_t t = {0};
    const int64_t shape[4] = {nb, rows, H, D};
    hcomm_tensor_init(&t, data, REAL_DTYPE, 4, shape);
    return t;
}

/* The micro-batch's core: which exchange runs over which group, and the geometry. */
static void attn_plan(const model_t *m, const train_rt_t *rt, const mb_cache_t *c,
                      attn_cache_t *a) {
    const int solo = c->solo, alg = rt->cp_size == 1 ? -1 : rt->cp_algo;
    a->a2a = !solo && (alg == CP_ULYSSES || alg == CP_A2A_P2P) && rt->a2a_size > 1;
    const int A = a->a2a ? rt->a2a_size : 1;
    a->mode = CORE_LOCAL;
    if (!solo && (alg == CP_RING || alg == CP_ALLGATHER)) {
        a->mode = alg == CP_RING ? CORE_RING : CORE_GATHER;
        a->grp = rt->cp;
        a->grank = rt->cp_rank;
        a->gsize = rt->cp_size;
    } else if (!solo && alg == CP_A2A_P2P && rt->p2p_size > 1) {
        a->mode = CORE_RING;
        a->grp = rt->cp_p2p;
        a->grank = rt->p2p_rank;
        a->gsize = rt->p2p_size;
    }
    const int64_t full = solo ? 1 : rt->seq;
    a->g = (core_t){.nb = c->nseq,
                    .nq = c->seq_len * A,
                    .H = m->Hl / A,
                    .D = m->D,
                    .B = solo ? 1 : rt->attn_block,
                    .scale = (real_t)(1.0 / sqrt((double)m->D))};
    a->g.nblk = (full + a->g.B - 1) / a->g.B;
}

/* x [n, C] -> q, k, v [n, Hl*D], then into core layout (the Ulysses exchange or a view). */
static hcomm_result_t attn_qkv(const model_t *m, train_rt_t *rt, const mb_cache_t *c,
                               attn_cache_t *a) {
    const layer_t *ly = &m->layers[c->layer];
    const int64_t n = mb_rows(c), C = m->C, HD = m->Hl * m->D, sz = core_size(&a->g);
    real_t *dst[3] = {a->q, a->k, a->v}, *cdst[3];
    const param_t *w[3] = {&ly->wq, &ly->wk, &ly->wv};
    for (int i = 0; i < 3; i++) {
        nn_linear_fwd(a->x, w[i]->w, NULL, dst[i], n, C, HD);
        bf16_store(m, dst[i], n * HD);
        cdst[i] = dst[i];
        if (!a->a2a)
            continue;
        const int64_t A = rt->a2a_size;
        cdst[i] = arena_reals(&rt->arena, sz);
        hcomm_tensor_t in = heads_tensor(dst[i], c->nseq, c->seq_len, m->Hl, m->D);
        hcomm_tensor_t out = heads_tensor(cdst[i], c->nseq, c->seq_len * A, m->Hl / A, m->D);
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_cp_a2a_seq_to_head(rt->cp_a2a, &in, &out, 1, 2)));
    }
    a->cq = cdst[0];
    a->ck = cdst[1];
    a->cv = cdst[2];
    return HCOMM_OK;
}

/* A core array back into this rank's rows (the inverse exchange, or a copy). */
static hcomm_result_t attn_uncore(const model_t *m, train_rt_t *rt, const mb_cache_t *c,
                                  const attn_cache_t *a, real_t *core, real_t *rows) {
    if (!a->a2a) {
        memcpy(rows, core, (size_t)(mb_rows(c) * m->Hl * m->D) * sizeof *rows);
        return HCOMM_OK;
    }
    const int64_t A = rt->a2a_size;
    hcomm_tensor_t in = heads_tensor(core, c->nseq, c->seq_len * A, m->Hl / A, m->D);
    hcomm_tensor_t out = heads_tensor(rows, c->nseq, c->seq_len, m->Hl, m->D);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_cp_a2a_head_to_seq(rt->cp_a2a, &in, &out, 1, 2)));
    return HCOMM_OK;
}

/* A row array into core layout (the Ulysses exchange), or the array itself. */
static hcomm_result_t attn_core_of(const model_t *m, train_rt_t *rt, const mb_cache_t *c,
                                   const attn_cache_t *a, real_t *rows, real_t **core) {
    *core = rows;
    if (!a->a2a)
        return HCOMM_OK;
    const int64_t A = rt->a2a_size;
    *core = arena_reals(&rt->arena, core_size(&a->g));
    hcomm_tensor_t in = heads_tensor(rows, c->nseq, c->seq_len, m->Hl, m->D);
    hcomm_tensor_t out = heads_tensor(*core, c->nseq, c->seq_len * A, m->Hl / A, m->D);
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_cp_a2a_seq_to_head(rt->cp_a2a, &in, &out, 1, 2)));
    return HCOMM_OK;
}

/* ---------------------------------------------------------------- the sublayer */

static hcomm_result_t attn_forward(const model_t *m, train_rt_t *rt, mb_cache_t *c, real_t *h) {
    const layer_t *ly = &m->layers[c->layer];
    const int64_t n = mb_rows(c), C = m->C, HD = m->Hl * m->D;
    arena_t *ar = &rt->arena;
    attn_cache_t *a = arena_alloc(ar, sizeof *a);
    memset(a, 0, sizeof *a);
    c->lc[c->layer].attn = a;
    attn_plan(m, rt, c, a);
    a->x = arena_reals(ar, n * C);
    a->q = arena_reals(ar, n * HD);
    a->k = arena_reals(ar, n * HD);
    a->v = arena_reals(ar, n * HD);
    a->o = arena_reals(ar, n * HD);
    a->qpos = arena_alloc(ar, (size_t)a->g.nq * sizeof *a->qpos);
    core_positions(a, a->grank, a->qpos);
    TRAIN_TRY(rt, sp_enter_fwd(rt, sp_rows_of(c), h, a->x, C));
    hcomm_result_t r = attn_qkv(m, rt, c, a);
    a->co = arena_reals(ar, core_size(&a->g));
    a->lse = arena_reals(ar, a->g.nb * a->g.nq * a->g.H);
    if (r == HCOMM_OK)
        r = core_forward(rt, a);
    if (r == HCOMM_OK)
        r = attn_uncore(m, rt, c, a, a->co, a->o);
    if (r != HCOMM_OK)
        return r;
    bf16_store(m, a->o, n * HD);
    real_t *y = arena_reals(ar, n * C), *s = arena_reals(ar, c->n * C);
    nn_linear_fwd(a->o, ly->wo.w, NULL, y, n, HD, C); /* partial sum over my heads */
    TRAIN_TRY(rt, sp_exit_fwd(rt, sp_rows_of(c), y, s, C));
    for (int64_t i = 0; i < c->n; i++) /* h holds the sublayer's input rows of this rank */
        for (int64_t k = 0; k < C; k++)
            h[i * C + k] = s[i * C + k] + (h[i * C + k] + ly->bo.w[k]);
    bf16_store(m, h, c->n * C);
    return HCOMM_OK;
}

/* dq, dk, dv [n, Hl*D] from the output gradient dout [n, Hl*D]. */
static hcomm_result_t attn_core_grads(const model_t *m, train_rt_t *rt, const mb_cache_t *c,
                                      attn_cache_t *a, real_t *dout, real_t **d) {
    const int64_t sz = core_size(&a->g), HD = m->Hl * m->D;
    real_t *cdo = NULL, *cd[3];
    TRAIN_TRY(rt, attn_core_of(m, rt, c, a, dout, &cdo));
    for (int i = 0; i < 3; i++) {
        cd[i] = arena_reals(&rt->arena, sz);
        d[i] = a->a2a ? arena_reals(&rt->arena, mb_rows(c) * HD) : cd[i];
    }
    hcomm_result_t r = core_backward(rt, a, cdo, cd[0], cd[1], cd[2]);
    for (int i = 0; i < 3 && r == HCOMM_OK && a->a2a; i++)
        r = attn_uncore(m, rt, c, a, cd[i], d[i]);
    return r;
}

static hcomm_result_t attn_backward(model_t *m, train_rt_t *rt, mb_cache_t *c, real_t *dh) {
    layer_t *ly = &m->layers[c->layer];
    attn_cache_t *a = c->lc[c->layer].attn;
    const int64_t n = mb_rows(c), C = m->C, HD = m->Hl * m->D;
    arena_t *ar = &rt->arena;
    real_t *dy = arena_reals(ar, n * C), *dout = arena_reals(ar, n * HD), *d[3];
    real_t *dxp = arena_reals(ar, n * C), *part = arena_reals(ar, n * C);
    real_t *dx = arena_reals(ar, c->n * C), *wt = arena_reals(ar, C * HD);
    TRAIN_TRY(rt, sp_exit_bwd(rt, sp_rows_of(c), dh, dy, C));
    for (int64_t i = 0; i < c->n; i++)
        nn_add(ly->bo.g, dh + i * C, C);
    nn_linear_bwd_params(a->o, dy, ly->wo.g, NULL, n, HD, C);
    nn_linear_bwd_input(dy, ly->wo.w, dout, wt, n, HD, C);
    bf16_store(m, dout, n * HD);
    hcomm_result_t r = attn_core_grads(m, rt, c, a, dout, d);
    if (r != HCOMM_OK)
        return r;
    param_t *w[3] = {&ly->wq, &ly->wk, &ly->wv};
    for (int i = 0; i < 3; i++) {
        bf16_store(m, d[i], n * HD);
        nn_linear_bwd_params(a->x, d[i], w[i]->g, NULL, n, C, HD);
        nn_linear_bwd_input(d[i], w[i]->w, i == 0 ? dxp : part, wt, n, C, HD);
        if (i > 0)
            nn_add(dxp, part, n * C);
    }
    TRAIN_TRY(rt, sp_enter_bwd(rt, sp_rows_of(c), dxp, dx, C));
    nn_add(dh, dx, c->n * C); /* the residual plus the sublayer's input gradient */
    bf16_store(m, dh, c->n * C);
    return HCOMM_OK;
}
