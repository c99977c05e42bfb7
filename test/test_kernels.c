/* The reduction kernels under the algorithms: hcomm__reduce_to (dst = a op b in one pass) and
 * hcomm__reduce_stream (the same through non-temporal stores) must give, for every dtype and
 * op and any length or alignment, the bits of hcomm__reduce (dst op= src), also where dst is a
 * or b itself; half precision must match an element-wise reference; and hcomm__widen /
 * hcomm__narrow must be the element conversions, and the f32 accumulation of half precision
 * (hcomm__accumulate_half, hcomm__reduce_many) the element-wise one. */
#include "harness.h"
#include "core/internal.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_ELEMS = 5000, MAX_BYTES = MAX_ELEMS * 8 + 64 };

/* Bytes that are valid values of every dtype and exercise the ops: floats from a small range
 * with both signs (and a NaN), integers of any bits. */
static void fill(unsigned char *buf, size_t n, hcomm_dtype_t dt, unsigned seed) {
    size_t es = hcomm__dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        unsigned h = (unsigned)(i * 2654435761u) ^ (seed * 40503u);
        h ^= h >> 13;
        float f = (float)((int)(h % 2001) - 1000) / 8.0f;
        if (h % 997 == 0)
            f = (float)NAN;
        unsigned char *e = buf + i * es;
        if (dt == HCOMM_F32) {
            memcpy(e, &f, 4);
        } else if (dt == HCOMM_F64) {
            double d = f;
            memcpy(e, &d, 8);
        } else if (dt == HCOMM_F16 || dt == HCOMM_BF16) {
            uint16_t u = dt == HCOMM_F16 ? hcomm__f32_to_f16(f) : hcomm__f32_to_bf16(f);
            memcpy(e, &u, 2);
        } else {
            for (size_t b = 0; b < es; b++)
                e[b] = (unsigned char)(h >> (b % 4 * 8));
        }
    }
}

/* shift: elements from the buffers' 64-byte aligned start (the streaming stores' head). */
static void check_case(hcomm_dtype_t dt, hcomm_op_t op, size_t n, size_t shift_elems) {
    static _Alignas(64) unsigned char a[MAX_BYTES], b[MAX_BYTES], want[MAX_BYTES], got[MAX_BYTES];
    size_t es = hcomm__dtype_size(dt), bytes = n * es, shift = shift_elems * es;
    unsigned char *pa = a + shift, *pb = b + shift, *pg = got + shift;
    fill(pa, n, dt, 1);
    fill(pb, n, dt, 2);
    memcpy(want, pa, bytes);
    hcomm__reduce(want, pb, n, dt, op);
    const char *name = "";
    hcomm_dtype_name(dt, &name);
    hcomm__reduce_to(pg, pa, pb, n, dt, op);
    T_CHECK(memcmp(pg, want, bytes) == 0, "reduce_to %s op=%d n=%zu shift=%zu", name, (int)op, n,
            shift);
    memset(pg, 0x5a, bytes);
    hcomm__reduce_stream(pg, pa, pb, n, dt, op);
    hcomm__stream_fence();
    T_CHECK(memcmp(pg, want, bytes) == 0, "reduce_stream %s op=%d n=%zu shift=%zu", name, (int)op,
            n, shift);
    memcpy(pg, pb, bytes); /* dst is b */
    hcomm__reduce_stream(pg, pa, pg, n, dt, op);
    hcomm__stream_fence();
    T_CHECK(memcmp(pg, want, bytes) == 0, "reduce_stream into b %s op=%d n=%zu", name, (int)op, n);
    memcpy(pg, pa, bytes); /* dst is a */
    hcomm__reduce_to(pg, pg, pb, n, dt, op);
    T_CHECK(memcmp(pg, want, bytes) == 0, "reduce_to into a %s op=%d n=%zu", name, (int)op, n);
}

static uint16_t to_half(float f, bool bf) {
    return bf ? hcomm__f32_to_bf16(f) : hcomm__f32_to_f16(f);
}

static float from_half(uint16_t h, bool bf) {
    return bf ? hcomm__bf16_to_f32(h) : hcomm__f16_to_f32(h);
}

