/* The local transport: every rank is a thread of this process and peers share memory.
 *
 * Frames travel through one single-producer single-consumer ring per (sender, receiver) pair
 * of a communicator, allocated by the sender on first use. The sender publishes a slot with a
 * release store of the ring's tail; the receiver reads it after an acquire load and frees the
 * slot with a release store of the head: no mutex on the path. An eager payload of up to
 * INLINE_BYTES rides in the slot, a larger one in a heap copy; a rendezvous frame carries the
 * sender's buffer address, the receiver copies straight from it (one copy) and sets the
 * sender's done flag. When a ring is full the sender keeps the frame in its own overflow list
 * and pushes it on a later progress call, so a send never blocks in the transport.
 *
 * Native collectives post buffer pointers and the call's signature in per-rank slots, meet at
 * a barrier (an atomic counter and generation), check the signatures, and then read each
 * other's buffers directly. Reductions are done chunk by chunk, each chunk by one rank in rank
 * order 0..n-1, so every rank gets bit-identical results equal to a serial left-to-right
 * reduction. Every wait checks the world's abort flag, the comm's hcomm_comm_abort() flag and
 * its timeout, so a failed or missing rank turns into an error instead of a hang. */
#include "transport/transport.h"

#include "core/topo_spec.h"

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

enum { RING_SLOTS = 64, INLINE_BYTES = 256, SMALL_REDUCE_BYTES = 256 };

typedef struct local_world {
    atomic_int aborted; /* set once any rank's function fails or a wait timed out */
} local_world_t;

typedef struct frame {
    unsigned char hdr[HCOMM__HDR_BYTES];
    size_t bytes;
    bool rndv;
    const void *src_buf; /* rendezvous: the sender's buffer */
    atomic_int *done;    /* rendezvous: the sender's completion flag */
    void *heap;          /* eager payload above INLINE_BYTES */
    double ready;        /* simulated inter-node link: not delivered before (hcomm__now), or 0 */
    unsigned char inl[INLINE_BYTES];
} frame_t;

typedef struct ring {
    _Alignas(64) atomic_size_t head; /* consumer */
    _Alignas(64) atomic_size_t tail; /* producer */
    frame_t slot[RING_SLOTS];
} ring_t;

typedef struct pending {
    struct pending *next;
    frame_t f;
} pending_t;

/* What one rank posts for a native collective; valid from its first barrier to its last. */
typedef struct local_slot {
    /* A line per rank: packed, 2 ranks' slots shared one, which both wrote on every call. */
    _Alignas(64) const void *send;
    void *aux;
    const size_t *counts, *displs, *rcounts;
    int color, key;
} local_slot_t;

/* What a rank posts with every call besides its slot: the call's signature and, for a small
 * all_reduce, its input itself. Two per rank, picked by the parity of the rank's post count:
 * a call that ends without a barrier (the small all_reduce) lets its rank post the next call
 * while slower peers still read this one; the one after can reuse this post only once every
 * peer posted the next, and so finished reading this one. */
typedef struct local_post {
    /* The post count it was written at, stored last (release): the small all_reduce waits on
     * its peers' seq instead of a barrier, and finds their signature and the first 16 bytes
     * of their input in the same cache line, where the barrier's counter, its generation, the
     * signature and the input took four transfers of a line in turn. */
    _Alignas(64) _Atomic unsigned seq;
    int32_t failed; /* as in hcomm__posted_sig_t */
    uint64_t words[5];
    _Alignas(16) unsigned char data[SMALL_REDUCE_BYTES];
    const char *failed_text;
} local_post_t;

_Static_assert(sizeof(((local_post_t *)0)->words) == sizeof(((hcomm__posted_sig_t *)0)->words),
               "a post holds the whole signature");
_Static_assert(offsetof(local_post_t, data) == 48, "a small input starts in the seq's line");

typedef struct local_shared {
    local_world_t *world;
    atomic_int aborted; /* a member's hcomm_comm_abort() reached a wait: the group is dead */
    int size;
    atomic_int refs;
    _Alignas(64) atomic_uint bar_count;
    _Alignas(64) atomic_uint bar_gen;
    local_slot_t *slots;      /* [size] */
    local_post_t *posts;      /* [2 * size]: rank r's of parity k at 2r + k */
    _Atomic(ring_t *) *rings; /* [size * size], sender-major; NULL until first use */
} local_shared_t;

/* One rank's view of a communicator. */
typedef struct local_comm {
    local_shared_t *sh;
    pending_t **ovf_head, **ovf_tail; /* [size] frames waiting for ring space, per receiver */
    int ovf_count;
    /* The reduced chunk of the shared-memory all_reduce / reduce_scatter, kept between calls
     * (grown to the largest, freed with the communicator): a fresh malloc per call above
     * glibc's mmap threshold page-faulted every 4 KiB of it, 1.5-4x the call at 32-128 MiB. */
    hcomm__scratch_t scratch;
    unsigned posts;              /* calls posted on this comm: the parity picks the local_post_t */
    hcomm__posted_sig_t views[]; /* [size]: the posts as local_posted_sig hands them out */
} local_comm_t;

typedef struct local_tx {
    atomic_int done;
} local_tx_t;

_Static_assert(sizeof(local_tx_t) <= sizeof(hcomm__treq_t), "local_tx_t fits a request");

static const hcomm__transport_t local_tr;

