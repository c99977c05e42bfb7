/* The local transport: every rank is a thread of this process and peers share memory. This
 * file holds the frames, the answers about peer memory (a peer's buffer is read where it
 * lies), the launch (a thread per rank), and the transport's table, which names the parts
 * below it (local_base.h lists them).
 *
 * Frames travel through one single-producer single-consumer ring per (sender, receiver) pair
 * of a communicator, allocated by the sender on first use. The sender publishes a slot with a
 * release store of the ring's tail; the receiver reads it after an acquire load and frees the
 * slot with a release store of the head: no mutex on the path. An eager payload of up to
 * INLINE_BYTES rides in the slot, a larger one in a heap copy; a rendezvous frame carries the
 * sender's buffer address, the receiver copies straight from it (one copy) and sets the
 * sender's done flag. When a ring is full the sender links a fresh ring after it (local_base.h,
 * ring_t), which the receiver moves to by itself: a send never blocks in the transport, and a
 * frame it queued reaches the receiver without another call by the sender. */
#include "transport/local_base.h"

#include "core/topo_spec.h"

#include <errno.h>
#include <time.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

/* --- frames --- */

typedef struct local_tx {
    atomic_int done;
} local_tx_t;

_Static_assert(sizeof(local_tx_t) <= sizeof(hcomm__treq_t), "local_tx_t fits a request");

/* The newest ring of the chain to peer; the first frame creates the chain. */
static ring_t *ring_to(hcomm_comm_t *c, int peer) {
    local_comm_t *lc = lc_of(c);
    if (lc->tx[peer])
        return lc->tx[peer];
    local_shared_t *sh = shared_of(c);
    ring_t *r = hcomm__calloc_lines(1, sizeof *r);
    if (r)
        atomic_store_explicit(&sh->rings[(size_t)c->rank * (size_t)sh->size + (size_t)peer], r,
                              memory_order_release);
    return lc->tx[peer] = r;
}

static bool ring_push(ring_t *r, const frame_t *f) {
    size_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    if (tail - atomic_load_explicit(&r->head, memory_order_acquire) >= RING_SLOTS)
        return false;
    r->slot[tail % RING_SLOTS] = *f;
    atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
    return true;
}

/* Queues f to peer. A full ring gets a fresh one linked after it, published only after the
 * frame is in it; this rank never touches the full ring again, so the receiver may free it. */
static hcomm_result_t enqueue(hcomm_comm_t *c, int peer, const frame_t *f) {
    ring_t *r = ring_to(c, peer);
    if (r && ring_push(r, f))
        return HCOMM_OK;
    ring_t *n = r ? hcomm__calloc_lines(1, sizeof *n) : NULL;
    if (!n)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn,
                          "out of memory queueing a message to rank %d", peer);
    ring_push(n, f);
    atomic_store_explicit(&r->next, n, memory_order_release);
    lc_of(c)->tx[peer] = n;
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

/* Delivers the frames waiting in ring r from src, in order; true when r is empty. */
static bool drain_frames(hcomm_comm_t *c, int src, ring_t *r, hcomm__deliver_fn_t deliver) {
    size_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    size_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    for (; head != tail; head++) {
        frame_t *f = &r->slot[head % RING_SLOTS];
        if (f->ready > 0.0 && hcomm__now() < f->ready)
            return false; /* still on the simulated link; later frames from src come after it */
        hcomm__rndv_t rv = {(uint64_t)(uintptr_t)f->src_buf, (uint64_t)(uintptr_t)f->done};
        const void *payload = f->rndv ? NULL : f->heap ? f->heap : f->inl;
        if (!deliver(c, src, f->hdr, payload, f->bytes, f->rndv ? &rv : NULL))
            return false;
        free(f->heap);
        atomic_store_explicit(&r->head, head + 1, memory_order_release);
    }
    return true;
}

/* Delivers the frames from src, following its chain of rings: a ring is left (and freed) once
 * it is empty and its sender linked the next one, after which its tail can no longer move. */
