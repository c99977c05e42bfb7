#include "core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

const char *hcomm__dtype_str(hcomm_dtype_t dt) {
    const char *name = "?";
    if (hcomm__dtype_valid(dt))
        hcomm_dtype_name(dt, &name);
    return name;
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
    static void reduce_##T(void *vd, const void *va, const void *vb, size_t n, hcomm_op_t op) {    \
        T *d = vd;                                                                                 \
        const T *a = va, *b = vb;                                                                  \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = (T)APPLY(a[i], b[i], op);                                                       \
    }
HCOMM__REDUCE_NATIVE(float, HCOMM__APPLY_FLT)
HCOMM__REDUCE_NATIVE(double, HCOMM__APPLY_FLT)
HCOMM__REDUCE_NATIVE(int8_t, HCOMM__APPLY_INT)
HCOMM__REDUCE_NATIVE(uint8_t, HCOMM__APPLY_INT)

/* Wide signed integers sum and multiply in unsigned arithmetic: wrap-around, not UB. */
#define HCOMM__REDUCE_WRAP(T, U)                                                                   \
    static void reduce_##T(void *vd, const void *va, const void *vb, size_t n, hcomm_op_t op) {    \
        T *d = vd;                                                                                 \
        const T *a = va, *b = vb;                                                                  \
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

static inline void store_u16(char *p, uint16_t u) {
    memcpy(p, &u, 2);
}

/* x86 with F16C converts 8 f16 values per instruction, exact and round-to-nearest-even like the
 * scalar code; only NaNs differ (the hardware keeps the payload), so NaN lanes are rewritten to
 * the scalar code's canonical quiet NaN of the same sign, and both paths give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HCOMM__HAVE_X86_PATHS 1

static bool f16c_usable(void) {
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}

static inline __attribute__((target("avx,f16c"))) __m256 canonical_nan(__m256 v) {
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    __m256 quiet = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)),
                                _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
    /* masks, not _mm256_blendv_ps: GCC 12 turns that blend into a branch per lane */
    return _mm256_or_ps(_mm256_andnot_ps(nan, v), _mm256_and_ps(nan, quiet));
}

static __attribute__((target("avx,f16c"))) void f16c_widen(float *dst, const char *h, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            dst + i, canonical_nan(_mm256_cvtph_ps(_mm_loadu_si128((const void *)(h + 2 * i)))));
    for (; i < n; i++)
        dst[i] = f16_to_f32(load_u16(h + 2 * i));
}

static __attribute__((target("avx,f16c"))) void f16c_narrow(char *h, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((void *)(h + 2 * i),
                         _mm256_cvtps_ph(canonical_nan(_mm256_loadu_ps(src + i)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        store_u16(h + 2 * i, f32_to_f16(src[i]));
}

static bool avx2_usable(void) {
    return __builtin_cpu_supports("avx2");
}

/* f32_to_bf16 on 8 lanes: the same wrapping integer arithmetic and NaN rule. */
static inline __attribute__((target("avx2"))) __m256i bf16_lanes(__m256i x) {
    __m256i top = _mm256_srli_epi32(x, 16);
    __m256i lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i quiet = _mm256_or_si256(top, _mm256_set1_epi32(0x40));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    return _mm256_or_si256(_mm256_andnot_si256(nan, rounded), _mm256_and_si256(nan, quiet));
}

/* Plain C leaves this loop scalar-speed on the x86-64 baseline (no 32-to-16-bit pack). */
static __attribute__((target("avx2"))) void avx2_narrow_bf16(char *h, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i lo = bf16_lanes(_mm256_loadu_si256((const void *)(src + i)));
        __m256i hi = bf16_lanes(_mm256_loadu_si256((const void *)(src + i + 8)));
        /* packus works per 128-bit half: the permute puts the four quarters back in order */
        _mm256_storeu_si256((void *)(h + 2 * i),
                            _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8));
    }
    for (; i < n; i++)
        store_u16(h + 2 * i, f32_to_bf16(src[i]));
}

/* bf16 to f32 is a 16-bit shift: 8 lanes per step (SSE2 code handles 4). */
static __attribute__((target("avx2"))) __m256 bf16_widen8(const char *h) {
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const void *)h));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

