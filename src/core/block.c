/* How a vector splits into per-rank blocks (internal.h): shared by the algorithms and by the
 * transports' native collectives, so every rank's block is the same wherever it is computed. */
#include "core/internal.h"

void hcomm__block(size_t count, int p, int r, size_t *off, size_t *len) {
    size_t base = count / (size_t)p, rem = count % (size_t)p, rr = (size_t)r;
    *off = rr * base + (rr < rem ? rr : rem);
    *len = base + (rr < rem ? 1 : 0);
}

size_t hcomm__block_start(size_t count, int p, int r) {
    size_t off, len;
    if (r >= p)
        return count;
    hcomm__block(count, p, r, &off, &len);
    return off;
}
