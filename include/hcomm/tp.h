/**
 * @file tp.h
 * @brief Tensor-parallel primitives (Megatron-LM, Shoeybi et al. 2019, "Megatron-LM:
 *        Training Multi-Billion Parameter Language Models Using Model Parallelism").
 *
 * Tensors are contiguous row-major host tensors (hcomm_tensor_t) of any dtype; in and out
 * have the same dtype; shapes are in elements. @p dim may be negative (-1 is the last dim).
 * @p group is the TP group from hcomm_ctx_group(), or any communicator.
 * Calls marked "collective" communicate over @p group: every member calls them, in the same
 * order, with the same shapes, dtype, dim and op, also for tensors with no elements; a rank
 * whose argument checks fail still joins the call, and its peers return HCOMM_ERR_PEER at once
 * (see core.h). in and out either are the same tensor (where a call allows it) or share no
 * byte (HCOMM_ERR_INVALID_ARG). Calls marked "local"
 * do not communicate. Thread-safe for distinct groups; one call at a time per group.
 * Errors (all functions): HCOMM_ERR_NULL (a tensor, its data with elements, or group is
 * NULL), HCOMM_ERR_DTYPE (in and out dtypes differ, or unknown), HCOMM_ERR_SHAPE (out shape
 * not as stated, or the split dim not divisible by the group size: the message names the dim
 * and the sizes), HCOMM_ERR_INVALID_ARG (dim out of range, bad op); collective calls also
 * HCOMM_ERR_NOMEM, HCOMM_ERR_MISMATCH (members disagree on the size), HCOMM_ERR_PEER,
 * HCOMM_ERR_TIMEOUT, HCOMM_ERR_ABORTED, HCOMM_ERR_UNSUPPORTED (mpi: more than INT_MAX elements or
 * bytes), HCOMM_ERR_BACKEND.
 */
#ifndef HCOMM_C_TP_H_
#define HCOMM_C_TP_H_

#include "hcomm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** all_reduce, collective: out = @p op (any, AVG included) over ranks of in; in and out have
 *  the same shape; in == out (or in->data == out->data) is in place. */
HCOMM_API hcomm_result_t hcomm_tp_all_reduce(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                             hcomm_tensor_t *out, hcomm_op_t op);
/** all_gather, collective: concatenates every rank's @p in along @p dim in rank order:
 *  out.shape[dim] = size * in.shape[dim], other dims equal (dim = -1 is the column-parallel
 *  concatenation). in and out must not share a byte (the same buffer too is
 *  HCOMM_ERR_INVALID_ARG, except in a group of one). */
HCOMM_API hcomm_result_t hcomm_tp_all_gather(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                             hcomm_tensor_t *out, int dim);
/** reduce_scatter, collective: reduces @p in over ranks with @p op and keeps this rank's
 *  slice (rank r: the r-th of size equal slices) along @p dim: in.shape[dim] =
 *  size * out.shape[dim]. out may be in itself (out->data == in->data: the result lands at
 *  the start of the buffer); any other overlap is HCOMM_ERR_INVALID_ARG. */
HCOMM_API hcomm_result_t hcomm_tp_reduce_scatter(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                 hcomm_tensor_t *out, int dim, hcomm_op_t op);
/** Local: copies this rank's slice of @p in along @p dim into @p out: in.shape[dim] =
 *  size * out.shape[dim]. in and out must not share a byte (the same buffer too is
 *  HCOMM_ERR_INVALID_ARG, except in a group of one). */
HCOMM_API hcomm_result_t hcomm_tp_split(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                        hcomm_tensor_t *out, int dim);

/** @name TP region mappings
 * The four TP region mappings of Megatron-LM (megatron/core/tensor_parallel/mappings.py),
 * forward and backward side by side, so a layer's backward is one call. Each is one of the
 * calls above: identity (local; out = in, same shape, may alias), all_reduce(sum), split
 * (local) or all_gather (collective), with the same shapes, rules and errors. @p dim is used by
 * scatter/gather only (Megatron-LM uses the last dim, -1).
 * @{ */

/** copy_to region forward: identity (out = in). Local. */
HCOMM_API hcomm_result_t hcomm_tp_copy_to_fwd(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                              hcomm_tensor_t *out);
/** copy_to region backward: all_reduce(sum) of the gradient. Collective. */
HCOMM_API hcomm_result_t hcomm_tp_copy_to_bwd(hcomm_comm_t *group, const hcomm_tensor_t *grad_out,
                                              hcomm_tensor_t *grad_in);
/** reduce_from region forward: all_reduce(sum). Collective. */
HCOMM_API hcomm_result_t hcomm_tp_reduce_from_fwd(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                  hcomm_tensor_t *out);
/** reduce_from region backward: identity. Local. */
HCOMM_API hcomm_result_t hcomm_tp_reduce_from_bwd(hcomm_comm_t *group,
                                                  const hcomm_tensor_t *grad_out,
                                                  hcomm_tensor_t *grad_in);
/** scatter_to region forward: split along @p dim. Local. */
HCOMM_API hcomm_result_t hcomm_tp_scatter_to_fwd(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                 hcomm_tensor_t *out, int dim);
/** scatter_to region backward: all_gather along @p dim. Collective. */
HCOMM_API hcomm_result_t hcomm_tp_scatter_to_bwd(hcomm_comm_t *group,
                                                 const hcomm_tensor_t *grad_out,
                                                 hcomm_tensor_t *grad_in, int dim);
