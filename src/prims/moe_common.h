/* What the MoE files share. Mixture-of-experts dispatch and combine over the EP group (GShard,
 * Lepikhin et al. 2020; the data path of Megatron-Core's MoEAlltoAllTokenDispatcher; DeepEP's
 * send-once layout).
 *
 * Dispatch: the layout step counts, per destination rank, the distinct tokens with a kept slot
 * there and, per (rank, local expert), the slots. One count exchange (an all_to_allv of a meta
 * row per peer, which also carries each rank's argument-check status) and one token exchange
 * (each token once per destination rank, followed by a header of k local-expert ids per row)
 * follow. The receiver expands every row into one row per slot, expert-major. The handle keeps
 * three orders and the maps between them:
 *   tokens [n]        the caller's order; slot t*k+j is (token t, slot j)
 *   pairs  [npair]    slots sent, rank-major, then token, then slot (source side)
 *   recv   [r]        slots received, expert-major, then source, then token, then slot
 * Every later pass is a pure data path over one all_to_allv:
 *   redispatch:            tokens -> (distinct rows) -> recv
 *   combine, dispatch_bwd: recv -> pairs, then a slot-ordered sum per token at the source
 *   combine_bwd:           pairs (w * grad) -> recv
 * Summing at the source in slot order is what makes combine independent of the EP layout and
 * of other ranks' batches; the price is that combine returns one row per slot.
 * On one node where the ranks load each other's memory (h->pull, algo/window.h) no rows are
 * sent: the meta rows carry where each source's tokens and row lists lie, the receiver reads its
 * rows there and expands them, and combine and dispatch_bwd read each token's slot rows where
 * they lie at the experts' ranks (pair_remote), summing as they load; the orders and maps are
 * the same, so the other passes and the results do not change.
 *
 * The files, each calling only those listed before it:
 *   moe_pool.c      scratch buffers kept per EP group
 *   moe_check.c     rank-local argument checks; the meta row that carries their verdict
 *   moe_layout.c    counting and capacity drops (hcomm_moe_layout); the row permutation kernels
 *   moe_handle.c    the routing handle: allocation, statistics, what callers read from it
 *   moe_hier.c      the hierarchical (per node) token exchange
 *   moe_etp.c       expert-TP with sequence-parallel tokens
 *   moe_pad.c       pad-to-capacity dispatch (static shapes, no count exchange)
 *   moe_dispatch.c  dispatch: count exchange, token exchange, expansion; the entry points
 *   moe_plan.c      preallocated plans
 *   moe_combine.c   combine, redispatch and the backward passes over a handle */
#ifndef HCOMM_C_PRIMS_MOE_COMMON_H_
#define HCOMM_C_PRIMS_MOE_COMMON_H_

#include "hcomm/moe.h"
#include "prims/prims.h"

/* ---- scratch pool (moe_pool.c) ---- */

typedef struct hcomm__moe_pool hcomm__moe_pool_t;

/* The group's pool, created on first use and freed with the group (NULL: out of memory). */
hcomm__moe_pool_t *hcomm__moe_pool_of(hcomm_comm_t *c);
/* A handle holding buffers of the pool keeps it alive past its group. */
void hcomm__moe_pool_ref(hcomm__moe_pool_t *pool);
void hcomm__moe_pool_unref(hcomm__moe_pool_t *pool);
/* A buffer of at least bytes (64-byte aligned, contents undefined), reused when one is free. */
hcomm_result_t hcomm__moe_pool_get(hcomm__moe_pool_t *pool, const char *fn, size_t bytes,
                                   void **out);
/* Whether new large buffers come from hcomm_mem_alloc (peers' one-copy reads of them). */
void hcomm__moe_pool_share(hcomm__moe_pool_t *pool, bool shared);
/* Gives p (from hcomm__moe_pool_get; NULL is a no-op) back for reuse. */
void hcomm__moe_pool_put(hcomm__moe_pool_t *pool, void *p);

/* ---- a dispatch: its arguments, plan, handle and meta row ---- */

/* What a dispatch was asked to do. */
typedef struct hcomm__moe_args {
    const char *fn;
    const hcomm_tensor_t *tokens;
    const int32_t *ids;
    const float *weights;
    int k, num_experts;
    bool topk, capacity_mode;
    double capacity_factor;
    int policy;
    int path;                     /* hcomm_moe_path_t */
    const hcomm_moe_plan_t *plan; /* preallocated mode: the limits every call is checked against */
} hcomm__moe_args_t;

/* A preallocated dispatch: limits agreed by every rank at creation, one receive buffer of the
 * worst case, one handle reused by every dispatch. */
