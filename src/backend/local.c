/* The local backend: every rank is a thread of this process and peers share memory.
 *
 * Each communicator has one shared state (local_shared_t) that all its member threads point
 * to. Collectives post their buffer pointers in per-rank slots, meet at a barrier, and then
 * read each other's buffers directly (one copy). Reductions are computed chunk by chunk, each
 * chunk by one rank in rank order 0..n-1, so every rank gets bit-identical results and the
 * result equals a serial left-to-right reduction. Point-to-point messages are eager: a send
 * copies into a mailbox of the destination and returns; a receive matches (source, tag) in
 * arrival order. Every wait polls the world's abort flag and gives up after HCOMM_TIMEOUT
 * seconds, so a failed or missing rank turns into an error instead of a hang. */
#include "backend/backend.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How often a waiter yields its core to the ranks it waits for before it sleeps on the condition
 * variable. With more rank threads than cores, yielding lets the peer run at once, where a
 * sleep costs a futex wake-up: all_reduce latency at 8 ranks on 2 cores fell from ~350 us to
 * ~60 us with it (hcomm-bench). */
enum { SPIN_YIELDS = 100 };

typedef struct local_world {
    atomic_int aborted; /* set once any rank's function fails */
    double timeout_s;
} local_world_t;

typedef struct local_msg {
    struct local_msg *next;
    int src, tag;
    size_t bytes;
    unsigned char data[]; /* payload copy */
} local_msg_t;

/* What one rank posts for a collective; valid between the op's first and last barrier. */
typedef struct local_slot {
    int call;    /* which collective, dtype and op: peers must agree */
    size_t size; /* its element or byte count: peers must agree */
    const void *send;
    void *aux;
    const size_t *counts, *displs, *rcounts;
    int color, key;
} local_slot_t;

typedef struct local_shared {
    local_world_t *world;
    int size;
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int bar_count;
    atomic_uint bar_gen;
    local_slot_t *slots; /* [size] */
    local_msg_t **mbox;  /* [size] head of each destination's queue, arrival order */
} local_shared_t;

struct hcomm__req {
    bool is_recv;
    void *buf;
    size_t bytes;
    int peer, tag;
    local_msg_t *msg; /* matched message, if matched early */
};

static const hcomm__backend_ops_t local_ops;

static local_shared_t *shared_of(hcomm_comm_t *c) {
    return (local_shared_t *)c->impl;
}

static local_shared_t *shared_new(local_world_t *world, int size) {
    local_shared_t *sh = calloc(1, sizeof *sh);
    if (!sh)
        return NULL;
    sh->slots = calloc((size_t)size, sizeof *sh->slots);
    sh->mbox = calloc((size_t)size, sizeof *sh->mbox);
    if (!sh->slots || !sh->mbox) {
        free(sh->slots);
        free(sh->mbox);
        free(sh);
        return NULL;
    }
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&sh->cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&sh->mu, NULL);
    sh->world = world;
    sh->size = size;
    atomic_init(&sh->refs, size);
    return sh;
}

static void shared_release(local_shared_t *sh) {
    if (atomic_fetch_sub(&sh->refs, 1) != 1)
        return;
    for (int r = 0; r < sh->size; r++) {
        local_msg_t *m = sh->mbox[r];
        while (m) {
            local_msg_t *next = m->next;
            free(m);
            m = next;
        }
    }
    pthread_mutex_destroy(&sh->mu);
    pthread_cond_destroy(&sh->cv);
    free(sh->slots);
    free(sh->mbox);
    free(sh);
}

/* Waits on sh->cv (mutex held) for at most ~50 ms; fails once the world aborted or the
 * deadline passed. The short slice lets waiters notice an abort raised on another comm. */
