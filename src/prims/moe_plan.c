/* Preallocated MoE dispatch: a plan fixes max_tokens_per_rank, H, k, E, the dtype and the
 * capacity options once, checked on every rank with one all_gather, and owns the worst-case
 * receive buffer and the handle its dispatches reuse (the dispatch itself is moe_dispatch.c's). */
#include "prims/moe_common.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The row each rank contributes to the creation check: its own check status, then the fields
 * every rank must agree on. */
enum { PL_STATUS, PL_MAX_T, PL_HIDDEN, PL_K, PL_E, PL_DTYPE, PL_CF, PL_POLICY, PL_PAD, PL_FIELDS };
static const char *const pl_names[PL_FIELDS] = {"",
                                                "max_tokens_per_rank",
                                                "hidden",
                                                "k",
                                                "num_experts",
                                                "dtype",
                                                "capacity_factor",
                                                "drop_policy",
                                                "pad_to_capacity"};

static hcomm_result_t check_plan_desc(const char *fn, const hcomm_moe_plan_desc_t *d, int size) {
    if (d->max_tokens_per_rank < 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "desc->max_tokens_per_rank=%lld, expected >= 0",
                          (long long)d->max_tokens_per_rank);
    if (d->hidden < 1)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "desc->hidden=%lld, expected >= 1",
                          (long long)d->hidden);
    if (!hcomm__dtype_valid(d->dtype))
        return hcomm__err(HCOMM_ERR_DTYPE, fn, "desc->dtype=%d is not a hcomm dtype",
                          (int)d->dtype);
    hcomm_moe_options_t o = {d->capacity_factor, d->drop_policy};
    HCOMM__TRY(hcomm__moe_check_options(fn, &o));
    if (d->pad_to_capacity && !(d->capacity_factor > 0))
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "desc->pad_to_capacity=%d needs desc->capacity_factor > 0 (it is %g)",
                          d->pad_to_capacity, d->capacity_factor);
    return hcomm__moe_check_layout_args(fn, 0, d->k, d->num_experts, size);
}

static void plan_row(const hcomm_moe_plan_desc_t *d, hcomm_result_t status, int64_t *row) {
    memset(row, 0, sizeof(int64_t) * PL_FIELDS);
    row[PL_STATUS] = status;
    if (d == NULL)
        return;
    int64_t cf;
    memcpy(&cf, &d->capacity_factor, sizeof cf);
    int64_t v[PL_FIELDS] = {status, d->max_tokens_per_rank, d->hidden,
                            d->k,   d->num_experts,         d->dtype,
                            cf,     d->drop_policy,         d->pad_to_capacity};
    memcpy(row, v, sizeof v);
}

static void field_text(int f, int64_t v, char *buf, size_t cap) {
    double cf;
    memcpy(&cf, &v, sizeof cf);
    if (f == PL_DTYPE)
        snprintf(buf, cap, "%s", hcomm__dtype_str((hcomm_dtype_t)v));
    else if (f == PL_CF)
        snprintf(buf, cap, "%g", cf);
    else
        snprintf(buf, cap, "%lld", (long long)v);
}

/* Every rank sees every row, so every rank reaches the same verdict and the same message. */
static hcomm_result_t plan_verdict(const char *fn, const int64_t *rows, int size, int me) {
    for (int r = 0; r < size; r++)
        if (r != me && rows[r * PL_FIELDS + PL_STATUS] != HCOMM_OK)
            return hcomm__err(HCOMM_ERR_PEER, fn, "rank %d of ep_group failed its checks with %s",
                              r, hcomm_result_name((hcomm_result_t)rows[r * PL_FIELDS]));
    for (int f = PL_MAX_T; f < PL_FIELDS; f++)
        for (int r = 1; r < size; r++)
            if (rows[r * PL_FIELDS + f] != rows[f]) {
                char a[32], b[32];
                field_text(f, rows[f], a, sizeof a);
                field_text(f, rows[r * PL_FIELDS + f], b, sizeof b);
                return hcomm__err(HCOMM_ERR_MISMATCH, fn, "%s=%s on rank 0 but %s=%s on rank %d",
                                  pl_names[f], a, pl_names[f], b, r);
            }
    return HCOMM_OK;
}