struct hcomm_moe_plan {
    hcomm_comm_t *group;
    hcomm_moe_plan_desc_t d;
    int64_t capacity; /* from max_tokens_per_rank; -1 dropless */
    int64_t max_rows; /* rows the buffer holds: the most any rank can receive */
    void *recv;       /* [max_rows, hidden] */
    hcomm_moe_handle_t *handle;
};

/* Routing state of one dispatch (its three orders: the top of this file). */
struct hcomm_moe_handle {
    hcomm_comm_t *group;
    hcomm__moe_pool_t *pool; /* the group's scratch: recv, y and every pass's buffers */
    int size, num_local, k;  /* EP group size, experts per rank, slots per token */
    bool topk;               /* false: the top-1 calls, whose passes copy rows of any dtype */
    bool no_y;               /* options->no_weight_grads: combine keeps no y */
    bool pad;                /* pad-to-capacity: every (expert, source) block has capacity rows */
    int64_t n, r, h, npair;  /* tokens, rows received, row width, slots sent */
    int64_t capacity;        /* per expert and source rank; -1 dropless */
    hcomm_dtype_t dtype;     /* of the dispatched tokens */
    int64_t *send_rows;      /* [size] distinct tokens to each rank */
    int64_t *send_off;       /* [size] first entry of send_tok for each rank */
    int64_t *send_tok;       /* [sum send_rows] token of each sent row, rank-major */
    int64_t *pair_rows;      /* [size] slots to each rank */
    int64_t *pair_off;       /* [size] first pair of each rank */
    int64_t *pair_slot;      /* [npair] slot t*k+j of each pair */
    int64_t *slot_pair;      /* [n*k] pair of each slot; -1 empty or dropped */
    float *weights;          /* [n*k] copy of topk_weights (1 when none were given) */
    int64_t *dropped;        /* [size*num_local] this rank's dropped slots per expert */
    int64_t *global_count;   /* [size*num_local] kept slots per expert over the group */
    int64_t global_dropped;  /* dropped slots over the group */
    int64_t *recv_rows;      /* [size] distinct rows from each rank */
    int64_t *recv_off;       /* [size] first compacted distinct row from each rank */
    int64_t *rpair_rows;     /* [size] slots from each rank */
    int64_t *rpair_off;      /* [size] first raw (source-major) slot from each rank */
    int64_t *rpair_row;      /* [r] compacted distinct row of each raw slot */
    int64_t *out_pair;       /* [r] raw slot of each expert-major row */
    int64_t *expert_off;     /* [num_local + 1] first row of each local expert */
    void *recv;              /* [r, h] received rows, expert-major */
    hcomm_moe_plan_t *plan;  /* the plan whose buffer recv is and which owns the handle */
    void *y;                 /* [npair, y_h] the last combine's inputs, pair order */
    int64_t y_h;
    hcomm_dtype_t y_dtype;
    /* Expert-TP with sequence-parallel tokens (moe_etp.c): recv holds every etp member's rows,
     * r_all of them, expert-major, then source EP rank, then etp member; r counts this rank's
     * own rows (its EP exchange). Without etp, r_all == r. */
    hcomm_comm_t *etp; /* NULL: no gather */
    int etp_size;
    int64_t r_all;
    int64_t *etp_rows; /* [etp_size] own rows of each member */
    int64_t *etp_perm; /* [r_all] row of the gathered blocks (member-major) of each row */
    /* How the token exchange ran (moe_hier.c). */
    bool hier;                      /* per node: inter-node exchange, then intra-node fan-out */
    int nnodes;                     /* nodes of the EP group (1 when its topology is unknown) */
    const struct hcomm__topo *topo; /* the group's model (NULL: unknown) */
    int64_t *relay_rows;            /* hier: [size] rows each source relays through this rank */
    int64_t *src_k;                 /* hier: [size] each source's k */
    int32_t *ids;                   /* hier: [n * k] the dispatched ids, for redispatch */
    int64_t internode_rows;         /* token rows this rank's dispatch sent to other nodes */
    /* The ranks read each other's rows where they lie (one node, hcomm__coll_reads_ok): the
     * token exchange and the passes back to the tokens load them instead of an all_to_allv. */
    bool pull;
    int64_t *pair_remote; /* pull: [npair] the expert-major row of each pair at its rank */
};

