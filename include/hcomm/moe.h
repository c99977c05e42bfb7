/**
 * @file moe.h
 * @brief Mixture-of-experts token dispatch and combine over the expert-parallel group
 *        (GShard, Lepikhin et al. 2020; Megatron-Core's MoEAlltoAllTokenDispatcher).
 *
 * Experts are laid out contiguously: with E experts and an EP group of size P, rank p owns
 * experts [p*E/P, (p+1)*E/P). Dispatch sends each token (a row of tokens[N, H]) to the rank
 * owning expert_ids[i] (top-1), exchanging the counts inside; the received rows are grouped by
 * local expert (expert-major, source rank next, original order within a source).
 * Combine sends expert outputs back and restores the original token order. The backward
 * passes reuse the routing: dispatch_bwd is a combine, combine_bwd a dispatch.
 * All calls are collective over the EP group; one handle per dispatched batch.
 * Errors (all): HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (expert id out of range, E not divisible
 * by P), HCOMM_ERR_SHAPE, HCOMM_ERR_DTYPE, HCOMM_ERR_MISMATCH, HCOMM_ERR_NOMEM,
 * HCOMM_ERR_TIMEOUT, HCOMM_ERR_ABORTED, HCOMM_ERR_BACKEND.
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
 *  received rows; read them with hcomm_moe_received(). N may differ between ranks; H and the
 *  dtype may not. The handle keeps @p ep_group: free the handle before the group.
 *  The token checks are rank-local, so their outcome travels with the count exchange: a rank
 *  whose tokens or expert ids are bad fails with its own error (HCOMM_ERR_NULL, _SHAPE,
 *  _DTYPE, _INVALID_ARG) and every other rank fails with HCOMM_ERR_ABORTED instead of waiting;
 *  ranks that disagree on H or dtype all fail with HCOMM_ERR_MISMATCH. *handle is NULL after
 *  any failure. */
HCOMM_API hcomm_result_t hcomm_moe_dispatch(hcomm_comm_t *ep_group, const hcomm_tensor_t *tokens,
                                            const int32_t *expert_ids, int num_experts,
                                            hcomm_moe_handle_t **handle);
/** The received rows as a tensor view [R, H] (owned by @p handle, valid until it is freed) and,
 *  if @p tokens_per_expert is not NULL, the row count of each local expert
 *  ([num_experts/P] entries). Not collective. */
HCOMM_API hcomm_result_t hcomm_moe_received(const hcomm_moe_handle_t *handle, hcomm_tensor_t *recv,
                                            int64_t *tokens_per_expert);
/** Sends @p expert_out [R, H'] (rows in received order, any H' and dtype) back and writes
 *  @p out [N, H'] in the original token order. */
HCOMM_API hcomm_result_t hcomm_moe_combine(hcomm_moe_handle_t *handle,
                                           const hcomm_tensor_t *expert_out, hcomm_tensor_t *out);
/** Backward of combine: routes @p grad_out [N, H'] like the dispatch into
 *  @p grad_expert_out [R, H']. */
HCOMM_API hcomm_result_t hcomm_moe_combine_bwd(hcomm_moe_handle_t *handle,
                                               const hcomm_tensor_t *grad_out,
                                               hcomm_tensor_t *grad_expert_out);
/** Backward of dispatch: brings @p grad_recv [R, H] (H as dispatched; any dtype, the same for
 *  @p grad_tokens) back into @p grad_tokens [N, H] (original order). */
HCOMM_API hcomm_result_t hcomm_moe_dispatch_bwd(hcomm_moe_handle_t *handle,
                                                const hcomm_tensor_t *grad_recv,
                                                hcomm_tensor_t *grad_tokens);
/** Frees @p handle (NULL is a no-op). Not collective. */
HCOMM_API hcomm_result_t hcomm_moe_handle_free(hcomm_moe_handle_t *handle);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_MOE_H_ */