/* The worst case of one rank's receive: every slot of every source to its experts, or each
 * source's capacity for each of its experts. */
static hcomm_result_t plan_buffer(const char *fn, hcomm_moe_plan_t *pl) {
    const hcomm_moe_plan_desc_t *d = &pl->d;
    int size = pl->group->size, num_local = d->num_experts / size;
    pl->capacity = -1;
    if (d->capacity_factor > 0) {
        double cap =
            ceil((double)d->max_tokens_per_rank * d->k / d->num_experts * d->capacity_factor);
        int64_t all = d->max_tokens_per_rank * d->k;
        pl->capacity = cap < (double)all ? (int64_t)cap : all;
    }
    pl->max_rows = (int64_t)size * d->max_tokens_per_rank * d->k;
    if (pl->capacity >= 0 &&
        (d->pad_to_capacity || (int64_t)size * num_local * pl->capacity < pl->max_rows))
        pl->max_rows = (int64_t)size * num_local * pl->capacity; /* padded: exactly this */
    return hcomm__alloc(fn, (size_t)pl->max_rows * (size_t)d->hidden * hcomm__dtype_size(d->dtype),
                        &pl->recv);
}

hcomm_result_t hcomm_moe_plan_create(hcomm_comm_t *ep_group, const hcomm_moe_plan_desc_t *desc,
                                     hcomm_moe_plan_t **plan) {
    if (plan != NULL) /* a NULL one still joins the all_gather, so peers fail with PEER */
        *plan = NULL;
    HCOMM__CHECK_NULL(ep_group);
    int size = ep_group->size;
    hcomm_result_t local =
        plan == NULL   ? hcomm__err(HCOMM_ERR_NULL, __func__, "argument 'plan' is NULL")
        : desc == NULL ? hcomm__err(HCOMM_ERR_NULL, __func__, "argument 'desc' is NULL")
                       : check_plan_desc(__func__, desc, size);
    int64_t mine[PL_FIELDS], *rows = malloc(sizeof(int64_t) * PL_FIELDS * (size_t)size);
    hcomm_moe_plan_t *pl = calloc(1, sizeof *pl);
    if (rows == NULL || pl == NULL) {
        free(rows);
        free(pl);
        return hcomm__err(HCOMM_ERR_NOMEM, __func__, "out of memory for the plan");
    }
    plan_row(desc, local, mine);
    hcomm__enter(ep_group, __func__);
    hcomm_result_t res = hcomm__coll_all_gather(ep_group, mine, rows, sizeof mine);
    if (res == HCOMM_OK)
        res = local != HCOMM_OK ? local : plan_verdict(__func__, rows, size, ep_group->rank);
    res = hcomm__leave(ep_group, res);
    free(rows);
    if (res == HCOMM_OK) {
        pl->group = ep_group;
        pl->d = *desc;
        res = plan_buffer(__func__, pl);
    }
    if (res != HCOMM_OK) {
        hcomm_moe_plan_free(pl);
        return res;
    }
    *plan = pl;
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_plan_dispatch(hcomm_moe_plan_t *plan, const hcomm_tensor_t *tokens,
                                       const int32_t *topk_ids, const float *topk_weights,
                                       hcomm_moe_handle_t **handle) {
    if (handle != NULL) /* a NULL one still joins the call (hcomm__moe_dispatch_call) */
        *handle = NULL;
    HCOMM__CHECK_NULL(plan);
    hcomm__moe_handle_release(plan->handle); /* its buffer is the one this dispatch fills */
    plan->handle = NULL;
    hcomm__moe_args_t a = {.fn = __func__,
                           .tokens = tokens,
                           .ids = topk_ids,
                           .weights = topk_weights,
                           .k = plan->d.k,
                           .num_experts = plan->d.num_experts,
                           .topk = true,
                           .policy = (int)plan->d.drop_policy,
                           .plan = plan};
    HCOMM__TRY(hcomm__moe_dispatch_call(plan->group, &a, NULL, handle));
    plan->handle = *handle;
    return HCOMM_OK;
}

hcomm_result_t hcomm_moe_plan_free(hcomm_moe_plan_t *plan) {
    if (plan == NULL)
        return HCOMM_OK;
    hcomm__moe_handle_release(plan->handle);
    free(plan->recv);
    free(plan);
    return HCOMM_OK;
}
