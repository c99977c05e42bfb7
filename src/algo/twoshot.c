/* all_reduce on one node by direct access to the peers' buffers (the "two-shot" scheme of
 * NCCL's and TensorRT-LLM's one-node all_reduce): each rank owns one block, reads that block
 * of every rank's input in rank order and reduces it into its output (reduce_scatter); where
 * it may write the peers' outputs (local's threads; mpi where every output comes from
 * hcomm_mem_alloc: can_push) it writes each reduced piece into every other rank's output at
 * once (push_piece), else, after a barrier, every other rank's block is read into its output
 * (all_gather); a last barrier keeps every buffer alive until nobody touches it. Each byte is
 * copied once per phase (transport.peer_read: memcpy on local, process_vm_readv on mpi), and each
 * element is reduced in rank order: the bits of the serial reduction. Only the buffer addresses and
 * the barriers travel as messages (with the call's signature). */
#include "algo/algos.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Elements reduced per piece: the accumulator and the piece being read stay in cache. */
#define PIECE_BYTES ((size_t)256 << 10)

/* From this many bytes per rank's vector, results are written with non-temporal stores
 * (hcomm__copy_stream): a piece is reduced (or read) in cache and then streamed to its place,
 * so no line of the output is read from memory before it is written. Measured on 2 mpi
 * processes (hcomm-bench --algo twoshot, 3 alternating runs): busbw 2.45-2.80 GB/s against
 * 2.03-2.58 cached at 256 MiB, 2.25-2.77 against 2.23-2.69 at 64 MiB. */
#define STREAM_MIN_BYTES ((size_t)64 << 20)

/* The whole comm's addresses and barrier (xfer.c). */
static hcomm_result_t exchange_addrs(const hcomm__xfer_t *x, const void *send, size_t send_bytes,
                                     void *recv, size_t recv_bytes, hcomm__buf_pair_t *all) {
    hcomm__group_t g = hcomm__x_everyone(x);
    return hcomm__x_addrs(x, &g, send, send_bytes, recv, recv_bytes, all);
}

static hcomm_result_t barrier(const hcomm__xfer_t *x) {
    hcomm__group_t g = hcomm__x_everyone(x);
    return hcomm__x_barrier(x, &g);
}

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
        HCOMM__TRY(hcomm__x_peer_load(x, q, &all[q].send, off, tmp + PIECE_BYTES, bytes, &in));
        hcomm__reduce_to(tmp, partial, in, n, dt, op);
        partial = tmp;
    }
    hcomm__reduce(acc, partial, n, dt, op);
    for (int q = me + 1; q < p; q++) {
        HCOMM__TRY(hcomm__x_peer_load(x, q, &all[q].send, off, tmp + PIECE_BYTES, bytes, &in));
        hcomm__reduce(acc, in, n, dt, op);
    }
    return HCOMM_OK;
}

/* Where reduce_range writes finished pieces besides out: nowhere, every peer's output, or
 * (any other value) that one rank's. */
#define PUSH_NONE (-2)
#define PUSH_ALL (-1)

static hcomm_result_t push_piece(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                 const void *piece, size_t at, size_t bytes, bool stream, int to);

/* reduce_range's scratch: a piece read out of a peer, a copy of the own piece (for halves:
 * the f32 accumulator), and one for partial results (streamed, or pieces only pushed). */
#define RANGE_SCRATCH (3 * PIECE_BYTES)

/* The room for every rank's addresses and (with scratch) reduce_range's, taken before any
 * address goes out: a rank short of memory then fails the call, and its peers with it, before
 * any of them may write into its buffers. */
