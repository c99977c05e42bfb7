/**
 * @file domain.h
 * @brief The domain manager: builds every parallel group of a job in one call.
 *
 * Layout follows Megatron-Core's RankGenerator (megatron/core/parallel_state.py): the order
 * string lists the axes fastest-varying first; a rank's coordinates are its mixed-radix
 * digits in that order; the group for a set of axes holds all ranks that agree on every
 * other axis; groups are listed by counting the other axes and members by counting the
 * grouped axes, first axis fastest. Dense layers use the grid (tp, cp, ep=1, dp, pp); expert
 * layers use (etp, cp=1, ep, edp = world/(etp*ep*pp), pp) in the same order. Sizes count ranks;
 * group lists hold ranks 0..world_size-1 of the world they were computed for.
 *
 * Only hcomm_ctx_create(), hcomm_ctx_rebuild() and hcomm_ctx_destroy() communicate; every other
 * function is local to the calling rank and thread-safe (the ctx accessors only read the context).
 */
#ifndef HCOMM_C_DOMAIN_H_
#define HCOMM_C_DOMAIN_H_

#include "hcomm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The groups a context builds. */
typedef enum hcomm_group_kind {
    HCOMM_GROUP_TP = 0,        /**< tensor parallel */
    HCOMM_GROUP_PP,            /**< pipeline parallel (member i = stage i) */
    HCOMM_GROUP_DP,            /**< data parallel */
    HCOMM_GROUP_CP,            /**< context parallel */
    HCOMM_GROUP_DP_CP,         /**< data x context parallel (gradient reduction of dense params) */
    HCOMM_GROUP_TP_PP,         /**< model parallel (tensor x pipeline) */
    HCOMM_GROUP_EP,            /**< expert parallel */
    HCOMM_GROUP_ETP,           /**< expert tensor parallel */
    HCOMM_GROUP_EDP,           /**< expert data parallel */
    HCOMM_GROUP_EMBEDDING,     /**< first and last pipeline stage (one rank if pp == 1) */
    HCOMM_GROUP_DP_SHARD,      /**< ZeRO/FSDP shard group of dense params: dp_shard x cp */
    HCOMM_GROUP_DP_REPLICATE,  /**< HSDP replicas of a dense shard (dp / dp_shard ranks) */
    HCOMM_GROUP_EDP_SHARD,     /**< shard group of expert params: edp / dp_replicate ranks */
    HCOMM_GROUP_EDP_REPLICATE, /**< HSDP replicas of an expert shard (dp_replicate ranks) */
    HCOMM_GROUP_COUNT
} hcomm_group_kind_t;

/** Parallel sizes. A size of 0 means "default": tp, pp, cp, ep default to 1, etp to tp,
 *  dp to world/(tp*pp*cp), dp_shard to dp. num_experts 0 means no MoE check. order NULL means
 *  "tp-cp-ep-dp-pp"; it must name each of tp, cp, ep, dp, pp at most once, separated by '-';
 *  an axis of size 1 may be left out.
 *
 *  Sharded data parallel (ZeRO, FSDP, HSDP): dp = dp_shard x dp_replicate with the shard index
 *  innermost, as torchtitan and Megatron-FSDP lay it out (a rank's dp index d has shard index
 *  d % dp_shard and replica index d / dp_shard). Dense parameters shard over dp_shard x cp
 *  (HCOMM_GROUP_DP_SHARD, Megatron's DP x CP) and replicate over dp_replicate ranks; expert
 *  parameters keep the same replica count, so they shard over edp / dp_replicate ranks of their
 *  EDP group (HCOMM_GROUP_EDP_SHARD), which dp_replicate must divide. dp_shard == dp (the
 *  default) is plain ZeRO/FSDP: every replicate group has one rank. */
typedef struct hcomm_parallel_config {
    int tp, pp, dp, cp, ep, etp;
    int num_experts;
    const char *order;
    int dp_shard; /**< ranks of a DP group sharing one copy of the state; divides dp */
} hcomm_parallel_config_t;

/** A rank's view of every group of the job. Opaque. */
typedef struct hcomm_ctx hcomm_ctx_t;

/** Group lists for one kind, as computed without any communication. */
typedef struct hcomm_group_list {
    int num_groups; /**< number of groups */
    int group_size; /**< ranks in each group */
    int *ranks;     /**< [num_groups][group_size] world ranks, groups in Megatron order */
} hcomm_group_list_t;

/** Checks @p cfg against @p world_size and fills @p *resolved with every default made
 *  explicit (order copied by pointer; a NULL order becomes the static default string).
 *  Local, thread-safe. Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (world_size < 1, negative
 *  or non-multiplying sizes, unknown/repeated axis in order, a size > 1 missing from order,
 *  num_experts not divisible by ep, etp*ep*pp not dividing the world, and Megatron-Core's
 *  pipeline checks for pp > 1: an order not ending in pp needs edp == dp, and expert layers
 *  must get the same pipeline groups as dense ones; dp_shard not dividing dp, and
 *  dp_replicate = dp / dp_shard not dividing edp). */
HCOMM_API hcomm_result_t hcomm_parallel_config_resolve(const hcomm_parallel_config_t *cfg,
                                                       int world_size,
                                                       hcomm_parallel_config_t *resolved);

/** Computes all groups of @p kind for a world of @p world_size with @p cfg, without
 *  communication (what hcomm-plan prints). @p out->ranks is malloc'ed; free it with
 *  hcomm_group_list_free(). On failure *out is empty. Local, thread-safe. Errors: those of
 *  hcomm_parallel_config_resolve(), HCOMM_ERR_INVALID_ARG (kind), HCOMM_ERR_NOMEM. */