static local_comm_t *lc_of(hcomm_comm_t *c) {
    return (local_comm_t *)c->impl;
}

static local_shared_t *shared_of(hcomm_comm_t *c) {
    return lc_of(c)->sh;
}

static local_shared_t *shared_new(local_world_t *world, int size) {
    local_shared_t *sh = hcomm__calloc_lines(1, sizeof *sh);
    if (!sh)
        return NULL;
    sh->slots = hcomm__calloc_lines((size_t)size, sizeof *sh->slots);
    sh->posts = hcomm__calloc_lines(2 * (size_t)size, sizeof *sh->posts);
    sh->rings = calloc((size_t)size * (size_t)size, sizeof *sh->rings);
    if (!sh->slots || !sh->posts || !sh->rings) {
        free(sh->slots);
        free(sh->posts);
        free((void *)sh->rings);
        free(sh);
        return NULL;
    }
    sh->world = world;
    atomic_init(&sh->aborted, 0);
    sh->size = size;
    atomic_init(&sh->refs, size);
    return sh;
}

/* Frees a ring's undelivered heap payloads (the comm is going away). */
static void ring_free(ring_t *r) {
    if (!r)
        return;
    for (size_t i = atomic_load(&r->head); i != atomic_load(&r->tail); i++)
        free(r->slot[i % RING_SLOTS].heap);
    free(r);
}

static void shared_release(local_shared_t *sh) {
    if (atomic_fetch_sub(&sh->refs, 1) != 1)
        return;
    for (int i = 0; i < sh->size * sh->size; i++)
        ring_free(atomic_load(&sh->rings[i]));
    free(sh->slots);
    free(sh->posts);
    free((void *)sh->rings);
    free(sh);
}

static local_comm_t *lc_new(local_shared_t *sh, int size) {
    local_comm_t *lc = hcomm__calloc_lines(1, sizeof *lc + (size_t)size * sizeof lc->views[0]);
    if (!lc)
        return NULL;
    lc->sh = sh;
    lc->ovf_head = calloc((size_t)size, sizeof *lc->ovf_head);
    lc->ovf_tail = calloc((size_t)size, sizeof *lc->ovf_tail);
    if (!lc->ovf_head || !lc->ovf_tail) {
        free(lc->ovf_head);
        free(lc->ovf_tail);
        free(lc);
        return NULL;
    }
    return lc;
}

/* --- waiting --- */

/* Why a wait must end now, or HCOMM_OK to keep waiting. what names the awaited event. Runs the
 * layers' idle progress first (comm.idle). */
static hcomm_result_t wait_verdict(hcomm_comm_t *c, double waited, const char *what) {
    if (c->idle)
        c->idle(c);
    if (atomic_load_explicit(&shared_of(c)->world->aborted, memory_order_relaxed))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "another rank failed or timed out while this rank waited for %s", what);
    if (atomic_load_explicit(&c->aborted, memory_order_relaxed)) {
        /* Its arrival may stay counted in a barrier: no member may rely on the group now. */
        atomic_store(&shared_of(c)->aborted, 1);
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "hcomm_comm_abort() was called on this communicator");
    }
    if (atomic_load_explicit(&shared_of(c)->aborted, memory_order_relaxed))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "a member of this group called hcomm_comm_abort() while it waited for %s",
                          what);
    if (waited > c->timeout_s) {
        /* The ranks are out of step for good: stop every other wait in this world too. */
        atomic_store(&shared_of(c)->world->aborted, 1);
        return hcomm__err(HCOMM_ERR_TIMEOUT, c->call_fn,
                          "waited %g s for %s (seq %u, HCOMM_TIMEOUT); a rank did not make the "
                          "matching call",
                          c->timeout_s, what, (unsigned)c->call_seq);
    }
    return HCOMM_OK;
}

static void flush_overflow(hcomm_comm_t *c, int peer);

static hcomm_result_t wait_gen_change(hcomm_comm_t *c, atomic_uint *gen, unsigned seen) {
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    while (atomic_load_explicit(gen, memory_order_acquire) == seen) {
        /* Eager sends count as done once queued: frames still waiting for ring space must
         * move on while this rank waits here, or a peer that receives them never arrives. */
        for (int p = 0; lc_of(c)->ovf_count > 0 && p < c->size; p++)
            flush_overflow(c, p);
        double waited = hcomm__backoff(&b);
        if ((b.iter & 63) == 0) {
            hcomm_result_t v = wait_verdict(c, waited, "every rank of the group to arrive");
            /* The barrier may have completed while the abort was raised: it stands. */
            if (v != HCOMM_OK && atomic_load_explicit(gen, memory_order_acquire) == seen)
                return v;
        }
    }
    return HCOMM_OK;
}

/* All ranks of c meet. A rank that left an earlier barrier of an aborted world left its
 * arrival counted, so nobody arrives once the world has aborted. */
static hcomm_result_t barrier(hcomm_comm_t *c) {
    local_shared_t *sh = shared_of(c);
    if (atomic_load(&sh->world->aborted))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn, "another rank failed; giving up");
    if (atomic_load(&sh->aborted) || atomic_load(&c->aborted))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "hcomm_comm_abort() was called on this group; it is unusable");
    unsigned gen = atomic_load_explicit(&sh->bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&sh->bar_count, 1, memory_order_acq_rel) ==
        (unsigned)sh->size - 1) {
        atomic_store_explicit(&sh->bar_count, 0, memory_order_relaxed);
        atomic_store_explicit(&sh->bar_gen, gen + 1, memory_order_release);
        return HCOMM_OK;
    }
    return wait_gen_change(c, &sh->bar_gen, gen);
}

