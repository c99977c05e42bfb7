/* Rooted algorithms: binomial trees (broadcast, reduce, gather, scatter), the naive all_reduce
 * (the serial reduction in rank order on rank 0, then a broadcast), direct gather / scatter and
 * Rabenseifner's reduce. */
#include "algo/algos.h"
#include "algo/select.h"
#include "algo/variants.h"

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
hcomm_result_t hcomm__reduce_tree(const hcomm__xfer_t *x, void *buf, void *tmp, size_t count,
                                  hcomm_dtype_t dt, hcomm_op_t op, int root) {
    int p = x->c->size, vr = (x->c->rank - root + p) % p;
    size_t bytes = count * hcomm__dtype_size(dt);
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
    return res;
}

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

/* The blocks a rank holds in a binomial gather or scatter, in relative ranks: its own and its
 * subtree's, vr .. vr + n - 1, n = the lowest set bit of vr (p for the root), cut at p. */
static int subtree_blocks(int vr, int p) {
    int low = vr == 0 ? p : vr & -vr;
    return low < p - vr ? low : p - vr;
}

/* Scratch for those blocks, bytes each; NULL when out of memory (the error is set). */
static unsigned char *subtree_scratch(const hcomm__xfer_t *x, int vr, size_t bytes, int *held) {
    *held = subtree_blocks(vr, x->c->size);
    unsigned char *tmp = malloc((size_t)*held * bytes + 1);
    if (!tmp)
        hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes",
                   (size_t)*held * bytes);
    return tmp;
}

/* Binomial gather (Thakur et al. 2005, section 4.5): a rank collects its children's subtrees
 * (relative ranks vr+1, vr+2, vr+4, ...) behind its own block and sends the lot to its parent;
 * clg rounds, each block crossing at most clg links. The root then has every block in
 * relative order and puts block j at rank (j + root) mod p. */
hcomm_result_t hcomm__gather_tree(const hcomm__xfer_t *x, const void *send, void *recv,
                                  size_t bytes, int root) {
    int p = x->c->size, vr = (x->c->rank - root + p) % p, held = 0;
    unsigned char *tmp = subtree_scratch(x, vr, bytes, &held);
    if (!tmp)
        return HCOMM_ERR_NOMEM;
    if (bytes)
        memcpy(tmp, send, bytes);
    hcomm_result_t res = HCOMM_OK;
    for (int mask = 1; mask < p && res == HCOMM_OK; mask <<= 1) {
        if (vr & mask) {
            res = hcomm__x_send(x, (vr - mask + root) % p, tmp, (size_t)held * bytes);
            break;
        }
        if (vr + mask < p)
            res = hcomm__x_recv(x, (vr + mask + root) % p, tmp + (size_t)mask * bytes,
                                (size_t)subtree_blocks(vr + mask, p) * bytes);
    }
    for (int j = 0; res == HCOMM_OK && vr == 0 && j < p && bytes; j++)
        memcpy((char *)recv + (size_t)((j + root) % p) * bytes, tmp + (size_t)j * bytes, bytes);
    free(tmp);
    return res;
}

/* Binomial scatter, the gather reversed: the root lays the blocks out in relative order, and
 * each rank receives its subtree's blocks from its parent and hands each child its part. */
hcomm_result_t hcomm__scatter_tree(const hcomm__xfer_t *x, const void *send, void *recv,
                                   size_t bytes, int root) {
    int p = x->c->size, vr = (x->c->rank - root + p) % p, held = 0;
    unsigned char *tmp = subtree_scratch(x, vr, bytes, &held);
    if (!tmp)
        return HCOMM_ERR_NOMEM;
    hcomm_result_t res = HCOMM_OK;
    int mask = 1;
    for (; mask < p; mask <<= 1)
        if (vr & mask) {
            res = hcomm__x_recv(x, (vr - mask + root) % p, tmp, (size_t)held * bytes);
            break;
        }
    for (int j = 0; vr == 0 && j < p && bytes; j++)
        memcpy(tmp + (size_t)j * bytes, (const char *)send + (size_t)((j + root) % p) * bytes,
               bytes);
    for (mask >>= 1; mask > 0 && res == HCOMM_OK; mask >>= 1)
        if (vr + mask < p)
            res = hcomm__x_send(x, (vr + mask + root) % p, tmp + (size_t)mask * bytes,
                                (size_t)subtree_blocks(vr + mask, p) * bytes);
    if (res == HCOMM_OK && bytes)
        memcpy(recv, tmp, bytes);
    free(tmp);
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
        res = hcomm__rsv_run(x, HCOMM__ALGO_RHD, send, mine, counts, dt, op);
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
