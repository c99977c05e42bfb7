/* all_to_allv through the board: one meeting agrees, checks and carries small blocks (see
 * a2a.h). */
#include "algo/a2a.h"

#include "algo/select.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* --- shm: one meeting on the board agrees, checks every pair and carries small blocks --- */

/* How a rank's blocks move: in its post, read by its peers where they lie, or (when some rank
 * can do neither well) by the backend's own call for everyone. */
enum { BY_POST, BY_READ, BY_NATIVE };

/* What a rank posts: this header, then its send counts, the offsets its blocks have (posted:
 * packed after the arrays, back to back in peer order; else its sdispls in its exported send
 * buffer) and its recv counts, p of each, then the packed blocks. */
typedef struct board_hdr {
    hcomm__peer_buf_t send; /* the send buffer, where its blocks are read */
    uint64_t extent;        /* bytes of it the blocks span */
    uint8_t by, wide, pad[6];
} board_hdr_t;

typedef struct board_post {
    board_hdr_t h;
    uint64_t sc, sd; /* the block for this rank: bytes, offset */
    const char *at;  /* the post, during the meeting */
} board_post_t;

static size_t board_arrays(int p) {
    return sizeof(board_hdr_t) + 3 * sizeof(uint64_t) * (size_t)p;
}

/* How the board's all_to_allv moves each rank's blocks: in the post where they fit (8 KiB
 * with 2 processes, above which a block read where it lies wins), else read where they lie
 * (staggered, so several peers do not read one buffer at once), else the backend's call
 * (docs/tuning.md: a2a.board). */
static int board_by(const hcomm__xfer_t *x, size_t total) {
    hcomm_comm_t *c = x->c;
    int p = c->size;
    if (total <= (p == 2 ? (size_t)8 << 10 : HCOMM__BOARD_ROOM - board_arrays(p)))
        return BY_POST;
    return hcomm__peer_reads(c) ? BY_READ : BY_NATIVE;
}

/* This rank's post into space (HCOMM__BOARD_ROOM bytes). */
static void board_fill(const hcomm__xfer_t *x, const hcomm__a2a_t *v, void *space) {
    int p = x->c->size, me = x->c->rank;
    size_t total = 0, extent = 0, at = 0;
    for (int q = 0; q < p; q++) {
        total += q != me ? v->scounts[q] : 0; /* the own block is copied locally */
        if (v->scounts[q] && v->sdispls[q] + v->scounts[q] > extent)
            extent = v->sdispls[q] + v->scounts[q];
    }
    board_hdr_t *h = space;
    *h = (board_hdr_t){.extent = extent, .wide = hcomm__a2a_wide(v, p)};
    hcomm__x_export(x, v->send, extent, &h->send);
    h->by = (uint8_t)board_by(x, total);
    uint64_t *sc = (uint64_t *)(h + 1), *sd = sc + p, *rc = sd + p;
    char *data = (char *)(rc + p);
    for (int q = 0; q < p; q++) {
        sc[q] = v->scounts[q];
        rc[q] = v->rcounts[q];
        sd[q] = h->by == BY_POST && q != me ? at : v->sdispls[q];
        if (h->by != BY_POST || q == me)
            continue;
        if (v->scounts[q])
            memcpy(data + at, v->send + v->sdispls[q], v->scounts[q]);
        at += v->scounts[q];
    }
}

/* Every pair's counts from the posts: every rank finds the same lowest (receiver, sender);
 * else each rank keeps what it needs of each post (its block's size and offset). */
static hcomm_result_t board_read_posts(const hcomm__xfer_t *x, board_post_t *posts) {
    hcomm_comm_t *c = x->c;
    int p = c->size, me = c->rank;
    for (int q = 0; q < p; q++) {
        const void *at;
        hcomm__board_peer(c, q, NULL, &at);
        posts[q].at = at;
    }
    for (int r = 0; r < p; r++) { /* receiver */
        const uint64_t *rc = (const uint64_t *)((const board_hdr_t *)posts[r].at + 1) + 2 * p;
        for (int q = 0; q < p; q++) { /* sender */
            const uint64_t *sc = (const uint64_t *)((const board_hdr_t *)posts[q].at + 1);
            if (sc[r] != rc[q]) {
                hcomm__a2a_bad_t b = {true, r, q, (size_t)sc[r], (size_t)rc[q]};
                return hcomm__a2a_verdict_as(x, &b, "no data was moved");
            }
        }
    }
    for (int q = 0; q < p; q++) {
        const board_hdr_t *h = (const board_hdr_t *)posts[q].at;
        const uint64_t *sc = (const uint64_t *)(h + 1);
        posts[q].h = *h;
        posts[q].sc = sc[me];
        posts[q].sd = sc[p + me];
    }
    return HCOMM_OK;
}

