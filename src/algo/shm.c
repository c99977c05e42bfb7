/* shm: collectives through the board (p2p.h), for ranks on one node. Each step every rank
 * copies its part into its own region, meets its peers there (the meeting checks the call's
 * signature, so no agreement runs first), and reads what it needs of theirs: two copies per
 * byte and one meeting per HCOMM__BOARD_ROOM bytes, where the backend's small collectives take
 * log2 p message round trips. Reductions combine every rank's input in rank order in one pass
 * (hcomm__reduce_many: f16/bf16 accumulate in f32 and round once, AVG divides before rounding),
 * so every rank gets the serial reduction's bits. The scheme is Open MPI's coll/sm and the
 * local transport's posted slots, with the payload copied in since processes cannot load each
 * other's private buffers. */
#include "algo/algos.h"

#include <string.h>

enum { MAX_SRCS = 256 };

/* Every rank's payload of the current meeting. */
static void payloads(hcomm_comm_t *c, const void **srcs) {
    for (int r = 0; r < c->size; r++)
        hcomm__board_peer(c, r, NULL, &srcs[r]);
}

/* One step: this rank's n bytes at src (may be NULL with n 0) go to the board, and the ranks
 * meet (from, to: whose payload is read and by whom, -1 every rank; xfer.meet); read the
 * payloads, then leave. */
static hcomm_result_t post_step(const hcomm__xfer_t *x, uint32_t step, const void *src, size_t n,
                                int from, int to) {
    void *space;
    HCOMM__TRY(hcomm__board_space(x->c, (uint32_t)x->tag, n, &space));
    if (n)
        memcpy(space, src, n);
    return x->meet(x, step, from, to);
}

/* [lo, hi) of the whole vector meets the piece [done, done + n) in [*a, *b) (empty: a >= b). */
static void overlap(size_t lo, size_t hi, size_t done, size_t n, size_t *a, size_t *b) {
    *a = lo > done ? lo : done;
    *b = hi < done + n ? hi : done + n;
}

/* Every rank posts its input of total elements a piece at a time; the reader `to` (-1: every
 * rank) reduces the part of [lo, hi) each piece holds into recv, which starts at element lo. */
static hcomm_result_t reduce_window(const hcomm__xfer_t *x, const void *send, size_t total,
                                    void *recv, size_t lo, size_t hi, hcomm_dtype_t dt,
                                    hcomm_op_t op, int to) {
    hcomm_comm_t *c = x->c;
    bool reads = to < 0 || to == c->rank;
    const void *srcs[MAX_SRCS];
    size_t es = hcomm__dtype_size(dt), piece = HCOMM__BOARD_ROOM / es, done = 0, a, b;
    uint32_t step = 0;
    do {
        size_t n = total - done < piece ? total - done : piece;
        HCOMM__TRY(post_step(x, step++, (const char *)send + done * es, n * es, -1, to));
        overlap(lo, hi, done, n, &a, &b);
        if (reads && a < b) {
            payloads(c, srcs);
            hcomm__reduce_many((char *)recv + (a - lo) * es, srcs, c->size, a - done, b - a, dt,
                               op);
        }
        hcomm__board_leave(c);
        done += n;
    } while (done < total);
    return HCOMM_OK;
}

/* The root posts total bytes at src a piece at a time; every other rank copies the part of
 * [lo, hi) each piece holds to dst, which starts at byte lo. Meetings from `step` on. */
static hcomm_result_t from_root(const hcomm__xfer_t *x, const void *src, size_t total, void *dst,
                                size_t lo, size_t hi, int root, uint32_t step) {
    hcomm_comm_t *c = x->c;
    bool mine = c->rank == root;
    size_t done = 0, a, b;
    do {
        size_t n = total - done < HCOMM__BOARD_ROOM ? total - done : HCOMM__BOARD_ROOM;
        HCOMM__TRY(post_step(x, step++, mine ? (const char *)src + done : NULL, mine ? n : 0, root,
                             -1)); /* src may be NULL off the root */
        overlap(lo, hi, done, n, &a, &b);
        if (!mine && a < b) {
            const void *theirs;
            hcomm__board_peer(c, root, NULL, &theirs);
            memcpy((char *)dst + (a - lo), (const char *)theirs + (a - done), b - a);
        }
        hcomm__board_leave(c);
        done += n;
    } while (done < total);
    return HCOMM_OK;
}

/* Every rank posts its block a piece at a time (as many meetings as the largest block needs;
 * block r is each[r] bytes, or equal where each is NULL, and blocks lie back to back in rank
 * order in recv); root copies every other rank's into recv (-1: every rank does; a root posts
 * nothing). send may be NULL where this rank's block is empty. */
