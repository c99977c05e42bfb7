#include "core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[HCOMM_DTYPE_COUNT] = {
    [HCOMM_F32] = {"f32", 4},   [HCOMM_F64] = {"f64", 8}, [HCOMM_F16] = {"f16", 2},
    [HCOMM_BF16] = {"bf16", 2}, [HCOMM_I8] = {"i8", 1},   [HCOMM_U8] = {"u8", 1},
    [HCOMM_I32] = {"i32", 4},   [HCOMM_I64] = {"i64", 8},
};

bool hcomm__dtype_valid(hcomm_dtype_t dt) {
    return (unsigned)dt < HCOMM_DTYPE_COUNT;
}

bool hcomm__dtype_is_float(hcomm_dtype_t dt) {
    return dt == HCOMM_F16 || dt == HCOMM_BF16 || dt == HCOMM_F32 || dt == HCOMM_F64;
}

bool hcomm__op_valid(hcomm_op_t op) {
    return (unsigned)op < HCOMM_OP_COUNT;
}

size_t hcomm__dtype_size(hcomm_dtype_t dt) {
    return hcomm__dtype_valid(dt) ? dtype_info[dt].size : 0;
}

hcomm_result_t hcomm_dtype_size(hcomm_dtype_t dtype, size_t *bytes) {
    HCOMM__CHECK_NULL(bytes);
    if (!hcomm__dtype_valid(dtype))
        return hcomm__err(HCOMM_ERR_DTYPE, __func__, "dtype=%d is not a valid hcomm_dtype_t",
                          (int)dtype);
    *bytes = dtype_info[dtype].size;
    return HCOMM_OK;
}

hcomm_result_t hcomm_dtype_name(hcomm_dtype_t dtype, const char **name) {
    HCOMM__CHECK_NULL(name);
    if (!hcomm__dtype_valid(dtype))
        return hcomm__err(HCOMM_ERR_DTYPE, __func__, "dtype=%d is not a valid hcomm_dtype_t",
                          (int)dtype);
    *name = dtype_info[dtype].name;
    return HCOMM_OK;
}

/* --- half precision: bit-exact conversions, round to nearest even --- */

/* Bit manipulation only (no libm calls): the reductions call these once per element. */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    float f;
    if (exp == 31) {
        bits = sign | (man ? 0x7fc00000u : 0x7f800000u);
    } else if (exp == 0) {
        f = (float)man * 0x1p-24f; /* zero or subnormal: exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) /* 65520 and up round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal, quantum 2^-24 */
        float a;
        memcpy(&a, &ax, 4);
        /* a * 2^24 < 2^10 is exact; adding 2^23 rounds it to an integer, to nearest even */
        float q = (a * 0x1p24f + 0x1p23f) - 0x1p23f;
        return (uint16_t)(sign | (uint32_t)q);
    }
    uint32_t h = ((((ax >> 23) - 112u) << 10) | ((ax >> 13) & 0x3ffu)), rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry out of the mantissa moves the exponent up, as it should */
    return (uint16_t)(sign | h);
}

float hcomm__f16_to_f32(uint16_t h) {
    return f16_to_f32(h);
}

uint16_t hcomm__f32_to_f16(float f) {
    return f32_to_f16(f);
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* A select, not a branch, so that loops of it vectorise. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16, quiet = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

float hcomm__bf16_to_f32(uint16_t h) {
    return bf16_to_f32(h);
}

uint16_t hcomm__f32_to_bf16(float f) {
    return f32_to_bf16(f);
}

/* --- reduction kernels --- */

/* MAX/MIN of floats propagate NaN whichever operand holds it (a > b is false for a NaN a,
 * so a bare a > b ? a : b would keep or drop the NaN depending on the operand order). */
#define HCOMM__APPLY_INT(a, b, op)                                                                 \
    ((op) == HCOMM_PROD  ? (a) * (b)                                                               \
     : (op) == HCOMM_MAX ? ((a) > (b) ? (a) : (b))                                                 \
     : (op) == HCOMM_MIN ? ((a) < (b) ? (a) : (b))                                                 \
                         : (a) + (b))
#define HCOMM__APPLY_FLT(a, b, op)                                                                 \
    ((op) == HCOMM_PROD  ? (a) * (b)                                                               \
     : (op) == HCOMM_MAX ? ((a) > (b) || isnan(a) ? (a) : (b))                                     \
     : (op) == HCOMM_MIN ? ((a) < (b) || isnan(a) ? (a) : (b))                                     \
                         : (a) + (b))

/* d[i] = a[i] op b[i]; d may be a (hcomm__reduce) or b. */
#define HCOMM__REDUCE_NATIVE(T, APPLY)                                                             \
    static void reduce_##T(T *d, const T *a, const T *b, size_t n, hcomm_op_t op) {                \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = (T)APPLY(a[i], b[i], op);                                                       \
    }
