/* Deterministic mode: every reduction gives the bits of the serial reduction in rank order,
 * acc = x0; acc = acc op x1; ...; whatever the algorithm, the chunking or an element's place.
 * Each result element is computed once, on one rank, from the p inputs in rank order (the
 * caller widened f16/bf16 to f32 and divides AVG afterwards, so those round once), then copied:
 *   - reduce_scatter(v) (hcomm__rsv_det): the owner of block b receives every rank's part of
 *     it at once (p-1 receives posted together, in segments bounded by DET_SCRATCH_BYTES) and
 *     reduces them in rank order as they complete; every rank sends (p-1)/p of its vector,
 *     as the ring does, but in one round of p-1 messages;
 *   - all_reduce (hcomm__ar_det): that reduce_scatter, then the chosen algorithm's all_gather
 *     (rhd: recursive doubling or Bruck; others: ring); rd, for small vectors, gathers all p
 *     vectors (Bruck) in pieces of DET_PIECE_BYTES and every rank reduces all of them itself;
 *     naive is deterministic as it is (rank 0 reduces in rank order, then broadcasts);
 *   - reduce (hcomm__reduce_det): the root receives the vectors in rank order. */
#include "algo/algos.h"

#include <stdlib.h>
#include <string.h>

/* Receive scratch of one segment per peer, in all. */
#define DET_SCRATCH_BYTES ((size_t)4 << 20)
/* rd's pieces: p of them are gathered on every rank. */
#define DET_PIECE_BYTES ((size_t)4096)

static hcomm_result_t nomem(const hcomm__xfer_t *x, size_t bytes) {
    return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes of scratch",
                      bytes);
}

/* Completes a receive and compares the sender's signature, as hcomm__x_recv does. */
static hcomm_result_t wait_recv(const hcomm__xfer_t *x, int peer, hcomm__req_t *req) {
    hcomm__env_t env = {0};
    hcomm_result_t res = hcomm__wait(req, &env, NULL);
    if (env.kind == HCOMM__ENV_DATA && (res == HCOMM_OK || res == HCOMM_ERR_MISMATCH)) {
        hcomm_result_t sig = x->check(x, peer, &env);
        if (sig != HCOMM_OK)
            return sig;
    }
    return res;
}

typedef struct det {
    const hcomm__xfer_t *x;
    const char *send;
    char *recv;
    const size_t *counts, *offs;
    char *slots;          /* p receive slots of slot elements (this rank's own unused) */
    hcomm__req_t **reqs;  /* p receives, then p sends */
    size_t es, seg, slot; /* elements per round of every block; per receive slot */
    hcomm_dtype_t dt;
    hcomm_op_t op;
} det_t;

static size_t seg_len(const det_t *d, int b, size_t s0) {
    size_t c = d->counts[b];
    return c > s0 ? (c - s0 < d->seg ? c - s0 : d->seg) : 0;
}

/* Segment s0 of this rank's block reduced in rank order. The running result lives where no
 * later read can see it: on rank 0 in recv itself (its own input, the first operand, is the
 * only part of send recv may alias there, and nobody is sent it); elsewhere in the slot of
 * rank 0's part, copied to recv once this round's sends are done (recv may alias send, but
 * only where this and earlier rounds read). */
static hcomm_result_t reduce_in_order(const det_t *d, size_t s0, size_t n, char **acc) {
    const hcomm__xfer_t *x = d->x;
    int p = x->c->size, me = x->c->rank;
    const char *own = d->send + (d->offs[me] + s0) * d->es;
    *acc = me == 0 ? d->recv + s0 * d->es : d->slots;
    if (me == 0 && *acc != own)
        memcpy(*acc, own, n * d->es);
    for (int r = 0; r < p; r++) {
        if (r != me) {
            hcomm_result_t res = wait_recv(x, r, d->reqs[r]);
            d->reqs[r] = NULL;
            HCOMM__TRY(res);
        }
        if (r > 0) /* r == 0 is already in place */
            hcomm__reduce(*acc, r == me ? own : d->slots + (size_t)r * d->slot * d->es, n, d->dt,
                          d->op);
    }
    return HCOMM_OK;
}

/* Segment [s0, s0 + seg) of every block: sends, receives, the rank-order reduction. */
static hcomm_result_t det_round(const det_t *d, size_t s0) {
    const hcomm__xfer_t *x = d->x;
    int p = x->c->size, me = x->c->rank;
    size_t n = seg_len(d, me, s0);
    hcomm__req_t **rq = d->reqs, **sq = d->reqs + p;
    hcomm_result_t res = HCOMM_OK;
    char *acc = NULL;
    for (int r = 0; r < p && res == HCOMM_OK; r++)
        if (r != me && n > 0)
            res = hcomm__irecv(x->c, HCOMM__CH_COLL, x->tag, r,
                               d->slots + (size_t)r * d->slot * d->es, n * d->es, HCOMM__RECV_EXACT,
                               &rq[r]);
    for (int b = 0; b < p && res == HCOMM_OK; b++)
        if (b != me && seg_len(d, b, s0) > 0)
            res = hcomm__isend(x->c, HCOMM__CH_COLL, x->tag, b, d->send + (d->offs[b] + s0) * d->es,
                               seg_len(d, b, s0) * d->es, &x->desc, &sq[b]);
    if (res == HCOMM_OK && n > 0)
        res = reduce_in_order(d, s0, n, &acc);
    hcomm_result_t wres = hcomm__wait_all(d->reqs, 2 * p); /* the sends; after a failure, all */
    memset(d->reqs, 0, sizeof(hcomm__req_t *) * 2 * (size_t)p);
    if (res == HCOMM_OK && wres == HCOMM_OK && n > 0 && acc != d->recv + s0 * d->es)
        memcpy(d->recv + s0 * d->es, acc, n * d->es);
    return res != HCOMM_OK ? res : wres;
}

