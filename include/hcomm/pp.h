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
 * (0 <= tag <= HCOMM_PP_TAG_MAX), whatever the backend (NCCL and HCCL have no tags; hcomm's
 * envelope carries them). Receives posted earlier match earlier messages (MPI's rules).
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

/** Largest tag the PP calls take (tags 0..HCOMM_PP_TAG_MAX; they live in hcomm's envelope
 *  on its user channel, so no backend tag space is needed). */
#define HCOMM_PP_TAG_MAX 0x3fffffff
/** The tags the pipeline helpers below use: activations travel forward (to the next stage)
 *  with HCOMM_PP_TAG_FORWARD, gradients backward with HCOMM_PP_TAG_BACKWARD. Plain send/recv
 *  may use them too, as the design brief does (pp.send(out, dst=1, tag=PP_TAG_FORWARD)). */
#define HCOMM_PP_TAG_FORWARD 1
#define HCOMM_PP_TAG_BACKWARD 2

/** Sends @p t to rank @p peer of @p group with @p tag. Called by the sender only; returns when
 *  @p t may be reused: at once up to HCOMM_EAGER_LIMIT bytes, else once the receiver copied it
 *  (a blocking send meanwhile accepts the peer's own sends, so two stages that send to each
 *  other and then receive complete; see the file comment). */
HCOMM_API hcomm_result_t hcomm_pp_send(hcomm_comm_t *group, const hcomm_tensor_t *t, int peer,
                                       int tag);
/** Receives into @p t (its dtype and shape are the expected ones) from rank @p peer of
 *  @p group with @p tag. Called by the receiver only; blocks until the message arrived. */
HCOMM_API hcomm_result_t hcomm_pp_recv(hcomm_comm_t *group, hcomm_tensor_t *t, int peer, int tag);
/** Receive by envelope: waits for the next message of @p tag from @p peer and receives it
 *  whatever its dtype and shape (any ndim; they may change per micro-batch) into @p out, whose
 *  data hcomm allocates (free it with hcomm_mem_free()). On failure out->data is NULL.
 *  Errors: as the file comment, HCOMM_ERR_NULL (@p out). */
HCOMM_API hcomm_result_t hcomm_pp_recv_any(hcomm_comm_t *group, int peer, int tag,
                                           hcomm_tensor_t *out);
/** Waits for the next message of @p tag from @p peer without receiving it and fills @p desc
 *  with its dtype and shape (desc->data = NULL), so the caller can allocate and then
 *  hcomm_pp_recv() it. The message stays queued for that receive. */
HCOMM_API hcomm_result_t hcomm_pp_probe(hcomm_comm_t *group, int peer, int tag,
                                        hcomm_tensor_t *desc);
/** Sends @p send to @p send_peer with @p send_tag and receives @p recv from @p recv_peer with
 *  @p recv_tag at once (an activation forward with one tag while a gradient comes back with
 *  another); cannot deadlock whatever order the peers call it in. Either side may be skipped
 *  with a NULL tensor or a peer of -1. Each peer calls its matching send or receive (or this). */
HCOMM_API hcomm_result_t hcomm_pp_send_recv(hcomm_comm_t *group, const hcomm_tensor_t *send,
                                            int send_peer, int send_tag, hcomm_tensor_t *recv,
                                            int recv_peer, int recv_tag);

/** A pending nonblocking PP transfer. Opaque. */
typedef struct hcomm_pp_req hcomm_pp_req_t;

/** Starts sending @p t to @p peer with @p tag; @p t's data must not change until the request
 *  completes. @p req must not be NULL; *req gets the request, or NULL when the call is made
 *  inside a group (group_end completes it then). Same for the receives below. */
HCOMM_API hcomm_result_t hcomm_pp_isend(hcomm_comm_t *group, const hcomm_tensor_t *t, int peer,
                                        int tag, hcomm_pp_req_t **req);
/** Starts receiving into @p t (expected dtype and shape, checked before data lands). @p t must
 *  stay valid until the request completes. */
HCOMM_API hcomm_result_t hcomm_pp_irecv(hcomm_comm_t *group, hcomm_tensor_t *t, int peer, int tag,
                                        hcomm_pp_req_t **req);
/** Starts a receive by envelope: on completion @p out (valid until then) gets the tensor that
 *  arrived, its data allocated by hcomm (free with hcomm_mem_free()). */
HCOMM_API hcomm_result_t hcomm_pp_irecv_any(hcomm_comm_t *group, int peer, int tag,
                                            hcomm_tensor_t *out, hcomm_pp_req_t **req);
/** Completes @p req and frees it (also on failure). Errors: the transfer's own, HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_pp_wait(hcomm_pp_req_t *req);
/** Makes progress; *done = 1 when @p req completed, in which case it is freed (as MPI_Test)
 *  and its result returned. Errors: the transfer's own, HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_pp_test(hcomm_pp_req_t *req, int *done);
/** Completes and frees @p reqs[0..n) (NULL entries skipped); returns the first failure.
 *  Errors: HCOMM_ERR_NULL (@p reqs with n > 0), HCOMM_ERR_INVALID_ARG (n < 0), the
 *  transfers'. */
HCOMM_API hcomm_result_t hcomm_pp_wait_all(hcomm_pp_req_t **reqs, int n);

/** Batched posting: between group_start and group_end, isend/irecv/irecv_any only record;
 *  group_end posts all receives, then all sends, and completes them together, whatever order
 *  the peers posted theirs in (a rank may post nothing). One group at a time per @p group.
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_STATE (nested, or end without start), and the transfers'. */
HCOMM_API hcomm_result_t hcomm_pp_group_start(hcomm_comm_t *group);
/** Ends the batch hcomm_pp_group_start() opened: posts and completes its transfers (see
 *  there). Errors: HCOMM_ERR_NULL, HCOMM_ERR_STATE (no batch open), and the transfers'. */
HCOMM_API hcomm_result_t hcomm_pp_group_end(hcomm_comm_t *group);

/** Flags of the pipeline helpers (a one-stage group has no neighbour, ring or not: every helper
 *  is then a no-op). */
enum {
    /** The last stage's next is the first and the first's previous the last (interleaved
     *  schedules); without it the missing neighbour of the first and last stage is a no-op. */
    HCOMM_PP_RING = 1,
    /** Receives take any dtype and shape: the tensor's data is allocated (hcomm_mem_free()). */
    HCOMM_PP_ANY_SHAPE = 2
};

/** Pipeline helpers on a PP group (rank i is stage i), as Megatron-LM's p2p_communication:
 *  forward = to the next stage with HCOMM_PP_TAG_FORWARD, backward = to the previous one with
 *  HCOMM_PP_TAG_BACKWARD. Each call is a no-op on the side whose neighbour is missing (first
 *  stage: no previous; last: no next) unless HCOMM_PP_RING. A combined call posts both sides at
 *  once and completes them together; with two stages (previous == next) the tags deliver each
 *  message to the right side. Receive tensors are expected shapes unless HCOMM_PP_ANY_SHAPE.
 *  Errors: as the file comment. */
HCOMM_API hcomm_result_t hcomm_pp_send_forward(hcomm_comm_t *pp, const hcomm_tensor_t *out,
                                               int flags);
/** Receives @p in from the previous stage (HCOMM_PP_TAG_FORWARD), as the helpers above say. */
HCOMM_API hcomm_result_t hcomm_pp_recv_forward(hcomm_comm_t *pp, hcomm_tensor_t *in, int flags);
/** Sends @p grad_in to the previous stage (HCOMM_PP_TAG_BACKWARD), as the helpers above say. */
HCOMM_API hcomm_result_t hcomm_pp_send_backward(hcomm_comm_t *pp, const hcomm_tensor_t *grad_in,
                                                int flags);
/** Receives @p grad_out from the next stage (HCOMM_PP_TAG_BACKWARD), as the helpers above say. */
HCOMM_API hcomm_result_t hcomm_pp_recv_backward(hcomm_comm_t *pp, hcomm_tensor_t *grad_out,
                                                int flags);
/** Sends @p out forward and receives @p grad_out from the next stage (1F1B steady state). */
HCOMM_API hcomm_result_t hcomm_pp_send_forward_recv_backward(hcomm_comm_t *pp,
                                                             const hcomm_tensor_t *out,
                                                             hcomm_tensor_t *grad_out, int flags);
/** Sends @p grad_in backward and receives @p in from the previous stage. */
HCOMM_API hcomm_result_t hcomm_pp_send_backward_recv_forward(hcomm_comm_t *pp,
                                                             const hcomm_tensor_t *grad_in,
                                                             hcomm_tensor_t *in, int flags);
/** Sends @p out forward and receives @p in from the previous stage (interleaved warm-up). */
HCOMM_API hcomm_result_t hcomm_pp_send_forward_recv_forward(hcomm_comm_t *pp,
                                                            const hcomm_tensor_t *out,
                                                            hcomm_tensor_t *in, int flags);
/** Sends @p grad_in backward and receives @p grad_out from the next stage. */
HCOMM_API hcomm_result_t hcomm_pp_send_backward_recv_backward(hcomm_comm_t *pp,
                                                              const hcomm_tensor_t *grad_in,
                                                              hcomm_tensor_t *grad_out, int flags);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_PP_H_ */
