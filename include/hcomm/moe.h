/**
 * @file moe.h
 * @brief Mixture-of-experts token dispatch and combine over the expert-parallel group
 *        (GShard, Lepikhin et al. 2020; Megatron-Core's MoEAlltoAllTokenDispatcher).
 *
 * Experts are laid out contiguously (expert parallel): with E experts and an EP group of size
 * P, rank p owns experts [p*E/P, (p+1)*E/P). Dispatch sends each token (a row of tokens[N, H])
 * to the rank owning expert_ids[i] (top-1), exchanging the counts inside, then the rows with one
 * all_to_allv (two when the group spans several nodes: "Multi-node" below; on one node, where
 * the ranks load each other's memory, each rank instead reads its rows where they lie and
 * combine reads the expert outputs likewise: one copy per row, same results); the received rows are
 * grouped by local expert (expert-major, source rank next, original order within a source).
 * Dropless: no capacity factor, no token is dropped or padded, so R (rows received) varies by rank
 * and batch. Top-k routing with weights, empty slots and capacity is hcomm_moe_dispatch_topk and
 * its passes below; the top-1 calls run on the same path as its k = 1 case, copying rows without
 * arithmetic (any dtype, H' and a combine that is a plain copy). hcomm_moe_stats reads the global
 * tokens per expert, imbalance and drops of a dispatch; hcomm_moe_plan_create fixes the limits once
 * for preallocated and pad-to-capacity dispatches. Options add expert-TP over sequence-parallel
 * tokens and the hierarchical multi-node path (sections below). Scratch and received rows come from
 * a pool kept per group and reused by later calls (freed with the group). Combine sends expert
 * outputs back and restores the original token order. The backward passes reuse the routing:
 * dispatch_bwd is a combine, combine_bwd a dispatch. Shapes are in rows and elements. Dispatch,
 * combine and the backward passes are collective over the EP group (every member calls them in the
 * same order, also with N = 0); hcomm_moe_received() and hcomm_moe_handle_free() are local. One
 * handle per dispatched batch; a handle is used by one thread at a time, and calls on one group are
 * made one at a time. Errors (all collective calls): HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (expert
 * id out of range, E not a positive multiple of P), HCOMM_ERR_SHAPE, HCOMM_ERR_DTYPE,
 * HCOMM_ERR_MISMATCH (members disagree on H, H', dtype or E), HCOMM_ERR_NOMEM, HCOMM_ERR_TIMEOUT,
 * HCOMM_ERR_ABORTED, HCOMM_ERR_UNSUPPORTED (mpi: a byte count or offset above INT_MAX),
 * HCOMM_ERR_BACKEND, HCOMM_ERR_PEER (a peer's own argument check failed), HCOMM_ERR_STATE (a
 * top-k handle passed to a top-1 pass). A rank whose argument check fails still
 * joins the call, so its peers return HCOMM_ERR_PEER at once instead of waiting (see core.h).
 */
#ifndef HCOMM_C_MOE_H_
#define HCOMM_C_MOE_H_

#include "hcomm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Routing state of one dispatch; owns the received tokens. Opaque. */
typedef struct hcomm_moe_handle hcomm_moe_handle_t;

/** Dispatches @p tokens [N, H] (any dtype, N >= 0) by @p expert_ids [N] (int32, each in
 *  0..num_experts-1; may be NULL when N = 0) over @p ep_group. On success *handle owns the
 *  received rows; read them with hcomm_moe_received(). N may differ between ranks; H, the
 *  dtype and @p num_experts may not. The handle keeps @p ep_group: free the handle before the
 *  group.
 *  The token checks are rank-local, so their outcome travels with the count exchange: a rank
 *  whose tokens or expert ids are bad fails with its own error (HCOMM_ERR_NULL, _SHAPE,
 *  _DTYPE, _INVALID_ARG) and every other rank fails with HCOMM_ERR_PEER instead of waiting;
 *  ranks that disagree on H or dtype all fail with HCOMM_ERR_MISMATCH. *handle is NULL after
 *  any failure. */