/* Every 16-bit pattern widened, and every f32 whose low 16 bits are one of the rounding cases
 * (ties, either side of them, odd and even kept bits) narrowed, at an odd byte address and with
 * a length that leaves a tail: the block conversions (vector code where the CPU has it) must
 * give the element functions' bits, NaNs included. */
static void check_conversions(void) {
    enum { N = 65536 };
    static const uint16_t lows[] = {0,      1,      0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000,
                                    0x3000, 0x7fff, 0x8000, 0x8001, 0x9000, 0xffff};
    static float f[N];
    static unsigned char raw[2 * N + 1];
    for (int bf = 0; bf < 2; bf++) {
        hcomm_dtype_t dt = bf ? HCOMM_BF16 : HCOMM_F16;
        long bad = 0;
        for (uint32_t i = 0; i < N; i++) {
            uint16_t u = (uint16_t)i;
            memcpy(raw + 1 + 2 * i, &u, 2);
        }
        hcomm__widen(f, raw + 1, N, dt);
        for (uint32_t i = 0; i < N; i++) {
            float e = from_half((uint16_t)i, bf);
            bad += memcmp(&e, &f[i], 4) != 0;
        }
        T_CHECK(bad == 0, "%ld of 65536 %s widenings differ from the element function", bad,
                bf ? "bf16" : "f16");
        bad = 0;
        for (size_t l = 0; l < sizeof lows / sizeof lows[0]; l++) {
            for (uint32_t hi = 0; hi < N; hi++) {
                uint32_t x = hi << 16 | lows[l];
                memcpy(&f[hi], &x, 4);
            }
            size_t n = N - 3 - l; /* each length leaves a different tail */
            hcomm__narrow(raw + 1, f, n, dt);
            for (size_t i = 0; i < n; i++) {
                uint16_t got;
                memcpy(&got, raw + 1 + 2 * i, 2);
                bad += got != to_half(f[i], bf);
            }
        }
        T_CHECK(bad == 0, "%ld %s narrowings differ from the element function", bad,
                bf ? "bf16" : "f16");
    }
}

/* Half precision against the element functions, not hcomm__reduce (which shares the block
 * path): widen both, apply the op in f32 (MAX/MIN keep a NaN), round once. */
static void check_half_reference(hcomm_dtype_t dt, hcomm_op_t op, size_t n) {
    static uint16_t a[MAX_ELEMS], b[MAX_ELEMS], got[MAX_ELEMS];
    bool bf = dt == HCOMM_BF16;
    fill((unsigned char *)a, n, dt, 4);
    fill((unsigned char *)b, n, dt, 5);
    hcomm__reduce_to(got, a, b, n, dt, op);
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        float x = from_half(a[i], bf), y = from_half(b[i], bf), r;
        if (op == HCOMM_SUM)
            r = x + y;
        else if (op == HCOMM_PROD)
            r = x * y;
        else if (isnan(x) || isnan(y))
            r = isnan(x) ? x : y;
        else
            r = op == HCOMM_MAX ? (x > y ? x : y) : (x < y ? x : y);
        bad += got[i] != to_half(r, bf);
    }
    T_CHECK(bad == 0, "%ld of %zu %s elements (op=%d) differ from the element-wise reference", bad,
            n, bf ? "bf16" : "f16", (int)op);
}

/* One more input of an f32 accumulation (hcomm__accumulate_half, the vector path under
 * twoshot's and direct's f16/bf16 reductions): every 16-bit pattern, at an odd byte address,
 * against acc op from_half(x) element by element, for accumulators that include NaN, inf and
 * subnormals. */