hcomm_result_t hcomm__rsv_det(const hcomm__xfer_t *x, const void *send, void *recv,
                              const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op) {
    int p = x->c->size, me = x->c->rank;
    size_t es = hcomm__dtype_size(dt), maxc = 0, seg = DET_SCRATCH_BYTES / es / (size_t)p;
    seg = seg > 0 ? seg : 1; /* the same on every rank: the rounds line up */
    det_t d = {x, send, recv, counts, NULL, NULL, NULL, es, seg, seg, dt, op};
    size_t *offs = hcomm__prefix_sums(counts, p, 0);
    for (int r = 0; r < p; r++)
        maxc = counts[r] > maxc ? counts[r] : maxc;
    d.offs = offs;
    if (d.slot > counts[me])
        d.slot = counts[me] > 0 ? counts[me] : 1;
    d.slots = malloc((size_t)p * d.slot * es + 1);
    d.reqs = calloc(2 * (size_t)p, sizeof *d.reqs);
    hcomm_result_t res = offs && d.slots && d.reqs ? HCOMM_OK : nomem(x, (size_t)p * d.slot * es);
    /* As many rounds as the longest block needs: the same on every rank. */
    for (size_t s0 = 0; res == HCOMM_OK && s0 < maxc; s0 += seg)
        res = det_round(&d, s0);
    free(d.reqs);
    free(d.slots);
    free(offs);
    return res;
}

/* rd: every rank gathers all p pieces (Bruck) and reduces them in rank order itself. */
static hcomm_result_t ar_det_gather_all(const hcomm__xfer_t *x, char *buf, size_t count,
                                        hcomm_dtype_t dt, hcomm_op_t op) {
    int p = x->c->size, me = x->c->rank;
    size_t es = hcomm__dtype_size(dt), piece = DET_PIECE_BYTES / es;
    char *all = malloc((size_t)p * DET_PIECE_BYTES);
    size_t *bytes = malloc(sizeof(size_t) * (size_t)p);
    hcomm_result_t res = all && bytes ? HCOMM_OK : nomem(x, (size_t)p * DET_PIECE_BYTES);
    for (size_t done = 0; res == HCOMM_OK && done < count; done += piece) {
        size_t n = count - done < piece ? count - done : piece;
        for (int r = 0; r < p; r++)
            bytes[r] = n * es;
        memcpy(all + (size_t)me * n * es, buf + done * es, n * es);
        res = hcomm__agv_bruck(x, all, bytes);
        if (res != HCOMM_OK)
            break;
        memcpy(buf + done * es, all, n * es);
        for (int r = 1; r < p; r++)
            hcomm__reduce(buf + done * es, all + (size_t)r * n * es, n, dt, op);
    }
    free(bytes);
    free(all);
    return res;
}

hcomm_result_t hcomm__ar_det(const hcomm__xfer_t *x, int algo, void *buf, size_t count,
                             hcomm_dtype_t dt, hcomm_op_t op) {
    algo &= ~HCOMM__ALGO_DET;
    if (algo == HCOMM__ALGO_NAIVE)
        return hcomm__ar_naive(x, buf, count, dt, op);
    if (algo == HCOMM__ALGO_RD)
        return ar_det_gather_all(x, buf, count, dt, op);
    int p = x->c->size, me = x->c->rank;
    size_t es = hcomm__dtype_size(dt), off, len;
    size_t *counts = malloc(sizeof(size_t) * 2 * (size_t)p), *bytes = counts + p;
    if (!counts)
        return nomem(x, sizeof(size_t) * 2 * (size_t)p);
    for (int r = 0; r < p; r++) {
        hcomm__block(count, p, r, &off, &counts[r]);
        bytes[r] = counts[r] * es;
    }
    hcomm__block(count, p, me, &off, &len);
    hcomm_result_t res = hcomm__rsv_det(x, buf, (char *)buf + off * es, counts, dt, op);
    if (res == HCOMM_OK)
        res = hcomm__agv_run(x, algo == HCOMM__ALGO_RHD ? HCOMM__ALGO_RD : HCOMM__ALGO_RING, buf,
                             bytes);
    free(counts);
    return res;
}

hcomm_result_t hcomm__reduce_det(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root) {
    size_t bytes = count * hcomm__dtype_size(dt);
    if (x->c->rank != root)
        return hcomm__x_send(x, root, send, bytes);
    /* In place on a root other than 0, the running sum would overwrite the root's own input. */
    char *tmp = malloc(bytes + 1), *acc = recv == send ? malloc(bytes + 1) : recv;
    hcomm_result_t res = tmp && acc ? HCOMM_OK : nomem(x, 2 * bytes);
    for (int r = 0; r < x->c->size && res == HCOMM_OK; r++) {
        const void *src = send;
        if (r != root) {
            res = hcomm__x_recv(x, r, tmp, bytes);
            src = tmp;
        }
        if (res == HCOMM_OK && r == 0 && bytes)
            memcpy(acc, src, bytes);
        else if (res == HCOMM_OK && r > 0)
            hcomm__reduce(acc, src, count, dt, op);
    }
    if (res == HCOMM_OK && acc != recv && bytes)
        memcpy(recv, acc, bytes);
    if (acc != recv)
        free(acc);
    free(tmp);
    return res;
}