/* --- frames --- */

static ring_t *ring_to(hcomm_comm_t *c, int peer) {
    local_shared_t *sh = shared_of(c);
    _Atomic(ring_t *) *cell = &sh->rings[(size_t)c->rank * (size_t)sh->size + (size_t)peer];
    ring_t *r = atomic_load_explicit(cell, memory_order_acquire);
    if (r)
        return r;
    r = hcomm__calloc_lines(1, sizeof *r);
    if (r)
        atomic_store_explicit(cell, r, memory_order_release); /* only this rank writes it */
    return r;
}

static bool ring_push(ring_t *r, const frame_t *f) {
    size_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    if (tail - atomic_load_explicit(&r->head, memory_order_acquire) >= RING_SLOTS)
        return false;
    r->slot[tail % RING_SLOTS] = *f;
    atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
    return true;
}

/* Pushes the frames that waited for ring space to peer, oldest first. */
static void flush_overflow(hcomm_comm_t *c, int peer) {
    local_comm_t *lc = lc_of(c);
    ring_t *r = lc->ovf_head[peer] ? ring_to(c, peer) : NULL;
    while (r && lc->ovf_head[peer] && ring_push(r, &lc->ovf_head[peer]->f)) {
        pending_t *p = lc->ovf_head[peer];
        lc->ovf_head[peer] = p->next;
        if (!p->next)
            lc->ovf_tail[peer] = NULL;
        lc->ovf_count--;
        free(p);
    }
}

static hcomm_result_t enqueue(hcomm_comm_t *c, int peer, const frame_t *f) {
    local_comm_t *lc = lc_of(c);
    flush_overflow(c, peer);
    ring_t *r = lc->ovf_head[peer] ? NULL : ring_to(c, peer);
    if (r && ring_push(r, f))
        return HCOMM_OK;
    pending_t *p = malloc(sizeof *p);
    if (!p)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn,
                          "out of memory queueing a message to rank %d", peer);
    p->next = NULL;
    p->f = *f;
    if (lc->ovf_tail[peer])
        lc->ovf_tail[peer]->next = p;
    else
        lc->ovf_head[peer] = p;
    lc->ovf_tail[peer] = p;
    lc->ovf_count++;
    return HCOMM_OK;
}

/* The simulated multi-node machine (HCOMM_TOPO="nodes=..."): a frame between ranks of
 * different declared nodes arrives alpha + bytes * beta of the inter-node class after it left
 * its sender's link, and each rank's link carries one frame at a time (one NIC per rank, as
 * one per GPU), so bandwidth is shared by the sender's concurrent messages. Returns the arrival
 * time, or 0 when the frame stays within a node (no simulation). */
static double sim_arrival(const hcomm_comm_t *c, int peer, size_t bytes) {
    static _Thread_local double link_free; /* one thread per rank */
    const hcomm__topo_spec_t *s = hcomm__topo_spec_env();
    if (s->kind != HCOMM__TOPO_NODES || hcomm__topo_spec_node(s, c->world_ranks[c->rank]) ==
                                            hcomm__topo_spec_node(s, c->world_ranks[peer]))
        return 0.0;
    const hcomm__link_t *l = &s->link[HCOMM__LINK_INTER];
    double now = hcomm__now(), start = link_free > now ? link_free : now;
    link_free = start + (double)bytes * l->beta;
    return link_free + l->alpha;
}

static hcomm_result_t local_send_frame(hcomm_comm_t *c, int peer, const void *hdr,
                                       const void *payload, size_t bytes, bool rndv,
                                       hcomm__treq_t *tx) {
    local_tx_t *t = (local_tx_t *)tx;
    frame_t f;
    memcpy(f.hdr, hdr, HCOMM__HDR_BYTES);
    f.bytes = bytes;
    f.rndv = rndv;
    f.src_buf = payload;
    f.done = &t->done;
    f.heap = NULL;
    f.ready = sim_arrival(c, peer, bytes);
    atomic_init(&t->done, rndv ? 0 : 1);
    if (!rndv && bytes > INLINE_BYTES) {
        f.heap = malloc(bytes);
        if (!f.heap)
            return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn,
                              "out of memory buffering a %zu-byte message to rank %d", bytes, peer);
        memcpy(f.heap, payload, bytes);
    } else if (!rndv && bytes > 0) {
        memcpy(f.inl, payload, bytes);
    }
    hcomm_result_t r = enqueue(c, peer, &f);
    if (r != HCOMM_OK)
        free(f.heap);
    return r;
}

static bool local_test_tx(hcomm_comm_t *c, hcomm__treq_t *tx, hcomm_result_t *res) {
    (void)c;
    *res = HCOMM_OK;
    return atomic_load_explicit(&((local_tx_t *)tx)->done, memory_order_acquire) == 1;
}

