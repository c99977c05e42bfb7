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
