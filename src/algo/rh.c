/* reduce_scatterv by recursive halving (Thakur, Rabenseifner & Gropp 2005, section 4.2): log2
 * steps among the largest power of two pof2 <= p ranks, each halving the blocks a rank is
 * responsible for. The first 2*(p - pof2) ranks pair up first: each even one hands its whole
 * vector to the odd one after it, which then stands for both, and gets its block back at the
 * end. Virtual rank v stands for the real blocks [first(v), first(v+1)), which are contiguous,
 * so each step sends one contiguous range. */
#include "algo/select.h"
#include "algo/variants.h"

#include <stdlib.h>
#include <string.h>

typedef struct rh {
    const hcomm__xfer_t *x;
    char *acc, *tmp;
    const size_t *offs; /* p + 1 element offsets of the real blocks */
    size_t es;
    hcomm_dtype_t dt;
    hcomm_op_t op;
    int pof2, rem;
} rh_t;

/* Element offset of virtual block v (v == pof2: the end). */
static size_t voff(const rh_t *h, int v) {
    return h->offs[v < h->rem ? 2 * v : v + h->rem];
}

static int real_rank(const rh_t *h, int v) {
    return v < h->rem ? 2 * v + 1 : v + h->rem;
}

static hcomm_result_t halve(const rh_t *h, int v) {
    int lo = 0, hi = h->pof2;
    for (int mask = h->pof2 / 2; mask > 0; mask >>= 1) {
        int mid = lo + (hi - lo) / 2, peer = real_rank(h, v ^ mask);
        int klo = v & mask ? mid : lo, khi = v & mask ? hi : mid;
        int slo = v & mask ? lo : mid, shi = v & mask ? mid : hi;
        size_t ks = voff(h, klo), kn = voff(h, khi) - ks, ss = voff(h, slo), sn = voff(h, shi) - ss;
        HCOMM__TRY(hcomm__x_sendrecv(h->x, peer, h->acc + ss * h->es, sn * h->es, peer, h->tmp,
                                     kn * h->es));
        hcomm__reduce(h->acc + ks * h->es, h->tmp, kn, h->dt, h->op);
        lo = klo;
        hi = khi;
    }
    return HCOMM_OK;
}

static hcomm_result_t rh_run(rh_t *h, void *recv) {
    const hcomm__xfer_t *x = h->x;
    int me = x->c->rank, p = x->c->size, v;
    size_t total = h->offs[p], mine = h->offs[me + 1] - h->offs[me];
    if (me < 2 * h->rem && me % 2 == 0) { /* folded: hand over, get this block back */
        HCOMM__TRY(hcomm__x_send(x, me + 1, h->acc, total * h->es));
        return hcomm__x_recv(x, me + 1, recv, mine * h->es);
    }
    if (me < 2 * h->rem) {
        HCOMM__TRY(hcomm__x_recv(x, me - 1, h->tmp, total * h->es));
        hcomm__reduce(h->acc, h->tmp, total, h->dt, h->op);
        v = me / 2;
    } else {
        v = me - h->rem;
    }
    HCOMM__TRY(halve(h, v));
    if (v < h->rem) /* this rank holds its folded partner's block too */
        HCOMM__TRY(hcomm__x_send(x, me - 1, h->acc + h->offs[me - 1] * h->es,
                                 (h->offs[me] - h->offs[me - 1]) * h->es));
    if (mine)
        memcpy(recv, h->acc + h->offs[me] * h->es, mine * h->es);
    return HCOMM_OK;
}

hcomm_result_t hcomm__rsv_rh(const hcomm__xfer_t *x, const void *send, void *recv,
                             const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op) {
    int p = x->c->size;
    size_t es = hcomm__dtype_size(dt);
    size_t *offs = malloc(sizeof(size_t) * ((size_t)p + 1));
    if (offs) {
        offs[0] = 0;
        for (int r = 0; r < p; r++)
            offs[r + 1] = offs[r] + counts[r];
    }
    /* The scratch copy leaves send untouched and lets recv alias it; the communicator's
     * scratch is kept between calls (a fresh 32 MiB+ malloc faults). */
    void *pacc = NULL, *ptmp = NULL;
    if (offs)
        hcomm__x_scratch_pair(x, offs[p] * es, offs[p] * es, &pacc, &ptmp);
    char *acc = pacc, *tmp = ptmp;
    hcomm_result_t res = tmp ? HCOMM_OK
                             : hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn,
                                          "out of memory for reduce_scatter scratch");
    if (res == HCOMM_OK) {
        if (offs[p])
            memcpy(acc, send, offs[p] * es);
        rh_t h = {x, acc, tmp, offs, es, dt, op, 1, 0};
        while (h.pof2 * 2 <= p)
            h.pof2 *= 2;
        h.rem = p - h.pof2;
        res = rh_run(&h, recv);
    }
    free(offs);
    return res;
}

hcomm_result_t hcomm__rsv_run(const hcomm__xfer_t *x, int algo, const void *send, void *recv,
                              const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op) {
    if (algo & HCOMM__ALGO_DET)
        return hcomm__rsv_det(x, send, recv, counts, dt, op);
    if (algo == HCOMM__ALGO_RHD)
        return hcomm__rsv_rh(x, send, recv, counts, dt, op);
    return hcomm__rsv_ring(x, send, recv, counts, dt, op);
}
