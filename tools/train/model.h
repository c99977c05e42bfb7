/* The model of hcomm-train and one rank's share of it.
 *
 * Four units, split contiguously over the pipeline stages:
 *   0 embed: h = emb_cur[c_t] + emb_prev[c_{t-1}]                         [n, C]
 *   1 TP block: h += W2 gelu(W1 h + b1) + b2, W1 column- and W2 row-parallel over TP
 *   2 MoE: p = softmax(h Wr); e = argmax p; h += p[e] * expert_e(h), experts spread over EP
 *      and each sharded over the expert-TP group like the TP block (top-1, dropless)
 *   3 head: logits = h Wo + bo; loss = softmax cross-entropy against c_{t+1}
 * Activations and gradients are double, so that layouts which sum partial results in another
 * order agree to ~1e-15 and top-1 routing decisions never flip between layouts.
 */
#ifndef HCOMM_TRAIN_MODEL_H_
#define HCOMM_TRAIN_MODEL_H_

#include "arena.h"
#include "hcomm/api.h"
#include "opts.h"

/* Kinds of unit: the model is embed, then --layers times (TP block, MoE), then head. */
enum { UNIT_EMBED, UNIT_TP, UNIT_MOE, UNIT_HEAD };

/* Units of a model of L layers, and the kind of unit u. */
static inline int model_units(int L) {
    return 2 + 2 * L;
}
static inline int unit_kind(int u, int L) {
    return u == 0 ? UNIT_EMBED : u == 1 + 2 * L ? UNIT_HEAD : (u % 2 == 1 ? UNIT_TP : UNIT_MOE);
}

/* One rank's groups, coordinates and time spent inside hcomm. */
typedef struct train_rt {
    hcomm_comm_t *world, *tp, *pp, *dp_cp, *ep, *etp, *edp;
    int world_rank, world_size;
    int tp_rank, tp_size, stage, pp_size, dp_rank, dp_size;
    int ep_rank, ep_size, etp_rank, etp_size, edp_rank, edp_size;
    int prev, next; /* PP neighbours as ranks of the PP group, -1 at the ends */
    double comm_s;  /* seconds spent inside hcomm calls */
    double pp_s;    /* ... of which in PP transfers */
    double dp_s;    /* ... of which waiting for DP gradient reductions */
    hcomm_dp_reducer_t *red_dense, *red_expert; /* --dp-overlap 1 */
    int *red_index; /* [nparams]: the parameter's index in its reducer's list */
    double mark;    /* when the current hcomm call started */
    arena_t arena;  /* buffers of the current step */
} train_rt_t;

/* Monotonic clock, seconds. */
double train_now(void);
/* Ends the timing of an hcomm call that TRAIN_COMM started; returns its result. */
hcomm_result_t train_comm_done(train_rt_t *rt, hcomm_result_t r);
/* Prints which call failed on which rank (not for HCOMM_ERR_ABORTED: the first failure has
 * already been printed) and returns r. */
hcomm_result_t train_fail(const train_rt_t *rt, const char *what, hcomm_result_t r);
/* train_fail naming only the hcomm function that the C text @p call of TRAIN_TRY calls. */
hcomm_result_t train_fail_call(const train_rt_t *rt, const char *call, hcomm_result_t r);

/* A 2-D f64 tensor [rows, cols] over data, the shape of every hcomm call here. */
hcomm_tensor_t train_view2(double *data, int64_t rows, int64_t cols);

