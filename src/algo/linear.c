/* The linear algorithms: the root exchanges with every rank itself. gather and scatter
 * ("direct" in HCOMM_ALGO: one message per rank, all posted at once), and the naive all_reduce
 * (every rank sends to rank 0, which reduces in rank order, the serial reference, then a binomial
 * broadcast). */
#include "algo/algos.h"

#include <stdlib.h>

/* Rank 0 reduces everyone's vector in rank order, one at a time (memory stays 2 vectors). */
static hcomm_result_t naive_reduce(const hcomm__xfer_t *x, void *buf, size_t count,
                                   hcomm_dtype_t dt, hcomm_op_t op) {
    size_t bytes = count * hcomm__dtype_size(dt);
    if (x->c->rank != 0)
        return hcomm__x_send(x, 0, buf, bytes);
    void *tmp = hcomm__x_scratch(x, bytes); /* kept: see ring.c */
    if (!tmp)
        return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes", bytes);
    hcomm_result_t res = HCOMM_OK;
    for (int r = 1; r < x->c->size && res == HCOMM_OK; r++) {
        res = hcomm__x_recv(x, r, tmp, bytes);
        if (res == HCOMM_OK)
            hcomm__reduce(buf, tmp, count, dt, op);
    }
    return res;
}

hcomm_result_t hcomm__ar_naive(const hcomm__xfer_t *x, void *buf, size_t count, hcomm_dtype_t dt,
                               hcomm_op_t op) {
    HCOMM__TRY(naive_reduce(x, buf, count, dt, op));
    return hcomm__bc_tree(x, buf, count * hcomm__dtype_size(dt), 0);
}

hcomm_result_t hcomm__gather_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                    size_t bytes, int root) {
    int p = x->c->size;
    if (x->c->rank != root)
        return hcomm__x_send(x, root, send, bytes);
    hcomm_result_t res = HCOMM_OK;
    for (int r = 0; r < p && res == HCOMM_OK; r++)
        if (r != root)
            res = hcomm__x_recv(x, r, (char *)recv + (size_t)r * bytes, bytes);
    return res;
}

hcomm_result_t hcomm__scatter_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                     size_t bytes, int root) {
    int p = x->c->size;
    if (x->c->rank != root)
        return hcomm__x_recv(x, root, recv, bytes);
    hcomm__req_t **reqs = calloc((size_t)p, sizeof *reqs);
    if (!reqs)
        return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %d requests", p);
    hcomm_result_t res = HCOMM_OK;
    for (int r = 0; r < p && res == HCOMM_OK; r++)
        if (r != root)
            res = hcomm__isend(x->c, HCOMM__CH_COLL, x->tag, r,
                               (const char *)send + (size_t)r * bytes, bytes, &x->desc, &reqs[r]);
    hcomm_result_t wres = hcomm__wait_all(reqs, p);
    free(reqs);
    return res != HCOMM_OK ? res : wres;
}
