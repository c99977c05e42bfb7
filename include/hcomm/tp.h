/**
 * @file tp.h
 * @brief Tensor-parallel primitives (Megatron-LM, Shoeybi et al. 2019, "Megatron-LM:
 *        Training Multi-Billion Parameter Language Models Using Model Parallelism").
 *
 * All functions are collective over @p group (the TP group from hcomm_ctx_group(), or any
 * communicator): every member calls them with the same shapes, dtype, dim and op. Tensors
 * are contiguous row-major host tensors (hcomm_tensor_t). @p dim may be negative (-1 is the
 * last dim). Thread-safe for distinct groups; one call at a time per group.
 * Errors (all functions): HCOMM_ERR_NULL (a tensor, its data with elements, or group is
 * NULL), HCOMM_ERR_DTYPE (in and out dtypes differ, or unknown), HCOMM_ERR_SHAPE (out shape
 * not as stated, or the split dim not divisible by the group size: the message names the dim
 * and the sizes), HCOMM_ERR_INVALID_ARG (dim out of range, bad op), HCOMM_ERR_TIMEOUT,
 * HCOMM_ERR_ABORTED, HCOMM_ERR_BACKEND.
 */
#ifndef HCOMM_C_TP_H_
#define HCOMM_C_TP_H_

#include "hcomm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** out = op over ranks of in; same shape and dtype; in == out (or in->data == out->data) is in
 *  place. */
HCOMM_API hcomm_result_t hcomm_tp_all_reduce(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                             hcomm_tensor_t *out, hcomm_op_t op);
/** Concatenates every rank's @p in along @p dim in rank order: out.shape[dim] =
 *  size * in.shape[dim], other dims equal (dim = -1 is the column-parallel concatenation). */
HCOMM_API hcomm_result_t hcomm_tp_all_gather(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                             hcomm_tensor_t *out, int dim);
/** Reduces @p in over ranks with @p op and keeps this rank's slice along @p dim:
 *  in.shape[dim] = size * out.shape[dim]. */
HCOMM_API hcomm_result_t hcomm_tp_reduce_scatter(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                 hcomm_tensor_t *out, int dim, hcomm_op_t op);
/** Copies this rank's slice of @p in along @p dim into @p out (no communication):
 *  in.shape[dim] = size * out.shape[dim]. */
HCOMM_API hcomm_result_t hcomm_tp_split(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                        hcomm_tensor_t *out, int dim);

/* The four TP region mappings of Megatron-LM (mappings.py), forward and backward side by
 * side, so a layer's backward is one call. @p dim is used by scatter/gather only. */

/** copy_to region forward: identity (out = in). */
HCOMM_API hcomm_result_t hcomm_tp_copy_to_fwd(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                              hcomm_tensor_t *out);
/** copy_to region backward: all_reduce(sum) of the gradient. */
HCOMM_API hcomm_result_t hcomm_tp_copy_to_bwd(hcomm_comm_t *group, const hcomm_tensor_t *grad_out,
                                              hcomm_tensor_t *grad_in);
/** reduce_from region forward: all_reduce(sum). */
HCOMM_API hcomm_result_t hcomm_tp_reduce_from_fwd(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                  hcomm_tensor_t *out);
/** reduce_from region backward: identity. */
HCOMM_API hcomm_result_t hcomm_tp_reduce_from_bwd(hcomm_comm_t *group,
                                                  const hcomm_tensor_t *grad_out,
                                                  hcomm_tensor_t *grad_in);
/** scatter_to region forward: split along @p dim. */
HCOMM_API hcomm_result_t hcomm_tp_scatter_to_fwd(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                 hcomm_tensor_t *out, int dim);
/** scatter_to region backward: all_gather along @p dim. */
HCOMM_API hcomm_result_t hcomm_tp_scatter_to_bwd(hcomm_comm_t *group,
                                                 const hcomm_tensor_t *grad_out,
                                                 hcomm_tensor_t *grad_in, int dim);
/** gather_from region forward: all_gather along @p dim. */
HCOMM_API hcomm_result_t hcomm_tp_gather_from_fwd(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                  hcomm_tensor_t *out, int dim);
/** gather_from region backward: split along @p dim. */
HCOMM_API hcomm_result_t hcomm_tp_gather_from_bwd(hcomm_comm_t *group,
                                                  const hcomm_tensor_t *grad_out,
                                                  hcomm_tensor_t *grad_in, int dim);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_TP_H_ */