static hcomm_result_t to_readers(const hcomm__xfer_t *x, const void *send, void *recv,
                                 const size_t *each, size_t equal, int root) {
    hcomm_comm_t *c = x->c;
    const void *srcs[MAX_SRCS];
    bool reads = root < 0 || c->rank == root;
    size_t most = 0, done = 0, mine = each ? each[c->rank] : equal;
    for (int r = 0; each && r < c->size; r++)
        most = each[r] > most ? each[r] : most;
    most = each ? most : equal;
    uint32_t step = 0;
    do {
        size_t left = mine > done && c->rank != root ? mine - done : 0, off = 0;
        HCOMM__TRY(post_step(x, step++, left ? (const char *)send + done : NULL,
                             left < HCOMM__BOARD_ROOM ? left : HCOMM__BOARD_ROOM, -1, root));
        if (reads)
            payloads(c, srcs);
        for (int r = 0; reads && r < c->size; r++) {
            size_t size = each ? each[r] : equal, n = size > done ? size - done : 0;
            if (r != c->rank && n)
                memcpy((char *)recv + off + done, srcs[r],
                       n < HCOMM__BOARD_ROOM ? n : HCOMM__BOARD_ROOM);
            off += size;
        }
        hcomm__board_leave(c);
        done += HCOMM__BOARD_ROOM;
    } while (done < most);
    return HCOMM_OK;
}

hcomm_result_t hcomm__ar_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                             hcomm_dtype_t dt, hcomm_op_t op) {
    return reduce_window(x, send, count, recv, 0, count, dt, op, -1);
}

/* reduce_scatter: every rank posts its whole input, and reduces its own block. */
hcomm_result_t hcomm__rs_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                             hcomm_dtype_t dt, hcomm_op_t op) {
    size_t lo = count * (size_t)x->c->rank;
    return reduce_window(x, send, count * (size_t)x->c->size, recv, lo, lo + count, dt, op, -1);
}

hcomm_result_t hcomm__reduce_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root) {
    return reduce_window(x, send, count, recv, 0, count, dt, op, root);
}

/* all_gather of bytes per rank; in place when send is this rank's block of recv. */
hcomm_result_t hcomm__ag_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t bytes) {
    char *mine = (char *)recv + (size_t)x->c->rank * bytes;
    HCOMM__TRY(to_readers(x, send, recv, NULL, bytes, -1));
    if (mine != send && bytes)
        memcpy(mine, send, bytes);
    return HCOMM_OK;
}

/* reduce_scatterv: every rank posts its whole input (the sum of counts) and reduces its own
 * block. In place (recv at send or at this rank's block of it) each piece is on the board
 * before anything at or above its start is written. */
hcomm_result_t hcomm__rsv_shm(const hcomm__xfer_t *x, const void *send, void *recv,
                              const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op) {
    size_t lo = 0, total = 0;
    for (int r = 0; r < x->c->size; r++) {
        lo += r < x->c->rank ? counts[r] : 0;
        total += counts[r];
    }
    return reduce_window(x, send, total, recv, lo, lo + counts[x->c->rank], dt, op, -1);
}

/* all_gatherv of bytes[r] from rank r, blocks back to back in rank order: every rank posts
 * its block a piece at a time (as many meetings as the largest block needs) and copies the
 * others'. In place when send is this rank's block of recv. */
hcomm_result_t hcomm__agv_shm(const hcomm__xfer_t *x, const void *send, void *recv,
                              const size_t *bytes) {
    size_t mine = 0;
    for (int r = 0; r < x->c->rank; r++)
        mine += bytes[r];
    HCOMM__TRY(to_readers(x, send, recv, bytes, 0, -1));
    if ((char *)recv + mine != send && bytes[x->c->rank])
        memcpy((char *)recv + mine, send, bytes[x->c->rank]);
    return HCOMM_OK;
}

/* gather of bytes per rank to root (its own block is the caller's copy). */
hcomm_result_t hcomm__gather_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t bytes,
                                 int root) {
    return to_readers(x, send, recv, NULL, bytes, root);
}

/* scatter of bytes per rank from root: each rank copies its block of the root's buffer (the
 * root's own block is the caller's copy). */
hcomm_result_t hcomm__scatter_shm(const hcomm__xfer_t *x, const void *send, void *recv,
                                  size_t bytes, int root) {
    size_t lo = bytes * (size_t)x->c->rank;
    return from_root(x, send, bytes * (size_t)x->c->size, recv, lo, lo + bytes, root, 0);
}

hcomm_result_t hcomm__bc_shm(const hcomm__xfer_t *x, void *buf, size_t bytes, int root) {
    return from_root(x, buf, bytes, buf, 0, bytes, root, 0);
}

/* The buffer descriptor rank r posted in the current meeting (a direct call's first). */
static hcomm__peer_buf_t posted_buf(hcomm_comm_t *c, int r) {
    const void *theirs;
    hcomm__peer_buf_t at;
    hcomm__board_peer(c, r, NULL, &theirs);
    memcpy(&at, theirs, sizeof at);
    return at;
}

/* A direct call's closing meeting (from, to as xfer.meet), which lets the ranks whose buffers
 * were read return; a rank whose copy failed (res) tells its peers instead, since they must not
 * wait for its post. */
