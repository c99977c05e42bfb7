/* The messages of hcomm-train's compute code (comm.c): the tensor an hcomm call reads or
 * writes for a [rows, cols] array of real_t, bf16 copies with --dtype bf16. */
#ifndef HCOMM_TRAIN_COMM_H_
#define HCOMM_TRAIN_COMM_H_

#include "../rt.h"
#include "real.h"

/* A 2-D real_t tensor [rows, cols] over data. */
static inline hcomm_tensor_t train_view2(real_t *data, int64_t rows, int64_t cols) {
    return train_view(data, REAL_DTYPE, rows, cols);
}

/* The tensor an hcomm call reads from x: x itself, or a bf16 copy from the arena. */
static hcomm_tensor_t comm_in(train_rt_t *rt, real_t *x, int64_t rows, int64_t cols);
/* The tensor an hcomm call writes for x: x itself, or a bf16 buffer comm_out_done widens. */
static hcomm_tensor_t comm_out(train_rt_t *rt, real_t *x, int64_t rows, int64_t cols);
/* x = the values in t (a tensor of comm_out() or of a received bf16 message). */
static void comm_out_done(const hcomm_tensor_t *t, real_t *x);

#endif /* HCOMM_TRAIN_COMM_H_ */
