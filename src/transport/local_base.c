/* The bottom of the local transport (local_base.h): the state the ranks of a communicator
 * share and each rank's view of it, created and freed here; and the verdict every wait asks for:
 * the world's abort flag, the comm's hcomm_comm_abort() flag and its timeout, so a failed or
 * missing rank turns into an error instead of a hang. */
#include "transport/local_base.h"

/* --- state --- */

local_shared_t *hcomm__local_shared_new(local_world_t *world, int size) {
    local_shared_t *sh = hcomm__calloc_lines(1, sizeof *sh);
    if (!sh)
        return NULL;
    sh->slots = hcomm__calloc_lines((size_t)size, sizeof *sh->slots);
    sh->posts = hcomm__calloc_lines(2 * (size_t)size, sizeof *sh->posts);
    sh->rings = calloc((size_t)size * (size_t)size, sizeof *sh->rings);
    sh->ft = hcomm__calloc_lines((size_t)size, sizeof *sh->ft);
    if (!sh->slots || !sh->posts || !sh->rings || !sh->ft) {
        free(sh->ft);
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

/* Frees a pair's chain of rings and their undelivered heap payloads (the comm is going away). */
static void ring_free(ring_t *r) {
    while (r) {
        ring_t *next = atomic_load(&r->next);
        for (size_t i = atomic_load(&r->head); i != atomic_load(&r->tail); i++)
            free(r->slot[i % RING_SLOTS].heap);
        free(r);
        r = next;
    }
}

void hcomm__local_shared_release(local_shared_t *sh) {
    if (atomic_fetch_sub(&sh->refs, 1) != 1)
        return;
    for (int i = 0; i < sh->size * sh->size; i++)
        ring_free(atomic_load(&sh->rings[i]));
    free(sh->slots);
    free(sh->posts);
    free(sh->ft);
    free((void *)sh->rings);
    free(sh);
}

/* Frees one rank's view (the rings it pushes to belong to the shared state). */
static void lc_free(local_comm_t *lc) {
    free(lc->scratch.p);
    free(lc->tx);
    free(lc);
}

static local_comm_t *lc_new(local_shared_t *sh, int size) {
    local_comm_t *lc = hcomm__calloc_lines(1, sizeof *lc + (size_t)size * sizeof lc->views[0]);
    if (!lc)
        return NULL;
    lc->sh = sh;
    lc->tx = calloc((size_t)size, sizeof *lc->tx);
    if (!lc->tx) {
        lc_free(lc);
        return NULL;
    }
    return lc;
}

hcomm_comm_t *hcomm__local_comm_new(const hcomm__transport_t *tr, local_shared_t *sh, int rank,
                                    int size, const hcomm_comm_t *parent) {
    local_comm_t *lc = lc_new(sh, size);
    hcomm_comm_t *c = lc ? hcomm__comm_alloc(tr, lc, rank, size, parent) : NULL;
    if (!c && lc)
        lc_free(lc);
    return c;
}

hcomm_result_t hcomm__local_group_comm(hcomm_comm_t *c, local_shared_t *sh, const int *ranks, int n,
                                       hcomm_comm_t **out) {
    int me = 0;
    while (ranks[me] != c->rank)
        me++;
    hcomm_comm_t *nc = hcomm__local_comm_new(c->tr, sh, me, n, c);
    if (!nc) {
        hcomm__local_shared_release(sh);
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "cannot allocate a communicator");
    }
    for (int i = 0; i < n; i++)
        nc->world_ranks[i] = c->world_ranks[ranks[i]];
    *out = nc;
    return HCOMM_OK;
}

void hcomm__local_destroy(hcomm_comm_t *c) {
    local_comm_t *lc = lc_of(c);
    if (!lc)
        return;
    hcomm__local_shared_release(lc->sh);
    lc_free(lc);
    c->impl = NULL;
}

/* --- waiting --- */

hcomm_result_t hcomm__local_wait_verdict(hcomm_comm_t *c, double waited, const char *what) {
    if (c->idle)
        c->idle(c);
    if (atomic_load_explicit(&shared_of(c)->world->aborted, memory_order_relaxed))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "another rank failed or timed out while this rank waited for %s", what);
    if (atomic_load_explicit(&c->aborted, memory_order_relaxed)) {
        /* Its arrival may stay counted in a barrier: no member may rely on the group now. */
        atomic_store(&shared_of(c)->aborted, atomic_load(&c->aborted));
        return hcomm__own_abort_error(c);
    }
    int how = atomic_load_explicit(&shared_of(c)->aborted, memory_order_relaxed);
    if (how == HCOMM__REVOKE_CALLED)
        return hcomm__err(HCOMM_ERR_REVOKED, c->call_fn,
                          "a member of this group revoked it (hcomm_comm_revoke) while this rank "
                          "waited for %s",
                          what);
    if (how)
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "a member of this group called hcomm_comm_abort() while it waited for %s",
                          what);
    HCOMM__TRY(hcomm__lost_verdict(c, -1));
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
