/**
 * @file domain.h
 * @brief The domain manager: builds every parallel group of a job in one call.
 *
 * Layout follows Megatron-Core's RankGenerator (megatron/core/parallel_state.py): the order
 * string lists the axes fastest-varying first; a rank's coordinates are its mixed-radix
 * digits in that order; the group for a set of axes holds all ranks that agree on every
 * other axis; groups are listed by counting the other axes and members by counting the
 * grouped axes, first axis fastest. Dense layers use the grid (tp, cp, ep=1, dp, pp); expert
 * layers use (etp, cp=1, ep, edp = world/(etp*ep*pp), pp) in the same order.
 */
#ifndef HCOMM_C_DOMAIN_H_
#define HCOMM_C_DOMAIN_H_

#include "hcomm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The groups a context builds. */
typedef enum hcomm_group_kind {
    HCOMM_GROUP_TP = 0,    /**< tensor parallel */
    HCOMM_GROUP_PP,        /**< pipeline parallel (member i = stage i) */
    HCOMM_GROUP_DP,        /**< data parallel */
    HCOMM_GROUP_CP,        /**< context parallel */
    HCOMM_GROUP_DP_CP,     /**< data x context parallel (gradient reduction of dense params) */
    HCOMM_GROUP_TP_PP,     /**< model parallel (tensor x pipeline) */
    HCOMM_GROUP_EP,        /**< expert parallel */
    HCOMM_GROUP_ETP,       /**< expert tensor parallel */
    HCOMM_GROUP_EDP,       /**< expert data parallel */
    HCOMM_GROUP_EMBEDDING, /**< first and last pipeline stage (one rank if pp == 1) */
    HCOMM_GROUP_COUNT
} hcomm_group_kind_t;

/** Parallel sizes. A size of 0 means "default": tp, pp, cp, ep default to 1, etp to tp,
 *  dp to world/(tp*pp*cp). num_experts 0 means no MoE check. order NULL means
 *  "tp-cp-ep-dp-pp"; it must name each of tp, cp, ep, dp, pp at most once, separated by '-';
 *  an axis of size 1 may be left out. */
typedef struct hcomm_parallel_config {
    int tp, pp, dp, cp, ep, etp;
    int num_experts;
    const char *order;
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
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (non-positive or non-multiplying sizes,
 *  unknown/repeated axis in order, a size > 1 missing from order, experts not divisible
 *  by ep, etp*ep*pp not dividing the world). Thread-safe. */
HCOMM_API hcomm_result_t hcomm_parallel_config_resolve(const hcomm_parallel_config_t *cfg,
                                                       int world_size,
                                                       hcomm_parallel_config_t *resolved);

/** Computes all groups of @p kind for a world of @p world_size with @p cfg, without
 *  communication (what hcomm-plan prints). @p out->ranks is malloc'ed; free it with
 *  hcomm_group_list_free(). Errors: those of hcomm_parallel_config_resolve(),
 *  HCOMM_ERR_NOMEM. Thread-safe. */
HCOMM_API hcomm_result_t hcomm_plan_groups(const hcomm_parallel_config_t *cfg, int world_size,
                                           hcomm_group_kind_t kind, hcomm_group_list_t *out);
/** Frees what hcomm_plan_groups() allocated; NULL or an empty list is a no-op. */
HCOMM_API hcomm_result_t hcomm_group_list_free(hcomm_group_list_t *list);
/** Lower-case name of @p kind ("tp", "dp_cp", "embedding", ...). Errors: HCOMM_ERR_NULL,
 *  HCOMM_ERR_INVALID_ARG. */
HCOMM_API hcomm_result_t hcomm_group_kind_name(hcomm_group_kind_t kind, const char **name);

/** Builds every group of the job over @p world. Collective over @p world: every rank calls it
 *  with the same @p cfg (checked: ranks whose resolved config differs from their peers' get
 *  HCOMM_ERR_MISMATCH). On any error nothing is left allocated and *out is NULL. One live
 *  context per communicator: a second create on the same @p world before hcomm_ctx_destroy
 *  fails with HCOMM_ERR_STATE; contexts on different communicators (e.g. a split) may coexist.
 *  Errors: those of hcomm_parallel_config_resolve(), HCOMM_ERR_NULL, HCOMM_ERR_STATE,
 *  HCOMM_ERR_MISMATCH, HCOMM_ERR_BACKEND, HCOMM_ERR_NOMEM, HCOMM_ERR_TIMEOUT. */
HCOMM_API hcomm_result_t hcomm_ctx_create(hcomm_comm_t *world, const hcomm_parallel_config_t *cfg,
                                          hcomm_ctx_t **out);
/** Frees @p ctx and every communicator it built (NULL is a no-op). Collective over the world
 *  the context was made from. */
HCOMM_API hcomm_result_t hcomm_ctx_destroy(hcomm_ctx_t *ctx);
/** The communicator of this rank's group of @p kind (owned by @p ctx). Errors: HCOMM_ERR_NULL,
 *  HCOMM_ERR_INVALID_ARG (kind), HCOMM_ERR_GROUP (this rank is in no embedding group: pp > 1
 *  and it is neither the first nor the last stage). Thread-safe. */
HCOMM_API hcomm_result_t hcomm_ctx_group(const hcomm_ctx_t *ctx, hcomm_group_kind_t kind,
                                         hcomm_comm_t **group);
/** This rank's resolved configuration. Errors: HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_ctx_config(const hcomm_ctx_t *ctx, hcomm_parallel_config_t *cfg);
/** Rank and size of this rank in the group of @p kind. Errors: as hcomm_ctx_group(). */
HCOMM_API hcomm_result_t hcomm_ctx_rank(const hcomm_ctx_t *ctx, hcomm_group_kind_t kind, int *rank,
                                        int *size);
/** Previous and next pipeline stage of this rank, as ranks in the PP group, or -1 at the first
 *  / last stage. Errors: HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_ctx_pp_neighbors(const hcomm_ctx_t *ctx, int *prev, int *next);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_DOMAIN_H_ */
