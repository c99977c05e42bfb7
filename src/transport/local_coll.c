/* The local transport's native collectives (local_base.h), and split. Each rank posts its
 * buffer pointers and the call's signature in its per-rank slot, the ranks meet at a barrier
 * (an atomic counter and generation), check the signatures, and then read each other's
 * buffers, or write into them, directly. Reductions are done chunk by chunk, each chunk by one
 * rank in rank order 0..n-1, so every rank gets bit-identical results equal to a serial
 * left-to-right reduction. */
#include "transport/local_base.h"

#include <string.h>

/* all_gather's piece: read once into the cache (L2 here), then written to every output. From
 * GATHER_STREAM_BYTES of output a rank, the outputs are written with non-temporal stores: no
 * line of them is read from memory first (docs/tuning.md: local.all-gather-stream). */
enum { GATHER_PIECE_BYTES = 256 << 10, GATHER_STREAM_BYTES = 16 << 20 };

/* --- the barriers every native collective meets at and ends in --- */

/* Takes back this rank's arrival at the barrier of generation gen unless that barrier has
 * completed or is completing: then false, and the wait goes on to its end. */
static bool withdraw(local_shared_t *sh, unsigned gen) {
    uint64_t w = atomic_load(&sh->bar_arrivals);
    while ((unsigned)(w >> 32) == gen && (uint32_t)w >= 1 && (uint32_t)w < (uint32_t)sh->size)
        if (atomic_compare_exchange_weak(&sh->bar_arrivals, &w, w - 1))
            return true;
    return false;
}

/* A closing barrier gives up only at HCOMM_TIMEOUT: every member passed the meeting, so each
 * comes once done with the buffers it reads, and none may return while a peer still reads its
 * own (an abort raised meanwhile fails the next call). */
static hcomm_result_t closing_verdict(hcomm_comm_t *c, double waited) {
    if (waited <= c->timeout_s) {
        if (c->idle)
            c->idle(c);
        return HCOMM_OK;
    }
    return hcomm__local_wait_verdict(c, waited, "every rank of the group to finish the call");
}

/* Waits until the barrier's generation moves on from gen; a rank that gives up withdraws its
 * arrival, so that no peer passes the barrier and reads its buffers after it has returned. */
static hcomm_result_t wait_gen_change(hcomm_comm_t *c, unsigned gen, bool closing) {
    local_shared_t *sh = shared_of(c);
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    while (atomic_load_explicit(&sh->bar_gen, memory_order_acquire) == gen) {
        double waited = hcomm__backoff(&b);
        if ((b.iter & 63) == 0) {
            hcomm_result_t v =
                closing ? closing_verdict(c, waited)
                        : hcomm__local_wait_verdict(c, waited, "every rank of the group to arrive");
            if (v != HCOMM_OK && withdraw(sh, gen))
                return v;
        }
    }
    return HCOMM_OK;
}

static hcomm_result_t barrier_as(hcomm_comm_t *c, bool closing) {
    local_shared_t *sh = shared_of(c);
    if (!closing && atomic_load(&sh->world->aborted))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn, "another rank failed; giving up");
    if (!closing && (atomic_load(&sh->aborted) || atomic_load(&c->aborted)))
        return hcomm__local_wait_verdict(c, 0.0, "the call to start"); /* says which */
    uint64_t w = atomic_fetch_add_explicit(&sh->bar_arrivals, 1, memory_order_acq_rel);
    unsigned gen = (unsigned)(w >> 32);
    if ((uint32_t)w == (uint32_t)sh->size - 1) {
        atomic_store_explicit(&sh->bar_arrivals, (uint64_t)(gen + 1u) << 32, memory_order_relaxed);
        atomic_store_explicit(&sh->bar_gen, gen + 1u, memory_order_release);
        return HCOMM_OK;
    }
    return wait_gen_change(c, gen, closing);
}

/* The meeting that opens a call: all ranks of c arrive, or none passes. */
static hcomm_result_t barrier(hcomm_comm_t *c) {
    return barrier_as(c, false);
}