static hcomm_result_t call_room(const hcomm__xfer_t *x, bool scratch, hcomm__buf_pair_t **all,
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

/* reduce_range for f16/bf16 sums, products and means (hcomm__sums_in_f32): every rank's piece
 * is accumulated in f32 in rank order (scratch piece 1), AVG divides there, and the sum is
 * rounded once: the bits of the serial reduction widened to f32, with no input widened whole
 * and 2 bytes per element read from each peer. The rounded piece goes to out, or (streamed, or
 * out NULL) to scratch piece 2 first. */
static hcomm_result_t reduce_range_f32(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                       const void *send, void *out, size_t off, size_t len,
                                       hcomm_dtype_t dt, hcomm_op_t op, bool stream, int push,
                                       unsigned char *tmp) {
    size_t es = hcomm__dtype_size(dt), step = PIECE_BYTES / sizeof(float);
    float *acc = (float *)(void *)(tmp + PIECE_BYTES);
    bool stage = !out || (stream && push == PUSH_NONE);
    for (size_t done = 0; done < len; done += step) {
        size_t n = len - done < step ? len - done : step, at = (off + done) * es;
        void *dst = stage ? (void *)(tmp + 2 * PIECE_BYTES) : (char *)out + done * es;
        for (int q = 0; q < x->c->size; q++) {
            const void *in;
            HCOMM__TRY(piece_of(x, all, q, at, (const char *)send + at, tmp, n * es, &in));
            if (q == 0)
                hcomm__widen(acc, in, n, dt);
            else
                hcomm__accumulate_half(acc, in, n, dt, op);
        }
        hcomm__round_half(dst, acc, n, dt, op, x->c->size);
        if (stage && out)
            hcomm__copy_stream((char *)out + done * es, dst, n * es);
        if (push != PUSH_NONE)
            HCOMM__TRY(push_piece(x, all, dst, at, n * es, stream, push));
    }
    if (stream)
        hcomm__stream_fence(); /* before the barrier tells the peers to read it */
    return HCOMM_OK;
}

/* Elements [off, off + len) of the result, piece by piece, into out (element 0 of out is
 * element off; NULL: pieces are only pushed); send is this rank's whole input, tmp holds
 * RANGE_SCRATCH bytes. Streamed, partial results of a piece stay in a third scratch piece and
 * its last step streams to out. Each finished piece is also written at its place into the
 * output (all[q].recv) of every peer (push PUSH_ALL) or of rank push (push_piece). */
static hcomm_result_t reduce_range(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                   const void *send, void *out, size_t off, size_t len,
                                   hcomm_dtype_t dt, hcomm_op_t op, bool stream, int push,
                                   unsigned char *tmp) {
    if (hcomm__sums_in_f32(dt, op))
        return reduce_range_f32(x, all, send, out, off, len, dt, op, stream, push, tmp);
    bool stream_out = stream;
    stream = stream && push == PUSH_NONE; /* pushed pieces are copied from cache */
    size_t es = hcomm__dtype_size(dt), step = PIECE_BYTES / es;
    hcomm_result_t res = HCOMM_OK;
    for (size_t done = 0; res == HCOMM_OK && done < len; done += step) {
        size_t n = len - done < step ? len - done : step, at = (off + done) * es;
        void *dst = out ? (void *)((char *)out + done * es) : (void *)(tmp + 2 * PIECE_BYTES),
             *acc = stream ? tmp + 2 * PIECE_BYTES : dst;
        const void *mine = (const char *)send + at;
        bool own = acc == mine && x->c->rank != 0; /* rank 0's piece would land on this one's */
        if (own && commutes(dt, op)) {
            res = fold_piece(x, all, at, acc, tmp, n, dt, op);
            if (res == HCOMM_OK && push != PUSH_NONE)
                res = push_piece(x, all, dst, at, n * es, stream_out, push);
            continue;
        }
        if (own) {
            memcpy(tmp + PIECE_BYTES, mine, n * es);
            mine = tmp + PIECE_BYTES;
        }
        res = reduce_piece(x, all, at, dst, mine, acc, tmp, n, dt, op, stream);
        if (res == HCOMM_OK && push != PUSH_NONE)
            res = push_piece(x, all, dst, at, n * es, stream_out, push);
    }
    if (stream || (push != PUSH_NONE && stream_out))
        hcomm__stream_fence(); /* before the barrier tells the peers to read it */
    return res;
}

/* This rank's block of the result, in recv at the block's place (and with push in every
 * peer's). */
static hcomm_result_t reduce_block(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                   const void *send, void *recv, size_t count, hcomm_dtype_t dt,
                                   hcomm_op_t op, bool push, unsigned char *tmp) {
    size_t off, len;
    hcomm__block(count, x->c->size, x->c->rank, &off, &len);
    return reduce_range(x, all, send, (char *)recv + off * hcomm__dtype_size(dt), off, len, dt, op,
                        count * hcomm__dtype_size(dt) >= STREAM_MIN_BYTES,
                        push ? PUSH_ALL : PUSH_NONE, tmp);
}

/* bytes at byte offset off of peer q's buffer r, into dst: read straight there, or streamed
 * (from r's view, or a piece at a time through scratch that stays in cache). */
static hcomm_result_t read_streamed(const hcomm__xfer_t *x, int q, const hcomm__remote_t *r,
                                    size_t off, void *dst, size_t bytes, unsigned char *tmp) {
    if (!tmp)
        return hcomm__x_peer_copy(x, q, r, off, dst, bytes);
    for (size_t done = 0; done < bytes; done += PIECE_BYTES) {
        size_t n = bytes - done < PIECE_BYTES ? bytes - done : PIECE_BYTES;
        const void *at;
        HCOMM__TRY(hcomm__x_peer_load(x, q, r, off + done, tmp, n, &at));
        hcomm__copy_stream((char *)dst + done, at, n);
    }
    return HCOMM_OK;
}

/* Every other rank's reduced block, read from its recv into this rank's. */
static hcomm_result_t gather_blocks(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                    void *recv, size_t count, hcomm_dtype_t dt) {
    size_t es = hcomm__dtype_size(dt), off, len;
    unsigned char *tmp = count * es >= STREAM_MIN_BYTES ? malloc(PIECE_BYTES) : NULL;
    hcomm_result_t res = HCOMM_OK;
    for (int q = 0; res == HCOMM_OK && q < x->c->size; q++) {
        if (q == x->c->rank)
            continue;
        hcomm__block(count, x->c->size, q, &off, &len);
        res = read_streamed(x, q, &all[q].recv, off * es, (char *)recv + off * es, len * es, tmp);
    }
    if (tmp)
        hcomm__stream_fence();
    free(tmp);
    return res;
}

/* A finished piece of this rank's block (bytes at byte offset at of the vector) written into
 * every other rank's output, where views may be written (transport.views_writable): the scheme
 * of NCCL's and TensorRT-LLM's one-node all_reduce. A block's owner is the only rank that
 * reads that block of any input, so its place in a peer's buffer is free as soon as the owner
 * reduced it, in place too: no barrier between the phases, and no second pass over the block.
 * Each peer's copy of the block then sits in this rank's cache, where the next call's reduce
 * phase reads it; read by the peers instead, every block of a repeated in-place call moved
 * between caches twice (2 threads on 2 cores, in place, run after itself: 32 KiB 4.0 against
 * 10.1 us, 128 KiB 8.5 against 19.6, 512 KiB 17.0 against 67). */
static hcomm_result_t push_piece(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                 const void *piece, size_t at, size_t bytes, bool stream, int to) {
    for (int d = 1; d < x->c->size; d++) {
        int q = (x->c->rank + d) % x->c->size; /* each rank starts at a different peer */
        const hcomm__remote_t *r = &all[q].recv;
        if (to != PUSH_ALL && q != to)
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

/* Pushing needs writable views of the peers' outputs, decided from what every rank knows alike:
 * where the transport can write without a view (mpi: process_vm_writev, the rare fallback), from
 * every rank's exported output (all from hcomm_mem_alloc; malloc's buffers keep the reads), else
 * (local) from the views themselves, which always exist there. */
static bool can_push(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all) {
    const hcomm__transport_t *tr = x->c->tr;
    if (!tr->views_writable)
        return false;
    for (int q = 0; q < x->c->size; q++)
        if (tr->peer_write ? all[q].recv.buf.obj == 0 : !all[q].recv.at)
            return false;
    return true;
}

hcomm_result_t hcomm__ar_twoshot(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op) {
    hcomm__buf_pair_t *all;
    unsigned char *tmp;
    HCOMM__TRY(call_room(x, true, &all, &tmp));
    size_t bytes = count * hcomm__dtype_size(dt);
    hcomm_result_t res = exchange_addrs(x, send, bytes, recv, bytes, all);
    bool push = res == HCOMM_OK && can_push(x, all);
    if (res == HCOMM_OK)
        res = hcomm__x_tell_peers(x, reduce_block(x, all, send, recv, count, dt, op, push, tmp));
    if (res == HCOMM_OK && !push)
        res = barrier(x);
    if (res == HCOMM_OK && !push)
        res = hcomm__x_tell_peers(x, gather_blocks(x, all, recv, count, dt));
    if (res == HCOMM_OK)
        res = barrier(x);
    free(tmp);
    free(all);
    return res;
}

/* --- direct reduce_scatter and all_gather: the first and the second half of twoshot --- */

/* Every rank reads its block of every rank's input in rank order and reduces it (the serial
 * reduction's bits). In place a rank other than 0 reduces into the communicator's scratch
 * first: its result's place is block 0 of its own input, which rank 0 reads until the barrier.
 * A staging buffer malloc'd per call paid its page faults every call (2 processes, 128 MiB in
 * place: 57 ms against 17 out of place; 33 through scratch). Reducing into its own block of
 * its input instead, then moving it, took 25 ms there but ran 10-25% slower at 32-256 KiB.
 * In place costs more than out of place at every size because the result lands on lines rank 0
 * has just read, and rank 0's next reads find them changed: 2 processes, 32 KiB 5.4-5.9 us
 * against 3.2-3.5 (3.4-3.6 with the final copy left out), 128 KiB 13.3-13.9 against 5.6-6.0.
 * Out of place, a benchmark's input that no call changes stays in the readers' caches. shm,
 * whose readers load the board rather than the caller's buffer, leads in place at 32-64 KiB
 * (3.6-3.7 and 6.2 us), and selection cannot follow: ranks may differ in whether they run in
 * place. The cost is the benchmark's: in place, each call's input is the last call's output,
 * written on another core, and shm moves those lines too. Copying block 0 aside before the
 * addresses go out (so no rank writes a line another reads) left 32 KiB where it was (5.1-5.3
 * against 5.0-5.1 us), and in another of the machine's modes direct and shm ran at par (4 runs
 * of 400 calls: 5.0-5.5 against 4.2-5.2 at 32 KiB, 7.7-8.7 against 7.5-9.4 at 64 KiB). */
/* Block `mine` (`len` elements at element offset `off`, of `total` per input). In place,
 * the result's place is the input's start, which the ranks whose blocks lie there read until
 * the barrier: a rank whose block starts elsewhere reduces into scratch first. */
static hcomm_result_t rs_block_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                      size_t off, size_t len, size_t total, hcomm_dtype_t dt,
                                      hcomm_op_t op) {
    size_t es = hcomm__dtype_size(dt), bytes = len * es;
    bool staged = send == recv && off != 0 && bytes > 0;
    void *out = staged ? hcomm__x_scratch(x, bytes) : recv;
    if (!out) /* the peers wait for this rank's addresses: they fail with this */
        return hcomm__x_tell_peers(
            x, hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes", bytes));
    hcomm__buf_pair_t *all;
    unsigned char *tmp;
    HCOMM__TRY(call_room(x, true, &all, &tmp));
    hcomm_result_t res = exchange_addrs(x, send, total * es, recv, bytes, all);
    if (res == HCOMM_OK)
        res = hcomm__x_tell_peers(
            x, reduce_range(x, all, send, out, off, len, dt, op, false, PUSH_NONE, tmp));
    if (res == HCOMM_OK)
        res = barrier(x);
    if (res == HCOMM_OK && staged)
        memcpy(recv, out, bytes);
    free(tmp);
    free(all);
    return res;
}

hcomm_result_t hcomm__rs_direct(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                hcomm_dtype_t dt, hcomm_op_t op) {
    size_t p = (size_t)x->c->size;
    return rs_block_direct(x, send, recv, (size_t)x->c->rank * count, count, p * count, dt, op);
}

hcomm_result_t hcomm__rsv_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                 const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op) {
    size_t off = 0, total = 0;
    for (int q = 0; q < x->c->size; q++) {
        if (q == x->c->rank)
            off = total;
        total += counts[q];
    }
    return rs_block_direct(x, send, recv, off, counts[x->c->rank], total, dt, op);
}

/* all_gather(v) by reads: block q (each[q] bytes, or equal bytes where each is NULL) lies at
 * byte offset off[q] of recv; every rank copies every other block from its owner's send. */
static hcomm_result_t gather_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                    const size_t *each, size_t equal) {
    int p = x->c->size, me = x->c->rank;
    hcomm__buf_pair_t *all = calloc((size_t)p, sizeof *all);
    size_t *off = malloc(sizeof *off * ((size_t)p + 1));
    if (!all || !off) { /* the peers wait for this rank's addresses: they fail with this */
        free(all);
        free(off);
        return hcomm__x_tell_peers(
            x, hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "out of memory for %d addresses", p));
    }
    off[0] = 0;
    for (int q = 0; q < p; q++)
        off[q + 1] = off[q] + (each ? each[q] : equal);
    size_t own = off[me + 1] - off[me];
    char *mine = (char *)recv + off[me];
    hcomm_result_t res = exchange_addrs(x, send, own, recv, off[p], all), got = HCOMM_OK;
    for (int d = 1; res == HCOMM_OK && got == HCOMM_OK && d < p; d++) {
        int q = (me + d) % p; /* each rank starts at a different peer */
        size_t n = off[q + 1] - off[q];
        /* the exchange viewed every send buffer as this rank's block size; q's is n */
        hcomm__remote_t from = each ? hcomm__x_remote(x, q, &all[q].send.buf, n) : all[q].send;
        got = hcomm__x_peer_copy(x, q, &from, 0, (char *)recv + off[q], n);
    }
    if (res == HCOMM_OK)
        res = hcomm__x_tell_peers(x, got);
    if (res == HCOMM_OK && mine != send && own)
        memcpy(mine, send, own);
    if (res == HCOMM_OK)
        res = barrier(x);
    free(off);
    free(all);
    return res;
}

