/**
 * @file cp.h
 * @brief Context (sequence) parallelism: the exchanges of ring attention, all-gather CP,
 *        Ulysses all-to-all and their hierarchical combination.
 *
 * Sources: ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers");
 * the zigzag load balance for causal masks and all-gather CP of Megatron-Core / Transformer
 * Engine (`cp_comm_type` "p2p", "all_gather", "a2a", "a2a+p2p" with
 * `hierarchical_context_parallel_sizes`); DeepSpeed Ulysses (Jacobs et al. 2023) and its GQA
 * handling as in yunchang / Megatron (fewer KV heads than ranks: each KV head is replicated).
 *
 * Tensors are contiguous row-major host tensors (hcomm_tensor_t) of any dtype and shape with
 * zero extents allowed; in and out have the same dtype and never share a byte (no call here has
 * an in-place form: HCOMM_ERR_INVALID_ARG). @p seq_dim and @p head_dim may be negative (-1 is
 * the last dim). @p group is the CP group of a context (hcomm_ctx_group(ctx, HCOMM_GROUP_CP))
 * or any communicator; its size is cp and rank i holds sequence part i.
 *
 * Collective calls: every member calls them in the same order with the same dtype and shape of
 * in, the same dims and flags. The members first exchange those (one small all_gather), so a
 * member that passes another shape or dtype makes the call fail on every member with
 * HCOMM_ERR_MISMATCH naming both ranks and what each passed; a member whose own argument checks
 * fail joins that exchange and its peers return HCOMM_ERR_PEER at once. Nothing is written to
 * out unless every check passed on every member.
 *
 * cp = 1: every call is the identity where shapes allow (split, gather: a copy; the ring's
 * step hands back a copy of the chunk it was given; Ulysses: a copy) and never communicates
 * beyond the group of one.
 *
 * Nonblocking forms (hcomm_cp_i...) run the same body on the group's worker, in issue order
 * with the group's other nonblocking calls (core.h); the tensors' descriptors are copied, their
 * data must stay untouched until hcomm_wait()/hcomm_test() completes the request, which also
 * delivers the errors. Thread-safe for distinct groups; one call at a time per group.
 *
 * Errors (all calls): HCOMM_ERR_NULL (group, a tensor, its data with elements, an output
 * pointer), HCOMM_ERR_DTYPE (in and out dtypes differ, or unknown), HCOMM_ERR_SHAPE (out's shape
 * not as stated; a sequence or head extent not divisible, naming both numbers),
 * HCOMM_ERR_INVALID_ARG (dim out of range, the two dims equal, bad flags or direction, buffers
 * that overlap), HCOMM_ERR_STATE (a ring step started twice), HCOMM_ERR_MISMATCH,
 * HCOMM_ERR_PEER, HCOMM_ERR_NOMEM, HCOMM_ERR_TIMEOUT, HCOMM_ERR_ABORTED, HCOMM_ERR_BACKEND.
 */
#ifndef HCOMM_C_CP_H_
#define HCOMM_C_CP_H_

#include "hcomm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How a sequence is laid out over the cp ranks (flags of the split and gather calls). */
enum {
    /** Rank i holds the i-th of cp equal contiguous parts. */
    HCOMM_CP_CONTIGUOUS = 0,
    /** Zigzag (load-balanced causal masks): the sequence in 2*cp equal chunks, rank i holds
     *  chunk i followed by chunk 2*cp-1-i. The sequence extent must divide by 2*cp. */
    HCOMM_CP_ZIGZAG = 1
};

/** @name Zigzag split and all-gather CP
 * A sequence tensor has the full extent S along @p seq_dim; a rank's part has S / cp (layout
 * per @p flags). With HCOMM_CP_ZIGZAG, S % (2*cp) != 0 is HCOMM_ERR_SHAPE naming S and 2*cp;
 * with HCOMM_CP_CONTIGUOUS, S % cp != 0 names S and cp.
 * @{ */

/** Local: copies this rank's part of the full sequence @p in into @p out (out.shape[seq_dim] =
 *  in.shape[seq_dim] / cp, other dims equal). Does not communicate. */
HCOMM_API hcomm_result_t hcomm_cp_split(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                        hcomm_tensor_t *out, int seq_dim, int flags);
/** The inverse of hcomm_cp_split, collective: every rank's part @p in gathered into the full
 *  sequence @p out in natural order (out.shape[seq_dim] = cp * in.shape[seq_dim]). All-gather
 *  CP's forward: the KV all_gather along the sequence dim. */