/* Delivers the frames waiting in src's ring to this rank, in order. */
static void drain_ring(hcomm_comm_t *c, int src, hcomm__deliver_fn_t deliver) {
    local_shared_t *sh = shared_of(c);
    ring_t *r = atomic_load_explicit(&sh->rings[(size_t)src * (size_t)sh->size + (size_t)c->rank],
                                     memory_order_acquire);
    if (!r)
        return;
    size_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    size_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    for (; head != tail; head++) {
        frame_t *f = &r->slot[head % RING_SLOTS];
        if (f->ready > 0.0 && hcomm__now() < f->ready)
            break; /* still on the simulated link; later frames from src come after it */
        hcomm__rndv_t rv = {(uint64_t)(uintptr_t)f->src_buf, (uint64_t)(uintptr_t)f->done};
        const void *payload = f->rndv ? NULL : f->heap ? f->heap : f->inl;
        if (!deliver(c, src, f->hdr, payload, f->bytes, f->rndv ? &rv : NULL))
            break;
        free(f->heap);
        atomic_store_explicit(&r->head, head + 1, memory_order_release);
    }
}

static hcomm_result_t local_poll(hcomm_comm_t *c, hcomm__deliver_fn_t deliver) {
    local_comm_t *lc = lc_of(c);
    for (int p = 0; lc->ovf_count > 0 && p < c->size; p++)
        flush_overflow(c, p);
    for (int s = 0; s < c->size; s++)
        drain_ring(c, s, deliver);
    return HCOMM_OK;
}

/* A rendezvous send's flag: TX_PENDING until the receiver claims it (TX_COPYING), copies and
 * sets TX_DONE; a sender that gives up first sets TX_WITHDRAWN, and the receiver then never
 * touches its buffer. */
enum { TX_WITHDRAWN = -1, TX_PENDING = 0, TX_DONE = 1, TX_COPYING = 2 };

/* The one copy of a rendezvous message: from the sender's buffer into the destination. */
static hcomm_result_t local_pull(hcomm_comm_t *c, int src, const hcomm__rndv_t *rv, void *dst,
                                 size_t bytes, hcomm__treq_t *rx) {
    atomic_int *flag = (atomic_int *)(uintptr_t)rv->b;
    int expect = TX_PENDING;
    atomic_init(&((local_tx_t *)rx)->done, 1);
    if (!atomic_compare_exchange_strong(flag, &expect, TX_COPYING))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "rank %d gave up sending this message (its send timed out or was "
                          "aborted) before it was received",
                          src);
    if (bytes > 0 && dst != NULL)
        memcpy(dst, (const void *)(uintptr_t)rv->a, bytes);
    atomic_store_explicit(flag, TX_DONE, memory_order_release);
    return HCOMM_OK;
}

/* A rendezvous send is withdrawn unless its receiver already claimed it; then its copy is
 * finished first (it is under way), so the buffer is free either way when this returns. */
static bool local_cancel(hcomm_comm_t *c, hcomm__treq_t *r, bool is_tx) {
    (void)c;
    if (!is_tx)
        return true;
    atomic_int *flag = &((local_tx_t *)r)->done;
    int expect = TX_PENDING;
    if (atomic_compare_exchange_strong(flag, &expect, TX_WITHDRAWN))
        return true;
    while (atomic_load_explicit(flag, memory_order_acquire) == TX_COPYING)
        sched_yield();
    return true;
}

static bool local_world_aborted(hcomm_comm_t *c) {
    return atomic_load_explicit(&shared_of(c)->world->aborted, memory_order_relaxed) != 0;
}

/* The ranks are threads of one process: a peer's buffer is read where it lies. */
static bool local_peer_read_ok(hcomm_comm_t *c) {
    (void)c;
    return true;
}

static hcomm_result_t local_peer_read(hcomm_comm_t *c, int peer, const void *remote, void *dst,
                                      size_t bytes) {
    (void)c;
    (void)peer;
    memcpy(dst, remote, bytes);
    return HCOMM_OK;
}

static void local_buf_export(hcomm_comm_t *c, const void *p, size_t bytes, hcomm__peer_buf_t *b) {
    (void)c, (void)bytes;
    *b = (hcomm__peer_buf_t){.addr = (uint64_t)(uintptr_t)p};
}

static const void *local_buf_view(hcomm_comm_t *c, int peer, const hcomm__peer_buf_t *b,
                                  size_t bytes) {
    (void)c, (void)peer, (void)bytes;
    return (const void *)(uintptr_t)b->addr;
}

static bool local_shares_memory(hcomm_comm_t *c, int peer) {
    (void)c, (void)peer;
    return true;
}

static bool local_threads_ok(void) {
    return true;
}

static hcomm__mem_kind_t local_mem_kind(hcomm_comm_t *c, const void *p) {
    (void)c, (void)p;
    return HCOMM__MEM_SHARED;
}

/* --- native collectives over posted slots --- */

static const local_slot_t *slot_of(hcomm_comm_t *c, int r) {
    return &shared_of(c)->slots[r];
}

/* Rank r's post of parity n (a post count). */
static local_post_t *post_at(hcomm_comm_t *c, int r, unsigned n) {
    return &shared_of(c)->posts[2 * (size_t)r + n % 2];
}

/* Rank r's post of the current call (every member has posted as many calls). */
static local_post_t *post_of(hcomm_comm_t *c, int r) {
    return post_at(c, r, lc_of(c)->posts);
}

/* Asks for this rank's next post line in exclusive state now, between calls: every peer
 * finished reading it (it held the call before this one), but each still has a copy, so the
 * next call's first store would otherwise wait for their invalidation before a peer could
 * load the line: two line transfers on the call's path instead of one. Only a hint: the
 * line's contents do not change. */
