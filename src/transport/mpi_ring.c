/* The mpi transport's frame rings (mpi_base.h): between the members of a comm that share one
 * node, frames travel through shared memory instead of MPI, as Open MPI's vader BTL moves its
 * own eager messages, without MPI's matching and requests on the way.
 *
 * Each member's board region holds, past the board (HCOMM__BOARD_BYTES), one line per peer
 * with the bytes it has written into its ring to that peer and the frames it has sent that peer
 * through MPI instead (head, spilled), one line per peer with the bytes it has consumed of that
 * peer's ring and the frames from it taken off MPI (tail, taken), then its ring to each peer.
 * Single writer, single reader: a release store of a count publishes everything before it.
 * Peers' regions are mapped read-only.
 *
 * A frame that finds its ring full goes through MPI (its sender may make no further call on
 * the comm, and the frame must still arrive), and so do the sender's next frames to that peer
 * until the peer has taken all of them: frames of one sender then stay in order, because the
 * ring holds only frames older than any it sent through MPI and not yet taken, and the
 * receiver empties a sender's ring before it takes that sender's next frame from MPI. */
#include "transport/mpi_base.h"

#include <stdlib.h>
#include <string.h>

#define LINE 64

/* A record: its length and whether it only skips to the ring's start, then the frame. */
typedef struct rec {
    uint32_t len;
    uint32_t skip;
} rec_t;

/* One line of counts: bytes through the ring, frames through MPI. */
typedef struct counts {
    _Atomic uint64_t bytes;
    _Atomic uint64_t frames;
} counts_t;

/* What this rank keeps of one peer: the peer's ring area, and counts of the rings both ways. */
typedef struct peer {
    unsigned char *area; /* the peer's ring area (this rank's own is writable) */
    uint64_t head;       /* bytes written into this rank's ring to the peer */
    uint64_t seen;       /* the peer's tail of that ring, as last read */
    uint64_t spilled;    /* frames sent to the peer through MPI */
    uint64_t caught;     /* of those, the most the peer was seen to have taken */
    uint64_t tail;       /* bytes consumed of the peer's ring to this rank */
    uint64_t taken;      /* frames from the peer taken off MPI */
} peer_t;

struct mpi_ring {
    int size, rank, next_src;
    bool sends;      /* every frame of this rank fits a ring: they travel through them */
    bool spill_seen; /* the last look found a peer's frame waiting in MPI */
    unsigned polls;  /* counts polls, to test the frame receives through MPI now and then */
    peer_t peer[];   /* [size] */
};

static size_t align_line(size_t n) {
    return (n + LINE - 1) / LINE * LINE;
}

size_t hcomm__mpi_ring_bytes(int size) {
    if (size < 2 || size > HCOMM__RING_MAX_RANKS)
        return 0;
    return 2 * (size_t)size * LINE + (size_t)size * HCOMM__RING_BYTES;
}

/* The sender's line for its ring from -> to. */
static counts_t *head_line(const mpi_ring_t *g, int from, int to) {
    return (counts_t *)(void *)(g->peer[from].area + (size_t)to * LINE);
}

/* The receiver's line for the ring from -> to. */
static counts_t *tail_line(const mpi_ring_t *g, int from, int to) {
    return (counts_t *)(void *)(g->peer[to].area + ((size_t)g->size + (size_t)from) * LINE);
}

static unsigned char *ring_of(const mpi_ring_t *g, int from, int to) {
    return g->peer[from].area + 2 * (size_t)g->size * LINE + (size_t)to * HCOMM__RING_BYTES;
}

void hcomm__mpi_ring_free(mpi_impl_t *m) {
    free(m->ring);
    m->ring = NULL;
}

hcomm_result_t hcomm__mpi_ring_init(const char *fn, hcomm_comm_t *c, size_t largest_frame) {
    mpi_impl_t *m = impl_of(c);
    if (!m->board || hcomm__mpi_ring_bytes(c->size) == 0)
        return HCOMM_OK;
    mpi_ring_t *g = calloc(1, sizeof *g + (size_t)c->size * sizeof(peer_t));
    if (!g)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for frame rings of %d ranks",
                          c->size);
    g->size = c->size;
    g->rank = c->rank;
    g->sends = sizeof(rec_t) + largest_frame <= HCOMM__RING_BYTES / 2;
    for (int r = 0; r < c->size; r++)
        g->peer[r].area = (unsigned char *)m->board[r] + HCOMM__BOARD_BYTES;
    m->ring = g;
    return HCOMM_OK;
}

/* Room for total bytes in the ring to peer (its tail read again only when the copy says no). */
static bool has_room(mpi_ring_t *g, int peer, size_t total) {
    uint64_t h = g->peer[peer].head;
    if (h + total - g->peer[peer].seen <= HCOMM__RING_BYTES)
        return true;
    g->peer[peer].seen =
        atomic_load_explicit(&tail_line(g, g->rank, peer)->bytes, memory_order_acquire);
    return h + total - g->peer[peer].seen <= HCOMM__RING_BYTES;
}