HCOMM_API hcomm_result_t hcomm_moe_dispatch(hcomm_comm_t *ep_group, const hcomm_tensor_t *tokens,
                                            const int32_t *expert_ids, int num_experts,
                                            hcomm_moe_handle_t **handle);
/** The received rows as a tensor view [R, H] of the dispatched dtype (owned by @p handle, valid
 *  until it is freed) and, if @p tokens_per_expert is not NULL, the row count of each local
 *  expert (int64, [num_experts/P] entries). Local, thread-safe. Errors: HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_moe_received(const hcomm_moe_handle_t *handle, hcomm_tensor_t *recv,
                                            int64_t *tokens_per_expert);
/** Sends @p expert_out [R, H'] (rows in received order, any H' and dtype) back and writes
 *  @p out [N, H'] (same dtype) in the original token order. Collective. */
HCOMM_API hcomm_result_t hcomm_moe_combine(hcomm_moe_handle_t *handle,
                                           const hcomm_tensor_t *expert_out, hcomm_tensor_t *out);
/** Backward of combine: routes @p grad_out [N, H'] (any H' and dtype) like the dispatch into
 *  @p grad_expert_out [R, H'] (same dtype). Collective. */
HCOMM_API hcomm_result_t hcomm_moe_combine_bwd(hcomm_moe_handle_t *handle,
                                               const hcomm_tensor_t *grad_out,
                                               hcomm_tensor_t *grad_expert_out);
/** Backward of dispatch: brings @p grad_recv [R, H] (H as dispatched; any dtype, the same for
 *  @p grad_tokens) back into @p grad_tokens [N, H] (original order). Collective. */
HCOMM_API hcomm_result_t hcomm_moe_dispatch_bwd(hcomm_moe_handle_t *handle,
                                                const hcomm_tensor_t *grad_recv,
                                                hcomm_tensor_t *grad_tokens);
/** @name Top-k routing with weights
 * As GShard, Megatron-Core's MoEAlltoAllTokenDispatcher and DeepEP route tokens:
 * topk_ids [T, k] (int32, row-major) names k experts per token, -1 an empty slot;
 * topk_weights [T, k] (f32) weights them. A token with several experts on one rank travels to
 * that rank once; the rank expands it into one received row per (token, slot), so R counts
 * slots. Received rows are expert-major: local expert, then source rank, then token, then slot.
 * Combine sends every (token, slot) output back to the token's rank and sums there in slot
 * order j = 0..k-1 (accumulating in f32 for f16/bf16/f32, f64 for f64), so out is bitwise the
 * same for any EP size and does not depend on other ranks' batches (dropless mode).
 * @{ */

/** How dispatch treats more slots for one expert than its capacity. */
typedef enum hcomm_moe_drop {
    HCOMM_MOE_DROP_POSITION = 0, /**< keep the earliest slots (token order, then slot order) */
    HCOMM_MOE_DROP_PROBS = 1,    /**< keep the highest weights; ties keep the earliest slot */
} hcomm_moe_drop_t;

/** Which token exchange a dispatch uses (see "Multi-node" below). */
typedef enum hcomm_moe_path {
    HCOMM_MOE_PATH_AUTO = 0, /**< hierarchical when the EP group spans more than one node */
    HCOMM_MOE_PATH_FLAT = 1, /**< one all_to_allv over the EP group */
    HCOMM_MOE_PATH_HIER = 2, /**< per node (also on one node, where it is a relay inside it) */
} hcomm_moe_path_t;

/** Options of hcomm_moe_dispatch_topk; NULL means dropless, no expert-TP gather, automatic
 *  path. Zero-initialised fields are the defaults. Every rank passes the same values
 *  (etp_group: each its own expert-TP group). */