hcomm_result_t hcomm__ag_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                size_t bytes) {
    return gather_direct(x, send, recv, NULL, bytes);
}

hcomm_result_t hcomm__agv_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                 const size_t *bytes) {
    return gather_direct(x, send, recv, bytes, 0);
}

/* True where every rank can write into the root's output: through a writable view, or by the
 * transport's peer_write where it has none (mpi: process_vm_writev on malloc's memory).
 * Transports with writable views and no peer_write have a view of every buffer (local). */
static bool root_writable(const hcomm__xfer_t *x) {
    return x->c->tr->peer_write || x->c->tr->views_writable;
}

/* reduce to root by reads. Below REDUCE_SPLIT_BYTES the root reduces every rank's input in
 * rank order straight from the peers' buffers (one read per byte and input). From there the
 * work is split like twoshot's first half: rank q reduces block q of every input in rank order
 * and writes it straight into the root's output at its place (push_piece), so each rank reads
 * and reduces 1/p of the data. Both give the serial reduction's bits, in place too: only block
 * q's owner reads block q of any input, the root's included, so the root's input under a piece
 * is free once its owner reduced it. A barrier keeps every buffer alive until the last piece is
 * read or written. Where the root's output cannot be written (no such transport today), the
 * root reads everything. Every rank takes its memory before the addresses go out (call_room);
 * a root whose reads fail later (a peer's buffer shorter than the call says) leaves at once and
 * its peers fail at the barrier, but one of them may still be writing its block into the root's
 * output then, as twoshot's pushes may.
 *
 * Split against root alone, 2 runs each (f32 sum, HCOMM_CHECK=off, us): mpi, 2 processes,
 * hcomm_mem_alloc buffers: 256 KiB 16-18 against 11-14, 512 KiB 27-31 against 24-28, 768 KiB
 * 40-50 against 46-65, 1 MiB 48-72 against 63-119, 16 MiB 0.85-1.07 ms against 1.25-1.97; on
 * malloc's 256 KiB 30-32 against 22-30, 512 KiB 46-63 against 62-70, 1 MiB 114-122 against
 * 145-225. Once the root's working set (its output and every input) leaves its 2 MiB L2, its
 * reads alone cost more than the split's writes; below, a benchmark's inputs, which no call
 * changes, stay in the root's cache. With 4 processes (2 cores) the split leads from 256 KiB
 * (shared 40-62 against 57-68, 1 MiB 175-181 against 238-295; on malloc's, where 3 processes
 * write into the root's at once, at par at 256-512 KiB, 3 runs: 105-147 against 100-152 and
 * 204-325 against 265-313, ahead at 1 MiB, 360-396 against 511-577), and so with 4 local threads
 * (256 KiB 47-49 against 62-64; from 64 KiB: 28-31 against 33-34) and 8 (256 KiB 168-177
 * against 202-224; at par at 64 KiB); 2 threads at par at 256 KiB, 33-52 against 44-110 at 1
 * MiB.
 * f16/bf16 sums (hcomm__sums_in_f32) split at every size: widening and rounding make the root's
 * work alone cost more than the pushes (bf16, 2 processes, split against root alone, 2 runs:
 * 8 KiB 3.0-3.1 against 3.8-4.6 us, 64 KiB 11 against 17-23, 256 KiB 37-40 against 62-87; 4
 * processes at par to 32 KiB and ahead from 128 KiB, 54-76 against 78-87). */