static void own_next_post(hcomm_comm_t *c) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    const local_post_t *next = post_at(c, c->rank, lc_of(c)->posts + 1);
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)next));
#else
    (void)c;
#endif
}

/* Posts this rank's slot, the signature the algorithms layer set and `bytes` of data; the
 * barrier that follows publishes them to peers, or the seq stored last (wait_posts). */
static void post(hcomm_comm_t *c, local_slot_t slot, const void *data, size_t bytes) {
    unsigned n = ++lc_of(c)->posts;
    local_post_t *p = post_of(c, c->rank);
    hcomm__posted_sig_t sig = c->posted ? *c->posted : (hcomm__posted_sig_t){{0}};
    memcpy(p->words, sig.words, sizeof p->words);
    p->failed = sig.failed;
    p->failed_text = sig.failed_text;
    if (bytes)
        memcpy(p->data, data, bytes);
    shared_of(c)->slots[c->rank] = slot;
    atomic_store_explicit(&p->seq, n, memory_order_release);
}

static bool same_sig(const local_post_t *a, const local_post_t *b) {
    return memcmp(a->words, b->words, sizeof a->words) == 0;
}

/* Whether every rank posted the same call; every rank sees the same posts, so all agree. A
 * failing call leaves the posts for the caller to read until posted_release. */
static hcomm_result_t check_posts(hcomm_comm_t *c) {
    const local_post_t *first = post_of(c, 0);
    for (int r = 0; r < c->size; r++) {
        const local_post_t *p = post_of(c, r);
        if (p->failed != HCOMM_OK || !same_sig(p, first)) {
            c->posted_held = true;
            return HCOMM_ERR_MISMATCH;
        }
    }
    return HCOMM_OK;
}

/* The barrier after posting, then the check that every peer posted the same call. */
static hcomm_result_t arrive(hcomm_comm_t *c) {
    HCOMM__TRY(barrier(c));
    return check_posts(c);
}

/* Waits for every peer's post of this rank's current call, without a barrier; a rank that
 * finished the call before this one read the posts of the one before that, so a post's
 * reuse two calls later needs no wait. */
static hcomm_result_t wait_posts(hcomm_comm_t *c) {
    unsigned n = lc_of(c)->posts;
    for (int r = 0; r < c->size; r++) {
        const local_post_t *p = post_of(c, r);
        hcomm__backoff_t b;
        hcomm__backoff_init(&b);
        while (atomic_load_explicit(&p->seq, memory_order_acquire) != n) {
            for (int q = 0; lc_of(c)->ovf_count > 0 && q < c->size; q++)
                flush_overflow(c, q);
            double waited = hcomm__backoff(&b);
            if ((b.iter & 63) == 0 && atomic_load_explicit(&p->seq, memory_order_acquire) != n)
                HCOMM__TRY(wait_verdict(c, waited, "every rank of the group to arrive"));
        }
    }
    hcomm_result_t res = check_posts(c);
    /* Peers that made another call wait in arrive's barrier: meet them there, so that both
     * sides' posted_release barriers pair up. */
    if (res == HCOMM_ERR_MISMATCH) {
        hcomm_result_t bar = barrier(c);
        return bar != HCOMM_OK ? bar : res;
    }
    return res;
}

static hcomm_result_t local_posted_only(hcomm_comm_t *c) {
    post(c, (local_slot_t){0}, NULL, 0);
    return arrive(c);
}

static const hcomm__posted_sig_t *local_posted_sig(hcomm_comm_t *c, int rank) {
    const local_post_t *p = post_of(c, rank);
    hcomm__posted_sig_t *v = &lc_of(c)->views[rank];
    memcpy(v->words, p->words, sizeof v->words);
    v->failed = p->failed;
    v->failed_text = p->failed_text;
    return v;
}

static hcomm_result_t local_posted_release(hcomm_comm_t *c) {
    c->posted_held = false;
    return barrier(c);
}

/* Chunk [lo, hi) of rank r's share when n items are split over size ranks. */
static void chunk(size_t n, int size, int r, size_t *lo, size_t *hi) {
    size_t base = n / (size_t)size, rem = n % (size_t)size, rr = (size_t)r;
    *lo = rr * base + (rr < rem ? rr : rem);
    *hi = *lo + base + (rr < rem ? 1 : 0);
}

/* dst = slots[0].send[off..] op slots[1].send[off..] op ... in rank order (the posts' data
 * instead when posted_data), in one pass so that f16/bf16 accumulate in f32 and round once
 * (AVG divides before rounding). */
static hcomm_result_t reduce_posted(hcomm_comm_t *c, void *dst, size_t off, size_t n,
                                    hcomm_dtype_t dt, hcomm_op_t op, bool posted_data) {
    enum { STACK_RANKS = 64 };
    const void *stack[STACK_RANKS] = {0};
    if (n == 0)
        return HCOMM_OK;
    const void **srcs = c->size <= STACK_RANKS ? stack : malloc((size_t)c->size * sizeof *srcs);
    if (!srcs)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "cannot allocate %d input pointers",
                          c->size);
    for (int r = 0; r < c->size; r++)
        srcs[r] = posted_data ? post_of(c, r)->data : slot_of(c, r)->send;
    hcomm__reduce_many(dst, srcs, c->size, off, n, dt, op);
    if (srcs != stack)
        free(srcs);
    return HCOMM_OK;
}

