/* The model of hcomm-train and one rank's share of it.
 *
 * Four kinds of unit (embed, --layers x (TP block, MoE), head), split into pp x V contiguous
 * chunks (V = --virtual-stages, 1 unless interleaved), chunk v*pp + s on stage s:
 *   0 embed: h = emb_cur[c_t] + emb_prev[c_{t-1}]                         [n, C]
 *   1 TP block: h += attention(h) (causal, heads split over TP, sequence over CP: attn.h);
 *      h += W2 gelu(W1 h + b1) + b2, W1 column- and W2 row-parallel over TP
 *   2 MoE: p = softmax(h Wr); h += sum over the --topk most likely experts e of
 *      p[e] * expert_e(h) (not renormalized), experts spread over EP and each sharded over the
 *      expert-TP group like the TP block; dropless unless --capacity-factor
 *   3 head: logits = h Wo + bo; loss = softmax cross-entropy against c_{t+1}
 * Weights, gradients and activations are real_t (real.h): f64 by default, so that layouts
 * which sum partial results in another order agree to ~1e-15 and routing decisions never flip
 * between layouts; f32 with --dtype f32 and bf16. The functions are static: real.h.
 */
#ifndef HCOMM_TRAIN_MODEL_H_
#define HCOMM_TRAIN_MODEL_H_

#include "../rt.h"
#include "comm.h"
#include "real.h"
#include "sp.h"

typedef enum shard { SHARD_NONE, SHARD_ROWS, SHARD_COLS } shard_t;

/* A parameter tensor: this rank's shard, its gradient and its momentum buffer. With bf16 the
 * units compute with w, the master weights rounded to bf16, and SGD updates the f32 master;
 * otherwise master is w. */
typedef struct param {
    real_t *w, *g, *v, *master;
    int64_t rows, cols;
    int gi;          /* index in model_tensors() */
    shard_t how;     /* how the full tensor is split over the TP group */
    int part, parts; /* this shard is part `part` of `parts` */
    int owner;       /* 1: this rank's copy of the shard goes into a checkpoint */
    int expert;      /* 1: gradient summed over the expert-DP group; 0: over DP x CP */
    int sharded;     /* 1: split over the (expert-)TP group; 0: the same on every TP rank */
} param_t;

typedef struct expert {
    param_t w1, b1, w2, b2; /* [C, Fe/etp], [Fe/etp], [Fe/etp, C], [C] */
} expert_t;

/* One of the --layers blocks: a TP MLP and an MoE layer. */
typedef struct layer {
    param_t w1, b1, w2, b2;     /* [C, Fs], [Fs], [Fs, C], [C] */
    param_t router;             /* [C, E] */
    expert_t *experts;          /* [E_local] */
    param_t wq, wk, wv, wo, bo; /* attention: [C, C/tp] x 3 (its heads), [C/tp, C], [C] */
} layer_t;

struct ckpt;

typedef struct model {
    int C, V, F, Fe, E;       /* width, vocabulary, TP FFN width, expert FFN width, experts */
    int L;                    /* layers */
    int bf16;                 /* --dtype bf16: w is master rounded to bf16 */
    int K;                    /* --topk: experts per token */
    double capacity_factor;   /* --capacity-factor; 0: dropless */
    int Fs, Fes;              /* this rank's shard widths: F / tp, Fe / etp */
    int vstages;              /* --virtual-stages V: model chunks on this rank */
    int *chunk_lo, *chunk_hi; /* [V]: chunk v holds the units [chunk_lo[v], chunk_hi[v]) */
    int expert_lo, E_local;
    param_t emb_cur, emb_prev; /* [V, C] each */
    layer_t *layers;           /* [L]; only the layers of this rank's stage hold tensors */
    param_t head_w, head_b;    /* [C, V], [V] */
    param_t **params;          /* the allocated parameters of this rank */
    int nparams;
    const struct ckpt *ck; /* during model_init: the checkpoint to load, or NULL */
    int heads, Hl, D;      /* attention heads, those of this TP rank, head width C / heads */
} model_t;

