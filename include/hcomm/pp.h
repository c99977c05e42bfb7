/**
 * @file pp.h
 * @brief Pipeline-parallel point-to-point: activations forward, gradients backward.
 *
 * The stage-to-stage transfers of a micro-batch pipeline schedule (GPipe, Huang et al. 2019);
 * as in Megatron-LM's p2p_communication with variable shapes, a tensor's dtype and shape travel
 * in the envelope of its one message, on hcomm's user channel, so PP tags never meet
 * collective traffic on the same group. Small tensors (HCOMM_EAGER_LIMIT, default 8 KiB) are
 * buffered and a send returns at once; larger ones are copied once, straight into the
 * receiver's tensor, and the send returns when that copy is done. A receive that waits more
 * than 2 ms, and a blocking send, accept peers' messages of other tags into the unexpected
 * buffer (HCOMM_UNEXPECTED_BYTES, default 256 MiB), so a stage that sends and then receives
 * while its neighbour does the same completes. Point-to-point, not
 * collective: only the two ranks of a transfer call, the sender a send and the receiver a
 * matching receive (same tag). Tensors are contiguous host tensors of any dtype and shape,
 * including zero elements (data may then be NULL).
 * Peers are ranks in @p group (normally the PP group, where rank i is stage i; see
 * hcomm_ctx_pp_neighbors()). Each message carries the tensor's dtype and shape; the receiver's
 * descriptor must match exactly, or the call fails with HCOMM_ERR_MISMATCH after draining the
 * message (nothing is left queued, the receiver's data is left untouched, and the error says
 * what was sent, e.g. "hcomm_pp_recv: peer 1 sent f32 [4, 8], expected f32 [4, 9]").
 * Messages between one pair with one tag arrive in the order sent; tags separate streams
 * (0 <= tag <= HCOMM_PP_TAG_MAX).
 * Errors (all): HCOMM_ERR_NULL (group, a tensor, its data with elements),
 * HCOMM_ERR_INVALID_ARG (peer out of range or self, tag out of range), HCOMM_ERR_DTYPE
 * (invalid dtype), HCOMM_ERR_SHAPE (ndim out of range, negative extent), HCOMM_ERR_MISMATCH
 * (receives), HCOMM_ERR_NOMEM, HCOMM_ERR_TIMEOUT (no matching peer within HCOMM_TIMEOUT),
 * HCOMM_ERR_ABORTED, HCOMM_ERR_UNSUPPORTED (mpi: more than INT_MAX bytes), HCOMM_ERR_BACKEND.
 * Thread-safe for distinct groups; one call at a time per group.
 */
#ifndef HCOMM_C_PP_H_
#define HCOMM_C_PP_H_

#include "hcomm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Largest tag the PP calls take (MPI guarantees tags up to 32767; hcomm keeps the top for
 *  its own header). */
#define HCOMM_PP_TAG_MAX 16383

/** Sends @p t to rank @p peer of @p group. Called by the sender only. On the local backend it
 *  returns before the receive is posted (eager); on mpi a large message may wait for it, so
 *  two stages that send to each other should use hcomm_pp_send_recv(). */
HCOMM_API hcomm_result_t hcomm_pp_send(hcomm_comm_t *group, const hcomm_tensor_t *t, int peer,
                                       int tag);
/** Receives into @p t (its dtype and shape are the expected ones) from rank @p peer of
 *  @p group. Called by the receiver only; blocks until the message arrives. */
HCOMM_API hcomm_result_t hcomm_pp_recv(hcomm_comm_t *group, hcomm_tensor_t *t, int peer, int tag);
/** Sends @p send to @p send_peer and receives @p recv from @p recv_peer at once (one tag for
 *  both); cannot deadlock whatever order the peers call it in. Either side may be skipped with
 *  a NULL tensor or a peer of -1. Each peer calls its matching send or receive (or this). */
HCOMM_API hcomm_result_t hcomm_pp_send_recv(hcomm_comm_t *group, const hcomm_tensor_t *send,
                                            int send_peer, hcomm_tensor_t *recv, int recv_peer,
                                            int tag);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_PP_H_ */
