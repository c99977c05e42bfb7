/**
 * @file zero.h
 * @brief Sharded data parallel: ZeRO-1/2/3 (Rajbhandari et al. 2020, "ZeRO: Memory
 *        Optimizations Toward Training Trillion Parameter Models"), FSDP (Zhao et al. 2023) and
 *        HSDP (shard inside a group, replicate across groups) as one shard plan.
 *
 * A plan is built once from the model's parameter list over a shard group (for HSDP also a
 * replicate group: hcomm_ctx_group() gives HCOMM_GROUP_DP_SHARD / HCOMM_GROUP_DP_REPLICATE).
 * Parameters are packed, in list order, into flat buckets of one dtype of at most
 * bucket_bytes (a larger parameter gets a bucket of its own; parameters without elements are in
 * no bucket). A bucket of numel elements is padded to a multiple of the shard group's size S;
 * rank r owns elements [r * shard, (r + 1) * shard) of it, shard = padded / S. The pad is
 * zero, never reduced into a parameter and never seen through hcomm_zero_param(): only the
 * shard view (hcomm_zero_shard()) shows where a shard ends (its valid count).
 *
 * The plan owns, per bucket: this rank's parameter shard (the master copy the optimizer
 * steps), its gradient shard (in the reduction dtype; from the first reduce_scatter until
 * hcomm_zero_clear_grads()), the gathered full parameters when
 * gathered (unless the caller gives a buffer) and the full gradients while a step accumulates
 * them. The stages are modes of the same calls:
 *  - ZeRO-1: the gathered parameters and the full gradients stay allocated; reduce_scatter
 *    gives each rank its gradient shard, the optimizer steps the shard, all_gather spreads it.
 *  - ZeRO-2: as ZeRO-1, but the full gradients are freed after each reduce_scatter.
 *  - ZeRO-3: as ZeRO-2, and hcomm_zero_release() frees gathered parameters between uses.
 * Every call with a bucket index also takes HCOMM_ZERO_ALL (every bucket, in order).
 *
 * Collective calls (create, gather, reduce_scatter) are made by every rank of the shard group
 * (and, for reduce_scatter with a replicate group, of the replicate group) with the same
 * bucket, in the same order. A rank whose own argument check fails still joins its peers'
 * collective, which then fails on every rank (HCOMM_ERR_PEER on the others). A plan is used by
 * one thread at a time, and no other call may run on its groups while a call of it runs.
 */
#ifndef HCOMM_C_ZERO_H_
#define HCOMM_C_ZERO_H_

#include "hcomm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Default bucket size in bytes of parameters (25 MiB, as DDP and FSDP's default). */
#define HCOMM_ZERO_BUCKET_BYTES_DEFAULT (25u << 20)
/** The most released buffers a plan keeps (hcomm_zero_config_t.spares). */
#define HCOMM_ZERO_SPARES_MAX 64
/** The bucket argument meaning every bucket of the plan, in bucket order. */
#define HCOMM_ZERO_ALL (-1)
/** hcomm_zero_config_t.reduce_dtype: reduce each bucket in its parameters' dtype. */
#define HCOMM_ZERO_PARAM_DTYPE (-1)

/** How a plan shards and reduces. */
typedef struct hcomm_zero_config {
    int stage;           /**< 1, 2 or 3 (ZeRO stage; see the file comment) */
    size_t bucket_bytes; /**< bucket cap in bytes of parameters; 0: the default */
    hcomm_op_t op;       /**< gradient reduction: HCOMM_SUM or HCOMM_AVG (over S * R ranks) */
    /** An hcomm_dtype_t the gradients are reduced and kept in (FSDP2's reduce_dtype), or
     *  HCOMM_ZERO_PARAM_DTYPE. It may equal a bucket's dtype, or be a wider float than a float
     *  bucket's (f16/bf16 to f32 or f64, f32 to f64); the message size is then the reduction
     *  dtype's. A narrower or integer one is HCOMM_ERR_DTYPE. */
    int reduce_dtype;
    /** 0: each reduce_scatter overwrites the gradient shard; 1: adds its result into it
     *  (FSDP's sharded accumulation: a reduce_scatter per micro-batch frees the full gradients
     *  at once), until hcomm_zero_clear_grads(). */
    int accumulate;
    /** Released buffers (gathered parameters, full or widened gradients) the plan keeps, at
     *  most HCOMM_ZERO_SPARES_MAX, for the next buffer of the same size, counted in
     *  hcomm_zero_memory(): a plan that is gathered and released bucket by bucket then stops
     *  faulting fresh pages inside its collectives (as a caching allocator keeps a step's
     *  buffers for the next). 0: every release frees (one plan per layer wants that). */
    int spares;
} hcomm_zero_config_t;

