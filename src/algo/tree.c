/* Binomial trees (MPICH; Thakur et al. 2005, section 4): broadcast, reduce, gather
 * and scatter, in ranks relative to the root, ceil(log2 p) rounds. */
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

/* The blocks a rank holds in a binomial gather or scatter, in relative ranks: its own and its
 * subtree's, vr .. vr + n - 1, n = the lowest set bit of vr (p for the root), cut at p. */
static int subtree_blocks(int vr, int p) {
    int low = vr == 0 ? p : vr & -vr;
    return low < p - vr ? low : p - vr;
}

/* One rank's part in a binomial gather or scatter: its relative rank, and scratch for the
 * blocks of its subtree (held of them, bytes each). */
typedef struct subtree {
    int p, vr, held;
    unsigned char *tmp;
} subtree_t;

static hcomm_result_t subtree_open(const hcomm__xfer_t *x, size_t bytes, int root, subtree_t *t) {
    t->p = x->c->size;
    t->vr = (x->c->rank - root + t->p) % t->p;
    t->held = subtree_blocks(t->vr, t->p);
    t->tmp = malloc((size_t)t->held * bytes + 1);
    if (!t->tmp)
        return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes",
                          (size_t)t->held * bytes);
    return HCOMM_OK;
}

/* Binomial gather (Thakur et al. 2005, section 4.5): a rank collects its children's subtrees
 * (relative ranks vr+1, vr+2, vr+4, ...) behind its own block and sends the lot to its parent;
 * clg rounds, each block crossing at most clg links. The root then has every block in
 * relative order and puts block j at rank (j + root) mod p. */
hcomm_result_t hcomm__gather_tree(const hcomm__xfer_t *x, const void *send, void *recv,
                                  size_t bytes, int root) {
    subtree_t t;
    HCOMM__TRY(subtree_open(x, bytes, root, &t));
    int p = t.p, vr = t.vr;
    unsigned char *tmp = t.tmp;
    if (bytes)
        memcpy(tmp, send, bytes);
    hcomm_result_t res = HCOMM_OK;
    for (int mask = 1; mask < p && res == HCOMM_OK; mask <<= 1) {
        if (vr & mask) {
            res = hcomm__x_send(x, (vr - mask + root) % p, tmp, (size_t)t.held * bytes);
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
    subtree_t t;
    HCOMM__TRY(subtree_open(x, bytes, root, &t));
    int p = t.p, vr = t.vr, mask = 1;
    hcomm_result_t res = HCOMM_OK;
    unsigned char *tmp = t.tmp;
    for (; mask < p; mask <<= 1)
        if (vr & mask) {
            res = hcomm__x_recv(x, (vr - mask + root) % p, tmp, (size_t)t.held * bytes);
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