static hcomm_result_t close_direct(const hcomm__xfer_t *x, hcomm_result_t res, int from, int to) {
    if (res != HCOMM_OK)
        return hcomm__x_tell_peers(x, res);
    HCOMM__TRY(x->meet(x, 1, from, to));
    hcomm__board_leave(x->c);
    return HCOMM_OK;
}

/* broadcast direct on a board: the first meeting carries where the root's buffer lies. Where
 * that is shared memory (hcomm_mem_alloc) every rank copies it once through its view and a
 * second meeting lets the root return; a private buffer is read with cross-memory attach by
 * one peer, while several peers' reads of it (serialised on the root's pages at a third of
 * memcpy's speed) lose to the board's two copies, so it goes through the board as shm does.
 * Every rank decides from the root's post, so alike. */
hcomm_result_t hcomm__bc_board_direct(const hcomm__xfer_t *x, void *buf, size_t bytes, int root) {
    hcomm_comm_t *c = x->c;
    hcomm__peer_buf_t at = {0};
    if (c->rank == root)
        hcomm__x_export(x, buf, bytes, &at);
    HCOMM__TRY(post_step(x, 0, &at, sizeof at, root, -1));
    at = posted_buf(c, root);
    hcomm__board_leave(c);
    if (at.obj == 0 && c->size > 2)
        return from_root(x, buf, bytes, buf, 0, bytes, root, 1);
    hcomm_result_t res = HCOMM_OK;
    if (c->rank != root && bytes) {
        hcomm__remote_t from = hcomm__x_remote(x, root, &at, bytes);
        res = hcomm__x_peer_copy(x, root, &from, 0, buf, bytes);
    }
    return close_direct(x, res, -1, root);
}

/* A scatter's private root buffer among more than two ranks, whose simultaneous cross-memory
 * reads of it crawl (as broadcast's, above): the backend's own scatter, which led the board's
 * pieces (docs/tuning.md: shm.scatter-private), or those pieces where it has none. The call was
 * checked in the meeting before. */
static hcomm_result_t scatter_private(const hcomm__xfer_t *x, const void *send, void *recv,
                                      size_t bytes, int root) {
    hcomm_comm_t *c = x->c;
    if (c->tr->native && c->tr->native->scatter)
        return c->tr->native->scatter(c, send, recv, bytes, root);
    size_t lo = bytes * (size_t)c->rank;
    return from_root(x, send, bytes * (size_t)c->size, recv, lo, lo + bytes, root, 1);
}

/* gather and scatter direct on a board: the first meeting carries where the buffers that will
 * be read lie (every rank's input for a gather, the root's for a scatter), the readers copy
 * their blocks once (through the views on hcomm_mem_alloc buffers, else with cross-memory
 * attach), and a second meeting lets the ranks whose buffers were read return; every rank
 * decides from the posts, so alike. The root's own block is the caller's copy
 * (docs/tuning.md: shm.rooted-direct). */
static hcomm_result_t rooted_board_direct(const hcomm__xfer_t *x, bool gather, const void *send,
                                          void *recv, size_t bytes, int root) {
    hcomm_comm_t *c = x->c;
    int me = c->rank, p = c->size;
    hcomm__peer_buf_t at = {0};
    if (gather ? me != root : me == root)
        hcomm__x_export(x, send, gather ? bytes : bytes * (size_t)p, &at);
    HCOMM__TRY(post_step(x, 0, &at, sizeof at, gather ? -1 : root, gather ? root : -1));
    hcomm_result_t res = HCOMM_OK;
    for (int r = 0; gather && me == root && res == HCOMM_OK && r < p; r++) {
        if (r == root)
            continue;
        at = posted_buf(c, r);
        hcomm__remote_t from = hcomm__x_remote(x, r, &at, bytes);
        res = hcomm__x_peer_copy(x, r, &from, 0, (char *)recv + (size_t)r * bytes, bytes);
    }
    if (!gather)
        at = posted_buf(c, root);
    hcomm__board_leave(c);
    if (!gather && at.obj == 0 && p > 2)
        return scatter_private(x, send, recv, bytes, root);
    if (!gather && me != root && bytes) {
        hcomm__remote_t from = hcomm__x_remote(x, root, &at, bytes * (size_t)p);
        res = hcomm__x_peer_copy(x, root, &from, bytes * (size_t)me, recv, bytes);
    }
    return close_direct(x, res, gather ? root : -1, gather ? -1 : root);
}

hcomm_result_t hcomm__gather_board_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                          size_t bytes, int root) {
    return rooted_board_direct(x, true, send, recv, bytes, root);
}

hcomm_result_t hcomm__scatter_board_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                           size_t bytes, int root) {
    return rooted_board_direct(x, false, send, recv, bytes, root);
}

bool hcomm__shm_fits(const hcomm_comm_t *c) {
    return c->size <= MAX_SRCS;
}