static hcomm_result_t wait_slice(local_shared_t *sh, double deadline, const char *fn) {
    if (atomic_load(&sh->world->aborted))
        return hcomm__err(HCOMM_ERR_ABORTED, fn, "another rank failed; giving up");
    double now = hcomm__now();
    if (now > deadline) {
        /* The ranks are out of step for good: stop every other wait in this world too. */
        atomic_store(&sh->world->aborted, 1);
        return hcomm__err(HCOMM_ERR_TIMEOUT, fn,
                          "waited %g s for peers (HCOMM_TIMEOUT); a rank did not call the "
                          "matching operation",
                          sh->world->timeout_s);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 50 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
    return HCOMM_OK;
}

static double deadline_of(local_shared_t *sh) {
    return hcomm__now() + sh->world->timeout_s;
}

static hcomm_result_t local_barrier(hcomm_comm_t *c) {
    local_shared_t *sh = shared_of(c);
    double deadline = deadline_of(sh);
    hcomm_result_t res = HCOMM_OK;
    pthread_mutex_lock(&sh->mu);
    /* A rank that left an earlier barrier of an aborted world left its arrival counted; no
     * barrier may complete on such counts, so nobody arrives once the world has aborted. */
    if (atomic_load(&sh->world->aborted)) {
        pthread_mutex_unlock(&sh->mu);
        return hcomm__err(HCOMM_ERR_ABORTED, "hcomm barrier", "another rank failed; giving up");
    }
    unsigned gen = atomic_load(&sh->bar_gen);
    if (++sh->bar_count == sh->size) {
        sh->bar_count = 0;
        atomic_store(&sh->bar_gen, gen + 1);
        pthread_cond_broadcast(&sh->cv);
    } else {
        /* Ranks outnumber cores: yield to the peers we wait for before sleeping. */
        pthread_mutex_unlock(&sh->mu);
        for (int i = 0; i < SPIN_YIELDS && atomic_load(&sh->bar_gen) == gen; i++)
            sched_yield();
        pthread_mutex_lock(&sh->mu);
        while (res == HCOMM_OK && gen == atomic_load(&sh->bar_gen))
            res = wait_slice(sh, deadline, "hcomm barrier");
    }
    pthread_mutex_unlock(&sh->mu);
    return res;
}

/* --- point-to-point --- */

static hcomm_result_t check_peer(hcomm_comm_t *c, int peer, int tag, const char *fn) {
    if (peer < 0 || peer >= c->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "peer=%d outside 0..%d", peer, c->size - 1);
    if (tag < 0 || tag > HCOMM__TAG_MAX)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "tag=%d outside 0..%d", tag, HCOMM__TAG_MAX);
    return HCOMM_OK;
}

static hcomm_result_t local_send(hcomm_comm_t *c, const void *buf, size_t bytes, int peer,
                                 int tag) {
    HCOMM__TRY(check_peer(c, peer, tag, "hcomm send"));
    local_msg_t *m = malloc(sizeof *m + bytes);
    if (!m)
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm send", "cannot buffer a %zu-byte message", bytes);
    *m = (local_msg_t){.src = c->rank, .tag = tag, .bytes = bytes};
    if (bytes)
        memcpy(m->data, buf, bytes);
    local_shared_t *sh = shared_of(c);
    pthread_mutex_lock(&sh->mu);
    local_msg_t **tail = &sh->mbox[peer];
    while (*tail)
        tail = &(*tail)->next;
    *tail = m;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    return HCOMM_OK;
}

/* Unlinks the first message from (peer, tag) in this rank's mailbox; mutex held. */
static local_msg_t *take_match(local_shared_t *sh, int me, int peer, int tag) {
    for (local_msg_t **p = &sh->mbox[me]; *p; p = &(*p)->next) {
        if ((*p)->src == peer && (*p)->tag == tag) {
            local_msg_t *m = *p;
            *p = m->next;
            return m;
        }
    }
    return NULL;
}

