/**
 * @file dp.h
 * @brief Data-parallel gradient reduction over many buffers in one call, bucketed
 *        (as PyTorch DDP, Li et al. 2020, "PyTorch Distributed").
 *
 * Two forms: hcomm_dp_all_reduce_grads() reduces every bucket when called, after the backward
 * pass; the reducer (hcomm_dp_reducer_*) overlaps the reduction with the backward pass as DDP
 * does: buckets are fixed at registration, each one's all_reduce starts (nonblocking) as soon as
 * its last gradient is marked ready, and one call at the end of backward waits for the rest.
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

/** A DDP-style gradient reducer over a fixed list of gradient tensors. Opaque. */
typedef struct hcomm_dp_reducer hcomm_dp_reducer_t;

/** Registers @p n gradient tensors (contiguous host tensors, any shapes and dtypes; the
 *  descriptors are copied, the data must stay allocated until destroy) for reduction with
 *  @p op (HCOMM_SUM or HCOMM_AVG) over @p dp_group. Buckets are formed once, as DDP does, in
 *  reverse registration order (gradients of the last layers are produced first): consecutive
 *  tensors of one dtype up to @p bucket_bytes bytes (0 = HCOMM_DP_BUCKET_BYTES_DEFAULT; a larger
 *  tensor forms a bucket alone, reduced in place; tensors without elements are skipped).
 *  Collective over @p dp_group: every member registers the same list of dtypes and shapes (a
 *  different list is HCOMM_ERR_MISMATCH on every rank, checked here once) with the same op and
 *  bucket_bytes. Not thread-safe with other calls on @p dp_group. Errors: as
 *  hcomm_dp_all_reduce_grads(), HCOMM_ERR_NULL (@p out). */
HCOMM_API hcomm_result_t hcomm_dp_reducer_create(hcomm_comm_t *dp_group,
                                                 const hcomm_tensor_t *grads, int n, hcomm_op_t op,
                                                 size_t bucket_bytes, hcomm_dp_reducer_t **out);
/** Marks gradient @p index (registration order) as final for this step. When it completes its
 *  bucket, and every earlier bucket has started, the bucket's all_reduce starts without
 *  waiting (buckets start in bucket order on every rank, so ranks that mark gradients in
 *  different orders still reduce the right buffers). The bucket's tensors must not change until
 *  hcomm_dp_reducer_finish(). Local to the calling rank (it may issue a nonblocking collective);
 *  one thread at a time per reducer, none with other calls on its group.
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (index out of range), HCOMM_ERR_STATE (marked
 *  twice in one step), and those of hcomm_iall_reduce(). */
HCOMM_API hcomm_result_t hcomm_dp_reducer_mark_ready(hcomm_dp_reducer_t *r, int index);
/** Ends the step: starts the buckets not started yet (a gradient never marked is reduced as it
 *  is, and reported), waits for every bucket and writes the results back into the gradients;
 *  the reducer is then ready for the next step. Collective over the group; one thread at a time
 *  per reducer. *wait_s (may be
 *  NULL) gets the seconds spent waiting here: the reduction time the backward pass did not hide.
 *  Errors: those of the all_reduce, HCOMM_ERR_STATE (some gradient was not marked; the message
 *  names the first). */
HCOMM_API hcomm_result_t hcomm_dp_reducer_finish(hcomm_dp_reducer_t *r, double *wait_s);
/** Frees the reducer. A step in flight (buckets started, hcomm_dp_reducer_finish not called)
 *  is waited for first (its buckets' results are dropped; peers must have started the same
 *  buckets, as in any step). NULL is a no-op. Local; not thread-safe with other calls on @p r.
 *  @return HCOMM_OK, or the first error of a bucket that was in flight (the reducer is freed
 *  either way). */
HCOMM_API hcomm_result_t hcomm_dp_reducer_destroy(hcomm_dp_reducer_t *r);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_DP_H_ */