#define REDUCE_SPLIT_BYTES_2 ((size_t)512 << 10)
#define REDUCE_SPLIT_BYTES ((size_t)256 << 10)

size_t hcomm__reduce_split_bytes(int p) {
    return p == 2 ? REDUCE_SPLIT_BYTES_2 : REDUCE_SPLIT_BYTES;
}

hcomm_result_t hcomm__reduce_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                    size_t count, hcomm_dtype_t dt, hcomm_op_t op, int root) {
    int p = x->c->size, me = x->c->rank;
    size_t es = hcomm__dtype_size(dt), bytes = count * es, off = 0, len = count;
    bool split = root_writable(x) &&
                 (bytes >= hcomm__reduce_split_bytes(p) || hcomm__sums_in_f32(dt, op)),
         stream = bytes >= STREAM_MIN_BYTES;
    hcomm__buf_pair_t *all;
    unsigned char *tmp;
    HCOMM__TRY(call_room(x, split || me == root, &all, &tmp));
    hcomm_result_t res =
        exchange_addrs(x, send, bytes, me == root ? recv : NULL, split ? bytes : 0, all);
    if (split)
        hcomm__block(count, p, me, &off, &len);
    void *out = me == root ? (char *)recv + off * es : NULL;
    if (res == HCOMM_OK && (split || me == root))
        res = hcomm__x_tell_peers(x, reduce_range(x, all, send, out, off, len, dt, op, stream,
                                                  me == root ? PUSH_NONE : root, tmp));
    if (res == HCOMM_OK)
        res = barrier(x);
    free(tmp);
    free(all);
    return res;
}

/* broadcast by reads of the root's buffer: the root tells every rank its address, each reads
 * the whole buffer (one copy per byte, no staging), and a barrier keeps the root's buffer
 * alive until every read is done. */
hcomm_result_t hcomm__bc_direct(const hcomm__xfer_t *x, void *buf, size_t bytes, int root) {
    int p = x->c->size, me = x->c->rank;
    hcomm__peer_buf_t at;
    hcomm__x_export(x, buf, bytes, &at);
    hcomm_result_t res = HCOMM_OK;
    if (me == root)
        for (int q = 0; res == HCOMM_OK && q < p; q++)
            res = q == root ? HCOMM_OK : hcomm__x_send(x, q, &at, sizeof at);
    else
        res = hcomm__x_recv(x, root, &at, sizeof at);
    if (res == HCOMM_OK && me != root) {
        hcomm__remote_t from = hcomm__x_remote(x, root, &at, bytes);
        res = hcomm__x_tell_peers(x, hcomm__x_peer_copy(x, root, &from, 0, buf, bytes));
    }
    if (res == HCOMM_OK)
        res = barrier(x);
    return res;
}
