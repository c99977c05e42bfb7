/* The communication-free half of the domain API: config resolution, group lists (what
 * hcomm-plan prints) and group kind names. */
#include "domain/rankgen.h"

#include <stdlib.h>

static const char *const kind_names[HCOMM_GROUP_COUNT] = {
    [HCOMM_GROUP_TP] = "tp",
    [HCOMM_GROUP_PP] = "pp",
    [HCOMM_GROUP_DP] = "dp",
    [HCOMM_GROUP_CP] = "cp",
    [HCOMM_GROUP_DP_CP] = "dp_cp",
    [HCOMM_GROUP_TP_PP] = "tp_pp",
    [HCOMM_GROUP_EP] = "ep",
    [HCOMM_GROUP_ETP] = "etp",
    [HCOMM_GROUP_EDP] = "edp",
    [HCOMM_GROUP_EMBEDDING] = "embedding",
    [HCOMM_GROUP_DP_SHARD] = "dp_shard",
    [HCOMM_GROUP_DP_REPLICATE] = "dp_replicate",
    [HCOMM_GROUP_EDP_SHARD] = "edp_shard",
    [HCOMM_GROUP_EDP_REPLICATE] = "edp_replicate",
};

hcomm_result_t hcomm_parallel_config_resolve(const hcomm_parallel_config_t *cfg, int world_size,
                                             hcomm_parallel_config_t *resolved) {
    HCOMM__CHECK_NULL(cfg);
    HCOMM__CHECK_NULL(resolved);
    hcomm__layout_t l;
    HCOMM__TRY(hcomm__layout_init(__func__, cfg, world_size, &l));
    *resolved = l.cfg;
    resolved->order = cfg->order ? cfg->order : hcomm__default_order;
    return HCOMM_OK;
}

hcomm_result_t hcomm_plan_groups(const hcomm_parallel_config_t *cfg, int world_size,
                                 hcomm_group_kind_t kind, hcomm_group_list_t *out) {
    HCOMM__CHECK_NULL(out);
    *out = (hcomm_group_list_t){0, 0, NULL};
    HCOMM__CHECK_NULL(cfg);
    HCOMM__TRY(hcomm__kind_check(__func__, kind));
    hcomm__layout_t l;
    HCOMM__TRY(hcomm__layout_init(__func__, cfg, world_size, &l));
    int num_groups = 0, group_size = 0;
    hcomm__layout_shape(&l, kind, &num_groups, &group_size);
    size_t n = (size_t)num_groups * (size_t)group_size;
    int *ranks = malloc(sizeof(int) * n);
    if (!ranks)
        return hcomm__err(HCOMM_ERR_NOMEM, __func__, "cannot allocate %zu ranks for kind %s", n,
                          kind_names[kind]);
    hcomm__layout_groups(&l, kind, ranks);
    *out = (hcomm_group_list_t){num_groups, group_size, ranks};
    return HCOMM_OK;
}

hcomm_result_t hcomm_group_list_free(hcomm_group_list_t *list) {
    if (!list)
        return HCOMM_OK;
    free(list->ranks);
    *list = (hcomm_group_list_t){0, 0, NULL};
    return HCOMM_OK;
}

hcomm_result_t hcomm_group_kind_name(hcomm_group_kind_t kind, const char **name) {
    HCOMM__CHECK_NULL(name);
    HCOMM__TRY(hcomm__kind_check(__func__, kind));
    *name = kind_names[kind];
    return HCOMM_OK;
}