HCOMM__REDUCE_NATIVE(float, HCOMM__APPLY_FLT)
HCOMM__REDUCE_NATIVE(double, HCOMM__APPLY_FLT)
HCOMM__REDUCE_NATIVE(int8_t, HCOMM__APPLY_INT)
HCOMM__REDUCE_NATIVE(uint8_t, HCOMM__APPLY_INT)

/* Wide signed integers sum and multiply in unsigned arithmetic: wrap-around, not UB. */
#define HCOMM__REDUCE_WRAP(T, U)                                                                   \
    static void reduce_##T(T *d, const T *a, const T *b, size_t n, hcomm_op_t op) {                \
        for (size_t i = 0; i < n; i++) {                                                           \
            if (op == HCOMM_SUM || op == HCOMM_PROD)                                               \
                d[i] = (T)(op == HCOMM_SUM ? (U)a[i] + (U)b[i] : (U)a[i] * (U)b[i]);               \
            else                                                                                   \
                d[i] = HCOMM__APPLY_INT(a[i], b[i], op);                                           \
        }                                                                                          \
    }
HCOMM__REDUCE_WRAP(int32_t, uint32_t)
HCOMM__REDUCE_WRAP(int64_t, uint64_t)

/* The 16-bit side is read and written with memcpy: it need not be 2-byte aligned (a row of a
 * packed MoE buffer), and the compiler still emits plain loads and stores. */
static inline uint16_t load_u16(const char *p) {
    uint16_t u;
    memcpy(&u, p, 2);
    return u;
}

void hcomm__widen(float *dst, const void *src, size_t n, hcomm_dtype_t dt) {
    const char *h = src;
    if (dt == HCOMM_BF16)
        for (size_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32(load_u16(h + 2 * i));
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = f16_to_f32(load_u16(h + 2 * i));
}

static inline void store_u16(char *p, uint16_t u) {
    memcpy(p, &u, 2);
}

void hcomm__narrow(void *dst, const float *src, size_t n, hcomm_dtype_t dt) {
    char *h = dst;
    if (dt == HCOMM_BF16)
        for (size_t i = 0; i < n; i++)
            store_u16(h + 2 * i, f32_to_bf16(src[i]));
    else
        for (size_t i = 0; i < n; i++)
            store_u16(h + 2 * i, f32_to_f16(src[i]));
}

static inline float half_to_f32(uint16_t h, bool bf) {
    return bf ? bf16_to_f32(h) : f16_to_f32(h);
}

static inline uint16_t f32_to_half(float f, bool bf) {
    return bf ? f32_to_bf16(f) : f32_to_f16(f);
}

/* Inlined into one loop per (format, op) below, so that no loop tests either per element:
 * several times faster than one loop that does. */
static inline __attribute__((always_inline)) void
half_loop(uint16_t *d, const uint16_t *a, const uint16_t *b, size_t n, hcomm_op_t op, bool bf) {
    for (size_t i = 0; i < n; i++) {
        float x = half_to_f32(a[i], bf), y = half_to_f32(b[i], bf);
        d[i] = f32_to_half(HCOMM__APPLY_FLT(x, y, op), bf);
    }
}

#define HCOMM__HALF_OPS(d, a, b, n, op, BF)                                                        \
    switch (op) {                                                                                  \
    case HCOMM_PROD:                                                                               \
        half_loop(d, a, b, n, HCOMM_PROD, BF);                                                     \
        break;                                                                                     \
    case HCOMM_MAX:                                                                                \
        half_loop(d, a, b, n, HCOMM_MAX, BF);                                                      \
        break;                                                                                     \
    case HCOMM_MIN:                                                                                \
        half_loop(d, a, b, n, HCOMM_MIN, BF);                                                      \
        break;                                                                                     \
    default:                                                                                       \
        half_loop(d, a, b, n, HCOMM_SUM, BF);                                                      \
        break;                                                                                     \
    }

static void reduce_half(uint16_t *d, const uint16_t *a, const uint16_t *b, size_t n, hcomm_op_t op,
                        bool bf) {
    if (bf) {
        HCOMM__HALF_OPS(d, a, b, n, op, true)
    } else {
        HCOMM__HALF_OPS(d, a, b, n, op, false)
    }
}

void hcomm__reduce_to(void *dst, const void *a, const void *b, size_t n, hcomm_dtype_t dt,
                      hcomm_op_t op) {
    switch (dt) {
    case HCOMM_F32:
        reduce_float(dst, a, b, n, op);
        break;
    case HCOMM_F64:
        reduce_double(dst, a, b, n, op);
        break;
    case HCOMM_F16:
        reduce_half(dst, a, b, n, op, false);
        break;
    case HCOMM_BF16:
        reduce_half(dst, a, b, n, op, true);
        break;
    case HCOMM_I8:
        reduce_int8_t(dst, a, b, n, op);
        break;
    case HCOMM_U8:
        reduce_uint8_t(dst, a, b, n, op);
        break;
    case HCOMM_I32:
        reduce_int32_t(dst, a, b, n, op);
        break;
    case HCOMM_I64:
        reduce_int64_t(dst, a, b, n, op);
        break;
    default:
        break;
    }
}

void hcomm__reduce(void *dst, const void *src, size_t n, hcomm_dtype_t dt, hcomm_op_t op) {
    hcomm__reduce_to(dst, dst, src, n, dt, op);
}

/* Half precision over n inputs: accumulated in f32 in input order, divided (AVG) and rounded
 * once, so the result does not depend on how many partial roundings a layout would cause. */
static void reduce_many_half(uint16_t *dst, const void *const *srcs, int n, size_t off,
                             size_t count, hcomm_op_t op, bool bf) {
    enum { BLOCK = 256 };
    float acc[BLOCK];
    hcomm_op_t aop = op == HCOMM_AVG ? HCOMM_SUM : op;
    for (size_t b = 0; b < count; b += BLOCK) {
        size_t m = count - b < BLOCK ? count - b : BLOCK;
        const uint16_t *s0 = (const uint16_t *)srcs[0] + off + b;
        for (size_t i = 0; i < m; i++)
            acc[i] = half_to_f32(s0[i], bf);
        for (int r = 1; r < n; r++) {
            const uint16_t *s = (const uint16_t *)srcs[r] + off + b;
            for (size_t i = 0; i < m; i++) {
                float v = half_to_f32(s[i], bf);
                acc[i] = HCOMM__APPLY_FLT(acc[i], v, aop);
            }
        }
        for (size_t i = 0; i < m; i++)
            dst[b + i] = f32_to_half(op == HCOMM_AVG ? acc[i] / (float)n : acc[i], bf);
    }
}

void hcomm__reduce_many(void *dst, const void *const *srcs, int n, size_t off, size_t count,
                        hcomm_dtype_t dt, hcomm_op_t op) {
    size_t es = hcomm__dtype_size(dt);
    if (count == 0 || n <= 0)
        return;
    if (dt == HCOMM_F16 || dt == HCOMM_BF16) {
        reduce_many_half(dst, srcs, n, off, count, op, dt == HCOMM_BF16);
        return;
    }
    hcomm_op_t aop = op == HCOMM_AVG ? HCOMM_SUM : op;
    memcpy(dst, (const char *)srcs[0] + off * es, count * es);
    for (int r = 1; r < n; r++)
        hcomm__reduce(dst, (const char *)srcs[r] + off * es, count, dt, aop);
    if (op == HCOMM_AVG)
        hcomm__scale_div(dst, count, dt, n);
}

/* Divides in int64 (or double): k need not fit in T (a group of 256 is 0 as a u8). */
#define HCOMM__DIV(T)                                                                              \
    static void div_##T(T *b, size_t n, int k) {                                                   \
        for (size_t i = 0; i < n; i++)                                                             \
            b[i] = (T)(b[i] / (int64_t)k);                                                         \
    }
