/* Scratch buffers of MoE dispatch and combine, kept per EP group and reused across calls.
 * Large buffers that are malloc'ed and freed per call come from fresh mmap'ed pages each time,
 * and zeroing those pages in the kernel cost more than moving the rows (docs/tuning.md:
 * moe.scratch-pool). A pool keeps up to POOL_SLOTS freed buffers and hands out the smallest one
 * that fits. Handles hold a reference, so a handle freed after its group still returns its
 * buffers safely. Where peers read the received rows in place only from hcomm_mem_alloc memory
 * (mpi on one node: hcomm__coll_wants_shared), large buffers come from there. */
#include "prims/moe_common.h"

#include <pthread.h>
#include <string.h>

enum { POOL_SLOTS = 12, HEADER = 64 };
/* Buffers from hcomm_mem_alloc start a page in (its pages are aligned), the header before. */
#define SHARED_LEAD ((size_t)4096)
#define SHARED_MIN_BYTES ((size_t)1 << 20)

typedef struct pooled {
    void *p;
    size_t cap;
} pooled_t;

struct hcomm__moe_pool {
    pthread_mutex_t mu;
    int refs;
    int nfree;
    bool shared; /* large buffers from hcomm_mem_alloc */
    pooled_t free[POOL_SLOTS];
};

/* Buffers carry their capacity and where they came from in a header in front of the data
 * (64 bytes: alignment). */
typedef struct header {
    size_t cap;
    bool shared;
} header_t;

static header_t header_of(const void *p) {
    header_t h;
    memcpy(&h, (const char *)p - HEADER, sizeof h);
    return h;
}

static size_t cap_of(const void *p) {
    return header_of(p).cap;
}

static void release(void *p) {
    if (header_of(p).shared)
        hcomm_mem_free((char *)p - SHARED_LEAD);
    else
        free((char *)p - HEADER);
}

void hcomm__moe_pool_share(hcomm__moe_pool_t *pool, bool shared) {
    pthread_mutex_lock(&pool->mu);
    pool->shared = shared;
    pthread_mutex_unlock(&pool->mu);
}

/* A new buffer of cap bytes with its header; NULL without memory. */
static void *allocate(size_t cap, bool shared) {
    char *raw = NULL;
    shared = shared && cap >= SHARED_MIN_BYTES;
    if (shared ? hcomm_mem_alloc(cap + SHARED_LEAD, (void **)&raw) != HCOMM_OK
               : posix_memalign((void **)&raw, HEADER, cap + HEADER) != 0)
        return NULL;
    char *data = raw + (shared ? SHARED_LEAD : HEADER);
    header_t h = {cap, shared};
    memcpy(data - HEADER, &h, sizeof h);
    return data;
}

static void pool_destroy(hcomm__moe_pool_t *pool) {
    for (int i = 0; i < pool->nfree; i++)
        release(pool->free[i].p);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

void hcomm__moe_pool_unref(hcomm__moe_pool_t *pool) {
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->mu);
    bool last = --pool->refs == 0;
    pthread_mutex_unlock(&pool->mu);
    if (last)
        pool_destroy(pool);
}

static void unref_layer(void *pool) {
    hcomm__moe_pool_unref(pool);
}

void hcomm__moe_pool_ref(hcomm__moe_pool_t *pool) {
    pthread_mutex_lock(&pool->mu);
    pool->refs++;
    pthread_mutex_unlock(&pool->mu);
}

hcomm__moe_pool_t *hcomm__moe_pool_of(hcomm_comm_t *c) {
    if (c->layer[HCOMM__LAYER_MOE])
        return c->layer[HCOMM__LAYER_MOE];
    hcomm__moe_pool_t *pool = calloc(1, sizeof *pool);
    if (pool == NULL)
        return NULL;
    pthread_mutex_init(&pool->mu, NULL);
    pool->refs = 1; /* the group's */
    c->layer[HCOMM__LAYER_MOE] = pool;
    c->layer_free[HCOMM__LAYER_MOE] = unref_layer;
    return pool;
}

/* Takes the smallest free buffer of at least bytes (-1: none). Called with mu held. */
static int best_fit(const hcomm__moe_pool_t *pool, size_t bytes) {
    int best = -1;
    for (int i = 0; i < pool->nfree; i++)
        if (pool->free[i].cap >= bytes && (best < 0 || pool->free[i].cap < pool->free[best].cap))
            best = i;
    return best;
}

hcomm_result_t hcomm__moe_pool_get(hcomm__moe_pool_t *pool, const char *fn, size_t bytes,
                                   void **out) {
    pthread_mutex_lock(&pool->mu);
    int i = best_fit(pool, bytes);
    bool shared = pool->shared;
    if (i >= 0) {
        *out = pool->free[i].p;
        pool->free[i] = pool->free[--pool->nfree];
    }
    pthread_mutex_unlock(&pool->mu);
    if (i >= 0)
        return HCOMM_OK;
    /* An eighth more than asked, so batches that grow a little still reuse it. */
    size_t cap = bytes + bytes / 8 + 64;
    *out = cap < bytes ? NULL : allocate(cap, shared);
    if (*out == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory allocating %zu bytes of scratch",
                          bytes);
    return HCOMM_OK;
}

void hcomm__moe_pool_put(hcomm__moe_pool_t *pool, void *p) {
    if (p == NULL)
        return;
    pthread_mutex_lock(&pool->mu);
    pooled_t in = {p, cap_of(p)};
    if (pool->nfree < POOL_SLOTS) {
        pool->free[pool->nfree++] = in;
        in.p = NULL;
    } else { /* full: keep the larger buffers, which cost most to fault in again */
        int small = 0;
        for (int i = 1; i < pool->nfree; i++)
            if (pool->free[i].cap < pool->free[small].cap)
                small = i;
        if (pool->free[small].cap < in.cap) {
            pooled_t out = pool->free[small];
            pool->free[small] = in;
            in = out;
        }
    }
    pthread_mutex_unlock(&pool->mu);
    if (in.p)
        release(in.p);
}