static __attribute__((target("avx2"))) void avx2_widen_bf16(float *dst, const char *h, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, bf16_widen8(h + 2 * i));
    for (; i < n; i++)
        dst[i] = bf16_to_f32(load_u16(h + 2 * i));
}

/* acc op= widen(h) in one pass over acc (sum or product, as reduce_float: acc first). */
static __attribute__((target("avx2"))) void avx2_accumulate_bf16(float *acc, const char *h,
                                                                 size_t n, bool prod) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(acc + i), v = bf16_widen8(h + 2 * i);
        _mm256_storeu_ps(acc + i, prod ? _mm256_mul_ps(a, v) : _mm256_add_ps(a, v));
    }
    for (; i < n; i++) {
        float v = bf16_to_f32(load_u16(h + 2 * i));
        acc[i] = prod ? acc[i] * v : acc[i] + v;
    }
}

static __attribute__((target("avx,f16c"))) void f16c_accumulate(float *acc, const char *h, size_t n,
                                                                bool prod) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(acc + i),
               v = canonical_nan(_mm256_cvtph_ps(_mm_loadu_si128((const void *)(h + 2 * i))));
        _mm256_storeu_ps(acc + i, prod ? _mm256_mul_ps(a, v) : _mm256_add_ps(a, v));
    }
    for (; i < n; i++) {
        float v = f16_to_f32(load_u16(h + 2 * i));
        acc[i] = prod ? acc[i] * v : acc[i] + v;
    }
}

/* hcomm__weighted_sum on 32 columns (one cache line of each row) a step from column i on: four
 * sums in registers, products then sums, and each row's line PREFETCH_AHEAD bytes on
 * prefetched: the rows are mostly in memory, k streams at once. */
#define PREFETCH_AHEAD 1024
static __attribute__((target("avx2"))) void avx2_weighted_sum_bf16(char *out,
                                                                   const char *const *rows,
                                                                   const float *w, int nrows,
                                                                   size_t i, size_t n) {
    for (; i + 32 <= n; i += 32) {
        const char *r = rows[0] + 2 * i;
        _mm_prefetch(r + PREFETCH_AHEAD, _MM_HINT_T0);
        __m256 w0 = _mm256_set1_ps(w[0]), s[4];
        for (int q = 0; q < 4; q++)
            s[q] = _mm256_mul_ps(w0, bf16_widen8(r + 16 * q));
        for (int j = 1; j < nrows; j++) {
            r = rows[j] + 2 * i;
            _mm_prefetch(r + PREFETCH_AHEAD, _MM_HINT_T0);
            __m256 wj = _mm256_set1_ps(w[j]);
            for (int q = 0; q < 4; q++)
                s[q] = _mm256_add_ps(s[q], _mm256_mul_ps(wj, bf16_widen8(r + 16 * q)));
        }
        for (int q = 0; q < 4; q += 2) {
            __m256i a = bf16_lanes(_mm256_castps_si256(s[q])),
                    b = bf16_lanes(_mm256_castps_si256(s[q + 1]));
            _mm256_storeu_si256((void *)(out + 2 * i + 16 * q),
                                _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8));
        }
    }
    for (; i < n; i++) {
        float acc = w[0] * bf16_to_f32(load_u16(rows[0] + 2 * i));
        for (int j = 1; j < nrows; j++)
            acc += w[j] * bf16_to_f32(load_u16(rows[j] + 2 * i));
        store_u16(out + 2 * i, f32_to_bf16(acc));
    }
}

static bool avx512_usable(void) {
    return __builtin_cpu_supports("avx512f");
}

static __attribute__((target("avx512f"))) __m512 bf16_widen16(const char *h) {
    __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)h));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}

