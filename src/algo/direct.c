/* The direct algorithms: one node, every rank reading (and where it may, writing) its peers'
 * buffers where they lie, so each byte is copied once; only buffer addresses and barriers
 * travel as messages (with the call's signature, on the transport's lane where it has one).
 *   reduce_scatter(v)  each rank reduces its block of every input in rank order (twoshot's
 *                      first half; the serial reduction's bits);
 *   all_gather(v)      each rank copies every other block from its owner's input (twoshot's
 *                      second half);
 *   reduce             the root reduces every input in rank order, or from a size on, each rank
 *                      its block, written into the root's output;
 *   broadcast          every rank reads the root's buffer.
 * Needs transport.peer_read_ok on every rank (the choice falls back elsewhere). */
#include "algo/algos.h"
#include "algo/peer_reduce.h"

#include <stdlib.h>
#include <string.h>

/* Block `mine` of reduce_scatter(v): every rank reads its block of every rank's input in rank
 * order and reduces it (the serial reduction's bits). In place, the result's place is the input's
 * start, which the ranks whose blocks lie there read until the barrier: a rank whose block starts
 * elsewhere reduces into the communicator's scratch first, kept between calls (docs/tuning.md:
 * direct.rs-in-place). `len` elements at element offset `off`, of `total` per input. */
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
    HCOMM__TRY(hcomm__pr_room(x, true, &all, &tmp));
    hcomm_result_t res = hcomm__x_addrs_all(x, send, total * es, recv, bytes, all);
    if (res == HCOMM_OK)
        res = hcomm__x_tell_peers(x, hcomm__pr_reduce_range(x, all, send, out, off, len, dt, op,
                                                            false, HCOMM__PR_PUSH_NONE, tmp));
    if (res == HCOMM_OK)
        res = hcomm__x_release_all(x);
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
    hcomm_result_t res = hcomm__x_addrs_all(x, send, own, recv, off[p], all), got = HCOMM_OK;
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
        res = hcomm__x_release_all(x);
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

/* reduce to root by reads. Below hcomm__reduce_split_bytes the root reduces every rank's input
 * in rank order straight from the peers' buffers (one read per byte and input). From there (and
 * for f16/bf16 sums at every size, whose widening makes the root's work alone the larger) the
 * work is split like twoshot's first half: rank q reduces block q of every input in rank order
 * and writes it into the root's output at its place (push), so each rank reads and reduces 1/p
 * of the data; above it the root's working set leaves its cache (docs/tuning.md:
 * direct.reduce-split). Both give the serial reduction's bits, in place too: only block q's owner
 * reads block q of any input, the root's included. A barrier keeps every buffer alive until the
 * last piece is read or written. Where the root's output cannot be written (no such transport
 * today), the root reads everything. A root whose reads fail (a peer's buffer shorter than the
 * call says) leaves at once and its peers fail at the barrier, but one of them may still be
 * writing its block into the root's output then, as twoshot's pushes may. */
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
         stream = bytes >= HCOMM__STREAM_MIN_BYTES;
    hcomm__buf_pair_t *all;
    unsigned char *tmp;
    HCOMM__TRY(hcomm__pr_room(x, split || me == root, &all, &tmp));
    hcomm_result_t res =
        hcomm__x_addrs_all(x, send, bytes, me == root ? recv : NULL, split ? bytes : 0, all);
    if (split)
        hcomm__block(count, p, me, &off, &len);
    void *out = me == root ? (char *)recv + off * es : NULL;
    if (res == HCOMM_OK && (split || me == root))
        res = hcomm__x_tell_peers(
            x, hcomm__pr_reduce_range(x, all, send, out, off, len, dt, op, stream,
                                      me == root ? HCOMM__PR_PUSH_NONE : root, tmp));
    if (res == HCOMM_OK)
        res = hcomm__x_release_all(x);
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
        res = hcomm__x_release_all(x);
    return res;
}