/* Small messages: each rank posts its input itself and reduces the whole vector from the
 * posts (no chunk exchange), so no rank reads another's buffers and the call needs no closing
 * barrier: one meeting per call (see local_post_t). */
static hcomm_result_t small_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                       size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    post(c, (local_slot_t){0}, sendbuf, count * hcomm__dtype_size(dt));
    HCOMM__TRY(wait_posts(c));
    hcomm_result_t res = reduce_posted(c, recvbuf, 0, count, dt, op, true);
    own_next_post(c);
    return res;
}

/* Larger messages: every rank reduces its chunk of every input in rank order straight into
 * its own output, then writes it into every peer's output, and a barrier closes the call (as
 * twoshot pushes, twoshot.c). Only a chunk's owner reads that chunk of any input, so its place
 * is free once reduced, in place too. Two barriers; before, the chunk went through scratch and
 * every rank read every chunk after a second barrier: three, and in place a rank's next call
 * read inputs its peers had just written (2 ranks, 16 KiB in place 12.6 us against twoshot's
 * 5.6). */
static hcomm_result_t local_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                       size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    size_t es = hcomm__dtype_size(dt), lo, hi;
    if (count * es <= SMALL_REDUCE_BYTES)
        return small_all_reduce(c, sendbuf, recvbuf, count, dt, op);
    chunk(count, c->size, c->rank, &lo, &hi);
    post(c, (local_slot_t){.send = sendbuf, .aux = recvbuf}, NULL, 0);
    HCOMM__TRY(arrive(c));
    char *mine = (char *)recvbuf + lo * es;
    hcomm_result_t red = reduce_posted(c, mine, lo, hi - lo, dt, op, false);
    for (int r = 0; red == HCOMM_OK && hi > lo && r < c->size; r++)
        if (r != c->rank)
            memcpy((char *)slot_of(c, r)->aux + lo * es, mine, (hi - lo) * es);
    hcomm_result_t res = barrier(c); /* every chunk written; every input read */
    return res != HCOMM_OK ? res : red;
}

/* reduce_scatter(v): this rank's n elements at element lo of every input (total elements
 * each), reduced in rank order straight into recvbuf. In place (recvbuf == sendbuf, whose
 * start peers read until the barrier) into this rank's own block of its input, which only it
 * reads, moved to the start after the barrier; any other overlap through scratch. Local, 2
 * ranks, 8 MiB in place: 600 us, against 815 through scratch (the direct algorithm: 603). */
static hcomm_result_t reduce_own_block(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                       size_t lo, size_t n, size_t total, hcomm_dtype_t dt,
                                       hcomm_op_t op) {
    size_t es = hcomm__dtype_size(dt);
    bool overlap = hcomm__overlaps(sendbuf, total * es, recvbuf, n * es);
    void *mine = !overlap             ? recvbuf
                 : recvbuf == sendbuf ? (char *)recvbuf + lo * es
                                      : hcomm__scratch(&lc_of(c)->scratch, n * es);
    if (!mine && n > 0) /* an empty block may have no buffer at all */
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "cannot allocate %zu bytes", n * es);
    post(c, (local_slot_t){.send = sendbuf}, NULL, 0);
    hcomm_result_t res = arrive(c), red = HCOMM_OK;
    if (res == HCOMM_OK) {
        red = reduce_posted(c, mine, lo, n, dt, op, false);
        res = barrier(c);
        res = res == HCOMM_OK ? red : res;
    }
    if (res == HCOMM_OK && mine != recvbuf)
        memmove(recvbuf, mine, n * es); /* v-blocks of other sizes may overlap the start */
    return res;
}

static hcomm_result_t local_reduce_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                           size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    return reduce_own_block(c, sendbuf, recvbuf, (size_t)c->rank * count, count,
                            count * (size_t)c->size, dt, op);
}

/* all_gather(v): rank r's block (each[r] bytes, or equal where each is NULL) copied from its
 * posted input to its place, blocks back to back in rank order. */
static hcomm_result_t gather_posted(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                    const size_t *each, size_t equal) {
    post(c, (local_slot_t){.send = sendbuf}, NULL, 0);
    HCOMM__TRY(arrive(c));
    size_t off = 0;
    for (int r = 0; r < c->size; r++) {
        size_t n = each ? each[r] : equal;
        char *dst = (char *)recvbuf + off;
        if (n > 0 && dst != slot_of(c, r)->send) /* in place: peers read this very block */
            hcomm__copy_pieces(dst, slot_of(c, r)->send, n);
        off += n;
    }
    return barrier(c);
}

static hcomm_result_t local_all_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                       size_t bytes) {
    return gather_posted(c, sendbuf, recvbuf, NULL, bytes);
}

/* The v forms: sizes the same on every rank. */
static hcomm_result_t local_all_gatherv(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                        const size_t *bytes) {
    return gather_posted(c, sendbuf, recvbuf, bytes, 0);
}

static hcomm_result_t local_reduce_scatterv(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                            const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op) {
    size_t lo = 0, total = 0;
    for (int r = 0; r < c->size; r++) {
        lo += r < c->rank ? counts[r] : 0;
        total += counts[r];
    }
    return reduce_own_block(c, sendbuf, recvbuf, lo, counts[c->rank], total, dt, op);
}

