/* A u8 all_reduce of 2^31+5 elements, in place, on 2 ranks (test_big_count.sh): counts above
 * INT_MAX work on both backends (core.h, "Buffers"). Element i on rank r is (i + r) mod 101,
 * so every element's sum is known; the ones either side of 2^31 are checked by name. */
#include "harness.h"

#include <stdint.h>

static const size_t COUNT = ((size_t)1 << 31) + 5;

static unsigned char want(size_t i) {
    return (unsigned char)(i % 101 + (i + 1) % 101);
}

static hcomm_result_t body(hcomm_comm_t *w, void *arg) {
    (void)arg;
    if (t_size(w) != 2)
        return HCOMM_OK;
    unsigned char *buf = malloc(COUNT);
    T_CHECK(buf != NULL, "cannot allocate %zu bytes", COUNT);
    if (!buf)
        return HCOMM_ERR_NOMEM;
    size_t r = (size_t)t_rank(w), bad = 0, first_bad = 0;
    for (size_t i = 0; i < COUNT; i++)
        buf[i] = (unsigned char)((i + r) % 101);
    T_OK(hcomm_all_reduce(w, buf, buf, COUNT, HCOMM_U8, HCOMM_SUM));
    for (size_t i = 0; i < COUNT; i++)
        if (buf[i] != want(i) && bad++ == 0)
            first_bad = i;
    T_CHECK(bad == 0, "%zu wrong elements, the first at %zu: %d, expected %d", bad, first_bad,
            buf[first_bad], want(first_bad));
    size_t edge = (size_t)INT32_MAX;
    T_EQ_INT(buf[edge], want(edge));
    T_EQ_INT(buf[edge + 1], want(edge + 1));
    T_EQ_INT(buf[COUNT - 1], want(COUNT - 1));
    free(buf);
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(body, NULL, 2);
    return t_finish("big_count");
}