static void drain_ring(hcomm_comm_t *c, int src, hcomm__deliver_fn_t deliver) {
    local_shared_t *sh = shared_of(c);
    _Atomic(ring_t *) *cell = &sh->rings[(size_t)src * (size_t)sh->size + (size_t)c->rank];
    ring_t *r = atomic_load_explicit(cell, memory_order_acquire);
    while (r && drain_frames(c, src, r, deliver)) {
        ring_t *n = atomic_load_explicit(&r->next, memory_order_acquire);
        if (!n)
            return;
        if (atomic_load_explicit(&r->tail, memory_order_relaxed) !=
            atomic_load_explicit(&r->head, memory_order_relaxed))
            continue; /* frames pushed before the link: deliver them first */
        atomic_store_explicit(cell, n, memory_order_relaxed); /* only this rank reads it now */
        free(r);
        r = n;
    }
}

static hcomm_result_t local_poll(hcomm_comm_t *c, hcomm__deliver_fn_t deliver) {
    for (int s = 0; s < c->size; s++)
        drain_ring(c, s, deliver);
    return HCOMM_OK;
}

/* A rendezvous send's flag: TX_PENDING until the receiver claims it (TX_COPYING), copies and
 * sets TX_DONE; a sender that gives up first sets TX_WITHDRAWN, and the receiver then never
 * touches its buffer. */
enum { TX_WITHDRAWN = -1, TX_PENDING = 0, TX_DONE = 1, TX_COPYING = 2 };

/* Why a sender gave its message up: a lost member of the group or a revoke (which it saw
 * first), else its own timeout or abort. */
static hcomm_result_t withdrawn(hcomm_comm_t *c, int src) {
    HCOMM__TRY(hcomm__lost_verdict(c, -1));
    if (atomic_load(&shared_of(c)->aborted) == HCOMM__REVOKE_CALLED)
        return hcomm__err(HCOMM_ERR_REVOKED, c->call_fn,
                          "rank %d gave up sending this message: a member revoked the group", src);
    return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                      "rank %d gave up sending this message (its send timed out or was "
                      "aborted) before it was received",
                      src);
}

