/* The shard plan's state, shared by zero_plan.c (layout, agreement, accessors), zero_comm.c
 * (gather, reduce_scatter, release, wait) and zero_buf.c (its buffers). */
#ifndef HCOMM_C_PRIMS_ZERO_INTERNAL_H_
#define HCOMM_C_PRIMS_ZERO_INTERNAL_H_

#include "hcomm/zero.h"
#include "prims/prims.h"

/* Most released buffers a plan keeps for reuse (hcomm_zero_config_t.spares). */
#define ZERO_SPARES HCOMM_ZERO_SPARES_MAX

typedef struct zbucket {
    hcomm_dtype_t dt, rd; /* parameter and reduction dtype */
    int first, end;       /* its parameters are among params[first, end) */
    size_t numel, padded; /* elements of parameters, and with the pad (a multiple of S) */
    size_t shard;         /* padded / S */
    void *pshard;         /* [shard] dt: this rank's master parameters (ZeRO-1/2: a view of
                             its block of full, which is gathered in place) */
    void *gshard;         /* [shard] rd: this rank's reduced gradients */
    void *full;           /* [padded] dt: gathered parameters, or NULL */
    bool full_owned;      /* full is the plan's (else the caller's) */
    bool gathered;        /* full holds the gathered values (no gather in flight) */
    void *gfull;          /* [padded] dt: accumulating gradients, or NULL */
    bool gstale;          /* gfull holds a reduced window's values: zeroed when next asked for
                             (hcomm_zero_grad, or a reduce_scatter), as zero_grad is the
                             backward's part of a step, not the reduction's */
    void *gwide;          /* [padded] rd: widened gradients while a reduce_scatter runs */
    void *gnew;           /* [shard] rd: with accumulate, the result before it is added */
    hcomm_request_t *ag;  /* gather in flight */
    hcomm_request_t *rs;  /* reduce_scatter in flight */
} zbucket_t;

struct hcomm_zero_plan {
    hcomm_comm_t *g, *rep; /* shard group, replicate group (or NULL) */
    int S, rank;
    hcomm_zero_config_t cfg;
    int n, nb;
    size_t *offset; /* [n] element offset of each parameter in its bucket */
    size_t *numel;  /* [n] */
    int *bucket_of; /* [n]; -1 for parameters without elements */
    zbucket_t *b;   /* [nb] */
    bool no_sync;
    void *spare[ZERO_SPARES]; /* released buffers kept for the next of their size (counted live) */
    size_t spare_bytes[ZERO_SPARES];
    size_t live, peak; /* bytes of buffers the plan holds */
};

/* Zeroed bytes counted in the plan's live and peak figures (a spare of that size if any). */
hcomm_result_t hcomm__zero_alloc(hcomm_zero_plan_t *p, size_t bytes, void **out);
/* The same, not zeroed: for a buffer that is overwritten whole (a gather's). */
hcomm_result_t hcomm__zero_alloc_raw(hcomm_zero_plan_t *p, size_t bytes, void **out);
void hcomm__zero_free(hcomm_zero_plan_t *p, void **ptr, size_t bytes);
/* Frees a released bucket-sized buffer, or keeps it as a spare (cfg.spares): ZeRO-3 frees
 * and gathers the same sizes every step, and fresh pages fault inside the collectives. */
void hcomm__zero_recycle(hcomm_zero_plan_t *p, void **ptr, size_t bytes);
/* Zeroes the bucket's full gradients if a reduce_scatter left them stale (ZeRO-1). */
void hcomm__zero_fresh_grads(zbucket_t *b);
/* HCOMM_ERR_INVALID_ARG unless bucket is a bucket index (or, with all_ok, HCOMM_ZERO_ALL). */
hcomm_result_t hcomm__zero_check_bucket(const hcomm_zero_plan_t *p, int bucket, bool all_ok);
/* Waits for the bucket's gather and reduce_scatter, finishing the latter. */
hcomm_result_t hcomm__zero_wait_bucket(hcomm_zero_plan_t *p, zbucket_t *b);
/* Gathers every bucket (blocking): ZeRO-1/2's full parameters at creation. */
hcomm_result_t hcomm__zero_gather_all(hcomm_zero_plan_t *p);

#endif /* HCOMM_C_PRIMS_ZERO_INTERNAL_H_ */