typedef struct hcomm_moe_options {
    /** <= 0: dropless (default). > 0: each source rank keeps at most
     *  capacity = min(ceil(T_max * k / E * capacity_factor), T_max * k) slots per expert, with
     *  T_max the largest T of any rank (one extra all_reduce of one int64). */
    double capacity_factor;
    hcomm_moe_drop_t drop_policy; /**< which slots to keep past capacity */
    /** Expert-TP with sequence-parallel tokens (Megatron-Core's MoEAlltoAllTokenDispatcher
     *  with sequence parallelism): this rank's expert-TP group (a group orthogonal to the EP
     *  group: world = ep x etp, as hcomm_domain's HCOMM_GROUP_ETP), across which the tokens are
     *  sharded. NULL (default): no expert-TP, or tokens replicated across it (each member
     *  passes the same tokens and dispatches them over its own EP group: they move once, no
     *  gather; the caller sums the expert-TP partial outputs, e.g. hcomm_tp_reduce_from_fwd,
     *  before combine). See "Expert-TP" below for what each call does with it. */
    hcomm_comm_t *etp_group;
    hcomm_moe_path_t path; /**< token exchange: automatic (default), flat or hierarchical */
    /** Nonzero: hcomm_moe_combine_topk on this handle keeps no copy of the expert outputs (y),
     *  so hcomm_moe_combine_topk_bwd gives no grad_weights (HCOMM_ERR_STATE if asked). For
     *  inference, or a caller that keeps expert_out for the weights' gradient itself (as an
     *  autograd framework saves it): each combine then writes T * k rows fewer. 0 (default):
     *  y is kept. */
    int no_weight_grads;
} hcomm_moe_options_t;
/** @} */

/** @page moe_multinode Multi-node: the hierarchical MoE path
 * As DeepEP's internode dispatch and Tutel's 2D hierarchical all_to_all do it.
 * When the EP group's ranks sit on more than one node (the topology layer: host names on mpi,
 * HCOMM_TOPO="nodes=..." or hcomm_comm_set_topo; see topo.h), dispatch sends each token once
 * per destination node instead of once per destination rank: to a relay on that node (the
 * rank with the sender's local index modulo the node's size: the same "rail" on equal nodes),
 * which forwards it to the ranks of its node that own its experts. The count exchange stays
 * one (the relay counts ride on it); the tokens take two exchanges: inter-node (every
 * rank to its relays, at most one row per token and node), then intra-node (relays to their
 * node's ranks). The received rows, offsets, statistics and every later pass are bitwise those
 * of the flat path; redispatch takes the same two exchanges. Combine and the backward passes send
 * each slot's row straight back to the token's rank (as the flat path does): summing a token's
 * slots per node before the inter-node link would change the order of combine's f32 sum (slot order
 * j = 0..k-1), which is what makes it deterministic and independent of the layout; their inter-node
 * bytes are the flat path's. options->path chooses: AUTO (the default, and what the top-1 calls and
 * plans use) takes the hierarchical path on more than one node, FLAT and HIER force one; ranks
 * whose choices differ all fail with HCOMM_ERR_MISMATCH. Pad-to-capacity plans always exchange
 * their fixed blocks directly. hcomm_moe_route_info tells which path ran and how many rows
 * this rank sent across nodes. */

