/* Recursive doubling over p2p (Thakur, Rabenseifner & Gropp 2005, section 4), with the extra
 * ranks of a non-power-of-two group folded into their neighbours first: all_reduce in pieces, the
 * union of blocks (all_gather, broadcast) and reduce_scatter as an all_reduce that keeps one
 * block. Each message carries the call's signature, so the check is part of the data exchange: a
 * rank that sees a different signature reports it to every peer and stops (x->check). The result
 * is identical on every rank since each step combines two vectors with a commutative op. */
#include "algo/algos.h"

#include <stdlib.h>
#include <string.h>

typedef struct rd {
    const hcomm__xfer_t *x;
    void *acc;          /* the running result, count elements */
    unsigned char *tmp; /* HCOMM__RD_PIECE_BYTES: what the partner sent */
    size_t count, bytes;
    hcomm_dtype_t dt;
    hcomm_op_t op;
    bool lane; /* messages take the transport's lane: acc and tmp have HCOMM__LANE_HDR before */
    /* nblocks > 0: a union instead of a reduction (rd_union): nblocks blocks of `block` bytes,
     * then one byte per block saying whether this vector holds it */
    int nblocks;
    size_t block;
} rd_t;

/* acc op= what the partner sent: a reduction, or the union of the blocks both hold. */
static void rd_merge(rd_t *d) {
    if (d->nblocks == 0) {
        hcomm__reduce(d->acc, d->tmp, d->count, d->dt, d->op);
        return;
    }
    unsigned char *acc = d->acc, *has = acc + d->block * (size_t)d->nblocks,
                  *got = d->tmp + d->block * (size_t)d->nblocks;
    for (int q = 0; q < d->nblocks; q++)
        if (got[q] && !has[q]) {
            memcpy(acc + d->block * (size_t)q, d->tmp + d->block * (size_t)q, d->block);
            has[q] = 1;
        }
}

/* One step on the lane: acc to `to` (-1: none), the partner's vector from `from` (-1: none)
 * into tmp, checked. */
static hcomm_result_t rd_lane(rd_t *d, int to, int from) {
    const hcomm__xfer_t *x = d->x;
    hcomm__env_t env = {.kind = HCOMM__ENV_DATA};
    size_t got;
    HCOMM__TRY(hcomm__lane_step(x->c, (uint32_t)x->tag, &x->desc.sig, to,
                                (unsigned char *)d->acc - HCOMM__LANE_HDR, d->bytes, from,
                                d->tmp - HCOMM__LANE_HDR, HCOMM__RD_PIECE_BYTES, &env.sig, &got));
    return from < 0 ? HCOMM_OK : x->check(x, from, &env);
}

static hcomm_result_t rd_send(rd_t *d, int peer) {
    if (d->lane)
        return rd_lane(d, peer, -1);
    return hcomm__x_send(d->x, peer, d->acc, d->bytes);
}

/* Receives the partner's vector into tmp and checks its signature. */
static hcomm_result_t rd_recv(rd_t *d, int peer) {
    if (d->lane)
        return rd_lane(d, -1, peer);
    hcomm__env_t env;
    HCOMM__TRY(hcomm__recv(d->x->c, HCOMM__CH_COLL, d->x->tag, peer, d->tmp, HCOMM__RD_PIECE_BYTES,
                           HCOMM__RECV_UPTO, &env));
    return d->x->check(d->x, peer, &env);
}

/* Sends acc to peer and receives the peer's into tmp at once. */
static hcomm_result_t rd_swap(rd_t *d, int peer) {
    if (d->lane)
        return rd_lane(d, peer, peer);
    hcomm__req_t *s = NULL;
    HCOMM__TRY(
        hcomm__isend(d->x->c, HCOMM__CH_COLL, d->x->tag, peer, d->acc, d->bytes, &d->x->desc, &s));
    hcomm_result_t res = rd_recv(d, peer);
    hcomm_result_t sres = hcomm__wait(s, NULL, NULL);
    HCOMM__TRY(res);
    return sres;
}

static hcomm_result_t rd_run(rd_t *d) {
    hcomm_comm_t *c = d->x->c;
    int p = c->size, rank = c->rank, pof2 = 1;
    while (pof2 * 2 <= p)
        pof2 *= 2;
    int rem = p - pof2, newrank;
    if (rank < 2 * rem && rank % 2 == 0) { /* folded: hand the vector over, get the result */
        HCOMM__TRY(rd_send(d, rank + 1));
        HCOMM__TRY(rd_recv(d, rank + 1));
        if (d->bytes)
            memcpy(d->acc, d->tmp, d->bytes);
        return HCOMM_OK;
    }
    if (rank < 2 * rem) {
        HCOMM__TRY(rd_recv(d, rank - 1));
        rd_merge(d);
        newrank = rank / 2;
    } else {
        newrank = rank - rem;
    }
    for (int mask = 1; mask < pof2; mask <<= 1) {
        int np = newrank ^ mask;
        HCOMM__TRY(rd_swap(d, np < rem ? np * 2 + 1 : np + rem));
        rd_merge(d);
    }
    if (rank < 2 * rem)
        HCOMM__TRY(rd_send(d, rank - 1));
    return HCOMM_OK;
}