static hcomm_result_t wait_match(hcomm_comm_t *c, int peer, int tag, local_msg_t **out) {
    local_shared_t *sh = shared_of(c);
    double deadline = deadline_of(sh);
    hcomm_result_t res = HCOMM_OK;
    pthread_mutex_lock(&sh->mu);
    for (int i = 0; i < SPIN_YIELDS && (*out = take_match(sh, c->rank, peer, tag)) == NULL; i++) {
        pthread_mutex_unlock(&sh->mu); /* as in local_barrier: let the sender run first */
        sched_yield();
        pthread_mutex_lock(&sh->mu);
    }
    while (res == HCOMM_OK && *out == NULL && (*out = take_match(sh, c->rank, peer, tag)) == NULL)
        res = wait_slice(sh, deadline, "hcomm recv");
    pthread_mutex_unlock(&sh->mu);
    return res;
}

static hcomm_result_t deliver(local_msg_t *m, void *buf, size_t bytes) {
    hcomm_result_t res = HCOMM_OK;
    if (m->bytes != bytes)
        res = hcomm__err(HCOMM_ERR_MISMATCH, "hcomm recv",
                         "peer %d sent %zu bytes with tag %d, the receive expected %zu", m->src,
                         m->bytes, m->tag, bytes);
    else if (bytes)
        memcpy(buf, m->data, bytes);
    free(m);
    return res;
}

static hcomm_result_t local_recv(hcomm_comm_t *c, void *buf, size_t bytes, int peer, int tag) {
    HCOMM__TRY(check_peer(c, peer, tag, "hcomm recv"));
    local_msg_t *m = NULL;
    HCOMM__TRY(wait_match(c, peer, tag, &m));
    return deliver(m, buf, bytes);
}

static hcomm_result_t new_req(bool is_recv, void *buf, size_t bytes, int peer, int tag,
                              hcomm__req_t **req) {
    hcomm__req_t *r = calloc(1, sizeof *r);
    if (!r)
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm irecv", "cannot allocate a request");
    *r = (hcomm__req_t){.is_recv = is_recv, .buf = buf, .bytes = bytes, .peer = peer, .tag = tag};
    *req = r;
    return HCOMM_OK;
}

static hcomm_result_t local_isend(hcomm_comm_t *c, const void *buf, size_t bytes, int peer, int tag,
                                  hcomm__req_t **req) {
    HCOMM__TRY(local_send(c, buf, bytes, peer, tag));
    return new_req(false, NULL, 0, peer, tag, req);
}

/* Matches at post time when the message is already there, so receives posted earlier take
 * earlier messages, as MPI orders them. */
static hcomm_result_t local_irecv(hcomm_comm_t *c, void *buf, size_t bytes, int peer, int tag,
                                  hcomm__req_t **req) {
    HCOMM__TRY(check_peer(c, peer, tag, "hcomm irecv"));
    HCOMM__TRY(new_req(true, buf, bytes, peer, tag, req));
    local_shared_t *sh = shared_of(c);
    pthread_mutex_lock(&sh->mu);
    (*req)->msg = take_match(sh, c->rank, peer, tag);
    pthread_mutex_unlock(&sh->mu);
    return HCOMM_OK;
}

static hcomm_result_t local_wait(hcomm_comm_t *c, hcomm__req_t *req) {
    hcomm_result_t res = HCOMM_OK;
    if (req->is_recv) {
        local_msg_t *m = req->msg;
        if (!m)
            res = wait_match(c, req->peer, req->tag, &m);
        if (res == HCOMM_OK)
            res = deliver(m, req->buf, req->bytes);
    }
    free(req);
    return res;
}

/* --- collectives over posted slots --- */

static void post(hcomm_comm_t *c, local_slot_t slot) {
    shared_of(c)->slots[c->rank] = slot; /* published to peers by the barrier that follows */
}

static const local_slot_t *slot_of(hcomm_comm_t *c, int r);

