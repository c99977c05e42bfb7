/* Rank layout of a job, as Megatron-Core's RankGenerator computes it
 * (megatron/core/parallel_state.py, generate_masked_orthogonal_rank_groups): pure arithmetic,
 * no communication, so hcomm_ctx_create() and hcomm_plan_groups() share one definition.
 *
 * A grid lists the five axes fastest-varying first; a world rank's coordinates are its
 * mixed-radix digits in that order. The group of a set of axes (the "mask") holds the ranks
 * that agree on every other axis; its index counts the other axes and a member's position
 * counts the masked axes, first axis fastest. Every call is O(axes), so listing all groups
 * of a kind is O(world). */
#ifndef HCOMM_C_DOMAIN_RANKGEN_H_
#define HCOMM_C_DOMAIN_RANKGEN_H_

#include "core/internal.h"
#include "hcomm/domain.h"

#define HCOMM__NUM_AXES 5
/* A grid splits dp into its shard digit (kept as HCOMM__AXIS_DP) and, right after it, the
 * replica digit (HCOMM__AXIS_DPR): dp index = shard + dp_shard * replica, so the rank
 * numbering is that of the five-axis grid. */
#define HCOMM__GRID_AXES 6
/* Longest valid order string: five two-letter axes and four dashes, plus the terminator. */
#define HCOMM__ORDER_CAP 16

typedef enum hcomm__axis {
    HCOMM__AXIS_TP = 0,
    HCOMM__AXIS_CP,
    HCOMM__AXIS_EP,
    HCOMM__AXIS_DP,
    HCOMM__AXIS_PP,
    HCOMM__AXIS_DPR /* grids only: the HSDP replica digit of dp */
} hcomm__axis_t;

/* One grid: position i (fastest first) holds axis[i] with extent size[i]; stride[i] is the
 * product of the extents before it. */
typedef struct hcomm__grid {
    int axis[HCOMM__GRID_AXES];
    int size[HCOMM__GRID_AXES];
    int stride[HCOMM__GRID_AXES];
} hcomm__grid_t;

/* A validated job layout: the dense grid (tp, cp, ep=1, dp, pp) and the expert grid
 * (etp, cp=1, ep, edp, pp), both in the order the user gave. */
typedef struct hcomm__layout {
    hcomm_parallel_config_t cfg; /* every default explicit; cfg.order is NOT set (see order) */
    int world;
    int edp;                      /* expert data parallel size: world / (etp * ep * pp) */
    int dp_replicate;             /* dp / dp_shard: HSDP replicas, on both grids */
    char order[HCOMM__ORDER_CAP]; /* the order as given (or the default), validated */
    hcomm__grid_t dense, expert;
} hcomm__layout_t;

/* The order used when the config's order is NULL. */
extern const char hcomm__default_order[];

/* Validates cfg for a world of world_size ranks and builds both grids. Failures are
 * HCOMM_ERR_INVALID_ARG with a message under the name fn (the public caller). */
hcomm_result_t hcomm__layout_init(const char *fn, const hcomm_parallel_config_t *cfg,
                                  int world_size, hcomm__layout_t *out);
/* Number of groups of kind and ranks per group (kind must be valid). */
void hcomm__layout_shape(const hcomm__layout_t *l, hcomm_group_kind_t kind, int *num_groups,
                         int *group_size);
/* Index of rank's group of kind and its position in it; *pos = -1 when rank is in no group
 * of that kind (embedding, middle pipeline stages). */
void hcomm__layout_locate(const hcomm__layout_t *l, hcomm_group_kind_t kind, int rank, int *group,
                          int *pos);
/* Writes all groups of kind into ranks[num_groups * group_size], groups in Megatron order. */
void hcomm__layout_groups(const hcomm__layout_t *l, hcomm_group_kind_t kind, int *ranks);
/* HCOMM_ERR_INVALID_ARG (under the name fn) unless kind is a valid group kind. */
hcomm_result_t hcomm__kind_check(const char *fn, hcomm_group_kind_t kind);
/* Coordinates of rank on the dense (expert = false) or expert grid, indexed by axis. */
void hcomm__layout_coords(const hcomm__layout_t *l, bool expert, int rank,
                          int coords[HCOMM__NUM_AXES]);

#endif /* HCOMM_C_DOMAIN_RANKGEN_H_ */
