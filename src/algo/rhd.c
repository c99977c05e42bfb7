/* Rabenseifner's algorithms (Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005, section 4),
 * among the largest power of two pof2 <= p ranks, the first 2*(p - pof2) ranks paired up first
 * (each even one hands its vector to the odd one after it and gets its result back at the end):
 *   all_reduce      a reduce_scatter by recursive halving, then an all_gather by
 *                   recursive doubling; blocks are hcomm__block over pof2;
 *   reduce_scatterv recursive halving alone, virtual rank v standing for the contiguous
 *                   real blocks of itself and its folded partner;
 *   reduce          that reduce_scatter, then the root gathers the blocks. */
#include "algo/algos.h"

#include <stdlib.h>
#include <string.h>

typedef struct rhd {
    const hcomm__xfer_t *x;
    char *buf, *tmp;
    size_t count, es;
    const size_t *offs; /* reduce_scatterv: p + 1 element offsets of the real blocks; else NULL */
    hcomm_dtype_t dt;
    hcomm_op_t op;
    int pof2, rem;
} rhd_t;

/* The largest power of two pof2 <= p, and the rem = p - pof2 pairs folded first. */
static void set_pof2(rhd_t *h, int p) {
    h->pof2 = 1;
    while (h->pof2 * 2 <= p)
        h->pof2 *= 2;
    h->rem = p - h->pof2;
}

/* Element offset where virtual block v (of pof2) starts; v == pof2 gives the end. all_reduce:
 * hcomm__block over pof2; reduce_scatterv: the real blocks of v and its folded partner. */
static size_t start_of(const rhd_t *h, int v) {
    if (h->offs)
        return h->offs[v < h->rem ? 2 * v : v + h->rem];
    return hcomm__block_start(h->count, h->pof2, v);
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
    rhd_t h = {x, buf, NULL, count, hcomm__dtype_size(dt), NULL, dt, op, 1, 0};
    set_pof2(&h, x->c->size);
    h.tmp = hcomm__x_scratch(x, count * h.es); /* kept: a fresh 32 MiB+ malloc faults */
    if (!h.tmp) /* the peers wait for this rank's messages: they fail with this */
        return hcomm__x_tell_peers(x, hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn,
                                                 "cannot allocate %zu bytes of scratch",
                                                 count * h.es));
    return rhd_run(&h);
}

/* --- reduce_scatterv by recursive halving --- */

static hcomm_result_t rh_run(rhd_t *h, void *recv) {
    const hcomm__xfer_t *x = h->x;
    int me = x->c->rank, p = x->c->size, v;
    size_t total = h->offs[p], mine = h->offs[me + 1] - h->offs[me];
    if (me < 2 * h->rem && me % 2 == 0) { /* folded: hand over, get this block back */
        HCOMM__TRY(hcomm__x_send(x, me + 1, h->buf, total * h->es));
        return hcomm__x_recv(x, me + 1, recv, mine * h->es);
    }
    if (me < 2 * h->rem) {
        HCOMM__TRY(hcomm__x_recv(x, me - 1, h->tmp, total * h->es));
        hcomm__reduce(h->buf, h->tmp, total, h->dt, h->op);
        v = me / 2;
    } else {
        v = me - h->rem;
    }
    int lo = 0, hi = h->pof2;
    HCOMM__TRY(halve(h, v, &lo, &hi));
    if (v < h->rem) /* this rank holds its folded partner's block too */
        HCOMM__TRY(hcomm__x_send(x, me - 1, h->buf + h->offs[me - 1] * h->es,
                                 (h->offs[me] - h->offs[me - 1]) * h->es));
    if (mine)
        memcpy(recv, h->buf + h->offs[me] * h->es, mine * h->es);
    return HCOMM_OK;
}

hcomm_result_t hcomm__rsv_rh(const hcomm__xfer_t *x, const void *send, void *recv,
                             const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op) {
    int p = x->c->size;
    size_t es = hcomm__dtype_size(dt);
    size_t *offs = hcomm__prefix_sums(counts, p, 0);
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
        rhd_t h = {x, acc, tmp, offs[p], es, offs, dt, op, 1, 0};
        set_pof2(&h, p);
        res = rh_run(&h, recv);
    }
    free(offs);
    return res;
}

/* Rabenseifner's reduce (Rabenseifner 2004; Thakur et al. 2005, section 4.3): a reduce_scatter
 * by recursive halving leaves block r (hcomm__block) reduced on rank r, and the root gathers
 * the blocks: about 2 (p-1)/p of the vector per rank where the tree moves clg vectors. */
hcomm_result_t hcomm__reduce_rhd(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root) {
    int p = x->c->size, me = x->c->rank;
    size_t es = hcomm__dtype_size(dt), off = 0, len = 0;
    size_t *counts = malloc(sizeof(size_t) * (size_t)p);
    hcomm__block(count, p, me, &off, &len);
    void *mine = malloc(len * es + 1);
    hcomm_result_t res = HCOMM_OK;
    if (!counts || !mine)
        res = hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes", len * es);
    for (int r = 0; res == HCOMM_OK && r < p; r++)
        hcomm__block(count, p, r, &off, &counts[r]);
    if (res == HCOMM_OK)
        res = hcomm__rsv_rh(x, send, mine, counts, dt, op);
    if (res == HCOMM_OK && me != root)
        res = hcomm__x_send(x, root, mine, len * es);
    for (int r = 0; res == HCOMM_OK && me == root && r < p; r++) {
        hcomm__block(count, p, r, &off, &len);
        char *dst = (char *)recv + off * es;
        if (r != root)
            res = hcomm__x_recv(x, r, dst, len * es);
        else if (len)
            memcpy(dst, mine, len * es);
    }
    free(counts);
    free(mine);
    return res;
}
