/* The body of every rank of hcomm-train: groups, pipeline schedule, gradient reduction,
 * optimizer and progress reports. */
#ifndef HCOMM_TRAIN_TRAIN_H_
#define HCOMM_TRAIN_TRAIN_H_

#include "data.h"
#include "hcomm/api.h"
#include "opts.h"

/* What every rank reads (never writes): the options and the text. */
typedef struct train_job {
    const train_opts_t *opts;
    const corpus_t *corpus;
} train_job_t;

/* hcomm_rank_fn_t of hcomm-train; @p arg is a train_job_t. */
hcomm_result_t train_rank(hcomm_comm_t *world, void *arg);

#endif /* HCOMM_TRAIN_TRAIN_H_ */