/* Identifies a collective call so ranks that called different ones (or with different sizes)
 * fail together with HCOMM_ERR_MISMATCH instead of reading each other's buffers wrongly. */
enum {
    CALL_ALL_REDUCE = 1,
    CALL_REDUCE_SCATTER,
    CALL_ALL_GATHER,
    CALL_BROADCAST,
    CALL_ALL_TO_ALLV,
    CALL_SPLIT,
    CALL_BARRIER
};

static int call_id(int kind, hcomm_dtype_t dt, hcomm_op_t op, int root) {
    return ((kind * 16 + (int)dt) * 8 + (int)op) * 4096 + root;
}

/* The barrier after posting, plus the check that every peer posted the same call. Every rank
 * sees the same slots, so either all pass or all fail (after one more barrier, so nobody
 * reposts while a peer still reads). */
static hcomm_result_t arrive(hcomm_comm_t *c, const char *fn) {
    HCOMM__TRY(local_barrier(c));
    const local_slot_t *me = slot_of(c, c->rank);
    for (int r = 0; r < c->size; r++) {
        const local_slot_t *p = slot_of(c, r);
        if (p->call != me->call || p->size != me->size) {
            hcomm_result_t res = hcomm__err(
                HCOMM_ERR_MISMATCH, fn,
                "ranks called different collectives: rank %d posted call %d size %zu, rank %d "
                "posted call %d size %zu",
                c->rank, me->call, me->size, r, p->call, p->size);
            local_barrier(c);
            return res;
        }
    }
    return HCOMM_OK;
}

static const local_slot_t *slot_of(hcomm_comm_t *c, int r) {
    return &shared_of(c)->slots[r];
}

/* Chunk [lo, hi) of rank r's share when n items are split over size ranks. */
static void chunk(size_t n, int size, int r, size_t *lo, size_t *hi) {
    size_t base = n / (size_t)size, rem = n % (size_t)size, rr = (size_t)r;
    *lo = rr * base + (rr < rem ? rr : rem);
    *hi = *lo + base + (rr < rem ? 1 : 0);
}

/* dst = slots[0].send[off..] op slots[1].send[off..] op ... in rank order. */
static void reduce_posted(hcomm_comm_t *c, void *dst, size_t off, size_t n, hcomm_dtype_t dt,
                          hcomm_op_t op) {
    size_t es = hcomm__dtype_size(dt);
    if (n == 0)
        return;
    memcpy(dst, (const char *)slot_of(c, 0)->send + off * es, n * es);
    for (int r = 1; r < c->size; r++)
        hcomm__reduce(dst, (const char *)slot_of(c, r)->send + off * es, n, dt, op);
}

static hcomm_result_t local_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                       size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    size_t es = hcomm__dtype_size(dt), lo, hi;
    chunk(count, c->size, c->rank, &lo, &hi);
    void *mine = malloc((hi - lo) * es + 1);
    if (!mine)
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_all_reduce", "cannot allocate %zu bytes",
                          (hi - lo) * es);
    post(c, (local_slot_t){.call = call_id(CALL_ALL_REDUCE, dt, op, 0),
                           .size = count,
                           .send = sendbuf,
                           .aux = mine});
    hcomm_result_t res = arrive(c, "hcomm_all_reduce");
    if (res == HCOMM_OK) {
        reduce_posted(c, mine, lo, hi - lo, dt, op);
        res = local_barrier(c); /* every chunk done; every input read */
    }
    for (int r = 0; res == HCOMM_OK && r < c->size; r++) {
        size_t rlo, rhi;
        chunk(count, c->size, r, &rlo, &rhi);
        if (rhi > rlo)
            memcpy((char *)recvbuf + rlo * es, slot_of(c, r)->aux, (rhi - rlo) * es);
    }
    if (res == HCOMM_OK)
        res = local_barrier(c); /* nobody reads my chunk any more */
    free(mine);
    return res;
}

