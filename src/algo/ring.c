/* Ring algorithms (Patarasuk & Yuan 2009): p-1 steps, each rank sending to rank+1 and
 * receiving from rank-1, so every link carries (p-1)/p of the data once per phase. */
#include "algo/algos.h"

#include <stdlib.h>
#include <string.h>

typedef struct ring {
    const hcomm__xfer_t *x;
    char *buf;          /* the vector, blocks at offs[b] (elements) */
    const size_t *offs; /* p + 1 block offsets */
    size_t es;
    int p, rank;
} ring_t;

static int mod(int a, int p) {
    return ((a % p) + p) % p;
}

static size_t blen(const ring_t *g, int b) {
    return g->offs[b + 1] - g->offs[b];
}

/* Reduce-scatter: step s sends block rank+shift-s to the right and reduces block
 * rank+shift-s-1 from the left into place; rank ends owning block rank+shift+1. */
static hcomm_result_t ring_rs(const ring_t *g, void *tmp, hcomm_dtype_t dt, hcomm_op_t op,
                              int shift) {
    int right = mod(g->rank + 1, g->p), left = mod(g->rank - 1, g->p);
    for (int s = 0; s < g->p - 1; s++) {
        int sb = mod(g->rank + shift - s, g->p), rb = mod(g->rank + shift - s - 1, g->p);
        HCOMM__TRY(hcomm__x_sendrecv(g->x, right, g->buf + g->offs[sb] * g->es, blen(g, sb) * g->es,
                                     left, tmp, blen(g, rb) * g->es));
        hcomm__reduce(g->buf + g->offs[rb] * g->es, tmp, blen(g, rb), dt, op);
    }
    return HCOMM_OK;
}

/* All-gather: rank starts owning block rank+shift; step s forwards block rank+shift-s and
 * receives block rank+shift-s-1 in place. */
static hcomm_result_t ring_ag(const ring_t *g, int shift) {
    int right = mod(g->rank + 1, g->p), left = mod(g->rank - 1, g->p);
    for (int s = 0; s < g->p - 1; s++) {
        int sb = mod(g->rank + shift - s, g->p), rb = mod(g->rank + shift - s - 1, g->p);
        HCOMM__TRY(hcomm__x_sendrecv(g->x, right, g->buf + g->offs[sb] * g->es, blen(g, sb) * g->es,
                                     left, g->buf + g->offs[rb] * g->es, blen(g, rb) * g->es));
    }
    return HCOMM_OK;
}

static size_t *even_offsets(size_t count, int p, size_t base) {
    size_t *offs = malloc(sizeof(size_t) * ((size_t)p + 1));
    if (!offs)
        return NULL;
    for (int r = 0; r < p; r++) {
        size_t len;
        hcomm__block(count, p, r, &offs[r], &len);
        offs[r] += base;
    }
    offs[p] = base + count;
    return offs;
}

static hcomm_result_t nomem(const hcomm__xfer_t *x, size_t bytes) {
    return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes of scratch",
                      bytes);
}

/* One segment [base, base+n) of the all_reduce: reduce_scatter, then all_gather. */
static hcomm_result_t ar_segment(const hcomm__xfer_t *x, void *buf, size_t base, size_t n,
                                 hcomm_dtype_t dt, hcomm_op_t op, void *tmp) {
    size_t *offs = even_offsets(n, x->c->size, base);
    if (!offs)
        return nomem(x, sizeof(size_t) * ((size_t)x->c->size + 1));
    ring_t g = {x, buf, offs, hcomm__dtype_size(dt), x->c->size, x->c->rank};
    hcomm_result_t res = ring_rs(&g, tmp, dt, op, 0);
    if (res == HCOMM_OK)
        res = ring_ag(&g, 1);
    free(offs);
    return res;
}

hcomm_result_t hcomm__ar_ring(const hcomm__xfer_t *x, void *buf, size_t count, hcomm_dtype_t dt,
                              hcomm_op_t op) {
    int p = x->c->size;
    size_t es = hcomm__dtype_size(dt);
    size_t seg =
        HCOMM__RING_SEGMENT_BYTES / es < (size_t)p ? (size_t)p : HCOMM__RING_SEGMENT_BYTES / es;
    size_t tmp_bytes = ((seg < count ? seg : count) / (size_t)p + 1) * es;
    void *tmp = malloc(tmp_bytes);
    if (!tmp)
        return nomem(x, tmp_bytes);
    hcomm_result_t res = HCOMM_OK;
    size_t base = 0;
    do { /* a zero count still runs one (empty) segment: every rank exchanges the signature */
        size_t n = count - base < seg ? count - base : seg;
        res = ar_segment(x, buf, base, n, dt, op, tmp);
        base += n;
    } while (res == HCOMM_OK && base < count);
    free(tmp);
    return res;
}

hcomm_result_t hcomm__agv_ring(const hcomm__xfer_t *x, void *buf, const size_t *bytes) {
    size_t *offs = hcomm__prefix_sums(bytes, x->c->size, 0);
    if (!offs)
        return nomem(x, sizeof(size_t) * ((size_t)x->c->size + 1));
    ring_t g = {x, buf, offs, 1, x->c->size, x->c->rank};
    hcomm_result_t res = ring_ag(&g, 0);
    free(offs);
    return res;
}

hcomm_result_t hcomm__rsv_ring(const hcomm__xfer_t *x, const void *send, void *recv,
                               const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op) {
    int p = x->c->size;
    size_t es = hcomm__dtype_size(dt), maxb = 0;
    size_t *offs = hcomm__prefix_sums(counts, p, 0);
    for (int r = 0; offs && r < p; r++)
        maxb = counts[r] > maxb ? counts[r] : maxb;
    /* The communicator's scratch, kept between calls: malloc maps anything from 32 MiB anew
     * each call, and Open MPI's cross-memory attach crawls on memory mapped that recently
     * (docs/tuning.md: scratch.kept). */
    void *pacc = NULL, *ptmp = NULL;
    if (offs)
        hcomm__x_scratch_pair(x, offs[p] * es, maxb * es, &pacc, &ptmp);
    char *acc = pacc, *tmp = ptmp;
    hcomm_result_t res = tmp ? HCOMM_OK : nomem(x, offs ? (offs[p] + maxb) * es : 0);
    if (res == HCOMM_OK) {
        /* The scratch copy leaves send untouched and lets recv alias it. */
        if (offs[p] > 0)
            memcpy(acc, send, offs[p] * es);
        ring_t g = {x, acc, offs, es, p, x->c->rank};
        res = ring_rs(&g, tmp, dt, op, -1);
        if (res == HCOMM_OK && counts[x->c->rank] > 0)
            memcpy(recv, acc + offs[x->c->rank] * es, counts[x->c->rank] * es);
    }
    free(offs);
    return res;
}