/** gather_from region forward: all_gather along @p dim. Collective. */
HCOMM_API hcomm_result_t hcomm_tp_gather_from_fwd(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                  hcomm_tensor_t *out, int dim);
/** gather_from region backward: split along @p dim. Local. */
HCOMM_API hcomm_result_t hcomm_tp_gather_from_bwd(hcomm_comm_t *group,
                                                  const hcomm_tensor_t *grad_out,
                                                  hcomm_tensor_t *grad_in, int dim);

/** @} */

/** @name Sequence-parallel TP regions
 * Megatron-LM's --sequence-parallel mappings (Korthikanti et al. 2022, "Reducing Activation
 * Recomputation in Large Transformer Models"; mappings.py's *_sequence_parallel_region): outside
 * the TP block the activations are split along the sequence dim @p dim over the TP group (rank r
 * holds the r-th of size equal parts); the block's entry gathers them and its exit
 * reduce-scatters, in place of copy_to / reduce_from. Each is one of the calls above with the
 * same shapes, rules and errors: all_gather along dim (collective), reduce_scatter(sum) along
 * dim (collective), or split (local). Megatron-LM uses the first dim (the sequence), 0.
 * @{ */

/** gather_from_sequence_parallel region forward (the block's entry): all_gather along @p dim.
 *  Collective. */
HCOMM_API hcomm_result_t hcomm_tp_gather_from_sp_fwd(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                     hcomm_tensor_t *out, int dim);
/** gather_from_sequence_parallel region backward: reduce_scatter(sum) of the gradient along
 *  @p dim. Collective. */
HCOMM_API hcomm_result_t hcomm_tp_gather_from_sp_bwd(hcomm_comm_t *group,
                                                     const hcomm_tensor_t *grad_out,
                                                     hcomm_tensor_t *grad_in, int dim);
/** reduce_scatter_to_sequence_parallel region forward (the block's exit): reduce_scatter(sum)
 *  along @p dim. Collective. */
HCOMM_API hcomm_result_t hcomm_tp_reduce_scatter_to_sp_fwd(hcomm_comm_t *group,
                                                           const hcomm_tensor_t *in,
                                                           hcomm_tensor_t *out, int dim);
/** reduce_scatter_to_sequence_parallel region backward: all_gather of the gradient along @p dim.
 *  Collective. */
HCOMM_API hcomm_result_t hcomm_tp_reduce_scatter_to_sp_bwd(hcomm_comm_t *group,
                                                           const hcomm_tensor_t *grad_out,
                                                           hcomm_tensor_t *grad_in, int dim);
/** scatter_to_sequence_parallel region forward (e.g. after the embedding): split along @p dim.
 *  Local. */
HCOMM_API hcomm_result_t hcomm_tp_scatter_to_sp_fwd(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                    hcomm_tensor_t *out, int dim);
/** scatter_to_sequence_parallel region backward: all_gather of the gradient along @p dim.
 *  Collective. */
HCOMM_API hcomm_result_t hcomm_tp_scatter_to_sp_bwd(hcomm_comm_t *group,
                                                    const hcomm_tensor_t *grad_out,
                                                    hcomm_tensor_t *grad_in, int dim);
/** @} */

/** Nonblocking hcomm_tp_all_reduce(), hcomm_tp_all_gather() and hcomm_tp_reduce_scatter():
 *  the same checks, results and errors (delivered by hcomm_wait()/hcomm_test() on *req), run in
 *  issue order by the group's worker (see the nonblocking collectives in core.h); the call's
 *  whole body, including the permutation an inner dim needs, runs there. The tensors'
 *  descriptors are copied; their data must stay untouched until the request completes.
 *  Collective over @p group in issue order. A NULL @p in or @p out is delivered by the
 *  request, as a failed check; a NULL @p req is returned at issue once this rank's failure
 *  has joined its peers' operation (they get HCOMM_ERR_PEER). Errors at issue: HCOMM_ERR_NULL
 *  (group, req), HCOMM_ERR_NOMEM. */
HCOMM_API hcomm_result_t hcomm_tp_iall_reduce(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                              hcomm_tensor_t *out, hcomm_op_t op,
                                              hcomm_request_t **req);
/** Nonblocking hcomm_tp_all_gather(), as hcomm_tp_iall_reduce() describes (collective over
 *  @p group in issue order; errors at issue: HCOMM_ERR_NULL, HCOMM_ERR_NOMEM). */
HCOMM_API hcomm_result_t hcomm_tp_iall_gather(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                              hcomm_tensor_t *out, int dim, hcomm_request_t **req);
/** Nonblocking hcomm_tp_reduce_scatter(), as hcomm_tp_iall_reduce() describes (collective over
 *  @p group in issue order; errors at issue: HCOMM_ERR_NULL, HCOMM_ERR_NOMEM). */
HCOMM_API hcomm_result_t hcomm_tp_ireduce_scatter(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                  hcomm_tensor_t *out, int dim, hcomm_op_t op,
                                                  hcomm_request_t **req);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_TP_H_ */