/* Times one hcomm call: the comma operator starts the clock before the call runs. */
#define TRAIN_COMM(rt, call) ((rt)->mark = train_now(), train_comm_done((rt), (call)))
/* Returns from the enclosing function, after printing, when call fails. */
#define TRAIN_TRY(rt, call)                                                                        \
    do {                                                                                           \
        hcomm_result_t tr_r_ = (call);                                                             \
        if (tr_r_ != HCOMM_OK)                                                                     \
            return train_fail_call((rt), #call, tr_r_);                                            \
    } while (0)

typedef enum shard { SHARD_NONE, SHARD_ROWS, SHARD_COLS } shard_t;

/* A parameter tensor: this rank's shard, its gradient and its momentum buffer. */
typedef struct param {
    double *w, *g, *v;
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
    param_t w1, b1, w2, b2; /* [C, Fs], [Fs], [Fs, C], [C] */
    param_t router;         /* [C, E] */
    expert_t *experts;      /* [E_local] */
} layer_t;

struct ckpt;

typedef struct model {
    int C, V, F, Fe, E;   /* width, vocabulary, TP FFN width, expert FFN width, experts */
    int L;                /* layers */
    int Fs, Fes;          /* this rank's shard widths: F / tp, Fe / etp */
    int unit_lo, unit_hi; /* the units [unit_lo, unit_hi) live on this rank's stage */
    int expert_lo, E_local;
    param_t emb_cur, emb_prev; /* [V, C] each */
    layer_t *layers;           /* [L]; only the layers of this rank's stage hold tensors */
    param_t head_w, head_b;    /* [C, V], [V] */
    param_t **params;          /* the allocated parameters of this rank */
    int nparams;
    const struct ckpt *ck; /* during model_init: the checkpoint to load, or NULL */
} model_t;

/* What one layer keeps of one micro-batch between its forward and its backward. */
typedef struct layer_cache {
    double *tp_x, *tp_z, *tp_g;    /* TP block: input [n,C], pre-act and gelu [n,Fs] */
    double *moe_x, *moe_p, *moe_y; /* MoE: input [n,C], router probs [n,E], output [n,C] */
    int32_t *moe_e;                /* [n] chosen expert */
    hcomm_moe_handle_t *moe_h;     /* routing of this micro-batch */
    int64_t moe_rows;              /* R: rows this rank's experts received */
    int64_t *moe_count;            /* [E_local] rows per local expert */
    double *moe_z, *moe_g, *moe_o; /* [R,Fes], [R,Fes], [R,C] */
} layer_cache_t;

/* Everything one micro-batch keeps between its forward and its backward (buffers from the
 * rank's arena). */
typedef struct mb_cache {
    int64_t n;                 /* tokens */
    int32_t *cur, *prev, *tgt; /* [n] input, previous and target characters */
    int nl, layer;             /* layers in lc; the one the running unit belongs to */
    layer_cache_t *lc;         /* [nl], allocated by the first layer unit */
    double *head_x, *head_p;   /* head: input [n,C], probabilities [n,V] */
    double loss;               /* sum of the token losses */
} mb_cache_t;

/* One tensor of the full model: its name and full shape. */
typedef struct model_tensor {
    char name[48];
    int64_t rows, cols;
} model_tensor_t;

/* The tensors of the full model in a fixed order (the checkpoint's); @p out has room for
 * model_num_tensors(). Returns their number. */
int model_num_tensors(const train_opts_t *o);
int model_tensors(const train_opts_t *o, int vocab, model_tensor_t *out);

struct ckpt;
/* Builds this rank's share of the model: every rank draws the full tensors from the seed (or
 * takes them and their momentum from checkpoint @p ck, when not NULL) and keeps its shards,
 * so every layout starts from the same weights. */
void model_init(model_t *m, const train_opts_t *o, int vocab, const train_rt_t *rt,
                const struct ckpt *ck);
void model_free(model_t *m);
void model_zero_grads(model_t *m);
/* v = momentum * v + g; w -= lr * v. */
void model_sgd(model_t *m, double lr, double momentum);
/* Number of parameters of the full model. */
int64_t model_full_size(const train_opts_t *o, int vocab);

/* Runs unit u forward on one micro-batch; h [n, C] is the unit's input and gets its output
 * (the head leaves h alone and adds the loss to c->loss). */
hcomm_result_t unit_forward(int u, const model_t *m, train_rt_t *rt, mb_cache_t *c, double *h);
/* Runs unit u backward; dh [n, C] holds the gradient of the unit's output and gets that of its
 * input (the head writes it from scratch). @p scale is 1 / (tokens in the global batch). */
hcomm_result_t unit_backward(int u, model_t *m, train_rt_t *rt, mb_cache_t *c, double *dh,
                             double scale);
/* Frees the MoE routing a micro-batch still holds (after a failure) and clears c. */
void mb_cache_clear(mb_cache_t *c);

#endif /* HCOMM_TRAIN_MODEL_H_ */
