/* all_gatherv by Bruck's algorithm (Bruck, Ho, Kipnis, Upfal & Weathersby 1997; any group size)
 * in ceil(log2 p) steps against the ring's p-1: the choice for small blocks, where each step's
 * latency dominates; and the all_gatherv of an algorithm name (rd for a power-of-two group, else
 * Bruck; ring), which deterministic mode and the runners use. */
#include "algo/algos.h"

#include <stdlib.h>
#include <string.h>

static hcomm_result_t nomem(const hcomm__xfer_t *x) {
    return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "out of memory for all_gather scratch");
}

/* Bruck: scratch block j holds rank (me + j) mod p's data. Step dist sends blocks [0, n) to
 * rank me - dist and receives blocks [dist, dist + n) from rank me + dist, n = min(dist,
 * p - dist); at the end the blocks are rotated into place. */
hcomm_result_t hcomm__agv_bruck(const hcomm__xfer_t *x, void *buf, const size_t *bytes) {
    int p = x->c->size, me = x->c->rank;
    size_t *offs = hcomm__prefix_sums(bytes, p, 0), *rot = hcomm__prefix_sums(bytes, p, me);
    /* The communicator's scratch, kept between calls (ring.c: Open MPI's cross-memory attach
     * crawls on memory malloc mapped anew, as it does each call from 32 MiB). */
    char *tmp = offs && rot ? hcomm__x_scratch(x, offs[p]) : NULL, *b = buf;
    hcomm_result_t res = tmp ? HCOMM_OK : nomem(x);
    if (res == HCOMM_OK && bytes[me])
        memcpy(tmp, b + offs[me], bytes[me]);
    for (int dist = 1; dist < p && res == HCOMM_OK; dist <<= 1) {
        int n = dist < p - dist ? dist : p - dist;
        res = hcomm__x_sendrecv(x, (me - dist + p) % p, tmp, rot[n], (me + dist) % p,
                                tmp + rot[dist], rot[dist + n] - rot[dist]);
    }
    for (int j = 1; j < p && res == HCOMM_OK; j++) {
        int r = (me + j) % p;
        if (bytes[r])
            memcpy(b + offs[r], tmp + rot[j], bytes[r]);
    }
    free(rot);
    free(offs);
    return res;
}

hcomm_result_t hcomm__agv_run(const hcomm__xfer_t *x, int algo, void *buf, const size_t *bytes) {
    algo &= ~HCOMM__ALGO_DET;
    if (algo == HCOMM__ALGO_RD && (x->c->size & (x->c->size - 1)) == 0)
        return hcomm__agv_rd(x, buf, bytes);
    if (algo == HCOMM__ALGO_RD || algo == HCOMM__ALGO_BRUCK)
        return hcomm__agv_bruck(x, buf, bytes);
    return hcomm__agv_ring(x, buf, bytes);
}