/** @name Expert-TP (Megatron-Core's two cases)
 * Replicated tokens (options NULL or options->etp_group NULL; hcomm-train's case): every
 * member of an expert-TP group passes the same tokens [T, H] and dispatches them over its own
 * EP group; each row moves once, nothing is gathered. The members run their slices of the
 * experts on the same received rows [R, H] and sum their partial outputs themselves (e.g.
 * hcomm_tp_reduce_from_fwd over the expert-TP group) before hcomm_moe_combine_topk.
 * Sequence-parallel tokens (options->etp_group = this rank's expert-TP group, size etp; the
 * world is ep x etp): member i passes its own shard [T_i, H] (T_i may differ, also 0).
 *   hcomm_moe_dispatch_topk: EP exchange of the shard (rows R_i), then an all_gather of one
 *       count row per member and an all_gatherv of the rows across etp_group: every member gets
 *       the same [R, H], R = sum of R_i, ordered local expert, then source EP rank, then member,
 *       then token and slot: the rows the replicated mode gives for the members' tokens
 *       concatenated in member order (dropless; with a capacity_factor each member's shard is
 *       capped on its own, from the largest T in its EP group, so more rows may be kept).
 *       hcomm_moe_received, _expert_offsets see these R rows; hcomm_moe_stats counts every
 *       member's tokens (the same on every rank of both groups); hcomm_moe_dropped this
 *       member's own.
 *   hcomm_moe_combine_topk: expert_out [R, H'] is each member's partial output; they are
 *       summed by a reduce_scatterv across etp_group (member i keeps its R_i rows; f16/bf16 sum
 *       in f32 and round once), then the reverse EP exchange and the slot-order sum: out [T_i,
 *       H'] are this member's tokens.
 *   hcomm_moe_dispatch_topk_bwd: grad_recv [R, H] reduce-scattered (summed) across etp_group,
 *       then as without expert-TP: grad_tokens [T_i, H].
 *   hcomm_moe_combine_topk_bwd: grad_out [T_i, H'] -> the EP exchange -> an all_gatherv across
 *       etp_group: grad_expert_out [R, H'] (the same on every member); grad_weights [T_i, k]
 *       from the summed outputs of the last combine.
 *   hcomm_moe_redispatch: tokens [T_i, H'] -> EP exchange -> all_gatherv -> recv [R, H'].
 * A member whose call fails (bad input, or an error in its EP exchange) joins the expert-TP
 * step so its peers fail with HCOMM_ERR_PEER instead of waiting. Expert-TP applies to
 * hcomm_moe_dispatch_topk only (not plans or the top-1 calls). options->etp_group equal to
 * ep_group is HCOMM_ERR_INVALID_ARG; so is, on every member, an etp_group whose members are not
 * the same rank of EP groups of one size (they would hold different experts). EP ranks whose
 * expert-TP groups differ in size (1: none) all fail with HCOMM_ERR_MISMATCH; a member whose
 * etp peers pass an etp_group but which passes none leaves them waiting until HCOMM_TIMEOUT.
 * @{ */

/** The layout step of dispatch, rank-local (no communication), thread-safe.
 *  @p topk_ids [num_tokens, k] int32 in -1..num_experts-1 (NULL allowed when num_tokens = 0).
 *  Writes @p tokens_per_rank [ep_size] (distinct tokens sent to each rank: a token with several
 *  experts on one rank counts once), @p tokens_per_expert [num_experts] (non-empty slots per
 *  expert) and, if not NULL, @p perm [num_tokens * k] (int64): the slots t * k + j of the
 *  non-empty entries, expert-major, stable (token, then slot order); the first
 *  sum(tokens_per_expert) entries are written. Experts are contiguous: rank p owns
 *  [p * E / ep_size, (p + 1) * E / ep_size).
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (num_tokens < 0, k < 1, ep_size < 1,
 *  num_experts not a positive multiple of ep_size, an id outside -1..num_experts-1; the message
 *  names the entry and its value, e.g. "hcomm_moe_layout: topk_ids[3][1]=9 outside -1..7"). */
HCOMM_API hcomm_result_t hcomm_moe_layout(const int32_t *topk_ids, int64_t num_tokens, int k,
                                          int num_experts, int ep_size, int64_t *tokens_per_rank,
                                          int64_t *tokens_per_expert, int64_t *perm);