/** A shard plan. Opaque. */
typedef struct hcomm_zero_plan hcomm_zero_plan_t;

/** This rank's shard of one bucket (views owned by the plan, valid until destroy). */
typedef struct hcomm_zero_shard {
    void *params;               /**< [count] parameter dtype: the master shard to step */
    void *grads;                /**< [count] reduction dtype: the reduced gradient shard; NULL
                                     before the first reduce_scatter since creation or
                                     hcomm_zero_clear_grads() */
    size_t count;               /**< elements of the shard (every rank: the same) */
    size_t valid;               /**< the first valid elements hold parameters; the rest is pad */
    size_t offset;              /**< element offset of the shard in the bucket */
    hcomm_dtype_t param_dtype;  /**< dtype of params */
    hcomm_dtype_t reduce_dtype; /**< dtype of grads */
} hcomm_zero_shard_t;

/** Builds a plan for @p n parameters (contiguous host tensors; their values are the initial
 *  parameters: each rank copies its shard, and ZeRO-1/2 gather the full parameters once here)
 *  over @p shard_group, with @p replicate_group (NULL: no replicas) for HSDP. The layout is
 *  agreed before any data moves: if any rank's list, config or group sizes differ, every rank
 *  fails with HCOMM_ERR_MISMATCH naming the first differing parameter index and both shapes
 *  ("params[3] is f32[4, 8] on rank 0 but f32[8, 4] on rank 2"); a rank whose checks fail gets
 *  its own error and its peers HCOMM_ERR_PEER. Collective over @p shard_group and then over
 *  @p replicate_group. n may be 0 (a plan of no buckets; every call on it is a no-op).
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (n < 0, stage, op), HCOMM_ERR_DTYPE
 *  (reduce_dtype), HCOMM_ERR_SHAPE, HCOMM_ERR_MISMATCH, HCOMM_ERR_PEER, HCOMM_ERR_NOMEM and
 *  the collectives' errors. On error *out is NULL. */
HCOMM_API hcomm_result_t hcomm_zero_create(hcomm_comm_t *shard_group, hcomm_comm_t *replicate_group,
                                           const hcomm_tensor_t *params, int n,
                                           const hcomm_zero_config_t *cfg, hcomm_zero_plan_t **out);
/** Waits for whatever the plan has in flight, frees it and sets *plan to NULL (so a later use
 *  of the variable is HCOMM_ERR_NULL, not a use after free); NULL or *plan NULL is a no-op.
 *  Local, except that a reduce_scatter still in flight is finished first, which with a
 *  replicate group is that group's all_reduce. Returns the first error of an operation that
 *  was in flight. */
HCOMM_API hcomm_result_t hcomm_zero_destroy(hcomm_zero_plan_t **plan);

/** Number of buckets in @p *nb. Local. Errors: HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_zero_num_buckets(const hcomm_zero_plan_t *plan, int *nb);
/** Bucket of parameter @p index (-1 for a parameter without elements) and the bytes a caller's
 *  buffer for that bucket's hcomm_zero_all_gather_params() must have (pad included). Either
 *  output may be NULL. Local. Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (index). */
HCOMM_API hcomm_result_t hcomm_zero_locate(const hcomm_zero_plan_t *plan, int index, int *bucket,
                                           size_t *gather_bytes);
/** This rank's shard of @p bucket. Local. Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG. */
HCOMM_API hcomm_result_t hcomm_zero_shard(const hcomm_zero_plan_t *plan, int bucket,
                                          hcomm_zero_shard_t *out);
/** Where the full parameter @p index lives while its bucket is gathered (in the plan's or the
 *  caller's buffer); waits for a gather of that bucket still in flight. NULL for a parameter
 *  without elements. Local. Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (index),
 *  HCOMM_ERR_STATE (the bucket is not gathered: released, or never gathered), the gather's. */
HCOMM_API hcomm_result_t hcomm_zero_param(hcomm_zero_plan_t *plan, int index, void **data);
/** Where parameter @p index's full gradient accumulates (parameter dtype, its shape): zero at
 *  the start of each accumulation window (after each reduce_scatter that was not in no_sync
 *  mode), added to by the caller. The pointer holds for one window: ask again after each
 *  reduce_scatter (ZeRO-1 zeroes the bucket then, as zero_grad does, not inside the
 *  reduce_scatter; ZeRO-2/3 allocate it anew). Allocates the bucket's full gradients when
 *  they are not. NULL for a parameter without elements. Local. Errors: HCOMM_ERR_NULL,
 *  HCOMM_ERR_INVALID_ARG, HCOMM_ERR_STATE (a reduce_scatter of the bucket in flight),
 *  HCOMM_ERR_NOMEM. */
