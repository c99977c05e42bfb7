/* Recursive halving-doubling all_reduce (Rabenseifner; Thakur, Rabenseifner & Gropp 2005,
 * section 4.4): a reduce_scatter by recursive halving, then an all_gather by recursive
 * doubling, among the largest power of two pof2 <= p ranks. The first 2*(p - pof2) ranks pair
 * up first: each even one hands its vector to the odd one after it and gets the result back at
 * the end. Blocks are hcomm__block over pof2. */
#include "algo/algos.h"

#include <stdlib.h>
#include <string.h>

typedef struct rhd {
    const hcomm__xfer_t *x;
    char *buf, *tmp;
    size_t count, es;
    hcomm_dtype_t dt;
    hcomm_op_t op;
    int pof2, rem;
} rhd_t;

/* Element offset where block b (of pof2) starts; b == pof2 gives count. */
static size_t start_of(const rhd_t *h, int b) {
    size_t off, len;
    if (b >= h->pof2)
        return h->count;
    hcomm__block(h->count, h->pof2, b, &off, &len);
    return off;
}

/* The real rank of a rank among the pof2 that take part. */
static int real_rank(const rhd_t *h, int newrank) {
    return newrank < h->rem ? newrank * 2 + 1 : newrank + h->rem;
}

/* Halving: at each mask (largest first) keep the half of [lo, hi) blocks on this rank's side,
 * send the other half to the partner and reduce the partner's copy of the kept half. */
static hcomm_result_t halve(const rhd_t *h, int newrank, int *lo, int *hi) {
    for (int mask = h->pof2 / 2; mask > 0; mask >>= 1) {
        int mid = *lo + (*hi - *lo) / 2, peer = real_rank(h, newrank ^ mask);
        int klo = newrank & mask ? mid : *lo, khi = newrank & mask ? *hi : mid;
        int slo = newrank & mask ? *lo : mid, shi = newrank & mask ? mid : *hi;
        size_t ks = start_of(h, klo), kn = start_of(h, khi) - ks;
        size_t ss = start_of(h, slo), sn = start_of(h, shi) - ss;
        HCOMM__TRY(hcomm__x_sendrecv(h->x, peer, h->buf + ss * h->es, sn * h->es, peer, h->tmp,
                                     kn * h->es));
        hcomm__reduce(h->buf + ks * h->es, h->tmp, kn, h->dt, h->op);
        *lo = klo;
        *hi = khi;
    }
    return HCOMM_OK;
}

/* Doubling: the reverse, exchanging the blocks each side has complete. */
static hcomm_result_t double_up(const rhd_t *h, int newrank, int lo, int hi) {
    for (int mask = 1; mask < h->pof2; mask <<= 1) {
        int width = hi - lo, peer = real_rank(h, newrank ^ mask);
        int plo = newrank & mask ? lo - width : hi, phi = plo + width;
        size_t ms = start_of(h, lo), mn = start_of(h, hi) - ms;
        size_t ps = start_of(h, plo), pn = start_of(h, phi) - ps;
        HCOMM__TRY(hcomm__x_sendrecv(h->x, peer, h->buf + ms * h->es, mn * h->es, peer,
                                     h->buf + ps * h->es, pn * h->es));
        lo = lo < plo ? lo : plo;
        hi = lo + 2 * width;
    }
    return HCOMM_OK;
}

static hcomm_result_t rhd_run(rhd_t *h) {
    const hcomm__xfer_t *x = h->x;
    int rank = x->c->rank, newrank;
    size_t bytes = h->count * h->es;
    if (rank < 2 * h->rem && rank % 2 == 0) { /* folded: hand over, get the result back */
        HCOMM__TRY(hcomm__x_send(x, rank + 1, h->buf, bytes));
        return hcomm__x_recv(x, rank + 1, h->buf, bytes);
    }
    if (rank < 2 * h->rem) {
        HCOMM__TRY(hcomm__x_recv(x, rank - 1, h->tmp, bytes));
        hcomm__reduce(h->buf, h->tmp, h->count, h->dt, h->op);
        newrank = rank / 2;
    } else {
        newrank = rank - h->rem;
    }
    int lo = 0, hi = h->pof2;
    HCOMM__TRY(halve(h, newrank, &lo, &hi));
    HCOMM__TRY(double_up(h, newrank, lo, hi));
    if (rank < 2 * h->rem)
        HCOMM__TRY(hcomm__x_send(x, rank - 1, h->buf, bytes));
    return HCOMM_OK;
}

hcomm_result_t hcomm__ar_rhd(const hcomm__xfer_t *x, void *buf, size_t count, hcomm_dtype_t dt,
                             hcomm_op_t op) {
    rhd_t h = {x, buf, NULL, count, hcomm__dtype_size(dt), dt, op, 1, 0};
    while (h.pof2 * 2 <= x->c->size)
        h.pof2 *= 2;
    h.rem = x->c->size - h.pof2;
    h.tmp = hcomm__x_scratch(x, count * h.es); /* kept: a fresh 32 MiB+ malloc faults */
    if (!h.tmp) /* the peers wait for this rank's messages: they fail with this */
        return hcomm__x_tell_peers(x, hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn,
                                                 "cannot allocate %zu bytes of scratch",
                                                 count * h.es));
    return rhd_run(&h);
}
