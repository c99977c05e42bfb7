/**
 * @file dp.h
 * @brief Data-parallel gradient reduction over many buffers in one call, bucketed
 *        (as PyTorch DDP, Li et al. 2020, "PyTorch Distributed").
 *
 * Unlike DDP, buckets are reduced one after another when called, not overlapped with the
 * backward pass.
 */
#ifndef HCOMM_C_DP_H_
#define HCOMM_C_DP_H_

#include "hcomm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Default bucket size in bytes (25 MiB, as DDP). */
#define HCOMM_DP_BUCKET_BYTES_DEFAULT (25u << 20)

/** All-reduces @p n gradient tensors in place over @p dp_group with @p op (HCOMM_SUM or
 *  HCOMM_AVG). Tensors may differ in size and dtype; those of one dtype are packed into
 *  buckets of at most @p bucket_bytes bytes (0 = default), one all_reduce per bucket, in the
 *  order given: dtypes in order of first appearance, and within a dtype, tensors in list
 *  order fill a bucket until the next one would overflow it. A tensor larger than a bucket
 *  forms a bucket alone; a bucket of one tensor is reduced in place, without copying.
 *  Tensors with no elements are skipped (a call without elements communicates nothing).
 *  AVG divides the sum by the group size (integer dtypes truncate). @p grads is an array of
 *  @p n contiguous host tensors, any shape and dtype, reduced in place.
 *  Collective over @p dp_group: every member passes the same list of shapes and dtypes, the
 *  same op and the same bucket_bytes (a list in another order, or with other dtypes or
 *  shapes, is HCOMM_ERR_MISMATCH on every rank: a digest of the list rides in every bucket's
 *  call signature); a rank whose argument checks fail still joins the call and its peers
 *  return HCOMM_ERR_PEER (see core.h).
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (n < 0, op not SUM/AVG), HCOMM_ERR_DTYPE,
 *  HCOMM_ERR_SHAPE, HCOMM_ERR_MISMATCH (members' lists differ), HCOMM_ERR_PEER, HCOMM_ERR_NOMEM,
 *  HCOMM_ERR_TIMEOUT, HCOMM_ERR_ABORTED, HCOMM_ERR_UNSUPPORTED (mpi: a bucket of more than
 *  INT_MAX elements), HCOMM_ERR_BACKEND. Thread-safe for distinct groups. */
HCOMM_API hcomm_result_t hcomm_dp_all_reduce_grads(hcomm_comm_t *dp_group, hcomm_tensor_t *grads,
                                                   int n, hcomm_op_t op, size_t bucket_bytes);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_DP_H_ */
