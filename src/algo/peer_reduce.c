/* Reductions straight from the peers' buffers on one node (transport.peer_read_ok), shared by
 * twoshot all_reduce and the direct reduce_scatter(v) and reduce (direct.c): every rank's
 * buffers are described to every other (hcomm__x_addrs_all), then each element of a range is
 * reduced from every rank's input in rank order, a piece at a time that stays in cache (the bits
 * of the serial reduction; f16/bf16 sums, products and means accumulated in f32 and rounded
 * once), and each finished piece can be written into peers' outputs at once (push). */
#include "algo/peer_reduce.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where this rank loads rank q's piece at byte offset off: mine (its own), a view of the
 * peer's, or a copy in tmp. */
static hcomm_result_t piece_of(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all, int q,
                               size_t off, const void *mine, void *tmp, size_t bytes,
                               const void **at) {
    if (q == x->c->rank) {
        *at = mine;
        return HCOMM_OK;
    }
    return hcomm__x_peer_load(x, q, &all[q].send, off, tmp, bytes, at);
}

/* dst[0..n) = rank 0's input op rank 1's op ... for the piece at byte offset off, each step
 * one pass over two inputs (hcomm__reduce_to). mine holds this rank's own piece (a copy when
 * the call is in place and dst would overwrite it too early). Partial results go to acc (dst
 * itself, or scratch when streamed: the last step then writes dst with non-temporal stores);
 * tmp takes a piece that has to be copied out of a peer. */
static hcomm_result_t reduce_piece(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all, size_t off,
                                   void *dst, const void *mine, void *acc, void *tmp, size_t n,
                                   hcomm_dtype_t dt, hcomm_op_t op, bool stream) {
    int p = x->c->size;
    size_t bytes = n * hcomm__dtype_size(dt);
    const void *prev, *in;
    HCOMM__TRY(piece_of(x, all, 0, off, mine, acc, bytes, &prev));
    for (int q = 1; q < p; q++) {
        HCOMM__TRY(piece_of(x, all, q, off, mine, tmp, bytes, &in));
        if (stream && q == p - 1) {
            hcomm__reduce_stream(dst, prev, in, n, dt, op);
            return HCOMM_OK;
        }
        hcomm__reduce_to(acc, prev, in, n, dt, op);
        prev = acc;
    }
    if (prev != dst) /* a group of one */
        memcpy(dst, prev, bytes);
    return HCOMM_OK;
}

/* a op b has the bits of b op a: integers, and IEEE sums and products (NaN payloads aside);
 * not float MAX/MIN, whose signed zeros would come out in the other operand's sign. */
static bool commutes(hcomm_dtype_t dt, hcomm_op_t op) {
    return !hcomm__dtype_is_float(dt) || op == HCOMM_SUM || op == HCOMM_PROD;
}

/* reduce_piece in place on a rank other than 0, where acc is this rank's own input: ranks
 * 0..me-1 are reduced (in scratch where there are several, else loaded in place) and folded in
 * as acc op partial (the bits of partial op acc, as commutes() says), then ranks me+1.. reduce
 * into acc; no copy of the piece is kept. */
static hcomm_result_t fold_piece(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all, size_t off,
                                 void *acc, unsigned char *tmp, size_t n, hcomm_dtype_t dt,
                                 hcomm_op_t op) {
    int p = x->c->size, me = x->c->rank;
    size_t bytes = n * hcomm__dtype_size(dt);
    const void *partial, *in;
    HCOMM__TRY(hcomm__x_peer_load(x, 0, &all[0].send, off, tmp, bytes, &partial));
    for (int q = 1; q < me; q++) {
        HCOMM__TRY(
            hcomm__x_peer_load(x, q, &all[q].send, off, tmp + HCOMM__PR_PIECE_BYTES, bytes, &in));
        hcomm__reduce_to(tmp, partial, in, n, dt, op);
        partial = tmp;
    }
    hcomm__reduce(acc, partial, n, dt, op);
    for (int q = me + 1; q < p; q++) {
        HCOMM__TRY(
            hcomm__x_peer_load(x, q, &all[q].send, off, tmp + HCOMM__PR_PIECE_BYTES, bytes, &in));
        hcomm__reduce(acc, in, n, dt, op);
    }
    return HCOMM_OK;
}

/* The piece at byte offset off reduced in one pass over every input (hcomm__reduce_many: an
 * f32 or f64 sum, or a half-precision sum, product or mean through f32, rounded once), where
 * every peer's input is a view here: dst = mine where the call is in place (each column is read
 * before it is written). False where it does not apply. */