static hcomm_result_t local_reduce_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                           size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    size_t es = hcomm__dtype_size(dt);
    void *mine = malloc(count * es + 1);
    if (!mine)
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm reduce_scatter", "cannot allocate %zu bytes",
                          count * es);
    post(c, (local_slot_t){
                .call = call_id(CALL_REDUCE_SCATTER, dt, op, 0), .size = count, .send = sendbuf});
    hcomm_result_t res = arrive(c, "hcomm_reduce_scatter");
    if (res == HCOMM_OK) {
        reduce_posted(c, mine, (size_t)c->rank * count, count, dt, op);
        res = local_barrier(c); /* inputs read: recvbuf may alias one of them */
    }
    if (res == HCOMM_OK && count > 0)
        memcpy(recvbuf, mine, count * es);
    free(mine);
    return res;
}

static hcomm_result_t local_all_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                       size_t bytes) {
    post(c,
         (local_slot_t){.call = call_id(CALL_ALL_GATHER, 0, 0, 0), .size = bytes, .send = sendbuf});
    HCOMM__TRY(arrive(c, "hcomm_all_gather"));
    for (int r = 0; r < c->size; r++) {
        char *dst = (char *)recvbuf + (size_t)r * bytes;
        if (bytes > 0 && dst != slot_of(c, r)->send) /* in place: peers read this very block */
            memmove(dst, slot_of(c, r)->send, bytes);
    }
    return local_barrier(c);
}

static hcomm_result_t local_broadcast(hcomm_comm_t *c, void *buf, size_t bytes, int root) {
    post(c,
         (local_slot_t){.call = call_id(CALL_BROADCAST, 0, 0, root), .size = bytes, .send = buf});
    HCOMM__TRY(arrive(c, "hcomm_broadcast"));
    if (c->rank != root && bytes > 0)
        memcpy(buf, slot_of(c, root)->send, bytes);
    return local_barrier(c);
}

/* Every rank sees every rank's send and receive counts, so all of them find the same first
 * mismatch and fail together before any data moves, as the mpi backend does. */
static hcomm_result_t check_all_to_allv_counts(hcomm_comm_t *c) {
    for (int r = 0; r < c->size; r++) /* by receiver first, as the mpi backend reports */
        for (int s = 0; s < c->size; s++) {
            size_t sent = slot_of(c, s)->counts[r], want = slot_of(c, r)->rcounts[s];
            if (sent != want)
                return hcomm__err(HCOMM_ERR_MISMATCH, "hcomm_all_to_allv",
                                  "rank %d sends %zu bytes to rank %d, which expects %zu; no "
                                  "data was moved",
                                  s, sent, r, want);
        }
    return HCOMM_OK;
}

static hcomm_result_t local_all_to_allv(hcomm_comm_t *c, const void *sendbuf,
                                        const size_t *sendcounts, const size_t *sdispls,
                                        void *recvbuf, const size_t *recvcounts,
                                        const size_t *rdispls) {
    post(c, (local_slot_t){.call = call_id(CALL_ALL_TO_ALLV, 0, 0, 0),
                           .send = sendbuf,
                           .counts = sendcounts,
                           .displs = sdispls,
                           .rcounts = recvcounts});
    HCOMM__TRY(arrive(c, "hcomm_all_to_allv"));
    hcomm_result_t res = check_all_to_allv_counts(c);
    for (int s = 0; res == HCOMM_OK && s < c->size; s++) {
        const local_slot_t *src = slot_of(c, s);
        if (recvcounts[s])
            memcpy((char *)recvbuf + rdispls[s], (const char *)src->send + src->displs[c->rank],
                   recvcounts[s]);
    }
    hcomm_result_t res2 = local_barrier(c); /* reached even after a mismatch: no hang */
    return res != HCOMM_OK ? res : res2;
}