static void check_accumulate(void) {
    enum { N = 65536 + 5 }; /* past a multiple of 8: the scalar tail too */
    static float acc[N], want[N];
    static unsigned char raw[2 * N + 1];
    static const hcomm_op_t acc_ops[] = {HCOMM_SUM, HCOMM_PROD, HCOMM_AVG, HCOMM_MAX, HCOMM_MIN};
    for (int bf = 0; bf < 2; bf++) {
        hcomm_dtype_t dt = bf ? HCOMM_BF16 : HCOMM_F16;
        for (size_t i = 0; i < N; i++) {
            uint16_t u = (uint16_t)(i * 40503u); /* every pattern, in an order tails meet too */
            memcpy(raw + 1 + 2 * i, &u, 2);
        }
        for (size_t o = 0; o < sizeof acc_ops / sizeof acc_ops[0]; o++) {
            hcomm_op_t op = acc_ops[o];
            long bad = 0;
            for (size_t i = 0; i < N; i++) {
                unsigned h = (unsigned)(i * 2654435761u);
                float a = (float)((int)(h % 4001) - 2000) / 16.0f;
                a = h % 251 == 0 ? (float)NAN : h % 253 == 0 ? INFINITY : h % 255 == 0 ? 1e-40f : a;
                float x = from_half((uint16_t)(i * 40503u), bf);
                acc[i] = a;
                if (op == HCOMM_MAX || op == HCOMM_MIN)
                    want[i] = isnan(a) || isnan(x) ? (isnan(a) ? a : x)
                              : op == HCOMM_MAX    ? (a > x ? a : x)
                                                   : (a < x ? a : x);
                else
                    want[i] = op == HCOMM_PROD ? a * x : a + x;
            }
            hcomm__accumulate_half(acc, raw + 1, N, dt, op);
            for (size_t i = 0; i < N; i++)
                bad += memcmp(&acc[i], &want[i], 4) != 0 && !(isnan(acc[i]) && isnan(want[i]));
            T_CHECK(bad == 0, "%ld of %d %s accumulations (op=%d) differ from a op x", bad, N,
                    bf ? "bf16" : "f16", (int)op);
        }
    }
}

/* hcomm__reduce_many on three f16/bf16 inputs: widened, combined in input order in f32, AVG
 * divided by 3, rounded once, element by element. */
static void check_many_half(hcomm_dtype_t dt, hcomm_op_t op, size_t n) {
    static uint16_t in[3][MAX_ELEMS], got[MAX_ELEMS];
    static unsigned char odd[3][2 * MAX_ELEMS + 1]; /* the inputs at odd byte addresses */
    static const uint16_t special[2][4] = {{0x7c00, 0xfc00, 0x0001, 0x8003},  /* f16: +-inf, */
                                           {0x7f80, 0xff80, 0x0001, 0x8003}}; /* subnormals */
    bool bf = dt == HCOMM_BF16;
    const void *srcs[3];
    for (int r = 0; r < 3; r++) {
        fill((unsigned char *)in[r], n, dt, 7u + (unsigned)r);
        for (size_t i = (size_t)r; i < n; i += 29)
            in[r][i] = special[bf][i % 4];
        memcpy(odd[r] + 1, in[r], 2 * n);
        srcs[r] = odd[r] + 1;
    }
    hcomm__reduce_many(got, srcs, 3, 0, n, dt, op);
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        float r = from_half(in[0][i], bf);
        for (int q = 1; q < 3; q++) {
            float x = from_half(in[q][i], bf);
            if (op == HCOMM_PROD)
                r = r * x;
            else if (op == HCOMM_MAX || op == HCOMM_MIN)
                r = isnan(r) || isnan(x) ? (isnan(r) ? r : x)
                    : op == HCOMM_MAX    ? (r > x ? r : x)
                                         : (r < x ? r : x);
            else
                r = r + x;
        }
        if (op == HCOMM_AVG)
            r = r / 3.0f;
        /* which NaN a sum of two NaNs keeps is unspecified (hcomm/core.h) */
        bad += got[i] != to_half(r, bf) && !(isnan(r) && isnan(from_half(got[i], bf)));
    }
    T_CHECK(bad == 0, "%ld of %zu %s elements of reduce_many (op=%d) differ from the reference",
            bad, n, bf ? "bf16" : "f16", (int)op);
}

/* hcomm__reduce_many on 4 f32 inputs of n elements, where dst is a separate buffer or input
 * `into` itself (local's in-place reduce_scatter: a later input is staged through a malloc'd
 * piece): the bits of the serial ((a op b) op c) op d, across the pieces the kernel works in
 * (256 KiB, and 16 KiB blocks where it cannot allocate). */