static bool sum_views(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all, size_t off,
                      const void *mine, void *dst, size_t n, hcomm_dtype_t dt, hcomm_op_t op) {
    enum { MAX_INPUTS = 64 };
    const void *srcs[MAX_INPUTS];
    int p = x->c->size;
    bool one_pass =
        hcomm__sums_in_f32(dt, op) || (op == HCOMM_SUM && (dt == HCOMM_F32 || dt == HCOMM_F64));
    if (!one_pass || p > MAX_INPUTS)
        return false;
    for (int q = 0; q < p; q++) {
        srcs[q] = q == x->c->rank ? mine : all[q].send.at ? all[q].send.at + off : NULL;
        if (!srcs[q])
            return false;
    }
    hcomm__reduce_many(dst, srcs, p, 0, n, dt, op);
    return true;
}

/* reduce_range's scratch: a piece read out of a peer, a copy of the own piece (for halves:
 * the f32 accumulator), and one for partial results (streamed, or pieces only pushed). */
#define RANGE_SCRATCH (3 * HCOMM__PR_PIECE_BYTES)

hcomm_result_t hcomm__pr_room(const hcomm__xfer_t *x, bool scratch, hcomm__buf_pair_t **all,
                              unsigned char **tmp) {
    *all = calloc((size_t)x->c->size, sizeof **all);
    *tmp = scratch ? malloc(RANGE_SCRATCH) : NULL;
    if (*all && (*tmp || !scratch))
        return HCOMM_OK;
    free(*all);
    free(*tmp);
    return hcomm__x_tell_peers(x, hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn,
                                             "out of memory for %d addresses and %zu bytes",
                                             x->c->size, scratch ? RANGE_SCRATCH : 0));
}

/* A finished piece of this rank's block (bytes at byte offset at of the vector) written into
 * every other rank's output (to: HCOMM__PR_PUSH_ALL) or one rank's, where views may be written
 * (transport.views_writable): the scheme of NCCL's and TensorRT-LLM's one-node all_reduce. A
 * block's owner is the only rank that reads that block of any input, so its place in a peer's
 * buffer is free as soon as the owner reduced it, in place too: no barrier between the phases,
 * and no second pass over the block. Each peer's copy then sits in this rank's cache, where the
 * next call's reduce phase reads it (docs/tuning.md: twoshot.push). */
static hcomm_result_t push_piece(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                 const void *piece, size_t at, size_t bytes, bool stream, int to) {
    for (int d = 1; d < x->c->size; d++) {
        int q = (x->c->rank + d) % x->c->size; /* each rank starts at a different peer */
        const hcomm__remote_t *r = &all[q].recv;
        if (to != HCOMM__PR_PUSH_ALL && q != to)
            continue;
        if (!r->at && !x->c->tr->peer_write)
            return hcomm__err(HCOMM_ERR_INTERNAL, x->c->call_fn,
                              "rank %d's output cannot be written from rank %d", q, x->c->rank);
        if (!r->at) /* no view of it here (mpi: malloc's memory, or more objects than slots) */
            HCOMM__TRY(
                x->c->tr->peer_write(x->c, q, (char *)(uintptr_t)r->buf.addr + at, piece, bytes));
        else if (stream)
            hcomm__copy_stream((char *)(uintptr_t)r->at + at, piece, bytes);
        else
            memcpy((char *)(uintptr_t)r->at + at, piece, bytes);
    }
    return HCOMM_OK;
}

/* dst = every rank's piece at byte offset off accumulated in f32 in rank order (acc), then
 * rounded once; tmp takes a piece copied out of a peer. */
static hcomm_result_t accumulate_piece(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                       size_t off, const void *mine, void *dst, float *acc,
                                       unsigned char *tmp, size_t n, hcomm_dtype_t dt,
                                       hcomm_op_t op) {
    for (int q = 0; q < x->c->size; q++) {
        const void *in;
        HCOMM__TRY(piece_of(x, all, q, off, mine, tmp, n * hcomm__dtype_size(dt), &in));
        if (q == 0)
            hcomm__widen(acc, in, n, dt);
        else
            hcomm__accumulate_half(acc, in, n, dt, op);
    }
    hcomm__round_half(dst, acc, n, dt, op, x->c->size);
    return HCOMM_OK;
}

