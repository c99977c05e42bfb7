/* Rooted algorithms: binomial trees (broadcast, reduce), the naive all_reduce (the serial
 * reduction in rank order on rank 0, then a broadcast) and direct gather / scatter. */
#include "algo/algos.h"

#include <stdlib.h>
#include <string.h>

/* The binomial broadcast of MPICH (Thakur et al. 2005, section 4.1): in relative ranks, a rank
 * receives from the one that differs in its lowest set bit, then sends down each lower bit. */
hcomm_result_t hcomm__bc_tree(const hcomm__xfer_t *x, void *buf, size_t bytes, int root) {
    int p = x->c->size, vr = (x->c->rank - root + p) % p, mask = 1;
    while (mask < p) {
        if (vr & mask) {
            HCOMM__TRY(hcomm__x_recv(x, (vr - mask + root) % p, buf, bytes));
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < p)
            HCOMM__TRY(hcomm__x_send(x, (vr + mask + root) % p, buf, bytes));
    return HCOMM_OK;
}

/* The mirror image: each rank combines its children's partial results (relative ranks
 * vr+1, vr+2, vr+4, ... in that order, so operands stay in rank order) and sends up. */
hcomm_result_t hcomm__reduce_tree(const hcomm__xfer_t *x, void *buf, size_t count, hcomm_dtype_t dt,
                                  hcomm_op_t op, int root) {
    int p = x->c->size, vr = (x->c->rank - root + p) % p;
    size_t bytes = count * hcomm__dtype_size(dt);
    void *tmp = malloc(bytes + 1);
    if (!tmp)
        return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes", bytes);
    hcomm_result_t res = HCOMM_OK;
    for (int mask = 1; mask < p && res == HCOMM_OK; mask <<= 1) {
        if (vr & mask) {
            res = hcomm__x_send(x, (vr - mask + root) % p, buf, bytes);
            break;
        }
        if (vr + mask < p) {
            res = hcomm__x_recv(x, (vr + mask + root) % p, tmp, bytes);
            if (res == HCOMM_OK)
                hcomm__reduce(buf, tmp, count, dt, op);
        }
    }
    free(tmp);
    return res;
}

/* Rank 0 reduces everyone's vector in rank order, one at a time (memory stays 2 vectors). */
static hcomm_result_t naive_reduce(const hcomm__xfer_t *x, void *buf, size_t count,
                                   hcomm_dtype_t dt, hcomm_op_t op) {
    size_t bytes = count * hcomm__dtype_size(dt);
    if (x->c->rank != 0)
        return hcomm__x_send(x, 0, buf, bytes);
    void *tmp = malloc(bytes + 1);
    if (!tmp)
        return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes", bytes);
    hcomm_result_t res = HCOMM_OK;
    for (int r = 1; r < x->c->size && res == HCOMM_OK; r++) {
        res = hcomm__x_recv(x, r, tmp, bytes);
        if (res == HCOMM_OK)
            hcomm__reduce(buf, tmp, count, dt, op);
    }
    free(tmp);
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