/* The meta row each rank sends each peer before the tokens move: its argument-check status
 * (so a rank with bad input fails every rank instead of leaving them waiting), its row layout
 * (so a disagreement is reported, not mis-delivered), the rows for that peer, the path of the
 * token exchange, its expert-TP group's size (1 without one; EP peers must agree, or their
 * expert-TP steps differ), the rows it relays through that peer (hierarchical: the peer is its
 * relay on the peer's node; else 0), its dropped slots and its kept slots for every expert (the
 * peer's own experts say what arrives; all of them give every rank the global statistics
 * without another collective). Where the ranks read each other's memory (hcomm__coll_reads_ok)
 * it also exports the buffers the peer reads its rows from: the tokens, the sent rows' tokens
 * and their headers, and where the peer's rows start among them (else those fields are 0). */
enum {
    META_STATUS,
    META_H,
    META_DTYPE,
    META_K,
    META_ROWS,
    META_PATH,
    META_ETP,
    META_NODE_ROWS,
    META_DROPPED,
    META_TOKENS = META_DROPPED + 1,                              /* hcomm__exported_t */
    META_SEND_TOK = META_TOKENS + sizeof(hcomm__exported_t) / 8, /* hcomm__exported_t */
    META_HDR = META_SEND_TOK + sizeof(hcomm__exported_t) / 8,    /* hcomm__exported_t */
    META_FIRST = META_HDR + sizeof(hcomm__exported_t) / 8,
    META_COUNTS
};

/* Meta rows are this wide: the fields above, then a count per expert of the group. */
static inline int hcomm__moe_meta_width(const hcomm_moe_handle_t *h) {
    return META_COUNTS + h->size * h->num_local;
}

/* n zeroed int64 (at least one), or NULL. */
static inline int64_t *hcomm__moe_alloc_i64(size_t n) {
    return calloc(n ? n : 1, sizeof(int64_t));
}

/* ---- argument checks and the meta row (moe_check.c) ---- */

/* Rank-local checks of options, and of T, k, E and the group size, worded for fn. */
hcomm_result_t hcomm__moe_check_options(const char *fn, const hcomm_moe_options_t *o);
hcomm_result_t hcomm__moe_check_layout_args(const char *fn, int64_t n, int k, int num_experts,
                                            int ep_size);
/* ids [n * k] are experts of 0..num_experts-1 (allow_empty: -1 too, the top-k form's wording). */
hcomm_result_t hcomm__moe_check_ids(const char *fn, const int32_t *ids, int64_t n, int k,
                                    int num_experts, bool allow_empty);
/* A dispatch's rank-local checks of tokens, ids, weights and options (or the plan's limits). */
hcomm_result_t hcomm__moe_check_dispatch(const hcomm__moe_args_t *a, const hcomm_moe_options_t *o);
/* Fills the meta row for each peer (row p at meta + p * w; row 0's counts are filled). */
void hcomm__moe_fill_meta(const hcomm_moe_handle_t *h, hcomm_result_t local, int64_t *meta, int w);
/* Fails if a peer failed its checks or disagrees on the rows (meta: one row from each peer). */
hcomm_result_t hcomm__moe_check_peers(const char *fn, const hcomm_moe_handle_t *h,
                                      const int64_t *meta);
/* A mismatch (res) that a collective of fn found names only that collective's byte counts: it
 * becomes the last error's text followed by fmt (which group, what its ranks must share). Any
 * other res is returned as it is. */
hcomm_result_t hcomm__moe_mismatch(const char *fn, hcomm_result_t res, const char *fmt, ...)
    HCOMM__PRINTF(3, 4);

/* ---- layout and permutation (moe_layout.c) ---- */

/* offsets[i] = counts[0] + ... + counts[i - 1]; returns the sum of all n. */
int64_t hcomm__moe_scan(const int64_t *counts, int64_t *offsets, int n);
/* keep[s]: slot s is routed (not empty, not dropped past h->capacity); counts the drops per
 * expert in h->dropped. */
hcomm_result_t hcomm__moe_mark_kept(const hcomm__moe_args_t *a, hcomm_moe_handle_t *h,
                                    uint8_t *keep);
/* The local permutation of dispatch and combine: dst row i = src row idx[i] (gather) or
 * dst row idx[i] = src row i (scatter), n rows of rb bytes. Tests time it against memcpy. */
void hcomm__moe_gather_rows(void *dst, const void *src, const int64_t *idx, int64_t n, size_t rb);
void hcomm__moe_scatter_rows(void *dst, const void *src, const int64_t *idx, int64_t n, size_t rb);
/* n rows of rb bytes into dst are written with streaming stores (hcomm__copy_stream, then
 * hcomm__stream_fence before the rows are announced). */
