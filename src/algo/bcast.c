/* Broadcast variants for long messages (Thakur, Rabenseifner & Gropp 2005, section 4.1):
 *   scatter_allgather (van de Geijn): the root's buffer in p blocks (hcomm__block, in ranks
 *     relative to the root) goes down a binomial tree, each rank receiving its subtree's
 *     blocks, then a ring all_gather completes every rank: about 2 (p-1)/p of the buffer per
 *     rank instead of log2 p whole copies down the tree;
 *   chain: root -> root+1 -> ... in segments of HCOMM__CHAIN_SEGMENT_BYTES bytes, each rank
 * forwarding a segment while the next arrives, so the time tends to one copy plus p-2 segments. */
#include "algo/algos.h"

#include <stdlib.h>
#include <string.h>

typedef struct bcast {
    const hcomm__xfer_t *x;
    char *buf;
    size_t bytes;
    int p, vr, root;
} bcast_t;

/* Byte offset of relative block i (i == p: the end). */
static size_t blk(const bcast_t *b, int i) {
    return hcomm__block_start(b->bytes, b->p, i);
}

static int real(const bcast_t *b, int vr) {
    return (vr % b->p + b->root) % b->p;
}

static hcomm_result_t scatter(const bcast_t *b) {
    int mask = 1;
    for (; mask < b->p; mask <<= 1)
        if (b->vr & mask) {
            int hi = b->vr + mask < b->p ? b->vr + mask : b->p;
            HCOMM__TRY(hcomm__x_recv(b->x, real(b, b->vr - mask), b->buf + blk(b, b->vr),
                                     blk(b, hi) - blk(b, b->vr)));
            break;
        }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (b->vr + mask < b->p) {
            int lo = b->vr + mask, hi = lo + mask < b->p ? lo + mask : b->p;
            HCOMM__TRY(
                hcomm__x_send(b->x, real(b, lo), b->buf + blk(b, lo), blk(b, hi) - blk(b, lo)));
        }
    return HCOMM_OK;
}

/* Ring all_gather over relative blocks: step s forwards block vr - s, receives vr - s - 1. */
static hcomm_result_t ring_all_gather(const bcast_t *b) {
    int right = real(b, b->vr + 1), left = real(b, b->vr + b->p - 1);
    for (int s = 0; s < b->p - 1; s++) {
        int sb = (b->vr - s + b->p) % b->p, rb = (b->vr - s - 1 + b->p) % b->p;
        HCOMM__TRY(hcomm__x_sendrecv(b->x, right, b->buf + blk(b, sb), blk(b, sb + 1) - blk(b, sb),
                                     left, b->buf + blk(b, rb), blk(b, rb + 1) - blk(b, rb)));
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm__bc_scatter_allgather(const hcomm__xfer_t *x, void *buf, size_t bytes,
                                           int root) {
    int p = x->c->size;
    bcast_t b = {x, buf, bytes, p, (x->c->rank - root + p) % p, root};
    HCOMM__TRY(scatter(&b));
    return ring_all_gather(&b);
}

hcomm_result_t hcomm__bc_chain(const hcomm__xfer_t *x, void *buf, size_t bytes, int root) {
    int p = x->c->size, me = x->c->rank, vr = (me - root + p) % p;
    char *b = buf;
    hcomm__req_t *pending = NULL;
    hcomm_result_t res = HCOMM_OK;
    for (size_t off = 0; off < bytes && res == HCOMM_OK; off += HCOMM__CHAIN_SEGMENT_BYTES) {
        size_t n =
            bytes - off < HCOMM__CHAIN_SEGMENT_BYTES ? bytes - off : HCOMM__CHAIN_SEGMENT_BYTES;
        if (vr > 0)
            res = hcomm__x_recv(x, (me + p - 1) % p, b + off, n);
        if (res == HCOMM_OK && vr < p - 1) { /* one send in flight while the next arrives */
            if (pending)
                res = hcomm__wait(pending, NULL, NULL);
            pending = NULL;
            if (res == HCOMM_OK)
                res = hcomm__isend(x->c, HCOMM__CH_COLL, x->tag, (me + 1) % p, b + off, n, &x->desc,
                                   &pending);
        }
    }
    hcomm_result_t wres = pending ? hcomm__wait(pending, NULL, NULL) : HCOMM_OK;
    return res != HCOMM_OK ? res : wres;
}