/* bf16_lanes on 16 lanes, narrowed to 16 bits (as avx2_narrow_bf16 packs them). */
static inline __attribute__((target("avx512f"))) __m256i bf16_lanes16(__m512i x) {
    __m256i lo = bf16_lanes(_mm512_castsi512_si256(x)),
            hi = bf16_lanes(_mm512_extracti64x4_epi64(x, 1));
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
}

/* The same sums on 128 columns (four lines of each row) a step in eight registers of 16: with the
 * rows in cache the AVX2 loop is bound by its instructions, and this one needs half as many
 * (docs/tuning.md: moe.wsum). Returns the columns done; the AVX2 loop takes the rest. */
static __attribute__((target("avx512f"))) size_t
avx512_weighted_sum_bf16(char *out, const char *const *rows, const float *w, int nrows, size_t n) {
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        const char *r = rows[0] + 2 * i;
        for (int p = 0; p < 256; p += 64)
            _mm_prefetch(r + PREFETCH_AHEAD + p, _MM_HINT_T0);
        __m512 w0 = _mm512_set1_ps(w[0]), s[8];
        for (int q = 0; q < 8; q++)
            s[q] = _mm512_mul_ps(w0, bf16_widen16(r + 32 * q));
        for (int j = 1; j < nrows; j++) {
            r = rows[j] + 2 * i;
            for (int p = 0; p < 256; p += 64)
                _mm_prefetch(r + PREFETCH_AHEAD + p, _MM_HINT_T0);
            __m512 wj = _mm512_set1_ps(w[j]);
            for (int q = 0; q < 8; q++)
                s[q] = _mm512_add_ps(s[q], _mm512_mul_ps(wj, bf16_widen16(r + 32 * q)));
        }
        for (int q = 0; q < 8; q++)
            _mm256_storeu_si256((void *)(out + 2 * i + 32 * q),
                                bf16_lanes16(_mm512_castps_si512(s[q])));
    }
    return i;
}

/* Sums of several inputs in one pass, in input order (the bits of the pairwise passes, which
 * read and wrote the partial sum once per input): 64 f32 or 32 f64 columns a step in four
 * registers. Each returns the columns done; the pairwise loop takes the rest. */
static __attribute__((target("avx512f"))) size_t
avx512_sum_many_f32(float *dst, const void *const *srcs, int n, size_t off, size_t count) {
    size_t i = 0;
    for (; i + 64 <= count; i += 64) {
        const float *s = (const float *)srcs[0] + off + i;
        __m512 a[4];
        for (int q = 0; q < 4; q++)
            a[q] = _mm512_loadu_ps(s + 16 * q);
        for (int r = 1; r < n; r++) {
            s = (const float *)srcs[r] + off + i;
            for (int q = 0; q < 4; q++)
                a[q] = _mm512_add_ps(a[q], _mm512_loadu_ps(s + 16 * q));
        }
        for (int q = 0; q < 4; q++)
            _mm512_storeu_ps(dst + i + 16 * q, a[q]);
    }
    return i;
}

static __attribute__((target("avx512f"))) size_t
avx512_sum_many_f64(double *dst, const void *const *srcs, int n, size_t off, size_t count) {
    size_t i = 0;
    for (; i + 32 <= count; i += 32) {
        const double *s = (const double *)srcs[0] + off + i;
        __m512d a[4];
        for (int q = 0; q < 4; q++)
            a[q] = _mm512_loadu_pd(s + 8 * q);
        for (int r = 1; r < n; r++) {
            s = (const double *)srcs[r] + off + i;
            for (int q = 0; q < 4; q++)
                a[q] = _mm512_add_pd(a[q], _mm512_loadu_pd(s + 8 * q));
        }
        for (int q = 0; q < 4; q++)
            _mm512_storeu_pd(dst + i + 8 * q, a[q]);
    }
    return i;
}

/* The same pass for bf16 sums and means: every input widened and added in f32 in input order,
 * a mean divided there, and each sum rounded once (reduce_many_half's bits), 64 columns a step. */