HCOMM_API hcomm_result_t hcomm_plan_groups(const hcomm_parallel_config_t *cfg, int world_size,
                                           hcomm_group_kind_t kind, hcomm_group_list_t *out);
/** Frees what hcomm_plan_groups() allocated and empties @p list; NULL or an empty list is a
 *  no-op. Local; thread-safe for distinct lists. Always returns HCOMM_OK. */
HCOMM_API hcomm_result_t hcomm_group_list_free(hcomm_group_list_t *list);
/** Lower-case name of @p kind ("tp", "dp_cp", "embedding", ...; a static string). Local,
 *  thread-safe. Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (kind). */
HCOMM_API hcomm_result_t hcomm_group_kind_name(hcomm_group_kind_t kind, const char **name);

/** Builds every group of the job over @p world (one hcomm_comm_split() per group kind).
 *  Collective over @p world: every rank calls it with the same @p cfg, checked with one
 *  all_reduce: if the resolved configs differ, every rank gets HCOMM_ERR_MISMATCH; a rank whose
 *  cfg is invalid gets that error and its peers HCOMM_ERR_MISMATCH. On any error nothing is
 *  left allocated and *out is NULL. One live context per communicator: a second create on the
 *  same @p world before hcomm_ctx_destroy fails with HCOMM_ERR_STATE; contexts on different
 *  communicators (e.g. a split) may coexist. No other call may use @p world meanwhile.
 *  Errors: those of hcomm_parallel_config_resolve(), HCOMM_ERR_NULL, HCOMM_ERR_STATE,
 *  HCOMM_ERR_MISMATCH, HCOMM_ERR_NOMEM, HCOMM_ERR_TIMEOUT, HCOMM_ERR_ABORTED,
 *  HCOMM_ERR_BACKEND. */
HCOMM_API hcomm_result_t hcomm_ctx_create(hcomm_comm_t *world, const hcomm_parallel_config_t *cfg,
                                          hcomm_ctx_t **out);
/** Frees @p ctx and every communicator it built (NULL is a no-op); @p world may then take a
 *  new context. Collective over the world the context was made from; no call may be in flight
 *  on its groups. Always returns HCOMM_OK. */
HCOMM_API hcomm_result_t hcomm_ctx_destroy(hcomm_ctx_t *ctx);
/** Revokes every group of @p ctx and the world it was built on (hcomm_comm_revoke, fault.h):
 *  the way a rank that found a peer lost releases the peers that wait on it in any group.
 *  Local. Errors: HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_ctx_revoke(hcomm_ctx_t *ctx);
/** Rebuilds @p ctx's groups on @p shrunk, the survivors of its world (hcomm_comm_shrink of
 *  that world): the same tp, pp, ep, cp and order, and dp lowered to the data-parallel
 *  replicas that kept every member. A replica is one DP rank's slice of the grid (tp x cp x pp
 *  ranks) when dp_shard = dp (replicated data parallelism, the default), else one shard group
 *  (HSDP: dp_shard DP ranks). The survivors of a replica that lost a member get *@p out =
 *  NULL and HCOMM_OK: they are not in the new context and should end. Ranks keep their order
 *  (new world rank = rank among the kept survivors). The new context owns its world
 *  (hcomm_ctx_destroy frees it); destroy @p ctx too, on every survivor. Collective over
 *  @p shrunk. Errors: HCOMM_ERR_NULL, HCOMM_ERR_STATE (no replica kept every member: restart
 *  from a checkpoint), HCOMM_ERR_INVALID_ARG (the smaller dp does not fit the config, e.g.
 *  ep or dp_replicate not dividing it), and those of hcomm_ctx_create(). */
HCOMM_API hcomm_result_t hcomm_ctx_rebuild(hcomm_ctx_t *ctx, hcomm_comm_t *shrunk,
                                           hcomm_ctx_t **out);
/** The communicator of this rank's group of @p kind (owned by @p ctx: do not destroy it).
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (kind), HCOMM_ERR_GROUP (this rank is in no
 *  embedding group: pp > 1 and it is neither the first nor the last stage). Thread-safe. */
HCOMM_API hcomm_result_t hcomm_ctx_group(const hcomm_ctx_t *ctx, hcomm_group_kind_t kind,
                                         hcomm_comm_t **group);
/** The resolved configuration, every default explicit; cfg->order points into @p ctx (valid
 *  until hcomm_ctx_destroy). Errors: HCOMM_ERR_NULL. Thread-safe. */
HCOMM_API hcomm_result_t hcomm_ctx_config(const hcomm_ctx_t *ctx, hcomm_parallel_config_t *cfg);
/** The communicator @p ctx was built on: the world given to hcomm_ctx_create(), or the one
 *  hcomm_ctx_rebuild() made (owned by @p ctx). Errors: HCOMM_ERR_NULL. Thread-safe. */
HCOMM_API hcomm_result_t hcomm_ctx_world(const hcomm_ctx_t *ctx, hcomm_comm_t **world);
/** Rank and size of this rank in the group of @p kind. Errors: as hcomm_ctx_group().
 *  Thread-safe. */
HCOMM_API hcomm_result_t hcomm_ctx_rank(const hcomm_ctx_t *ctx, hcomm_group_kind_t kind, int *rank,
                                        int *size);
/** Previous and next pipeline stage of this rank, as ranks in the PP group, or -1 at the first
 *  / last stage. Errors: HCOMM_ERR_NULL. Thread-safe. */
HCOMM_API hcomm_result_t hcomm_ctx_pp_neighbors(const hcomm_ctx_t *ctx, int *prev, int *next);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_DOMAIN_H_ */