/* The barrier that closes a call whose meeting every rank passed (closing_verdict). */
static hcomm_result_t close_call(hcomm_comm_t *c) {
    return barrier_as(c, true);
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
static void post(hcomm_comm_t *c, const local_slot_t *slot, const void *data, size_t bytes) {
    unsigned n = ++lc_of(c)->posts;
    local_post_t *p = post_of(c, c->rank);
    hcomm__posted_sig_t sig = c->posted ? *c->posted : (hcomm__posted_sig_t){{0}};
    memcpy(p->words, sig.words, sizeof p->words);
    p->failed = sig.failed;
    p->failed_text = sig.failed_text;
    if (bytes)
        memcpy(p->data, data, bytes);
    shared_of(c)->slots[c->rank] = *slot;
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
            double waited = hcomm__backoff(&b);
            c->wait_peer = r; /* for the flight recorder's dump */
            if ((b.iter & 63) == 0 && atomic_load_explicit(&p->seq, memory_order_acquire) != n)
                HCOMM__TRY(
                    hcomm__local_wait_verdict(c, waited, "every rank of the group to arrive"));
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

hcomm_result_t hcomm__local_posted_only(hcomm_comm_t *c) {
    post(c, &(local_slot_t){0}, NULL, 0);
    return arrive(c);
}

const hcomm__posted_sig_t *hcomm__local_posted_sig(hcomm_comm_t *c, int rank) {
    const local_post_t *p = post_of(c, rank);
    hcomm__posted_sig_t *v = &lc_of(c)->views[rank];
    memcpy(v->words, p->words, sizeof v->words);
    v->failed = p->failed;
    v->failed_text = p->failed_text;
    return v;
}

hcomm_result_t hcomm__local_posted_release(hcomm_comm_t *c) {
    c->posted_held = false;
    return close_call(c);
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
    post(c, &(local_slot_t){0}, sendbuf, count * hcomm__dtype_size(dt));
    HCOMM__TRY(wait_posts(c));
    hcomm_result_t res = reduce_posted(c, recvbuf, 0, count, dt, op, true);
    own_next_post(c);
    return res;
}

/* Larger messages: every rank reduces its chunk (hcomm__block) of every input in rank order
 * straight into its own output, then writes it into every peer's output, and a barrier closes
 * the call (as twoshot pushes, twoshot.c). Only a chunk's owner reads that chunk of any input,
 * so its place is free once reduced, in place too: two barriers, where a pass through scratch
 * took three (docs/tuning.md: local.all-reduce-chunks). */
static hcomm_result_t local_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                       size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    size_t es = hcomm__dtype_size(dt), lo, n;
    if (count * es <= SMALL_REDUCE_BYTES)
        return small_all_reduce(c, sendbuf, recvbuf, count, dt, op);
    hcomm__block(count, c->size, c->rank, &lo, &n);
    post(c, &(local_slot_t){.send = sendbuf, .aux = recvbuf}, NULL, 0);
    HCOMM__TRY(arrive(c));
    char *mine = (char *)recvbuf + lo * es;
    hcomm_result_t red = reduce_posted(c, mine, lo, n, dt, op, false);
    for (int r = 0; red == HCOMM_OK && n > 0 && r < c->size; r++)
        if (r != c->rank)
            memcpy((char *)slot_of(c, r)->aux + lo * es, mine, n * es);
    hcomm_result_t res = close_call(c); /* every chunk written; every input read */
    return res != HCOMM_OK ? res : red;
}

/* reduce_scatter(v): this rank's n elements at element lo of every input (total elements
 * each), reduced in rank order straight into recvbuf. In place (recvbuf == sendbuf, whose
 * start peers read until the barrier) into this rank's own block of its input, which only it
 * reads, moved to the start after the barrier: as fast as the direct algorithm, where a pass
 * through scratch is not; any other overlap through scratch (docs/tuning.md:
 * local.reduce-scatter-in-place). */
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
    post(c, &(local_slot_t){.send = sendbuf}, NULL, 0);
    hcomm_result_t res = arrive(c), red = HCOMM_OK;
    if (res == HCOMM_OK) {
        red = reduce_posted(c, mine, lo, n, dt, op, false);
        res = close_call(c);
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

/* all_gather(v): this rank's block (each[rank] bytes, or equal where each is NULL) copied from
 * its input into its place in every rank's output, blocks back to back in rank order, a piece
 * to every output before the next: the piece is read from memory once, where pulling every
 * block read each one once per rank (docs/tuning.md: local.all-gather-push). */
static hcomm_result_t gather_posted(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                    const size_t *each, size_t equal) {
    post(c, &(local_slot_t){.send = sendbuf, .aux = recvbuf}, NULL, 0);
    HCOMM__TRY(arrive(c));
    size_t off = 0, total = 0, n = each ? each[c->rank] : equal;
    for (int r = 0; r < c->size; r++) {
        size_t block = each ? each[r] : equal;
        off += r < c->rank ? block : 0;
        total += block;
    }
    bool stream = total >= GATHER_STREAM_BYTES;
    for (size_t done = 0; done < n; done += GATHER_PIECE_BYTES) {
        size_t m = n - done < GATHER_PIECE_BYTES ? n - done : GATHER_PIECE_BYTES;
        const char *src = (const char *)sendbuf + done;
        for (int i = 0; i < c->size; i++) {
            char *dst = (char *)slot_of(c, (c->rank + i) % c->size)->aux + off + done;
            if (dst == src) /* in place: this block is already where it goes */
                continue;
            if (stream)
                hcomm__copy_stream(dst, src, m);
            else
                memcpy(dst, src, m);
        }
    }
    if (stream)
        hcomm__stream_fence(); /* before the closing barrier tells peers their output is whole */
    return close_call(c);
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
    post(c, &(local_slot_t){.send = buf}, NULL, 0);
    HCOMM__TRY(arrive(c));
    if (c->rank != root && bytes > 0)
        hcomm__copy_pieces(buf, slot_of(c, root)->send, bytes);
    return close_call(c);
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
                                        const size_t *rdispls, bool counts_proved) {
    (void)counts_proved; /* the posted slots compare every pair's counts anyway */
    post(c,
         &(local_slot_t){
             .send = sendbuf, .counts = sendcounts, .displs = sdispls, .rcounts = recvcounts},
         NULL, 0);
    HCOMM__TRY(arrive(c));
    hcomm_result_t bad = check_pair_counts(c);
    if (bad != HCOMM_OK) {
        hcomm_result_t r = close_call(c);
        return r != HCOMM_OK ? r : bad;
    }
    for (int s = 0; s < c->size; s++) {
        const local_slot_t *src = slot_of(c, s);
        if (src->counts[c->rank])
            memcpy((char *)recvbuf + rdispls[s], (const char *)src->send + src->displs[c->rank],
                   src->counts[c->rank]);
    }
    return close_call(c);
}

/* clang-format off */
const hcomm__native_ops_t hcomm__local_native = {
    /* reductions, in rank order */
    .all_reduce = local_all_reduce, .reduce_scatter = local_reduce_scatter,
    .reduce_scatterv = local_reduce_scatterv,
    /* moves (no rooted calls: tree and direct run them) */
    .all_gather = local_all_gather, .all_gatherv = local_all_gatherv,
    .broadcast = local_broadcast, .all_to_allv = local_all_to_allv,
};
/* clang-format on */

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
    int *ranks = malloc(sizeof *ranks * (size_t)m);
    if (!ranks) {
        hcomm__local_shared_release(sh);
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "cannot allocate a communicator");
    }
    for (int i = 0; i < m; i++)
        ranks[i] = mem[i].rank;
    hcomm_result_t res = hcomm__local_group_comm(c, sh, ranks, m, out);
    free(ranks);
    return res;
}

/* Every rank posts (color, key); the first member of each group creates the group's shared
 * state and posts it; the members pick it up. */
hcomm_result_t hcomm__local_split(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out) {
    *out = NULL;
    member_t *mem = malloc(sizeof *mem * (size_t)c->size);
    post(c, &(local_slot_t){.color = color < 0 ? -1 : color, .key = key}, NULL, 0);
    hcomm_result_t res = arrive(c);
    if (res != HCOMM_OK) {
        free(mem);
        return res;
    }
    int m = (color >= 0 && mem) ? collect_members(c, color, mem) : 0;
    if (m > 0 && mem[0].rank == c->rank)
        shared_of(c)->slots[c->rank].aux = hcomm__local_shared_new(shared_of(c)->world, m);
    res = close_call(c);
    if (res == HCOMM_OK && color >= 0) {
        local_shared_t *group = mem ? slot_of(c, mem[0].rank)->aux : NULL;
        if (!group)
            res = hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "cannot allocate a group");
        else
            res = make_member_comm(c, group, mem, m, out);
    }
    hcomm_result_t after = close_call(c); /* slots are read; they may be reused */
    free(mem);
    return res != HCOMM_OK ? res : after;
}