static hcomm_result_t local_broadcast(hcomm_comm_t *c, void *buf, size_t bytes, int root) {
    post(c, (local_slot_t){.send = buf}, NULL, 0);
    HCOMM__TRY(arrive(c));
    if (c->rank != root && bytes > 0)
        hcomm__copy_pieces(buf, slot_of(c, root)->send, bytes);
    return barrier(c);
}

/* Every rank sees every rank's send and receive counts, so all of them find the same first
 * differing pair (by receiver, then sender) and fail together before any data moves. */
static hcomm_result_t check_pair_counts(hcomm_comm_t *c) {
    for (int r = 0; r < c->size; r++)
        for (int s = 0; s < c->size; s++) {
            size_t sent = slot_of(c, s)->counts[r], want = slot_of(c, r)->rcounts[s];
            if (sent != want)
                return hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn,
                                  "sendcounts[%d]=%zu on rank %d but recvcounts[%d]=%zu on rank "
                                  "%d; no data was moved",
                                  r, sent, s, s, want, r);
        }
    return HCOMM_OK;
}

/* A count mismatch is reported here, after the signatures agreed (see transport.h). */
static hcomm_result_t local_all_to_allv(hcomm_comm_t *c, const void *sendbuf,
                                        const size_t *sendcounts, const size_t *sdispls,
                                        void *recvbuf, const size_t *recvcounts,
                                        const size_t *rdispls) {
    post(c,
         (local_slot_t){
             .send = sendbuf, .counts = sendcounts, .displs = sdispls, .rcounts = recvcounts},
         NULL, 0);
    HCOMM__TRY(arrive(c));
    hcomm_result_t bad = check_pair_counts(c);
    if (bad != HCOMM_OK) {
        hcomm_result_t r = barrier(c);
        return r != HCOMM_OK ? r : bad;
    }
    for (int s = 0; s < c->size; s++) {
        const local_slot_t *src = slot_of(c, s);
        if (src->counts[c->rank])
            memcpy((char *)recvbuf + rdispls[s], (const char *)src->send + src->displs[c->rank],
                   src->counts[c->rank]);
    }
    return barrier(c);
}

static const hcomm__native_ops_t local_native = {
    .all_reduce = local_all_reduce,
    .all_gather = local_all_gather,
    .reduce_scatter = local_reduce_scatter,
    .broadcast = local_broadcast,
    .all_to_allv = local_all_to_allv,
    .all_gatherv = local_all_gatherv,
    .reduce_scatterv = local_reduce_scatterv,
};

/* --- split --- */

typedef struct member {
    int key, rank;
} member_t;

static int member_cmp(const void *a, const void *b) {
    const member_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Lists the members with this rank's color, ordered by (key, rank). */
static int collect_members(hcomm_comm_t *c, int color, member_t *out) {
    int m = 0;
    for (int r = 0; r < c->size; r++)
        if (slot_of(c, r)->color == color)
            out[m++] = (member_t){slot_of(c, r)->key, r};
    qsort(out, (size_t)m, sizeof *out, member_cmp);
    return m;
}

static hcomm_result_t make_member_comm(hcomm_comm_t *c, local_shared_t *sh, const member_t *mem,
                                       int m, hcomm_comm_t **out) {
    int me = 0;
    while (mem[me].rank != c->rank)
        me++;
    local_comm_t *lc = lc_new(sh, m);
    hcomm_comm_t *nc = lc ? hcomm__comm_alloc(&local_tr, lc, me, m, c) : NULL;
    if (!nc) {
        if (lc) {
            free(lc->ovf_head);
            free(lc->ovf_tail);
            free(lc);
        }
        shared_release(sh);
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "cannot allocate a communicator");
    }
    for (int i = 0; i < m; i++)
        nc->world_ranks[i] = c->world_ranks[mem[i].rank];
    *out = nc;
    return HCOMM_OK;
}

/* Every rank posts (color, key); the first member of each group creates the group's shared
 * state and posts it; the members pick it up. */
static hcomm_result_t local_split(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out) {
    *out = NULL;
    member_t *mem = malloc(sizeof *mem * (size_t)c->size);
    post(c, (local_slot_t){.color = color < 0 ? -1 : color, .key = key}, NULL, 0);
    hcomm_result_t res = arrive(c);
    if (res != HCOMM_OK) {
        free(mem);
        return res;
    }
    int m = (color >= 0 && mem) ? collect_members(c, color, mem) : 0;
    if (m > 0 && mem[0].rank == c->rank)
        shared_of(c)->slots[c->rank].aux = shared_new(shared_of(c)->world, m);
    res = barrier(c);
    if (res == HCOMM_OK && color >= 0) {
        local_shared_t *group = mem ? slot_of(c, mem[0].rank)->aux : NULL;
        if (!group)
            res = hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "cannot allocate a group");
        else
            res = make_member_comm(c, group, mem, m, out);
    }
    hcomm_result_t after = barrier(c); /* slots are read; they may be reused */
    free(mem);
    return res != HCOMM_OK ? res : after;
}