HCOMM__DIV(int8_t)
HCOMM__DIV(uint8_t)
HCOMM__DIV(int32_t)
HCOMM__DIV(int64_t)

static void div_float(float *b, size_t n, int k) {
    for (size_t i = 0; i < n; i++)
        b[i] = b[i] / (float)k;
}

static void div_double(double *b, size_t n, int k) {
    for (size_t i = 0; i < n; i++)
        b[i] = b[i] / (double)k;
}

static void div_half(uint16_t *b, size_t n, int k, bool bf) {
    for (size_t i = 0; i < n; i++)
        b[i] = f32_to_half(half_to_f32(b[i], bf) / (float)k, bf);
}

void hcomm__scale_div(void *buf, size_t n, hcomm_dtype_t dt, int k) {
    switch (dt) {
    case HCOMM_F32:
        div_float(buf, n, k);
        break;
    case HCOMM_F64:
        div_double(buf, n, k);
        break;
    case HCOMM_F16:
        div_half(buf, n, k, false);
        break;
    case HCOMM_BF16:
        div_half(buf, n, k, true);
        break;
    case HCOMM_I8:
        div_int8_t(buf, n, k);
        break;
    case HCOMM_U8:
        div_uint8_t(buf, n, k);
        break;
    case HCOMM_I32:
        div_int32_t(buf, n, k);
        break;
    case HCOMM_I64:
        div_int64_t(buf, n, k);
        break;
    default:
        break;
    }
}

double hcomm__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void hcomm__backoff_init(hcomm__backoff_t *b) {
    *b = (hcomm__backoff_t){0};
}

/* Spinning is cheapest while the peer runs on another core; yielding lets an oversubscribed
 * peer run at once (8 ranks on 2 cores); a nap after 2 ms keeps idle waiters off the cores. */
double hcomm__backoff(hcomm__backoff_t *b) {
    unsigned long i = b->iter++;
    if (i < 64)
        return 0.0;
    if (b->start == 0.0)
        b->start = hcomm__now();
    if ((i & 63) == 0) {
        b->waited = hcomm__now() - b->start;
        b->napping = b->waited > 2e-3;
    }
    if (b->napping) {
        struct timespec ts = {0, 20 * 1000};
        nanosleep(&ts, NULL);
    } else {
        sched_yield();
    }
    return b->waited;
}
