/* What every precision of hcomm-train shares: one rank's groups, coordinates and timers, the
 * helpers that time and report hcomm calls, and the list of the full model's tensors. */
#ifndef HCOMM_TRAIN_RT_H_
#define HCOMM_TRAIN_RT_H_

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
    int bf16;      /* --dtype bf16: weights and activations rounded to bf16, sent as bf16 */
    double comm_s; /* seconds spent inside hcomm calls */
    double pp_s;   /* ... of which in PP transfers */
    double dp_s;   /* ... of which waiting for DP gradient reductions */
    hcomm_dp_reducer_t *red_dense, *red_expert; /* --dp-overlap 1 */
    int *red_index;          /* [nparams]: the parameter's index in its reducer's list */
    double mark;             /* when the current hcomm call started */
    arena_t arena;           /* buffers of the current step */
    struct train_zero *zero; /* --zero >= 1: the shard plans (real/zero.c), else NULL */
    /* context parallelism (real/attn.c): the CP group, and for a2a+p2p its two parts */
    hcomm_comm_t *cp, *cp_a2a, *cp_p2p;
    hcomm_cp_hier_t *cp_hier;
    int cp_rank, cp_size, cp_algo, data_rank; /* data_rank: the rank in the DP group alone */
    int a2a_rank, a2a_size, p2p_rank, p2p_size;
    int seq, attn_block;
    int sp; /* --sequence-parallel (real/sp.h) */
    /* --max-failures (real/recover.c): the current context, the recovery state, and this
     * step's first failure (its text, and how long that call waited before it failed) */
    hcomm_ctx_t *ctx;
    struct recover *rec;
    char step_error[320];
    double step_error_wait;
    int launch_rank; /* this rank in the launch's world (--inject-failure names it) */
    int stopped;     /* --inject-failure stopped this rank (local: its thread returns) */
    int left;        /* a recovery dropped this rank's replica: it leaves the run */
} train_rt_t;

/* Monotonic clock, seconds. */
double train_now(void);
/* Ends the timing of an hcomm call that TRAIN_COMM started; returns its result. */
hcomm_result_t train_comm_done(train_rt_t *rt, hcomm_result_t r);
/* Prints which call failed on which rank (not for HCOMM_ERR_ABORTED: the first failure has
 * already been printed) and returns r. */
hcomm_result_t train_fail(train_rt_t *rt, const char *what, hcomm_result_t r);
/* train_fail naming only the hcomm function that the C text @p call of TRAIN_TRY calls. */
hcomm_result_t train_fail_call(train_rt_t *rt, const char *call, hcomm_result_t r);

/* A 2-D tensor [rows, cols] of @p dtype over data, the shape of every hcomm call here. */
hcomm_tensor_t train_view(void *data, hcomm_dtype_t dtype, int64_t rows, int64_t cols);

/* Times one hcomm call: the comma operator starts the clock before the call runs. */
#define TRAIN_COMM(rt, call) ((rt)->mark = train_now(), train_comm_done((rt), (call)))
/* Returns from the enclosing function, after printing, when call fails. */
#define TRAIN_TRY(rt, call)                                                                        \
    do {                                                                                           \
        hcomm_result_t tr_r_ = (call);                                                             \
        if (tr_r_ != HCOMM_OK)                                                                     \
            return train_fail_call((rt), #call, tr_r_);                                            \
    } while (0)

/* One tensor of the full model: its name and full shape. */
typedef struct model_tensor {
    char name[48];
    int64_t rows, cols;
} model_tensor_t;

/* The tensors of the full model in a fixed order (the checkpoint's); @p out has room for
 * model_num_tensors(). Returns their number. */
int model_num_tensors(const train_opts_t *o);
int model_tensors(const train_opts_t *o, int vocab, model_tensor_t *out);
/* Number of parameters of the full model. */
int64_t model_full_size(const train_opts_t *o, int vocab);

/* Indices in model_tensors(): the embeddings, then per layer the TP block's MLP four, the router,
 * the attention's five
 * and 4 per expert, then the head's two. */
enum { GI_EMB_CUR, GI_EMB_PREV, GI_LAYER0 };
enum { GL_W1, GL_B1, GL_W2, GL_B2, GL_ROUTER, GL_WQ, GL_WK, GL_WV, GL_WO, GL_BO, GL_EXPERT0 };
/* Index in model_tensors() of layer l's first tensor (of E experts per layer); l = L gives
 * the head's. */
static inline int gi_layer(int E, int l) {
    return GI_LAYER0 + l * (GL_EXPERT0 + 4 * E);
}

#endif /* HCOMM_TRAIN_RT_H_ */