static void local_destroy(hcomm_comm_t *c) {
    local_comm_t *lc = lc_of(c);
    if (!lc)
        return;
    for (int p = 0; p < c->size; p++)
        while (lc->ovf_head[p]) {
            pending_t *n = lc->ovf_head[p]->next;
            free(lc->ovf_head[p]->f.heap);
            free(lc->ovf_head[p]);
            lc->ovf_head[p] = n;
        }
    shared_release(lc->sh);
    free(lc->scratch.p);
    free(lc->ovf_head);
    free(lc->ovf_tail);
    free(lc);
    c->impl = NULL;
}

static const hcomm__transport_t local_tr = {
    .name = "local",
    .send_frame = local_send_frame,
    .test_tx = local_test_tx,
    .poll = local_poll,
    .pull = local_pull,
    .pull_discards = true,
    .test_rx = local_test_tx,
    .cancel = local_cancel,
    .world_aborted = local_world_aborted,
    .shares_memory = local_shares_memory,
    .peer_read_ok = local_peer_read_ok,
    .peer_read = local_peer_read,
    .buf_export = local_buf_export,
    .buf_view = local_buf_view,
    .views_writable = true,
    .mem_kind = local_mem_kind,
    .threads_ok = local_threads_ok,
    .native = &local_native,
    .posted_only = local_posted_only,
    .posted_sig = local_posted_sig,
    .posted_release = local_posted_release,
    .split = local_split,
    .destroy = local_destroy,
};

/* --- launcher --- */

typedef struct rank_thread {
    pthread_t tid;
    hcomm_comm_t *world;
    hcomm_rank_fn_t fn;
    void *arg;
    local_world_t *lw;
    hcomm_result_t result;
    char message[512]; /* the rank's last error, carried to the launching thread */
} rank_thread_t;

static void *rank_main(void *p) {
    rank_thread_t *t = p;
    t->result = t->fn(t->world, t->arg);
    if (t->result != HCOMM_OK) {
        strncpy(t->message, hcomm_last_error(), sizeof t->message - 1);
        atomic_store(&t->lw->aborted, 1);
    }
    return NULL;
}

static hcomm_result_t make_world(local_world_t *lw, int n, rank_thread_t *th) {
    local_shared_t *sh = shared_new(lw, n);
    if (!sh)
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_launch", "cannot allocate a world of %d", n);
    for (int r = 0; r < n; r++) {
        local_comm_t *lc = lc_new(sh, n);
        th[r].world = lc ? hcomm__comm_alloc(&local_tr, lc, r, n, NULL) : NULL;
        if (!th[r].world) {
            if (lc) {
                free(lc->ovf_head);
                free(lc->ovf_tail);
                free(lc);
            }
            for (int k = r; k < n; k++) /* drop the references no comm will release */
                shared_release(sh);
            return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_launch", "cannot allocate rank %d", r);
        }
        th[r].world->is_world = true;
        for (int i = 0; i < n; i++)
            th[r].world->world_ranks[i] = i;
    }
    return HCOMM_OK;
}

static hcomm_result_t run_threads(rank_thread_t *th, int n) {
    int started = 0;
    hcomm_result_t res = HCOMM_OK;
    for (; started < n; started++)
        if (pthread_create(&th[started].tid, NULL, rank_main, &th[started]) != 0)
            break;
    if (started < n) {
        atomic_store(&th[0].lw->aborted, 1); /* the started ranks would wait forever */
        res = hcomm__err(HCOMM_ERR_BACKEND, "hcomm_launch", "cannot start thread for rank %d: %s",
                         started, strerror(errno));
    }
    for (int r = 0; r < started; r++)
        pthread_join(th[r].tid, NULL);
    return res;
}

/* The first failing rank's result and message, re-recorded on the launching thread; ranks
 * that only saw the abort or a peer's failure come after the rank that caused it. */
static hcomm_result_t first_failure(const rank_thread_t *th, int n) {
    int first = -1;
    for (int r = 0; r < n; r++) {
        if (th[r].result == HCOMM_OK)
            continue;
        bool echo = th[r].result == HCOMM_ERR_ABORTED || th[r].result == HCOMM_ERR_PEER;
        bool first_echo = first >= 0 && (th[first].result == HCOMM_ERR_ABORTED ||
                                         th[first].result == HCOMM_ERR_PEER);
        if (first < 0 || (first_echo && !echo))
            first = r;
    }
    if (first < 0)
        return HCOMM_OK;
    const char *msg = th[first].message[0] ? th[first].message : "(no hcomm error message)";
    return hcomm__err(th[first].result, "hcomm_launch", "rank %d failed with %s: %s", first,
                      hcomm_result_name(th[first].result), msg);
}

hcomm_result_t hcomm__local_launch(int n, hcomm_rank_fn_t fn, void *arg) {
    local_world_t lw;
    atomic_init(&lw.aborted, 0);
    rank_thread_t *th = calloc((size_t)n, sizeof *th);
    if (!th)
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_launch", "cannot allocate %d ranks", n);
    for (int r = 0; r < n; r++)
        th[r] = (rank_thread_t){.fn = fn, .arg = arg, .lw = &lw, .result = HCOMM_OK};
    hcomm__ranks_here(n, n);
    hcomm_result_t res = make_world(&lw, n, th);
    if (res == HCOMM_OK)
        res = run_threads(th, n);
    hcomm__ranks_here(-n, -n);
    if (res == HCOMM_OK)
        res = first_failure(th, n);
    for (int r = 0; r < n; r++)
        hcomm__comm_free(th[r].world);
    free(th);
    return res;
}
