/* all_reduce on one node by direct access to the peers' buffers (the "two-shot" scheme of
 * NCCL's and TensorRT-LLM's one-node all_reduce): each rank owns one block, reads that block
 * of every rank's input in rank order and reduces it into its output (reduce_scatter); where
 * it may write the peers' outputs (local's threads; mpi where every output comes from
 * hcomm_mem_alloc: can_push) it writes each reduced piece into every other rank's output at
 * once (push_piece), else, after a barrier, every other rank's block is read into its output
 * (all_gather); a last pair of barriers keeps every buffer alive until nobody touches it and tells
 * each rank its reads were from buffers still in the call (hcomm__x_release_all). Each byte is
 * copied once per phase (transport.peer_read: memcpy on local, process_vm_readv on mpi), and each
 * element is reduced in rank order: the bits of the serial reduction. Only the buffer addresses and
 * the barriers travel as messages (with the call's signature). */
#include "algo/algos.h"
#include "algo/peer_reduce.h"

#include <stdlib.h>

/* This rank's block of the result, in recv at the block's place (and with push in every
 * peer's). */
static hcomm_result_t reduce_block(const hcomm__xfer_t *x, const hcomm__buf_pair_t *all,
                                   const void *send, void *recv, size_t count, hcomm_dtype_t dt,
                                   hcomm_op_t op, bool push, unsigned char *tmp) {
    size_t off, len;
    hcomm__block(count, x->c->size, x->c->rank, &off, &len);
    return hcomm__pr_reduce_range(x, all, send, (char *)recv + off * hcomm__dtype_size(dt), off,
                                  len, dt, op,
                                  count * hcomm__dtype_size(dt) >= HCOMM__STREAM_MIN_BYTES,
                                  push ? HCOMM__PR_PUSH_ALL : HCOMM__PR_PUSH_NONE, tmp);
}

/* bytes at byte offset off of peer q's buffer r, into dst: read straight there, or streamed
 * (from r's view, or a piece at a time through scratch that stays in cache). */
static hcomm_result_t read_streamed(const hcomm__xfer_t *x, int q, const hcomm__remote_t *r,
                                    size_t off, void *dst, size_t bytes, unsigned char *tmp) {
    if (!tmp)
        return hcomm__x_peer_copy(x, q, r, off, dst, bytes);
    for (size_t done = 0; done < bytes; done += HCOMM__PR_PIECE_BYTES) {
        size_t n = bytes - done < HCOMM__PR_PIECE_BYTES ? bytes - done : HCOMM__PR_PIECE_BYTES;
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
    unsigned char *tmp =
        count * es >= HCOMM__STREAM_MIN_BYTES ? malloc(HCOMM__PR_PIECE_BYTES) : NULL;
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
    HCOMM__TRY(hcomm__pr_room(x, true, &all, &tmp));
    size_t bytes = count * hcomm__dtype_size(dt);
    hcomm_result_t res = hcomm__x_addrs_all(x, send, bytes, recv, bytes, all);
    bool push = res == HCOMM_OK && can_push(x, all);
    if (res == HCOMM_OK)
        res = hcomm__x_tell_peers(x, reduce_block(x, all, send, recv, count, dt, op, push, tmp));
    if (res == HCOMM_OK && !push)
        res = hcomm__x_barrier_all(x);
    if (res == HCOMM_OK && !push)
        res = hcomm__x_tell_peers(x, gather_blocks(x, all, recv, count, dt));
    if (res == HCOMM_OK)
        res = hcomm__x_release_all(x);
    free(tmp);
    free(all);
    return res;
}