HCOMM_API hcomm_result_t hcomm_cp_all_gather(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                             hcomm_tensor_t *out, int seq_dim, int flags);
/** All-gather CP's backward, collective: @p in is this rank's gradient over the full sequence
 *  (natural order); @p out gets the sum over ranks of this rank's part (layout per @p flags,
 *  out.shape[seq_dim] = in.shape[seq_dim] / cp), summed as hcomm_reduce_scatter() sums (in rank
 *  order under hcomm_comm_set_deterministic()). */
HCOMM_API hcomm_result_t hcomm_cp_reduce_scatter(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                 hcomm_tensor_t *out, int seq_dim, int flags);
/** Nonblocking hcomm_cp_all_gather() (see the file comment). Errors at issue: HCOMM_ERR_NULL
 *  (group, req), HCOMM_ERR_NOMEM; the rest through the request. */
HCOMM_API hcomm_result_t hcomm_cp_iall_gather(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                              hcomm_tensor_t *out, int seq_dim, int flags,
                                              hcomm_request_t **req);
/** Nonblocking hcomm_cp_reduce_scatter(), as hcomm_cp_iall_gather(). */
HCOMM_API hcomm_result_t hcomm_cp_ireduce_scatter(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                  hcomm_tensor_t *out, int seq_dim, int flags,
                                                  hcomm_request_t **req);
/** @} */

/** @name Ring exchange (ring attention)
 * A ring handle holds two receive buffers shaped as the chunk it was created with (double
 * buffering): hcomm_cp_ring_start() sends the chunk the caller computes on to the next rank
 * and receives the previous rank's into the buffer the caller is not using, on the group's
 * worker, so the exchange runs while the caller computes; hcomm_cp_ring_wait() hands that
 * buffer over. cp - 1 steps pass every rank's chunk over every rank:
 * @code
 *   hcomm_tensor_t cur = my_kv, next;
 *   for (int s = 0; s < cp; s++) {
 *       if (s + 1 < cp) hcomm_cp_ring_start(ring, &cur);
 *       attend(q, &cur);                   // chunk of rank (rank - s) mod cp
 *       if (s + 1 < cp) { hcomm_cp_ring_wait(ring, &next); cur = next; }
 *   }
 * @endcode
 * Direction HCOMM_CP_RING_FORWARD sends to rank + 1 and receives from rank - 1 (mod cp), the
 * KV ring. HCOMM_CP_RING_BACKWARD sends to rank - 1 and receives from rank + 1: the ring that
 * returns dK/dV to their owners (a rank that computed the gradient of the chunk it holds at
 * step s, owned by rank - s, sends it back s hops; or the accumulated dK/dV travels forward
 * with the chunk and one more forward step brings it home after cp steps in all).
 * @{ */

/** A ring exchange on a group. Opaque. */
typedef struct hcomm_cp_ring hcomm_cp_ring_t;

/** Ring directions. */
enum { HCOMM_CP_RING_FORWARD = 0, HCOMM_CP_RING_BACKWARD = 1 };

/** Creates a ring for chunks of @p chunk's dtype and shape (its data is not read), collective
 *  over @p group: the members' chunk dtypes and shapes and directions must agree (else
 *  HCOMM_ERR_MISMATCH on every member, naming both ranks and their chunks). The handle keeps
 *  @p group, which must outlive it. Errors: as the file comment; HCOMM_ERR_INVALID_ARG (a
 *  direction other than the two). */
HCOMM_API hcomm_result_t hcomm_cp_ring_create(hcomm_comm_t *group, const hcomm_tensor_t *chunk,
                                              int direction, hcomm_cp_ring_t **ring);
/** Starts one step, collective over the ring's group (every member starts its step): sends
 *  @p cur (the caller's chunk, or the tensor the last hcomm_cp_ring_wait() gave) and receives
 *  the neighbour's chunk into the ring's buffer that @p cur is not. @p cur's data must stay
 *  untouched until the wait. Errors: HCOMM_ERR_STATE (a step already started and not waited
 *  for: nothing is sent), HCOMM_ERR_SHAPE / HCOMM_ERR_DTYPE (@p cur is not shaped as the
 *  ring's chunk: the step still joins its peers', who get HCOMM_ERR_PEER at their wait),
 *  HCOMM_ERR_INVALID_ARG (@p cur overlaps a ring buffer without being one). */
HCOMM_API hcomm_result_t hcomm_cp_ring_start(hcomm_cp_ring_t *ring, const hcomm_tensor_t *cur);
/** Completes the started step: *@p next describes the received chunk (data in a ring buffer,
 *  valid until the step after the next one is waited for, or the ring is destroyed). On
 *  failure next->data is NULL. Errors: HCOMM_ERR_STATE (no step started), the exchange's. */
