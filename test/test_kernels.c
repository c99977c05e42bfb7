/* The reduction kernels under the algorithms: hcomm__reduce_to (dst = a op b in one pass) and
 * hcomm__reduce_stream (the same through non-temporal stores) must give, for every dtype and
 * op and any length or alignment, the bits of hcomm__reduce (dst op= src), also where dst is a
 * or b itself; and hcomm__widen / hcomm__narrow must be the element conversions. */
#include "harness.h"
#include "core/internal.h"

#include <math.h>
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

static void check_conversions(void) {
    static uint16_t h[MAX_ELEMS], back[MAX_ELEMS];
    static float f[MAX_ELEMS];
    for (int bf = 0; bf < 2; bf++) {
        hcomm_dtype_t dt = bf ? HCOMM_BF16 : HCOMM_F16;
        fill((unsigned char *)h, MAX_ELEMS, dt, 3);
        hcomm__widen(f, h, MAX_ELEMS, dt);
        long bad = 0;
        for (size_t i = 0; i < MAX_ELEMS; i++) {
            float e = bf ? hcomm__bf16_to_f32(h[i]) : hcomm__f16_to_f32(h[i]);
            bad += memcmp(&e, &f[i], 4) != 0;
            f[i] = f[i] * 1.001f; /* something to round */
        }
        hcomm__narrow(back, f, MAX_ELEMS, dt);
        for (size_t i = 0; i < MAX_ELEMS; i++)
            bad += back[i] != (bf ? hcomm__f32_to_bf16(f[i]) : hcomm__f32_to_f16(f[i]));
        T_CHECK(bad == 0, "%ld %s conversions differ from the element functions", bad,
                bf ? "bf16" : "f16");
    }
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
    return t_finish("test_kernels");
}