/* reduce_range for f16/bf16 sums, products and means (hcomm__sums_in_f32): every rank's piece
 * is accumulated in f32 in rank order (scratch piece 1), AVG divides there, and the sum is
 * rounded once: the bits of the serial reduction widened to f32, with no input widened whole
 * and 2 bytes per element read from each peer. The rounded piece goes to out, or (streamed, or
 * out NULL) to scratch piece 2 first. */
static hcomm_result_t reduce_range_f32(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                       const void *send, void *out, size_t off, size_t len,
                                       hcomm_dtype_t dt, hcomm_op_t op, bool stream, int push,
                                       unsigned char *tmp) {
    size_t es = hcomm__dtype_size(dt), step = HCOMM__PR_PIECE_BYTES / sizeof(float);
    float *acc = (float *)(void *)(tmp + HCOMM__PR_PIECE_BYTES);
    bool stage = !out || (stream && push == HCOMM__PR_PUSH_NONE);
    for (size_t done = 0; done < len; done += step) {
        size_t n = len - done < step ? len - done : step, at = (off + done) * es;
        void *dst = stage ? (void *)(tmp + 2 * HCOMM__PR_PIECE_BYTES) : (char *)out + done * es;
        const void *mine = (const char *)send + at;
        if (!sum_views(x, all, at, mine, dst, n, dt, op))
            HCOMM__TRY(accumulate_piece(x, all, at, mine, dst, acc, tmp, n, dt, op));
        if (stage && out)
            hcomm__copy_stream((char *)out + done * es, dst, n * es);
        if (push != HCOMM__PR_PUSH_NONE)
            HCOMM__TRY(push_piece(x, all, dst, at, n * es, stream, push));
    }
    if (stream)
        hcomm__stream_fence(); /* before the barrier tells the peers to read it */
    return HCOMM_OK;
}

/* tmp holds RANGE_SCRATCH bytes; streamed, a piece's partial results stay in its third piece. */
hcomm_result_t hcomm__pr_reduce_range(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                      const void *send, void *out, size_t off, size_t len,
                                      hcomm_dtype_t dt, hcomm_op_t op, bool stream, int push,
                                      unsigned char *tmp) {
    if (hcomm__sums_in_f32(dt, op))
        return reduce_range_f32(x, all, send, out, off, len, dt, op, stream, push, tmp);
    bool stream_out = stream;
    stream = stream && push == HCOMM__PR_PUSH_NONE; /* pushed pieces are copied from cache */
    size_t es = hcomm__dtype_size(dt), step = HCOMM__PR_PIECE_BYTES / es;
    hcomm_result_t res = HCOMM_OK;
    for (size_t done = 0; res == HCOMM_OK && done < len; done += step) {
        size_t n = len - done < step ? len - done : step, at = (off + done) * es;
        void *dst = out ? (void *)((char *)out + done * es)
                        : (void *)(tmp + 2 * HCOMM__PR_PIECE_BYTES),
             *acc = stream ? tmp + 2 * HCOMM__PR_PIECE_BYTES : dst;
        const void *mine = (const char *)send + at;
        if (sum_views(x, all, at, mine, acc, n, dt, op)) {
            if (acc != dst)
                hcomm__copy_stream(dst, acc, n * es); /* streamed out of scratch */
            if (push != HCOMM__PR_PUSH_NONE)
                res = push_piece(x, all, dst, at, n * es, stream_out, push);
            continue;
        }
        bool own = acc == mine && x->c->rank != 0; /* rank 0's piece would land on this one's */
        if (own && commutes(dt, op)) {
            res = fold_piece(x, all, at, acc, tmp, n, dt, op);
            if (res == HCOMM_OK && push != HCOMM__PR_PUSH_NONE)
                res = push_piece(x, all, dst, at, n * es, stream_out, push);
            continue;
        }
        if (own) {
            memcpy(tmp + HCOMM__PR_PIECE_BYTES, mine, n * es);
            mine = tmp + HCOMM__PR_PIECE_BYTES;
        }
        res = reduce_piece(x, all, at, dst, mine, acc, tmp, n, dt, op, stream);
        if (res == HCOMM_OK && push != HCOMM__PR_PUSH_NONE)
            res = push_piece(x, all, dst, at, n * es, stream_out, push);
    }
    if (stream || (push != HCOMM__PR_PUSH_NONE && stream_out))
        hcomm__stream_fence(); /* before the barrier tells the peers to read it */
    return res;
}