/* What one layer keeps of one micro-batch between its forward and its backward. */
typedef struct layer_cache {
    real_t *tp_x, *tp_z, *tp_g;    /* TP block: input [n,C], pre-act and gelu [n,Fs] */
    real_t *moe_x, *moe_p, *moe_y; /* MoE: input [n,C], router probs [n,E], output [n,C] */
    int32_t *moe_e;                /* [n, k] chosen experts, most likely first */
    float *moe_w;                  /* [n, k] their probabilities (the top-k combine weights) */
    hcomm_moe_handle_t *moe_h;     /* routing of this micro-batch */
    int64_t moe_rows;              /* R: rows this rank's experts received */
    real_t *moe_r;                 /* [R,C] those rows (widened from bf16 with --dtype bf16) */
    int64_t *moe_count;            /* [E_local] rows per local expert */
    real_t *moe_z, *moe_g, *moe_o; /* [R,Fes], [R,Fes], [2R,C]: shard outputs, then their sum */
    struct attn_cache *attn;       /* the attention sublayer's (real/attn.c) */
} layer_cache_t;

/* Everything one micro-batch keeps between its forward and its backward (buffers from the
 * rank's arena). */
typedef struct mb_cache {
    int64_t n;                 /* tokens */
    int32_t *cur, *prev, *tgt; /* [n] input, previous and target characters */
    int nl, layer;             /* layers in lc; the one the running unit belongs to */
    layer_cache_t *lc;         /* [nl], allocated by the first layer unit */
    real_t *head_x, *head_p;   /* head: input [n,C], probabilities [n,V] */
    double loss;               /* sum of the token losses */
    int64_t nseq, seq_len;     /* n = nseq sequences of seq_len tokens (this CP rank's) */
    int solo;                  /* 1: one token with no context (sampling): no CP exchange */
    int sp;                    /* 1: n is this TP rank's share of the rows (real/sp.h) */
} mb_cache_t;

/* Rows of the micro-batch inside the TP block: every token of this CP rank. */
static inline int64_t mb_rows(const mb_cache_t *c) {
    return c->nseq * c->seq_len;
}

/* The rows the TP block's entry and exit map between (sp.h). */
static inline sp_rows_t sp_rows_of(const mb_cache_t *c) {
    return (sp_rows_t){.n = c->n, .rows = mb_rows(c), .on = c->sp};
}

struct ckpt;
/* Builds this rank's share of the model: every rank draws the full tensors from the seed (or
 * takes them and their momentum from checkpoint @p ck, when not NULL) and keeps its shards,
 * so every layout starts from the same weights. */
static void model_init(model_t *m, const train_opts_t *o, int vocab, const train_rt_t *rt,
                       const struct ckpt *ck);
static void model_free(model_t *m);
/* Which shards this rank writes into a checkpoint, from its coordinates in rt (again after a
 * recovery changed them). */
static void model_set_owners(model_t *m, const train_rt_t *rt);
static void model_zero_grads(model_t *m);
/* v = momentum * v + g; master -= lr * v (and, with bf16, w = master rounded). */
static void model_sgd(model_t *m, double lr, double momentum);

/* Runs unit u forward on one micro-batch; h [n, C] is the unit's input and gets its output
 * (the head leaves h alone and adds the loss to c->loss). */
static hcomm_result_t unit_forward(int u, const model_t *m, train_rt_t *rt, mb_cache_t *c,
                                   real_t *h);
/* Runs unit u backward; dh [n, C] holds the gradient of the unit's output and gets that of its
 * input (the head writes it from scratch). @p scale is 1 / (tokens in the global batch). */
static hcomm_result_t unit_backward(int u, model_t *m, train_rt_t *rt, mb_cache_t *c, real_t *dh,
                                    double scale);
/* The pieces of a unit whose parameters are used together: the TP block's attention and MLP,
 * the MoE layer's router and its local expert j (PIECE_EXPERT0 + j); the embedding and the
 * head are one piece each. The units call zero_piece before a piece's parameters are used,
 * on every rank whatever its tokens, since it may communicate (real/zero.c: it closes the
 * piece used before, whose gradients reduce_scatter in backward and whose parameters --zero 3
 * frees, and opens this one, gathered with --zero 3; a no-op without --zero). */
enum { PIECE_ATTN = 0, PIECE_MLP = 1, PIECE_ROUTER = 0, PIECE_EXPERT0 = 1 };
static hcomm_result_t zero_piece(train_rt_t *rt, int u, int s, int fwd);
/* Frees the MoE routing a micro-batch still holds (after a failure) and clears c. */
static void mb_cache_clear(mb_cache_t *c);
/* With --sequence-parallel: sums over TP the gradients of the weights every TP rank keeps whole. */
static hcomm_result_t sp_reduce_grads(const model_t *m, train_rt_t *rt);

#endif /* HCOMM_TRAIN_MODEL_H_ */