static __attribute__((target("avx512f"))) size_t avx512_sum_many_bf16(uint16_t *dst,
                                                                      const void *const *srcs,
                                                                      int n, size_t off,
                                                                      size_t count, bool mean) {
    size_t i = 0;
    for (; i + 64 <= count; i += 64) {
        const char *s = (const char *)((const uint16_t *)srcs[0] + off + i);
        __m512 a[4];
        for (int q = 0; q < 4; q++)
            a[q] = bf16_widen16(s + 32 * q);
        for (int r = 1; r < n; r++) {
            s = (const char *)((const uint16_t *)srcs[r] + off + i);
            for (int q = 0; q < 4; q++)
                a[q] = _mm512_add_ps(a[q], bf16_widen16(s + 32 * q));
        }
        for (int q = 0; q < 4; q++) {
            if (mean)
                a[q] = _mm512_div_ps(a[q], _mm512_set1_ps((float)n));
            _mm256_storeu_si256((void *)(dst + i + 16 * q),
                                bf16_lanes16(_mm512_castps_si512(a[q])));
        }
    }
    return i;
}

/* The vector conversions where this host has them (AVX2 for bf16, F16C for f16). */
static bool half_vectors(hcomm_dtype_t dt) {
    return dt == HCOMM_BF16 ? avx2_usable() : f16c_usable();
}
#endif