static void check_many_into(size_t n, int into, hcomm_op_t op) {
    enum { INPUTS = 4 };
    float *in[INPUTS], *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    const void *srcs[INPUTS];
    for (int r = 0; r < INPUTS; r++) {
        in[r] = malloc(n * sizeof(float));
        for (size_t i = 0; in[r] && i < n; i++) /* random bits of value: no order sums exactly */
            in[r][i] = (float)((i * 2654435761u + (unsigned)r * 40503u) % 100003u) / 977.0f - 50.0f;
        srcs[r] = in[r];
    }
    T_CHECK(want && got && in[0] && in[1] && in[2] && in[3], "out of memory for %zu floats", n);
    if (!(want && got && in[0] && in[1] && in[2] && in[3]))
        return;
    for (size_t i = 0; i < n; i++) {
        float r = in[0][i];
        for (int q = 1; q < INPUTS; q++)
            r = op == HCOMM_PROD  ? r * in[q][i]
                : op == HCOMM_MAX ? (r > in[q][i] ? r : in[q][i])
                                  : r + in[q][i];
        want[i] = r;
    }
    float *dst = into < 0 ? got : in[into];
    hcomm__reduce_many(dst, srcs, INPUTS, 0, n, HCOMM_F32, op);
    T_CHECK(memcmp(dst, want, n * sizeof *want) == 0,
            "reduce_many of %zu f32 (op=%d) into %s%d differs from the serial reduction", n,
            (int)op, into < 0 ? "a separate buffer" : "input ", into);
    for (int r = 0; r < INPUTS; r++)
        free(in[r]);
    free(want);
    free(got);
}

/* hcomm__reduce_many's sum of 1..9 f32 or f64 inputs from element off (the one-pass vector
 * kernel, its tail and the pairwise loop), into a separate buffer or over input `into`: the
 * bits of the serial ((x0 + x1) + x2) + ..., at every length around the vector step. */
static void check_many_sum(hcomm_dtype_t dt, size_t n, int inputs, size_t off, int into) {
    enum { INPUTS = 9 };
    static double in64[INPUTS][MAX_ELEMS + 8], want64[MAX_ELEMS], got64[MAX_ELEMS];
    static float in32[INPUTS][MAX_ELEMS + 8], want32[MAX_ELEMS], got32[MAX_ELEMS];
    bool f64 = dt == HCOMM_F64;
    const void *srcs[INPUTS];
    for (int r = 0; r < inputs; r++) {
        for (size_t i = 0; i < n + off; i++) { /* no order of these sums is exact */
            double v = (double)((i * 2654435761u + (unsigned)r * 40503u) % 100003u) / 977.0 - 50.0;
            in64[r][i] = v / 3.0;
            in32[r][i] = (float)v;
        }
        srcs[r] = f64 ? (const void *)in64[r] : (const void *)in32[r];
    }
    for (size_t i = 0; i < n; i++) {
        double a = in64[0][off + i];
        float b = in32[0][off + i];
        for (int r = 1; r < inputs; r++) {
            a += in64[r][off + i];
            b += in32[r][off + i];
        }
        want64[i] = a;
        want32[i] = b;
    }
    void *dst = into < 0 ? (f64 ? (void *)got64 : (void *)got32)
                         : (f64 ? (void *)(in64[into] + off) : (void *)(in32[into] + off));
    char where[32] = "a separate buffer";
    if (into >= 0)
        snprintf(where, sizeof where, "input %d", into);
    hcomm__reduce_many(dst, srcs, inputs, off, n, dt, HCOMM_SUM);
    T_CHECK(memcmp(dst, f64 ? (const void *)want64 : (const void *)want32,
                   n * hcomm__dtype_size(dt)) == 0,
            "reduce_many sum of %d %s inputs of %zu elements from %zu into %s differs from the "
            "serial sum",
            inputs, f64 ? "f64" : "f32", n, off, where);
}

/* Element i of a buffer of f32, f16 or bf16 at any alignment, as f32. */
static float elem(const unsigned char *buf, size_t i, hcomm_dtype_t dt) {
    float f;
    uint16_t u;
    if (dt == HCOMM_F32) {
        memcpy(&f, buf + 4 * i, 4);
        return f;
    }
    memcpy(&u, buf + 2 * i, 2);
    return from_half(u, dt == HCOMM_BF16);
}

/* hcomm__weighted_sum of 1..9 rows (MoE's combine: k expert outputs of a token) at odd byte
 * addresses, with NaNs among the values: the bits of the element loop acc = w0 * x0,
 * acc += wj * xj in f32, rounded once, at every length (the vector steps of 128 and 32 columns,
 * and their tails). */