/* The user-visible barrier posts a slot too, so a peer inside another collective sees it. */
static hcomm_result_t local_barrier_call(hcomm_comm_t *c) {
    post(c, (local_slot_t){.call = call_id(CALL_BARRIER, 0, 0, 0)});
    HCOMM__TRY(arrive(c, "hcomm_barrier"));
    return local_barrier(c);
}

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
    hcomm_comm_t *nc = hcomm__comm_alloc(&local_ops, sh, me, m);
    if (!nc)
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_comm_split", "cannot allocate a communicator");
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
    post(c, (local_slot_t){
                .call = call_id(CALL_SPLIT, 0, 0, 0), .color = color < 0 ? -1 : color, .key = key});
    hcomm_result_t res = arrive(c, "hcomm_comm_split");
    if (res != HCOMM_OK) {
        free(mem);
        return res;
    }
    int m = (color >= 0 && mem) ? collect_members(c, color, mem) : 0;
    if (m > 0 && mem[0].rank == c->rank)
        shared_of(c)->slots[c->rank].aux = shared_new(shared_of(c)->world, m);
    res = local_barrier(c);
    if (res == HCOMM_OK && color >= 0) {
        local_shared_t *group = mem ? slot_of(c, mem[0].rank)->aux : NULL;
        if (!group)
            res = hcomm__err(HCOMM_ERR_NOMEM, "hcomm_comm_split", "cannot allocate a group");
        else
            res = make_member_comm(c, group, mem, m, out);
    }
    hcomm_result_t after = local_barrier(c); /* slots are read; they may be reused */
    free(mem);
    return res != HCOMM_OK ? res : after;
}

static void local_destroy(hcomm_comm_t *c) {
    if (c->impl)
        shared_release(shared_of(c));
    c->impl = NULL;
}

static const hcomm__backend_ops_t local_ops = {
    .name = "local",
    .send = local_send,
    .recv = local_recv,
    .isend = local_isend,
    .irecv = local_irecv,
    .wait = local_wait,
    .all_reduce = local_all_reduce,
    .all_gather = local_all_gather,
    .reduce_scatter = local_reduce_scatter,
    .broadcast = local_broadcast,
    .all_to_allv = local_all_to_allv,
    .barrier = local_barrier_call,
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
        th[r].world = hcomm__comm_alloc(&local_ops, sh, r, n);
        if (!th[r].world) {
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
 * that only saw the abort come after the rank that caused it. */
static hcomm_result_t first_failure(const rank_thread_t *th, int n) {
    int first = -1;
    for (int r = 0; r < n; r++) {
        if (th[r].result == HCOMM_OK)
            continue;
        if (first < 0 ||
            (th[first].result == HCOMM_ERR_ABORTED && th[r].result != HCOMM_ERR_ABORTED))
            first = r;
    }
    if (first < 0)
        return HCOMM_OK;
    const char *msg = th[first].message[0] ? th[first].message : "(no hcomm error message)";
    return hcomm__err(th[first].result, "hcomm_launch", "rank %d failed with %s: %s", first,
                      hcomm_result_name(th[first].result), msg);
}

hcomm_result_t hcomm__local_launch(int n, hcomm_rank_fn_t fn, void *arg) {
    local_world_t lw = {.timeout_s = hcomm__timeout_s()};
    atomic_init(&lw.aborted, 0);
    rank_thread_t *th = calloc((size_t)n, sizeof *th);
    if (!th)
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_launch", "cannot allocate %d ranks", n);
    for (int r = 0; r < n; r++)
        th[r] = (rank_thread_t){.fn = fn, .arg = arg, .lw = &lw, .result = HCOMM_OK};
    hcomm_result_t res = make_world(&lw, n, th);
    if (res == HCOMM_OK)
        res = run_threads(th, n);
    if (res == HCOMM_OK)
        res = first_failure(th, n);
    for (int r = 0; r < n; r++)
        hcomm__comm_free(th[r].world);
    free(th);
    return res;
}
