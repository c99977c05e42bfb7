/* Copies whose stores bypass the cache (see internal.h). */
#include "core/internal.h"

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>

void hcomm__copy_stream(void *dst, const void *src, size_t bytes) {
    char *d = dst;
    const char *s = src;
    size_t head = (16 - (uintptr_t)d % 16) % 16;
    if (head > bytes)
        head = bytes;
    memcpy(d, s, head); /* up to dst's first 16-byte boundary */
    size_t i = head;
    for (; i + 64 <= bytes; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    for (; i + 16 <= bytes; i += 16)
        _mm_stream_si128((__m128i *)(d + i), _mm_loadu_si128((const __m128i *)(s + i)));
    memcpy(d + i, s + i, bytes - i);
}

void hcomm__stream_fence(void) {
    _mm_sfence();
}
#else
void hcomm__copy_stream(void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}

void hcomm__stream_fence(void) {}
#endif

/* Below this glibc's memcpy copies with `rep movsb`, above it with a vector loop (its stop
 * threshold for rep movsb, the L2 size here), which one core alone runs slower
 * (docs/tuning.md: copy-pieces). */
#define COPY_PIECE_BYTES ((size_t)256 << 10)

bool hcomm__overlaps(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return an > 0 && bn > 0 && pa < pb + bn && pb < pa + an;
}

void hcomm__copy_pieces(void *dst, const void *src, size_t bytes) {
    for (size_t done = 0; done < bytes; done += COPY_PIECE_BYTES) {
        size_t n = bytes - done < COPY_PIECE_BYTES ? bytes - done : COPY_PIECE_BYTES;
        memcpy((char *)dst + done, (const char *)src + done, n);
    }
}

void hcomm__reduce_stream(void *dst, const void *a, const void *b, size_t count, hcomm_dtype_t dt,
                          hcomm_op_t op) {
    _Alignas(64) unsigned char block[4096];
    size_t es = hcomm__dtype_size(dt), step = es ? sizeof block / es : 0;
    for (size_t i = 0; i < count; i += step) {
        size_t n = count - i < step ? count - i : step, at = i * es;
        hcomm__reduce_to(block, (const char *)a + at, (const char *)b + at, n, dt, op);
        hcomm__copy_stream((char *)dst + at, block, n * es);
    }
}