/** Top-k dispatch of @p tokens [T, H] (any dtype; H >= 1; T >= 0 and may differ by rank) by
 *  @p topk_ids [T, k] (int32, -1 = empty) with @p topk_weights [T, k] (f32, or NULL for
 *  weight 1) over @p ep_group. Collective over ep_group, one call per rank in the same order.
 *  Moves data with one count exchange and one token exchange (plus one all_reduce of the
 *  maximum T in capacity mode; two token exchanges on the hierarchical path; with
 *  options->etp_group, an all_gather of counts and an all_gatherv of rows across it). On success
 * *handle owns the received rows [R, H] expert-major (read them with hcomm_moe_received(), offsets
 * with hcomm_moe_expert_offsets(), drops with hcomm_moe_dropped()). The handle keeps the group and
 * a copy of the ids and weights. Errors: the rank-local checks (HCOMM_ERR_NULL, _SHAPE, _DTYPE,
 * _INVALID_ARG: k, ids, weights not finite, options) ride on the count exchange: the failing rank
 * returns its own error, every other rank HCOMM_ERR_PEER, and the group stays usable; so do a
 * NULL @p handle (HCOMM_ERR_NULL) and num_experts not a positive multiple of the group size
 * (HCOMM_ERR_INVALID_ARG) on the ranks that pass them. Ranks that disagree on H, dtype,
 * num_experts, options->path or the expert-TP group's size: HCOMM_ERR_MISMATCH on all. Also
 * HCOMM_ERR_NOMEM, _TIMEOUT, _ABORTED, _UNSUPPORTED (mpi, a byte count above INT_MAX), _BACKEND.
 * Not thread-safe per group (one call on a group at a time). */
HCOMM_API hcomm_result_t hcomm_moe_dispatch_topk(hcomm_comm_t *ep_group,
                                                 const hcomm_tensor_t *tokens,
                                                 const int32_t *topk_ids, const float *topk_weights,
                                                 int k, int num_experts,
                                                 const hcomm_moe_options_t *options,
                                                 hcomm_moe_handle_t **handle);

/** Dispatches @p tokens [T, H'] (any dtype and H') again with the routing of @p handle, no
 *  count exchange: @p recv [R, H'] (same dtype) gets the rows hcomm_moe_received() would.
 *  Collective over the handle's group (one token exchange). Errors: as combine. */
HCOMM_API hcomm_result_t hcomm_moe_redispatch(hcomm_moe_handle_t *handle,
                                              const hcomm_tensor_t *tokens, hcomm_tensor_t *recv);

/** Start offset of each local expert's rows in the received rows: @p offsets [E / P + 1]
 *  (int64), offsets[E / P] = R. Local, thread-safe. Errors: HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_moe_expert_offsets(const hcomm_moe_handle_t *handle,
                                                  int64_t *offsets);

/** What capacity dropped on this rank: @p dropped_per_expert [E] (may be NULL) slots of this
 *  rank's tokens dropped per global expert, *total (may be NULL) their sum, *capacity (may be
 *  NULL) the per-expert capacity (-1 when dropless). Local, thread-safe. HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_moe_dropped(const hcomm_moe_handle_t *handle,
                                           int64_t *dropped_per_expert, int64_t *total,
                                           int64_t *capacity);

/** Statistics of the dispatch that made @p handle, the same on every rank of the group (they
 *  ride on the count exchange: no extra communication): @p tokens_per_expert [E] (int64, may
 *  be NULL) slots kept for each global expert, summed over the group's ranks;
 *  *imbalance (may be NULL) their maximum over their mean (1.0 = balanced, E = everything on
 *  one expert, 0.0 when no slot was routed); *dropped (may be NULL) slots dropped by capacity
 *  on all ranks together (0 when dropless). Local, thread-safe. Errors: HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_moe_stats(const hcomm_moe_handle_t *handle,
                                         int64_t *tokens_per_expert, double *imbalance,
                                         int64_t *dropped);

/** How the dispatch that made a handle moved its tokens (hcomm_moe_route_info). */
typedef struct hcomm_moe_route_info {
    int hierarchical;    /**< 1: the per-node path ran, 0: the flat one */
    int nnodes;          /**< nodes the EP group spans (the topology layer's model; 1 if unknown) */
    int token_exchanges; /**< all_to_allv calls moving token rows in the dispatch: 1 flat, 2
                          *   hierarchical, 0 pad-to-capacity (its one exchange carries all) */
    /** Token rows this rank sent to ranks of other nodes in the dispatch: flat, one per (token,
     *  remote rank with a kept slot); hierarchical, one per (token, remote node). */
    int64_t internode_rows;
} hcomm_moe_route_info_t;