static void check_weighted_sum(hcomm_dtype_t dt, size_t n, int nrows) {
    enum { ROWS = 9 };
    static unsigned char in[ROWS][4 * MAX_ELEMS + 1], got[4 * MAX_ELEMS + 1];
    static const float w[ROWS] = {0.125f, 0.3f, -1.7f, 2.0f, 0.0f, 1e-3f, 0.5f, 7.25f, -0.1f};
    size_t es = hcomm__dtype_size(dt);
    const void *rows[ROWS];
    for (int j = 0; j < nrows; j++) {
        fill(in[j] + 1, n, dt, 11u + (unsigned)j);
        rows[j] = in[j] + 1;
    }
    hcomm__weighted_sum(got + 1, rows, w, nrows, n, dt);
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        float acc = w[0] * elem(in[0] + 1, i, dt);
        for (int j = 1; j < nrows; j++)
            acc += w[j] * elem(in[j] + 1, i, dt);
        unsigned char want[4];
        uint16_t h = dt == HCOMM_F32 ? 0 : to_half(acc, dt == HCOMM_BF16);
        memcpy(want, dt == HCOMM_F32 ? (const void *)&acc : (const void *)&h, es);
        /* which NaN a sum of two NaNs keeps is unspecified (hcomm/core.h) */
        bad +=
            memcmp(got + 1 + i * es, want, es) != 0 && !(isnan(acc) && isnan(elem(got + 1, i, dt)));
    }
    const char *name = "";
    hcomm_dtype_name(dt, &name);
    T_CHECK(bad == 0,
            "%ld of %zu %s elements of a weighted sum of %d rows differ from the element "
            "loop",
            bad, n, name, nrows);
}

int main(void) {
    static const hcomm_dtype_t dts[] = {HCOMM_F32, HCOMM_F64, HCOMM_F16, HCOMM_BF16,
                                        HCOMM_I8,  HCOMM_U8,  HCOMM_I32, HCOMM_I64};
    static const hcomm_op_t ops[] = {HCOMM_SUM, HCOMM_PROD, HCOMM_MAX, HCOMM_MIN};
    static const size_t ns[] = {0, 1, 3, 17, 511, 512, 1023, 2049, 4999};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
                check_case(dts[d], ops[o], ns[k], k % 3);
    check_conversions();
    for (int bf = 0; bf < 2; bf++)
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
                check_half_reference(bf ? HCOMM_BF16 : HCOMM_F16, ops[o], ns[k]);
    check_accumulate();
    static const hcomm_op_t many_ops[] = {HCOMM_SUM, HCOMM_PROD, HCOMM_AVG, HCOMM_MAX, HCOMM_MIN};
    for (int bf = 0; bf < 2; bf++)
        for (size_t o = 0; o < sizeof many_ops / sizeof many_ops[0]; o++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
                check_many_half(bf ? HCOMM_BF16 : HCOMM_F16, many_ops[o], ns[k]);
    static const size_t pieces[] = {4095, 4097, 65536, 3 * 65536 + 5};
    static const hcomm_op_t f32_ops[] = {HCOMM_SUM, HCOMM_PROD, HCOMM_MAX};
    for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++)
        for (int into = -1; into < 4; into++)
            check_many_into(pieces[k], into, f32_ops[(k + (size_t)into + 1) % 3]);
    static const size_t sum_ns[] = {0, 1, 31, 32, 63, 64, 65, 97, 130, 4999};
    for (int f64 = 0; f64 < 2; f64++)
        for (size_t k = 0; k < sizeof sum_ns / sizeof sum_ns[0]; k++)
            for (int inputs = 1; inputs <= 9; inputs++)
                check_many_sum(f64 ? HCOMM_F64 : HCOMM_F32, sum_ns[k], inputs, k % 3,
                               (int)(k + (size_t)inputs) % 4 - 1 < inputs
                                   ? (int)(k + (size_t)inputs) % 4 - 1
                                   : -1);
    static const hcomm_dtype_t sum_dts[] = {HCOMM_BF16, HCOMM_F16, HCOMM_F32};
    for (size_t d = 0; d < 3; d++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (int nrows = 1; nrows <= 9; nrows += 1 + (int)(k % 3))
                check_weighted_sum(sum_dts[d], ns[k], nrows);
    return t_finish("test_kernels");
}