/* The one copy of a rendezvous message: from the sender's buffer into the destination. */
static hcomm_result_t local_pull(hcomm_comm_t *c, int src, const hcomm__rndv_t *rv, void *dst,
                                 size_t bytes, hcomm__treq_t *rx) {
    atomic_int *flag = (atomic_int *)(uintptr_t)rv->b;
    int expect = TX_PENDING;
    atomic_init(&((local_tx_t *)rx)->done, 1);
    if (!atomic_compare_exchange_strong(flag, &expect, TX_COPYING))
        return withdrawn(c, src);
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

/* --- the world's state and peer memory --- */

static bool local_world_aborted(hcomm_comm_t *c) {
    return atomic_load_explicit(&shared_of(c)->world->aborted, memory_order_relaxed) != 0;
}

/* Peers waiting in a native collective on c see the flag (hcomm__local_wait_verdict). */
static void local_abort_group(hcomm_comm_t *c) {
    int how = atomic_load(&c->aborted);
    atomic_store(&shared_of(c)->aborted, how ? how : HCOMM__ABORT_CALLED);
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

/* --- lost ranks (transport/ft.c) --- */

static bool local_lost(hcomm_comm_t *c, int rank) {
    local_world_t *w = shared_of(c)->world;
    return atomic_load_explicit(&w->nlost, memory_order_acquire) > 0 &&
           atomic_load_explicit(&w->lost[c->world_ranks[rank]], memory_order_acquire) != 0;
}

static hcomm__ft_slot_t *local_ft_slot(hcomm_comm_t *c, int rank) {
    return &shared_of(c)->ft[rank];
}

/* The new group's shared state, made by its first member. */
static uint64_t local_subset_token(hcomm_comm_t *c, int n, uint64_t round) {
    (void)round;
    return (uint64_t)(uintptr_t)hcomm__local_shared_new(shared_of(c)->world, n);
}

static hcomm_result_t local_subset(hcomm_comm_t *c, const int *members, int n, uint64_t token,
                                   hcomm_comm_t **out) {
    local_shared_t *sh = (local_shared_t *)(uintptr_t)token;
    if (!sh)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "cannot allocate a group of %d ranks", n);
    return hcomm__local_group_comm(c, sh, members, n, out);
}

/* This rank's thread stops for good, as a crashed rank would: it is marked lost and waits,
 * touching nothing, until every other rank's function has returned (its buffers stay valid
 * for peers still reading them). */
static hcomm_result_t local_stop(hcomm_comm_t *c) {
    local_world_t *w = shared_of(c)->world;
    atomic_store(&w->lost[c->world_ranks[c->rank]], 1);
    atomic_fetch_add(&w->nlost, 1);
    while (atomic_load(&w->done) + atomic_load(&w->nlost) < w->size) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return hcomm__err(HCOMM_ERR_PEER_LOST, "hcomm_fault_stop",
                      "this rank stopped for good (a simulated failure); return from the rank "
                      "function");
}

/* clang-format off */
static const hcomm__transport_t local_tr = {
    .name = "local",
    /* frames through the rings */
    .send_frame = local_send_frame, .test_tx = local_test_tx, .test_rx = local_test_tx,
    .poll = local_poll, .pull = local_pull, .pull_discards = true, .cancel = local_cancel,
    /* where the ranks are, and their memory: one address space */
    .world_aborted = local_world_aborted, .abort_group = local_abort_group,
    .shares_memory = local_shares_memory,
    .mem_kind = local_mem_kind, .peer_read_ok = local_peer_read_ok, .peer_read = local_peer_read,
    .buf_export = local_buf_export, .buf_view = local_buf_view, .views_writable = true,
    /* native collectives, checked in the posted slots */
    .native = &hcomm__local_native, .posted_only = hcomm__local_posted_only,
    .posted_sig = hcomm__local_posted_sig, .posted_release = hcomm__local_posted_release,
    /* communicators */
    .threads_ok = local_threads_ok, .split = hcomm__local_split, .destroy = hcomm__local_destroy,
    /* lost ranks */
    .lost = local_lost, .ft_slot = local_ft_slot, .subset_token = local_subset_token,
    .subset = local_subset, .stop = local_stop,
};
/* clang-format on */

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

/* A rank that stopped for good (hcomm_fault_stop) neither fails the world nor counts as done:
 * its peers go on without it. */
static bool stopped(const rank_thread_t *t, int rank) {
    return atomic_load(&t->lw->lost[rank]) != 0;
}

static void *rank_main(void *p) {
    rank_thread_t *t = p;
    t->result = t->fn(t->world, t->arg);
    bool lost = stopped(t, t->world->rank);
    if (t->result != HCOMM_OK && !lost) {
        strncpy(t->message, hcomm_last_error(), sizeof t->message - 1);
        atomic_store(&t->lw->aborted, 1);
    }
    if (!lost)
        atomic_fetch_add(&t->lw->done, 1);
    return NULL;
}

static hcomm_result_t make_world(local_world_t *lw, int n, rank_thread_t *th) {
    local_shared_t *sh = hcomm__local_shared_new(lw, n);
    if (!sh)
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_launch", "cannot allocate a world of %d", n);
    for (int r = 0; r < n; r++) {
        th[r].world = hcomm__local_comm_new(&local_tr, sh, r, n, NULL);
        if (!th[r].world) {
            for (int k = r; k < n; k++) /* drop the references no comm will release */
                hcomm__local_shared_release(sh);
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
        if (th[r].result == HCOMM_OK || stopped(&th[r], r))
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
    local_world_t lw = {.size = n};
    atomic_init(&lw.aborted, 0);
    atomic_init(&lw.nlost, 0);
    atomic_init(&lw.done, 0);
    lw.lost = calloc((size_t)n, sizeof *lw.lost);
    rank_thread_t *th = calloc((size_t)n, sizeof *th);
    if (!th || !lw.lost) {
        free(th);
        free(lw.lost);
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_launch", "cannot allocate %d ranks", n);
    }
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
    free(lw.lost);
    return res;
}
