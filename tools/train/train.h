/* The body of every rank of hcomm-train: groups, pipeline schedule, gradient reduction,
 * optimizer and progress reports. */
#ifndef HCOMM_TRAIN_TRAIN_H_
#define HCOMM_TRAIN_TRAIN_H_

#include "data.h"
#include "hcomm/api.h"
#include "opts.h"

#include <stdatomic.h>

struct ckpt;

/* What every rank reads: the options, the text and the checkpoint to start from. */
typedef struct train_job {
    const train_opts_t *opts;
    const corpus_t *corpus;
    const struct ckpt *start; /* checkpoint to resume from, or NULL */
    atomic_int *explained;    /* set by a rank that told the user why the run stops */
} train_job_t;

/* hcomm_rank_fn_t of hcomm-train, one per compute precision (real/real.h): f64 for --dtype
 * f64, f32 for f32 and bf16; @p arg is a train_job_t. */
hcomm_result_t train_rank_f64(hcomm_comm_t *world, void *arg);
hcomm_result_t train_rank_f32(hcomm_comm_t *world, void *arg);

#endif /* HCOMM_TRAIN_TRAIN_H_ */