HCOMM_API hcomm_result_t hcomm_cp_ring_wait(hcomm_cp_ring_t *ring, hcomm_tensor_t *next);
/** Blocking step: hcomm_cp_ring_start() then hcomm_cp_ring_wait(). */
HCOMM_API hcomm_result_t hcomm_cp_ring_step(hcomm_cp_ring_t *ring, const hcomm_tensor_t *cur,
                                            hcomm_tensor_t *next);
/** Frees the ring; a started step is completed first. NULL is a no-op. Local. */
HCOMM_API hcomm_result_t hcomm_cp_ring_destroy(hcomm_cp_ring_t *ring);
/** @} */

/** @name Ulysses all-to-all
 * The sequence-to-head exchange before attention, [B, S/P, H, D] -> [B, S, H/P, D] for
 * P = cp, and its inverse after, with the dims wherever the caller's layout puts them
 * (@p seq_dim and @p head_dim, distinct; any other dims ride along). The gathered sequence is
 * the ranks' parts in rank order. H % P != 0 is HCOMM_ERR_SHAPE naming H and P, except grouped-
 * query attention with fewer heads than ranks (P % H == 0): each head is replicated to P / H
 * ranks (rank j gets head j / (P / H), out's head extent 1), and the inverse sums the replicas'
 * gradients in rank order into H heads.
 * @{ */

/** Sequence to head, collective: @p in [.., S/P, .., H, ..] -> @p out [.., S, .., H/P (or 1),
 *  ..] along (seq_dim, head_dim). */
HCOMM_API hcomm_result_t hcomm_cp_a2a_seq_to_head(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                  hcomm_tensor_t *out, int seq_dim, int head_dim);
/** Head to sequence (the inverse), collective: @p in [.., S, .., H/P (or 1), ..] -> @p out
 *  [.., S/P, .., H, ..]; with out's H < P (GQA) the replicas are summed. S % P != 0 is
 *  HCOMM_ERR_SHAPE naming S and P. */
HCOMM_API hcomm_result_t hcomm_cp_a2a_head_to_seq(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                  hcomm_tensor_t *out, int seq_dim, int head_dim);
/** Nonblocking hcomm_cp_a2a_seq_to_head(), as hcomm_cp_iall_gather(). */
HCOMM_API hcomm_result_t hcomm_cp_ia2a_seq_to_head(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                   hcomm_tensor_t *out, int seq_dim, int head_dim,
                                                   hcomm_request_t **req);
/** Nonblocking hcomm_cp_a2a_head_to_seq(), as hcomm_cp_iall_gather(). */
HCOMM_API hcomm_result_t hcomm_cp_ia2a_head_to_seq(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                                   hcomm_tensor_t *out, int seq_dim, int head_dim,
                                                   hcomm_request_t **req);
/** @} */

/** @name Hierarchical a2a + p2p (USP: Ulysses inside a node, ring across nodes)
 * The CP group of cp = a2a * p2p ranks as Megatron's hierarchical_context_parallel_sizes
 * [a2a, p2p]: a2a groups of consecutive ranks (rank r in a2a group r / a2a, as its member
 * r % a2a) run the Ulysses calls, p2p groups (ranks with the same r % a2a) run the ring.
 * @{ */

/** The two groups of a hierarchical CP. Opaque. */
typedef struct hcomm_cp_hier hcomm_cp_hier_t;

/** Splits @p group, collective. @p a2a_size > 0 is the a2a size (must divide cp: else
 *  HCOMM_ERR_SHAPE naming both); 0 takes it from the node layout (hcomm_comm_node(): the ranks
 *  per node, where every node holds the same number of consecutive ranks; the whole group on
 *  one node gives a2a = cp, p2p = 1; else HCOMM_ERR_INVALID_ARG naming the layout). Members
 *  passing different sizes: HCOMM_ERR_MISMATCH naming both. */
HCOMM_API hcomm_result_t hcomm_cp_hier_create(hcomm_comm_t *group, int a2a_size,
                                              hcomm_cp_hier_t **hier);
/** The a2a and p2p groups (owned by @p hier) and their sizes; any output may be NULL. Local. */
HCOMM_API hcomm_result_t hcomm_cp_hier_groups(const hcomm_cp_hier_t *hier, hcomm_comm_t **a2a,
                                              hcomm_comm_t **p2p, int *a2a_size, int *p2p_size);
/** Frees @p hier and its groups, collective over the group it was split from. NULL: no-op. */
HCOMM_API hcomm_result_t hcomm_cp_hier_destroy(hcomm_cp_hier_t *hier);
/** @} */

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_CP_H_ */