void hcomm__widen(float *dst, const void *src, size_t n, hcomm_dtype_t dt) {
    const char *h = src;
#ifdef HCOMM__HAVE_X86_PATHS
    if (half_vectors(dt)) {
        (dt == HCOMM_BF16 ? avx2_widen_bf16 : f16c_widen)(dst, h, n);
        return;
    }
#endif
    if (dt == HCOMM_BF16)
        for (size_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32(load_u16(h + 2 * i));
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = f16_to_f32(load_u16(h + 2 * i));
}

/* A block of columns of every row widened in turn (the conversions above) and summed in f32. */
static void weighted_sum_blocks(char *out, const char *const *rows, const float *w, int nrows,
                                size_t n, hcomm_dtype_t dt) {
    size_t es = dt == HCOMM_F32 ? 4 : 2;
    float acc[256], tmp[256];
    for (size_t o = 0; o < n; o += 256) {
        size_t m = n - o < 256 ? n - o : 256;
        for (int j = 0; j < nrows; j++) {
            if (dt == HCOMM_F32)
                memcpy(tmp, rows[j] + o * es, m * es);
            else
                hcomm__widen(tmp, rows[j] + o * es, m, dt);
            for (size_t i = 0; i < m; i++)
                acc[i] = j == 0 ? w[j] * tmp[i] : acc[i] + w[j] * tmp[i];
        }
        if (dt == HCOMM_F32)
            memcpy(out + o * es, acc, m * es);
        else
            hcomm__narrow(out + o * es, acc, m, dt);
    }
}

void hcomm__weighted_sum(void *out, const void *const *rows, const float *w, int nrows, size_t n,
                         hcomm_dtype_t dt) {
#ifdef HCOMM__HAVE_X86_PATHS
    if (dt == HCOMM_BF16 && avx2_usable()) {
        const char *const *r = (const char *const *)rows;
        size_t done = avx512_usable() ? avx512_weighted_sum_bf16(out, r, w, nrows, n) : 0;
        avx2_weighted_sum_bf16(out, r, w, nrows, done, n);
        return;
    }
#endif
    weighted_sum_blocks(out, (const char *const *)rows, w, nrows, n, dt);
}

void hcomm__narrow(void *dst, const float *src, size_t n, hcomm_dtype_t dt) {
    char *h = dst;
#ifdef HCOMM__HAVE_X86_PATHS
    if (half_vectors(dt)) {
        (dt == HCOMM_BF16 ? avx2_narrow_bf16 : f16c_narrow)(h, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        store_u16(h + 2 * i, dt == HCOMM_BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]));
}

/* Half precision is reduced through f32 blocks: the conversions run as whole-block loops (8
 * lanes per instruction for f16 with F16C, plain vector code for bf16) and the op as the f32
 * kernel, so no loop tests the format or the op per element. */
enum { HALF_BLOCK = 512 };

static void div_float(float *b, size_t n, int k) {
    for (size_t i = 0; i < n; i++)
        b[i] = b[i] / (float)k;
}

static void reduce_half(uint16_t *d, const uint16_t *a, const uint16_t *b, size_t n, hcomm_op_t op,
                        hcomm_dtype_t dt) {
    float x[HALF_BLOCK], y[HALF_BLOCK];
    for (size_t o = 0; o < n; o += HALF_BLOCK) {
        size_t m = n - o < HALF_BLOCK ? n - o : HALF_BLOCK;
        hcomm__widen(x, a + o, m, dt);
        hcomm__widen(y, b + o, m, dt);
        reduce_float(x, x, y, m, op);
        hcomm__narrow(d + o, x, m, dt);
    }
}

static void reduce_f16(void *d, const void *a, const void *b, size_t n, hcomm_op_t op) {
    reduce_half(d, a, b, n, op, HCOMM_F16);
}

static void reduce_bf16(void *d, const void *a, const void *b, size_t n, hcomm_op_t op) {
    reduce_half(d, a, b, n, op, HCOMM_BF16);
}

/* d = a op b, by dtype. */
typedef void (*reduce_kernel_t)(void *d, const void *a, const void *b, size_t n, hcomm_op_t op);
static const reduce_kernel_t reduce_kernels[HCOMM_DTYPE_COUNT] = {
    [HCOMM_F32] = reduce_float,   [HCOMM_F64] = reduce_double,  [HCOMM_F16] = reduce_f16,
    [HCOMM_BF16] = reduce_bf16,   [HCOMM_I8] = reduce_int8_t,   [HCOMM_U8] = reduce_uint8_t,
    [HCOMM_I32] = reduce_int32_t, [HCOMM_I64] = reduce_int64_t,
};

void hcomm__reduce_to(void *dst, const void *a, const void *b, size_t n, hcomm_dtype_t dt,
                      hcomm_op_t op) {
    if (hcomm__dtype_valid(dt) && reduce_kernels[dt])
        reduce_kernels[dt](dst, a, b, n, op);
}

void hcomm__reduce(void *dst, const void *src, size_t n, hcomm_dtype_t dt, hcomm_op_t op) {
    hcomm__reduce_to(dst, dst, src, n, dt, op);
}

bool hcomm__sums_in_f32(hcomm_dtype_t dt, hcomm_op_t op) {
    return (dt == HCOMM_F16 || dt == HCOMM_BF16) && op != HCOMM_MAX && op != HCOMM_MIN;
}

void hcomm__accumulate_half(float *acc, const void *src, size_t n, hcomm_dtype_t dt,
                            hcomm_op_t op) {
    hcomm_op_t aop = op == HCOMM_AVG ? HCOMM_SUM : op;
#ifdef HCOMM__HAVE_X86_PATHS
    if ((aop == HCOMM_SUM || aop == HCOMM_PROD) && half_vectors(dt)) {
        (dt == HCOMM_BF16 ? avx2_accumulate_bf16 : f16c_accumulate)(acc, src, n, aop == HCOMM_PROD);
        return;
    }
#endif
    float v[HALF_BLOCK];
    for (size_t b = 0; b < n; b += HALF_BLOCK) {
        size_t m = n - b < HALF_BLOCK ? n - b : HALF_BLOCK;
        hcomm__widen(v, (const uint16_t *)src + b, m, dt);
        reduce_float(acc + b, acc + b, v, m, aop);
    }
}

void hcomm__round_half(void *dst, float *acc, size_t n, hcomm_dtype_t dt, hcomm_op_t op,
                       int inputs) {
    if (op == HCOMM_AVG)
        div_float(acc, n, inputs);
    hcomm__narrow(dst, acc, n, dt);
}

/* Half precision over n inputs: accumulated in f32 in input order, divided (AVG) and rounded
 * once, so the result does not depend on how many partial roundings a layout would cause. A
 * block at a time, so the accumulator stays in the first-level cache. */
static void reduce_many_half(uint16_t *dst, const void *const *srcs, int n, size_t off,
                             size_t count, hcomm_op_t op, hcomm_dtype_t dt) {
    float acc[HALF_BLOCK];
    size_t done = 0;
#ifdef HCOMM__HAVE_X86_PATHS
    if (dt == HCOMM_BF16 && (op == HCOMM_SUM || op == HCOMM_AVG) && avx512_usable())
        done = avx512_sum_many_bf16(dst, srcs, n, off, count, op == HCOMM_AVG);
#endif
    for (size_t b = done; b < count; b += HALF_BLOCK) {
        size_t m = count - b < HALF_BLOCK ? count - b : HALF_BLOCK;
        hcomm__widen(acc, (const uint16_t *)srcs[0] + off + b, m, dt);
        for (int r = 1; r < n; r++)
            hcomm__accumulate_half(acc, (const uint16_t *)srcs[r] + off + b, m, dt, op);
        hcomm__round_half(dst + b, acc, m, dt, op, n);
    }
}

enum { MANY_BLOCK_BYTES = 16 << 10, MANY_PIECE_BYTES = 256 << 10 };

/* Whether dst is element off of a source after the first two (which the first pass reads
 * before it writes each element). */
static bool dst_is_later_source(const void *dst, const void *const *srcs, int n, size_t off,
                                size_t es) {
    for (int r = 2; r < n; r++)
        if ((const char *)srcs[r] + off * es == (const char *)dst)
            return true;
    return false;
}

/* The leading columns of an f32 or f64 sum done in one pass where the host has AVX-512, or 0. */
static size_t sum_many_fused(void *dst, const void *const *srcs, int n, size_t off, size_t count,
                             hcomm_dtype_t dt) {
#ifdef HCOMM__HAVE_X86_PATHS
    if ((dt == HCOMM_F32 || dt == HCOMM_F64) && avx512_usable())
        return dt == HCOMM_F32 ? avx512_sum_many_f32(dst, srcs, n, off, count)
                               : avx512_sum_many_f64(dst, srcs, n, off, count);
#else
    (void)dst, (void)srcs, (void)n, (void)off, (void)count, (void)dt;
#endif
    return 0;
}

void hcomm__reduce_many(void *dst, const void *const *srcs, int n, size_t off, size_t count,
                        hcomm_dtype_t dt, hcomm_op_t op) {
    size_t es = hcomm__dtype_size(dt);
    if (count == 0 || n <= 0)
        return;
    if (dt == HCOMM_F16 || dt == HCOMM_BF16) { /* reads a block of every input, then writes it */
        reduce_many_half(dst, srcs, n, off, count, op, dt);
        return;
    }
    hcomm_op_t aop = op == HCOMM_AVG ? HCOMM_SUM : op;
    size_t fused = op == HCOMM_SUM && n > 1 ? sum_many_fused(dst, srcs, n, off, count, dt) : 0;
    if (fused > 0) {
        if (fused < count)
            hcomm__reduce_many((char *)dst + fused * es, srcs, n, off + fused, count - fused, dt,
                               op);
        return;
    }
    /* A piece at a time, so that the result stays in cache while every source is folded in
     * (over the whole vector at once dst went through memory n times); pieces of 256 KiB, as
     * the direct algorithm's. Where dst is a later input, each piece is reduced in a malloc'd
     * piece and copied over it after (in 16 KiB blocks on the stack where malloc fails)
     * (docs/tuning.md: reduce-many.pieces). */
    _Alignas(64) unsigned char small[MANY_BLOCK_BYTES];
    bool staged = dst_is_later_source(dst, srcs, n, off, es);
    unsigned char *big = staged && count * es > sizeof small ? malloc(MANY_PIECE_BYTES) : NULL;
    unsigned char *tmp = big ? big : small;
    size_t step = (staged && !big ? MANY_BLOCK_BYTES : MANY_PIECE_BYTES) / es;
    for (size_t b = 0; b < count; b += step) {
        size_t m = count - b < step ? count - b : step, at = (off + b) * es;
        char *d = (char *)dst + b * es, *acc = staged ? (char *)tmp : d;
        if (n == 1)
            memmove(acc, (const char *)srcs[0] + at, m * es);
        else
            hcomm__reduce_to(acc, (const char *)srcs[0] + at, (const char *)srcs[1] + at, m, dt,
                             aop);
        for (int r = 2; r < n; r++)
            hcomm__reduce(acc, (const char *)srcs[r] + at, m, dt, aop);
        if (op == HCOMM_AVG)
            hcomm__scale_div(acc, m, dt, n);
        if (staged)
            memcpy(d, acc, m * es);
    }
    free(big);
}

/* Divides in int64 (or double): k need not fit in T (a group of 256 is 0 as a u8). */
#define HCOMM__DIV(T)                                                                              \
    static void div_##T(void *vb, size_t n, int k) {                                               \
        T *b = vb;                                                                                 \
        for (size_t i = 0; i < n; i++)                                                             \
            b[i] = (T)(b[i] / (int64_t)k);                                                         \
    }
