/* The precision of one copy of hcomm-train's compute code (real/): real_f64.c and real_f32.c
 * compile nn.c, model.c and train.c once each, as one translation unit, with real_t the
 * element type of every weight, gradient and activation; --dtype picks the copy at run time
 * (bf16 runs the f32 copy with train_rt_t.bf16 set: see model.c). The functions of a copy are
 * static, so the two copies never clash; only train_rank_f64 / train_rank_f32 leave it. */
#ifndef HCOMM_TRAIN_REAL_H_
#define HCOMM_TRAIN_REAL_H_

#include "../arena.h"
#include "hcomm/core.h"

#include <stdint.h>
#include <string.h>

#if defined(TRAIN_REAL_F32)
typedef float real_t;
#define REAL_DTYPE HCOMM_F32
#define REAL_NAME(f) f##_f32
#define REAL_TINY 1e-38f     /* floor of a probability before its log */
typedef int32_t real_bits_t; /* an integer of real_t's size: moves its bits in a sum */
#define REAL_BITS_DTYPE HCOMM_I32
#elif defined(TRAIN_REAL_F64)
typedef double real_t;
#define REAL_DTYPE HCOMM_F64
#define REAL_NAME(f) f##_f64
#define REAL_TINY 1e-300
typedef int64_t real_bits_t;
#define REAL_BITS_DTYPE HCOMM_I64
#else
#error "compile real/ through real_f32.c or real_f64.c"
#endif

/* @p count uninitialized elements of real_t from the step's arena. */
static inline real_t *arena_reals(arena_t *a, int64_t count) {
    return arena_alloc(a, (size_t)count * sizeof(real_t));
}

/* bf16 (the top 16 bits of an f32) of @p f, rounded to nearest even; NaN stays NaN. */
static inline uint16_t bf16_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if (f != f)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float bf16_value(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

#endif /* HCOMM_TRAIN_REAL_H_ */
