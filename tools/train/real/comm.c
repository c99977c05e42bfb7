/* The messages of hcomm-train's compute code: the tensor an hcomm call reads or writes for a
 * [rows, cols] array of real_t (bf16 copies with --dtype bf16), for model.c, attn.c and sp.c. */
#include "comm.h"

#include <string.h>

/* The tensor an hcomm call reads from x [rows, cols]: x itself, or with --dtype bf16 a bf16
 * copy from the arena, so that the message is half the size of the f32 one. */
static hcomm_tensor_t comm_in(train_rt_t *rt, real_t *x, int64_t rows, int64_t cols) {
    if (!rt->bf16)
        return train_view2(x, rows, cols);
    uint16_t *b = arena_alloc(&rt->arena, (size_t)(rows * cols) * sizeof *b);
    for (int64_t i = 0; i < rows * cols; i++)
        b[i] = bf16_bits((float)x[i]);
    return train_view(b, HCOMM_BF16, rows, cols);
}

/* The tensor an hcomm call writes for x [rows, cols]: x itself, or a bf16 buffer that
 * comm_out_done() then widens into x. */
static hcomm_tensor_t comm_out(train_rt_t *rt, real_t *x, int64_t rows, int64_t cols) {
    if (!rt->bf16)
        return train_view2(x, rows, cols);
    uint16_t *b = arena_alloc(&rt->arena, (size_t)(rows * cols) * sizeof *b);
    return train_view(b, HCOMM_BF16, rows, cols);
}

/* x = the values in t (a tensor of comm_out() or of a received bf16 message). */
static void comm_out_done(const hcomm_tensor_t *t, real_t *x) {
    const int64_t count = t->shape[0] * t->shape[1];
    if (t->data == (void *)x)
        return;
    if (t->dtype == HCOMM_BF16)
        for (int64_t i = 0; i < count; i++)
            x[i] = (real_t)bf16_value(((const uint16_t *)t->data)[i]);
    else
        memcpy(x, t->data, (size_t)count * sizeof(real_t));
}