/** Fills @p info for the dispatch that made @p handle. Local, thread-safe. Errors:
 *  HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_moe_route_info(const hcomm_moe_handle_t *handle,
                                              hcomm_moe_route_info_t *info);

/** Top-k combine: @p expert_out [R, H'] (f16, bf16, f32 or f64; rows in received order) ->
 *  @p out [T, H'] (same dtype), out[t] = sum over j = 0..k-1 of w[t, j] * y[t, j] in slot
 *  order, accumulated in f32 (f64 for f64) and rounded once; a token with no kept slot gets
 *  zeros. Deterministic, independent of the EP size, batch-invariant (dropless). Keeps y in
 *  the handle for hcomm_moe_combine_topk_bwd (unless dispatched with
 *  options->no_weight_grads). Collective (one token exchange).
 *  Errors (rank-local checks fail the peers with HCOMM_ERR_PEER): HCOMM_ERR_NULL, _SHAPE,
 *  _DTYPE (not a float dtype), and the transport's errors. A handle from
 *  hcomm_moe_dispatch works too (k = 1, weight 1), but keeps no y for combine_topk_bwd; the
 *  top-1 passes refuse a top-k handle with HCOMM_ERR_STATE. */
HCOMM_API hcomm_result_t hcomm_moe_combine_topk(hcomm_moe_handle_t *handle,
                                                const hcomm_tensor_t *expert_out,
                                                hcomm_tensor_t *out);

/** Backward of hcomm_moe_combine_topk: @p grad_out [T, H'] -> @p grad_expert_out [R, H']
 *  (row of slot (t, j) = w[t, j] * grad_out[t], rounded once) and, if not NULL,
 *  @p grad_weights [T, k] (f32) = <grad_out[t], y[t, j]> accumulated in f32 (f64 for f64) in
 *  column order, 0 for empty or dropped slots; grad_weights needs a combine with the same H'
 *  before (else HCOMM_ERR_STATE). Collective (one token exchange). Errors: as combine. */
HCOMM_API hcomm_result_t hcomm_moe_combine_topk_bwd(hcomm_moe_handle_t *handle,
                                                    const hcomm_tensor_t *grad_out,
                                                    hcomm_tensor_t *grad_expert_out,
                                                    float *grad_weights);

/** Backward of hcomm_moe_dispatch_topk: @p grad_recv [R, H] -> @p grad_tokens [T, H] (same
 *  float dtype), grad_tokens[t] = sum of the gradients of t's kept slots in slot order
 *  (unweighted, accumulated as in combine; zeros for a token with none). Collective. Errors:
 *  as combine. */
HCOMM_API hcomm_result_t hcomm_moe_dispatch_topk_bwd(hcomm_moe_handle_t *handle,
                                                     const hcomm_tensor_t *grad_recv,
                                                     hcomm_tensor_t *grad_tokens);
/** @} */

/** @name Preallocated worst-case mode
 * A plan fixes max_tokens_per_rank, H, k, E, the dtype and the capacity options once, checked
 * collectively at creation, and sizes one receive buffer for the worst case (every slot of
 * every rank to this rank's experts, or each rank's capacity for each local expert), so a
 * training step allocates nothing for the received rows and capacity needs no all_reduce of
 * the largest T (it comes from max_tokens_per_rank).
 * @{ */