/* The most bytes of one vector rd sends whole: one lane message, or its stack piece. */
static size_t rd_room(const hcomm_comm_t *c) {
    size_t lane = hcomm__lane_payload(c);
    return lane && lane < HCOMM__RD_PIECE_BYTES ? lane : HCOMM__RD_PIECE_BYTES;
}

hcomm_result_t hcomm__ar_rd(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                            hcomm_dtype_t dt, hcomm_op_t op) {
    _Alignas(16) unsigned char tmp[HCOMM__LANE_HDR + HCOMM__RD_PIECE_BYTES],
        acc[HCOMM__LANE_HDR + HCOMM__RD_PIECE_BYTES];
    size_t lane = hcomm__lane_payload(x->c), es = hcomm__dtype_size(dt), done = 0;
    size_t room = rd_room(x->c);
    size_t piece = count * es <= room ? count : room / es; /* one piece: no division */
    do {
        size_t n = count - done < piece ? count - done : piece, bytes = n * es;
        rd_t d = {x,
                  acc + HCOMM__LANE_HDR,
                  tmp + HCOMM__LANE_HDR,
                  n,
                  bytes,
                  dt,
                  op == HCOMM_AVG ? HCOMM_SUM : op,
                  lane > 0};
        if (bytes)
            memcpy(d.acc, (const char *)send + done * es, bytes);
        if (x->c->size > 1)
            HCOMM__TRY(rd_run(&d));
        if (bytes)
            memcpy((char *)recv + done * es, d.acc, bytes);
        done += n;
    } while (done < count);
    return HCOMM_OK;
}

/* nblocks blocks (own: this rank's, -1: none) merged by union over the whole vector: log2 p
 * steps in which every rank sends and receives. block * nblocks + nblocks <= rd_room.
 * out gets every block. */
static hcomm_result_t rd_union(const hcomm__xfer_t *x, const void *mine, size_t block, int nblocks,
                               int own, void *out) {
    _Alignas(16) unsigned char tmp[HCOMM__LANE_HDR + HCOMM__RD_PIECE_BYTES],
        acc[HCOMM__LANE_HDR + HCOMM__RD_PIECE_BYTES];
    size_t data = block * (size_t)nblocks;
    rd_t d = {x,         acc + HCOMM__LANE_HDR,         tmp + HCOMM__LANE_HDR,
              0,         data + (size_t)nblocks,        HCOMM_U8,
              HCOMM_SUM, hcomm__lane_payload(x->c) > 0, nblocks,
              block};
    unsigned char *v = d.acc;
    memset(v + data, 0, (size_t)nblocks);
    if (own >= 0) {
        if (block)
            memcpy(v + block * (size_t)own, mine, block);
        v[data + (size_t)own] = 1;
    }
    if (x->c->size > 1)
        HCOMM__TRY(rd_run(&d));
    if (data)
        memcpy(out, v, data);
    return HCOMM_OK;
}

bool hcomm__ag_rd_whole_fits(const hcomm_comm_t *c, size_t bytes) {
    size_t p = (size_t)c->size, room = rd_room(c);
    return p > 2 && p < room && bytes <= (room - p) / p;
}

hcomm_result_t hcomm__ag_rd_whole(const hcomm__xfer_t *x, const void *send, void *recv,
                                  size_t bytes) {
    return rd_union(x, send, bytes, x->c->size, x->c->rank, recv);
}

hcomm_result_t hcomm__bc_rd(const hcomm__xfer_t *x, void *buf, size_t bytes, int root) {
    size_t room = rd_room(x->c) - 1, done = 0;
    bool mine = x->c->rank == root;
    do {
        size_t n = bytes - done < room ? bytes - done : room;
        char *at = (char *)buf + done;
        HCOMM__TRY(rd_union(x, at, n, 1, mine ? 0 : -1, at));
        done += n;
    } while (done < bytes);
    return HCOMM_OK;
}

hcomm_result_t hcomm__rs_rd(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                            hcomm_dtype_t dt, hcomm_op_t op) {
    size_t es = hcomm__dtype_size(dt), total = count * (size_t)x->c->size;
    _Alignas(16) unsigned char small[HCOMM__RD_PIECE_BYTES];
    unsigned char *all = total * es <= sizeof small ? small : hcomm__x_scratch(x, total * es);
    if (!all)
        return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes", total * es);
    hcomm_result_t res = hcomm__ar_rd(x, send, all, total, dt, op);
    if (res == HCOMM_OK && count)
        memcpy(recv, all + (size_t)x->c->rank * count * es, count * es);
    return res;
}

/* Step mask exchanges the mask blocks each side has complete, in place. */
hcomm_result_t hcomm__agv_rd(const hcomm__xfer_t *x, void *buf, const size_t *bytes) {
    int p = x->c->size, me = x->c->rank;
    size_t *offs = hcomm__prefix_sums(bytes, p, 0);
    if (!offs)
        return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "out of memory for all_gather scratch");
    char *b = buf;
    hcomm_result_t res = HCOMM_OK;
    for (int mask = 1; mask < p && res == HCOMM_OK; mask <<= 1) {
        int peer = me ^ mask, mine = me & ~(mask - 1), theirs = peer & ~(mask - 1);
        res = hcomm__x_sendrecv(x, peer, b + offs[mine], offs[mine + mask] - offs[mine], peer,
                                b + offs[theirs], offs[theirs + mask] - offs[theirs]);
    }
    free(offs);
    return res;
}
