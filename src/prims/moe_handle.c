/* The routing handle of a dispatch: its allocation and release, the group's statistics, and
 * what callers read from it (received rows, expert offsets, drops, statistics, the route). */
#include "prims/moe_common.h"

#include <string.h>

hcomm_moe_handle_t *hcomm__moe_handle_alloc(hcomm_comm_t *g, int num_local, int64_t n, int k) {
    hcomm_moe_handle_t *h = calloc(1, sizeof *h);
    if (h == NULL)
        return NULL;
    size_t p = (size_t)g->size, slots = (size_t)(n * k);
    *h = (hcomm_moe_handle_t){.group = g,
                              .pool = hcomm__moe_pool_of(g),
                              .size = g->size,
                              .num_local = num_local,
                              .n = n,
                              .k = k,
                              .capacity = -1};
    if (h->pool == NULL) {
        free(h);
        return NULL;
    }
    hcomm__moe_pool_ref(h->pool);
    h->send_rows = hcomm__moe_alloc_i64(p);
    h->send_off = hcomm__moe_alloc_i64(p);
    h->pair_rows = hcomm__moe_alloc_i64(p);
    h->pair_off = hcomm__moe_alloc_i64(p);
    h->recv_rows = hcomm__moe_alloc_i64(p);
    h->recv_off = hcomm__moe_alloc_i64(p);
    h->rpair_rows = hcomm__moe_alloc_i64(p);
    h->rpair_off = hcomm__moe_alloc_i64(p);
    h->slot_pair = hcomm__moe_alloc_i64(slots);
    h->dropped = hcomm__moe_alloc_i64(p * (size_t)num_local);
    h->global_count = hcomm__moe_alloc_i64(p * (size_t)num_local);
    h->expert_off = hcomm__moe_alloc_i64((size_t)num_local + 1);
    h->weights = malloc(sizeof(float) * (slots ? slots : 1));
    if (!h->send_rows || !h->send_off || !h->pair_rows || !h->pair_off || !h->recv_rows ||
        !h->recv_off || !h->rpair_rows || !h->rpair_off || !h->slot_pair || !h->dropped ||
        !h->global_count || !h->expert_off || !h->weights) {
        hcomm__moe_handle_release(h);
        return NULL;
    }
    return h;
}

hcomm_result_t hcomm_moe_handle_free(hcomm_moe_handle_t *handle) {
    if (handle != NULL && handle->plan == NULL) /* a plan's handle lives as long as the plan */
        hcomm__moe_handle_release(handle);
    return HCOMM_OK;
}

void hcomm__moe_handle_release(hcomm_moe_handle_t *handle) {
    if (handle == NULL)
        return;
    void *owned[] = {
        handle->send_rows,    handle->send_off,  handle->send_tok,   handle->pair_rows,
        handle->pair_off,     handle->pair_slot, handle->slot_pair,  handle->weights,
        handle->dropped,      handle->recv_rows, handle->recv_off,   handle->rpair_rows,
        handle->rpair_off,    handle->rpair_row, handle->out_pair,   handle->expert_off,
        handle->global_count, handle->etp_rows,  handle->etp_perm,   handle->relay_rows,
        handle->src_k,        handle->ids,       handle->pair_remote};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
        free(owned[i]);
    if (handle->plan == NULL)
        hcomm__moe_pool_put(handle->pool, handle->recv);
    hcomm__moe_pool_put(handle->pool, handle->y);
    hcomm__moe_pool_unref(handle->pool);
    free(handle);
}

/* The group's statistics: the sum of every source's counts and drops. */
void hcomm__moe_add_stats(hcomm_moe_handle_t *h, const int64_t *m) {
    h->global_dropped += m[META_DROPPED];
    for (int e = 0; e < h->size * h->num_local; e++)
        h->global_count[e] += m[META_COUNTS + e];
}

/* ---- reading the handle ---- */

hcomm_result_t hcomm_moe_received(const hcomm_moe_handle_t *handle, hcomm_tensor_t *recv,
                                  int64_t *tokens_per_expert) {
    HCOMM__CHECK_NULL(handle);
    HCOMM__CHECK_NULL(recv);
    *recv = (hcomm_tensor_t){.data = handle->recv, .dtype = handle->dtype, .ndim = 2};
    recv->shape[0] = handle->r_all;
    recv->shape[1] = handle->h;
    for (int l = 0; tokens_per_expert && l < handle->num_local; l++)
        tokens_per_expert[l] = handle->expert_off[l + 1] - handle->expert_off[l];
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_expert_offsets(const hcomm_moe_handle_t *handle, int64_t *offsets) {
    HCOMM__CHECK_NULL(handle);
    HCOMM__CHECK_NULL(offsets);
    memcpy(offsets, handle->expert_off, sizeof(int64_t) * (size_t)(handle->num_local + 1));
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_dropped(const hcomm_moe_handle_t *handle, int64_t *dropped_per_expert,
                                 int64_t *total, int64_t *capacity) {
    HCOMM__CHECK_NULL(handle);
    int e_all = handle->size * handle->num_local;
    int64_t sum = 0;
    for (int e = 0; e < e_all; e++)
        sum += handle->dropped[e];
    if (dropped_per_expert)
        memcpy(dropped_per_expert, handle->dropped, sizeof(int64_t) * (size_t)e_all);
    if (total)
        *total = sum;
    if (capacity)
        *capacity = handle->capacity;
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_stats(const hcomm_moe_handle_t *handle, int64_t *tokens_per_expert,
                               double *imbalance, int64_t *dropped) {
    HCOMM__CHECK_NULL(handle);
    int e_all = handle->size * handle->num_local;
    int64_t sum = 0, max = 0;
    for (int e = 0; e < e_all; e++) {
        sum += handle->global_count[e];
        max = handle->global_count[e] > max ? handle->global_count[e] : max;
    }
    if (tokens_per_expert)
        memcpy(tokens_per_expert, handle->global_count, sizeof(int64_t) * (size_t)e_all);
    if (imbalance) /* max / mean, mean = sum / E */
        *imbalance = sum > 0 ? (double)max * e_all / (double)sum : 0.0;
    if (dropped)
        *dropped = handle->global_dropped;
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_route_info(const hcomm_moe_handle_t *handle,
                                    hcomm_moe_route_info_t *info) {
    HCOMM__CHECK_NULL(handle);
    HCOMM__CHECK_NULL(info);
    *info = (hcomm_moe_route_info_t){.hierarchical = handle->hier,
                                     .nnodes = handle->nnodes > 0 ? handle->nnodes : 1,
                                     .token_exchanges = handle->pad    ? 0
                                                        : handle->hier ? 2
                                                                       : 1,
                                     .internode_rows = handle->internode_rows};
    return HCOMM_OK;
}