HCOMM_API hcomm_result_t hcomm_zero_grad(hcomm_zero_plan_t *plan, int index, void **data);

/** Gathers @p bucket's full parameters from every rank's shard, into @p buf (@p buf_bytes, as
 *  hcomm_zero_locate() gives) or, with buf NULL, a buffer the plan owns (kept until release in
 *  ZeRO-3, always in ZeRO-1/2). If a gather of the bucket is in flight it is waited for
 *  instead (buf must then be NULL or its buffer). Collective over the shard group.
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (bucket, buf_bytes, a caller's buffer for a
 *  ZeRO-1/2 plan), HCOMM_ERR_PEER, HCOMM_ERR_NOMEM, the collective's. */
HCOMM_API hcomm_result_t hcomm_zero_all_gather_params(hcomm_zero_plan_t *plan, int bucket,
                                                      void *buf, size_t buf_bytes);
/** Nonblocking hcomm_zero_all_gather_params() (a prefetch: issue the next bucket's gather
 *  while the current one is used; forward order, reverse order for backward). Complete it with
 *  hcomm_zero_wait(), or by a blocking gather or hcomm_zero_param() of the bucket. A second
 *  prefetch of a bucket in flight is a no-op. Errors at issue: as the blocking call. */
HCOMM_API hcomm_result_t hcomm_zero_iall_gather_params(hcomm_zero_plan_t *plan, int bucket,
                                                       void *buf, size_t buf_bytes);
/** Frees @p bucket's gathered parameters (ZeRO-3: only the shard stays). A no-op for ZeRO-1/2
 *  plans and for buckets not gathered. Local. Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG,
 *  HCOMM_ERR_STATE (a gather of the bucket is in flight: nothing is freed; wait first). */
HCOMM_API hcomm_result_t hcomm_zero_release(hcomm_zero_plan_t *plan, int bucket);

/** Reduces @p bucket's full gradients over the shard group into every rank's gradient shard
 *  (in the reduction dtype, with the plan's op), then, with a replicate group, all-reduces the
 *  shard over it; the full gradients then start a new window: zeroed when next asked for
 *  (ZeRO-1, hcomm_zero_grad()) or freed (ZeRO-2/3). A bucket
 *  whose gradients were never asked for reduces zeros. In no_sync mode it does nothing (the
 *  gradients keep accumulating). Collective over the shard group, then the replicate group.
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG (bucket), HCOMM_ERR_PEER, HCOMM_ERR_NOMEM,
 *  the collectives'. */
HCOMM_API hcomm_result_t hcomm_zero_reduce_scatter_grads(hcomm_zero_plan_t *plan, int bucket);
/** Nonblocking hcomm_zero_reduce_scatter_grads(): issue it as soon as the bucket's last
 *  gradient is final, so that it overlaps the rest of backward. Complete it with
 *  hcomm_zero_wait() (which runs the replicate all_reduce). Errors at issue: as the blocking
 *  call. */
HCOMM_API hcomm_result_t hcomm_zero_ireduce_scatter_grads(hcomm_zero_plan_t *plan, int bucket);
/** Completes what is in flight on @p bucket (gather and reduce_scatter); *wait_s (may be NULL)
 *  gets the seconds spent waiting. Collective where a replicate all_reduce is left to run.
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_INVALID_ARG, the collectives'. */
HCOMM_API hcomm_result_t hcomm_zero_wait(hcomm_zero_plan_t *plan, int bucket, double *wait_s);
/** Frees every gradient shard (after the optimizer step, as set_to_none: ZeRO-2/3 hold no
 *  gradients between steps); the next reduce_scatter starts a zeroed one. Local.
 *  Errors: HCOMM_ERR_NULL, HCOMM_ERR_STATE (a reduce_scatter in flight). */
HCOMM_API hcomm_result_t hcomm_zero_clear_grads(hcomm_zero_plan_t *plan);
/** no_sync mode on (@p on != 0) or off: while on, reduce_scatter calls keep gradients local
 *  (gradient accumulation steps, as DDP's and FSDP's no_sync()). Local. Errors: HCOMM_ERR_NULL,
 *  HCOMM_ERR_STATE (a reduce_scatter in flight). */
HCOMM_API hcomm_result_t hcomm_zero_set_no_sync(hcomm_zero_plan_t *plan, int on);
/** Bytes the plan holds now (@p live) and at most since creation (@p peak): shards, gathered
 *  buffers it owns, full gradients and reduction scratch. Either may be NULL. Local.
 *  Errors: HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_zero_memory(const hcomm_zero_plan_t *plan, size_t *live,
                                           size_t *peak);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_ZERO_H_ */