/* The blocks this rank gets from the posts (during the meeting), and its own. */
static void board_copy_posted(const hcomm__xfer_t *x, const hcomm__a2a_t *v,
                              const board_post_t *posts) {
    int p = x->c->size, me = x->c->rank;
    for (int q = 0; q < p; q++)
        if (q != me && posts[q].h.by == BY_POST && posts[q].sc)
            memcpy(v->recv + v->rdispls[q], posts[q].at + board_arrays(p) + posts[q].sd,
                   posts[q].sc);
    if (v->scounts[me])
        memmove(v->recv + v->rdispls[me], v->send + v->sdispls[me], v->scounts[me]);
}

/* The blocks of the senders that did not post them, read where they lie. */
static hcomm_result_t board_reads(const hcomm__xfer_t *x, const hcomm__a2a_t *v,
                                  const board_post_t *posts) {
    int p = x->c->size;
    for (int d = 1; d < p; d++) {
        int q = (x->c->rank + d) % p; /* staggered: the ranks do not all read rank 0 first */
        if (posts[q].h.by != BY_READ || posts[q].sc == 0)
            continue;
        hcomm__remote_t from = hcomm__x_remote(x, q, &posts[q].h.send, posts[q].h.extent);
        HCOMM__TRY(
            hcomm__x_peer_copy(x, q, &from, posts[q].sd, v->recv + v->rdispls[q], posts[q].sc));
    }
    return HCOMM_OK;
}

/* The posts' verdict on how the call goes on: BY_NATIVE when any rank asked for it, else
 * BY_READ when any rank's blocks are to be read, else BY_POST. */
static int board_plan(const board_post_t *posts, int p, bool *wide) {
    int plan = BY_POST;
    *wide = false;
    for (int q = 0; q < p; q++) {
        plan = posts[q].h.by > plan ? posts[q].h.by : plan;
        *wide |= posts[q].h.wide != 0;
    }
    return plan;
}

hcomm_result_t hcomm__a2a_shm(const hcomm__xfer_t *x, const hcomm__a2a_t *v, int *fallback) {
    hcomm_comm_t *c = x->c;
    int p = c->size, plan = BY_POST;
    *fallback = -1;
    if (board_arrays(p) > HCOMM__BOARD_ROOM)
        return hcomm__err(HCOMM_ERR_UNSUPPORTED, c->call_fn,
                          "shm all_to_allv takes at most %d ranks",
                          (int)((HCOMM__BOARD_ROOM - sizeof(board_hdr_t)) / 24));
    _Alignas(16) board_post_t stack[16];
    board_post_t *posts = p <= 16 ? stack : malloc(sizeof *posts * (size_t)p);
    void *space = NULL;
    hcomm_result_t res =
        posts ? hcomm__board_space(c, (uint32_t)x->tag, HCOMM__BOARD_ROOM, &space)
              : hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for %d posts", p);
    if (res != HCOMM_OK) { /* the peers wait in the meeting: they fail with this instead */
        if (posts != stack)
            free(posts);
        return hcomm__x_tell_peers(x, res);
    }
    board_fill(x, v, space);
    res = x->meet(x, 0, -1, -1);
    if (res == HCOMM_OK) {
        res = board_read_posts(x, posts);
        bool wide = false;
        plan = res == HCOMM_OK ? board_plan(posts, p, &wide) : BY_POST;
        if (plan == BY_NATIVE) /* counts beyond an int: MPI's call cannot take them */
            *fallback = wide ? HCOMM__ALGO_PAIRWISE : HCOMM__ALGO_NATIVE;
        else if (res == HCOMM_OK)
            board_copy_posted(x, v, posts);
        hcomm__board_leave(c);
    }
    if (res == HCOMM_OK && plan == BY_READ) { /* a last meeting lets the senders return */
        hcomm_result_t got = board_reads(x, v, posts);
        if (got != HCOMM_OK)
            res = hcomm__x_tell_peers(x, got);
        else if ((res = x->meet(x, 1, -1, -1)) == HCOMM_OK)
            hcomm__board_leave(c);
    }
    if (posts != stack)
        free(posts);
    return res;
}