/* Whether peer has taken every frame this rank sent it through MPI. */
static bool caught_up(mpi_ring_t *g, int peer) {
    if (g->peer[peer].caught == g->peer[peer].spilled)
        return true;
    g->peer[peer].caught =
        atomic_load_explicit(&tail_line(g, g->rank, peer)->frames, memory_order_acquire);
    return g->peer[peer].caught == g->peer[peer].spilled;
}

bool hcomm__mpi_ring_put(mpi_impl_t *m, int peer, const void *const *part, const size_t *part_len,
                         int n) {
    mpi_ring_t *g = m->ring;
    if (!g || !g->sends)
        return false;
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += part_len[i];
    size_t need = align_line(sizeof(rec_t) + len);
    uint64_t h = g->peer[peer].head;
    size_t at = (size_t)(h % HCOMM__RING_BYTES), to_end = HCOMM__RING_BYTES - at;
    if (!has_room(g, peer, need + (to_end < need ? to_end : 0)) || !caught_up(g, peer))
        return false;
    unsigned char *ring = ring_of(g, g->rank, peer);
    if (to_end < need) { /* records never wrap: skip to the start */
        memcpy(ring + at, &(rec_t){0, 1}, sizeof(rec_t));
        h += to_end;
        at = 0;
    }
    memcpy(ring + at, &(rec_t){(uint32_t)len, 0}, sizeof(rec_t));
    unsigned char *dst = ring + at + sizeof(rec_t);
    for (int i = 0; i < n; i++) {
        if (part_len[i])
            memcpy(dst, part[i], part_len[i]);
        dst += part_len[i];
    }
    g->peer[peer].head = h + need;
    atomic_store_explicit(&head_line(g, g->rank, peer)->bytes, h + need, memory_order_release);
    return true;
}

void hcomm__mpi_ring_spill(mpi_impl_t *m, int peer) {
    mpi_ring_t *g = m->ring;
    if (!g || !g->sends)
        return;
    g->peer[peer].spilled++;
    atomic_store_explicit(&head_line(g, g->rank, peer)->frames, g->peer[peer].spilled,
                          memory_order_release);
}

/* The next record from src, past a skip; NULL when its ring is empty. Notes whether src has
 * frames waiting in MPI. */
static const rec_t *next_record(mpi_ring_t *g, int src) {
    const counts_t *line = head_line(g, src, g->rank);
    uint64_t h = atomic_load_explicit(&line->bytes, memory_order_acquire);
    if (atomic_load_explicit(&line->frames, memory_order_relaxed) != g->peer[src].taken)
        g->spill_seen = true;
    uint64_t t = g->peer[src].tail;
    if (h == t)
        return NULL;
    const unsigned char *ring = ring_of(g, src, g->rank);
    const rec_t *r = (const rec_t *)(const void *)(ring + t % HCOMM__RING_BYTES);
    if (!r->skip)
        return r;
    t += HCOMM__RING_BYTES - t % HCOMM__RING_BYTES;
    g->peer[src].tail = t;
    atomic_store_explicit(&tail_line(g, src, g->rank)->bytes, t, memory_order_release);
    return h == t ? NULL : (const rec_t *)(const void *)ring;
}

const void *hcomm__mpi_ring_peek(mpi_impl_t *m, int *src, size_t *len) {
    mpi_ring_t *g = m->ring;
    if (!g)
        return NULL;
    g->spill_seen = false;
    for (int k = 0; k < g->size; k++) {
        int s = (g->next_src + k) % g->size;
        const rec_t *r = next_record(g, s); /* this rank's own too: sends to itself */
        if (r) {
            g->next_src = (s + 1) % g->size; /* the next poll looks at the others first */
            *src = s;
            *len = r->len;
            return r + 1;
        }
    }
    return NULL;
}

bool hcomm__mpi_ring_holds(mpi_impl_t *m, int src) {
    mpi_ring_t *g = m->ring;
    return g && next_record(g, src) != NULL;
}

void hcomm__mpi_ring_consume(mpi_impl_t *m, int src, size_t len) {
    mpi_ring_t *g = m->ring;
    g->peer[src].tail += align_line(sizeof(rec_t) + len);
    atomic_store_explicit(&tail_line(g, src, g->rank)->bytes, g->peer[src].tail,
                          memory_order_release);
}

void hcomm__mpi_ring_took(mpi_impl_t *m, int src) {
    mpi_ring_t *g = m->ring;
    if (!g)
        return;
    g->peer[src].taken++;
    atomic_store_explicit(&tail_line(g, src, g->rank)->frames, g->peer[src].taken,
                          memory_order_release);
}

bool hcomm__mpi_ring_skip_mpi(mpi_impl_t *m) {
    mpi_ring_t *g = m->ring;
    return g && !g->spill_seen && (++g->polls & 15) != 0;
}