bool hcomm__moe_streams(const void *dst, size_t rb, int64_t n);
/* One row of rb bytes (the kernels' copy). */
void hcomm__moe_copy_row(void *dst, const void *src, size_t rb);

/* ---- the handle (moe_handle.c) ---- */

/* A handle for n tokens of k slots each over g's experts (NULL: out of memory). */
hcomm_moe_handle_t *hcomm__moe_handle_alloc(hcomm_comm_t *g, int num_local, int64_t n, int k);
/* Frees a handle, also a plan's (NULL is a no-op). */
void hcomm__moe_handle_release(hcomm_moe_handle_t *handle);
/* Adds one source's meta row m to the group's statistics (counts and drops). */
void hcomm__moe_add_stats(hcomm_moe_handle_t *h, const int64_t *m);

/* ---- hierarchical token exchange (moe_hier.c) ---- */

/* Looks up the group's topology and decides the path (path: hcomm_moe_path_t); rank-local. */
hcomm_result_t hcomm__moe_hier_setup(const char *fn, hcomm_moe_handle_t *h, int path);
/* Sets META_NODE_ROWS of each peer's meta row (meta rows of width w) and h->internode_rows. */
void hcomm__moe_hier_meta(hcomm_moe_handle_t *h, const int32_t *ids, int64_t *meta, int w);
/* Keeps what a later hierarchical exchange needs: the rows each source relays through this
 * rank and each source's k (from the count exchange's meta rows), and room for the ids. */
hcomm_result_t hcomm__moe_hier_keep(const char *fn, hcomm_moe_handle_t *h, const int64_t *meta);
/* What receives the rows of the hierarchical exchange: source s's block at raw + roff[s]. */
typedef hcomm_result_t (*hcomm__moe_sink_t)(const char *fn, hcomm_moe_handle_t *h, const char *raw,
                                            const size_t *roff, size_t rb, void *arg);
/* The hierarchical token exchange of tokens (rows of rb bytes) by ids (h->n * h->k global
 * expert ids, kept slots per h->slot_pair); roff [size] is scratch for the sink. */
hcomm_result_t hcomm__moe_hier_move(const char *fn, hcomm_moe_handle_t *h, const void *tokens,
                                    const int32_t *ids, size_t rb, size_t *roff,
                                    hcomm__moe_sink_t sink, void *arg);

/* ---- expert-TP with sequence-parallel tokens (moe_etp.c) ----
 * Each runs on h->etp (non-NULL), naming fn in errors; a local failure joins the peers' call
 * so they fail with HCOMM_ERR_PEER. */

/* Dispatch's step after the EP exchange, whose result on this rank is prev: one all_gather of
 * counts and statuses, then the rows (h->recv becomes the r_all gathered rows, h->expert_off
 * their offsets). own_counts [num_local * size]: rows received per (local expert, source). */
hcomm_result_t hcomm__moe_etp_dispatch(const char *fn, hcomm_moe_handle_t *h, hcomm_result_t prev,
                                       const int64_t *own_counts);
/* own [r, rb bytes] of every member -> out [r_all] in the gathered order. */
hcomm_result_t hcomm__moe_etp_gather(const char *fn, const hcomm_moe_handle_t *h, const void *own,
                                     void *out, size_t rb);
/* in [r_all, cols] summed over the members -> own [r, cols] (this rank's rows). */
hcomm_result_t hcomm__moe_etp_reduce(const char *fn, const hcomm_moe_handle_t *h, const void *in,
                                     hcomm_dtype_t dt, int64_t cols, void *own);
/* Joins the etp group's next call as failed with res (no-op without etp or when res is OK). */
hcomm_result_t hcomm__moe_etp_fail(const char *fn, const hcomm_moe_handle_t *h, hcomm_result_t res);

/* ---- pad-to-capacity (moe_pad.c) ---- */

/* The padded dispatch of a plan with pad_to_capacity: one all_to_all of fixed blocks; local is
 * this rank's check result, which every peer learns from its block's meta row. */
hcomm_result_t hcomm__moe_dispatch_padded(const hcomm__moe_args_t *a, hcomm_moe_handle_t *h,
                                          hcomm_result_t local);

/* ---- dispatch (moe_dispatch.c) ---- */

/* Checks (rank-local), allocates the handle and runs the collective part of a dispatch. */
hcomm_result_t hcomm__moe_dispatch_call(hcomm_comm_t *g, const hcomm__moe_args_t *a,
                                        const hcomm_moe_options_t *o, hcomm_moe_handle_t **out);

#endif /* HCOMM_C_PRIMS_MOE_COMMON_H_ */
