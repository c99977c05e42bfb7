/**
 * @file moe.h
 * @brief Mixture-of-experts token dispatch and combine over the expert-parallel group
 *        (GShard, Lepikhin et al. 2020; Megatron-Core's MoEAlltoAllTokenDispatcher).
 *
 * Experts are laid out contiguously (expert parallel): with E experts and an EP group of size
 * P, rank p owns experts [p*E/P, (p+1)*E/P). Dispatch sends each token (a row of tokens[N, H])
 * to the rank owning expert_ids[i] (top-1), exchanging the counts inside, then the rows with one
 * all_to_allv; the received rows are grouped by local expert (expert-major, source rank next,
 * original order within a source). Dropless: no capacity factor, no token is dropped or
 * padded, so R (rows received) varies by rank and batch. For top-k routing pass each token k
 * times (N = tokens * k rows) and weight the k combined rows. Combine sends expert outputs back
 * and restores the original token order. The backward passes reuse the routing: dispatch_bwd
 * is a combine, combine_bwd a dispatch. Shapes are in rows and elements.
 * Dispatch, combine and the backward passes are collective over the EP group (every member
 * calls them in the same order, also with N = 0); hcomm_moe_received() and
 * hcomm_moe_handle_free() are local. One handle per dispatched batch; a handle is used by one
 * thread at a time, and calls on one group are made one at a time.
 * Errors (all collective calls): HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (expert id out of
 * range, E not a positive multiple of P), HCOMM_ERR_SHAPE, HCOMM_ERR_DTYPE, HCOMM_ERR_MISMATCH
 * (members disagree on H, H', dtype or E), HCOMM_ERR_NOMEM, HCOMM_ERR_TIMEOUT,
 * HCOMM_ERR_ABORTED, HCOMM_ERR_UNSUPPORTED (mpi: a byte count or offset above INT_MAX),
 * HCOMM_ERR_BACKEND. Outside
 * dispatch, argument checks are rank-local: a rank whose check fails returns without
 * communicating (see core.h).
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
/** Frees @p handle (NULL is a no-op). Local. Always returns HCOMM_OK. */
HCOMM_API hcomm_result_t hcomm_moe_handle_free(hcomm_moe_handle_t *handle);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_MOE_H_ */