/** What a plan is made for; every rank of the group passes the same values. */
typedef struct hcomm_moe_plan_desc {
    int64_t max_tokens_per_rank; /**< the largest T any dispatch of the plan passes (>= 0) */
    int64_t hidden;              /**< H, elements per token row (>= 1) */
    int k;                       /**< slots per token (>= 1) */
    int num_experts;             /**< E, a positive multiple of the group size */
    hcomm_dtype_t dtype;         /**< of the tokens */
    /** <= 0: dropless. > 0: capacity = min(ceil(max_tokens_per_rank * k / E *
     *  capacity_factor), max_tokens_per_rank * k) slots per expert and source rank. */
    double capacity_factor;
    hcomm_moe_drop_t drop_policy; /**< which slots to keep past capacity */
    /** Non-zero: pad-to-capacity (GShard's static shapes; needs capacity_factor > 0). Every
     *  local expert receives exactly capacity rows from every rank, R = E / P * P * capacity
     *  rows [local expert][source rank][capacity], the kept slots first (token, then slot
     *  order) and zero rows after them; no count exchange: a dispatch is one all_to_all of
     *  fixed blocks that carry the checks and statistics too. Combine ignores padding rows;
     *  the backward passes take and give [R, H'] with zeros in them. */
    int pad_to_capacity;
} hcomm_moe_plan_desc_t;

/** Preallocated dispatch state. Opaque. */
typedef struct hcomm_moe_plan hcomm_moe_plan_t;

/** Creates a plan over @p ep_group from @p desc. Collective over ep_group (one all_gather of
 *  eight int64 per rank). Every rank checks its own desc (HCOMM_ERR_NULL, _INVALID_ARG, _DTYPE,
 *  as hcomm_moe_dispatch_topk words them) and then every rank compares all of them: a rank
 *  whose checks failed returns its own error and the others HCOMM_ERR_PEER; ranks that disagree
 *  all fail with HCOMM_ERR_MISMATCH naming the field, both values and both ranks, e.g.
 *  "hcomm_moe_plan_create: hidden=8 on rank 0 but hidden=6 on rank 2". Also HCOMM_ERR_NOMEM
 *  (the buffer: ep size x max_tokens_per_rank x k rows of H, fewer with capacity) and the
 *  transport's errors. *plan is NULL after any failure. The plan keeps ep_group: free the plan
 *  before the group. Not thread-safe per group. */
HCOMM_API hcomm_result_t hcomm_moe_plan_create(hcomm_comm_t *ep_group,
                                               const hcomm_moe_plan_desc_t *desc,
                                               hcomm_moe_plan_t **plan);

/** hcomm_moe_dispatch_topk with the plan's k, E and capacity into the plan's buffer:
 *  @p tokens [T, H] with T <= max_tokens_per_rank and the plan's H and dtype; a rank that
 *  passes more tokens (or another H or dtype) fails with HCOMM_ERR_SHAPE, and every other rank
 *  with HCOMM_ERR_PEER, in the count exchange (no hang, the group stays usable). One count
 *  exchange and one token exchange, also in capacity mode. *handle belongs to the plan: it is
 *  valid until the next hcomm_moe_plan_dispatch on the plan or hcomm_moe_plan_free, every
 *  pass and reader takes it, and hcomm_moe_handle_free on it does nothing. Collective over the
 *  plan's group. Errors: as hcomm_moe_dispatch_topk. */
HCOMM_API hcomm_result_t hcomm_moe_plan_dispatch(hcomm_moe_plan_t *plan,
                                                 const hcomm_tensor_t *tokens,
                                                 const int32_t *topk_ids, const float *topk_weights,
                                                 hcomm_moe_handle_t **handle);

/** Frees @p plan, its buffer and its handle (NULL is a no-op). Local; no call may be using the
 *  plan or its handle. Returns HCOMM_OK. */
HCOMM_API hcomm_result_t hcomm_moe_plan_free(hcomm_moe_plan_t *plan);

/** Frees @p handle (NULL is a no-op; a plan's handle stays with its plan). Local; no call may be
 *  using the handle. Always returns HCOMM_OK. */
HCOMM_API hcomm_result_t hcomm_moe_handle_free(hcomm_moe_handle_t *handle);
/** @} */

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_MOE_H_ */