HCOMM__DIV(int8_t)
HCOMM__DIV(uint8_t)
HCOMM__DIV(int32_t)
HCOMM__DIV(int64_t)

static void div_double(void *vb, size_t n, int k) {
    double *b = vb;
    for (size_t i = 0; i < n; i++)
        b[i] = b[i] / (double)k;
}

static void div_half(uint16_t *b, size_t n, int k, hcomm_dtype_t dt) {
    float x[HALF_BLOCK];
    for (size_t o = 0; o < n; o += HALF_BLOCK) {
        size_t m = n - o < HALF_BLOCK ? n - o : HALF_BLOCK;
        hcomm__widen(x, b + o, m, dt);
        div_float(x, m, k);
        hcomm__narrow(b + o, x, m, dt);
    }
}

static void div_f32(void *b, size_t n, int k) {
    div_float(b, n, k);
}

static void div_f16(void *b, size_t n, int k) {
    div_half(b, n, k, HCOMM_F16);
}

static void div_bf16(void *b, size_t n, int k) {
    div_half(b, n, k, HCOMM_BF16);
}

/* b /= k, by dtype. */
typedef void (*div_kernel_t)(void *b, size_t n, int k);
static const div_kernel_t div_kernels[HCOMM_DTYPE_COUNT] = {
    [HCOMM_F32] = div_f32,     [HCOMM_F64] = div_double,  [HCOMM_F16] = div_f16,
    [HCOMM_BF16] = div_bf16,   [HCOMM_I8] = div_int8_t,   [HCOMM_U8] = div_uint8_t,
    [HCOMM_I32] = div_int32_t, [HCOMM_I64] = div_int64_t,
};

void hcomm__scale_div(void *buf, size_t n, hcomm_dtype_t dt, int k) {
    if (hcomm__dtype_valid(dt) && div_kernels[dt])
        div_kernels[dt](buf, n, k);
}

void *hcomm__scratch_two(hcomm__scratch_t *s, size_t first, size_t second, void **at_second) {
    size_t room = (first + 63) & ~(size_t)63;
    char *p = hcomm__scratch(s, room + second);
    *at_second = p ? p + room : NULL;
    return p;
}

void hcomm__scratch_trim(hcomm__scratch_t *s, size_t keep) {
    if (s->cap > keep) {
        free(s->p);
        s->p = NULL;
        s->cap = 0;
    }
}

_Thread_local bool hcomm__scratch_fails_next;

void *hcomm__scratch(hcomm__scratch_t *s, size_t bytes) {
    if (hcomm__scratch_fails_next) {
        hcomm__scratch_fails_next = false;
        return NULL;
    }
    if (bytes > s->cap || !s->p) {
        free(s->p);
        s->p = malloc(bytes + 1);
        s->cap = s->p ? bytes : 0;
    }
    return s->p;
}
