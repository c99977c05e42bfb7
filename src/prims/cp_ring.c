/* The ring exchange of ring attention (Liu et al. 2023; Megatron-Core / Transformer Engine
 * cp_comm_type "p2p"): each step moves every rank's current chunk one hop around the CP group
 * while the caller computes on it. A step is an all_to_allv with one nonzero block each way
 * (to the next rank, from the previous), queued on the group's worker, so it is a collective
 * with the library's checks and failure joins and it progresses without the caller. */
#include "prims/cp_common.h"

#include <string.h>

struct hcomm_cp_ring {
    hcomm_comm_t *g;
    hcomm_tensor_t chunk; /* dtype and shape; data unused */
    size_t bytes;
    void *buf[2];
    size_t *counts; /* [4][p]: send counts, send displacements, receive counts, displacements */
    hcomm_request_t *req;
    int into; /* the buffer the started step receives into */
    bool started;
};

/* What the worker runs: the step's all_to_allv on the group's duplicate. */
typedef struct ring_step {
    const hcomm_cp_ring_t *ring;
    const void *send;
    void *recv;
} ring_step_t;

static hcomm_result_t run_step(hcomm_comm_t *g, void *p) {
    const ring_step_t *s = p;
    const size_t *c = s->ring->counts, n = (size_t)g->size;
    return hcomm__coll_all_to_allv(g, s->send, c, c + n, s->recv, c + 2 * n, c + 3 * n, false);
}

static hcomm_result_t check_create(hcomm_comm_t *g, const hcomm_tensor_t *chunk, int direction,
                                   hcomm_cp_ring_t **ring) {
    const char *fn = "hcomm_cp_ring_create";
    if (ring == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'ring' is NULL");
    *ring = NULL;
    HCOMM__TRY(hcomm__tensor_check(fn, "chunk", chunk, NULL));
    if (direction != HCOMM_CP_RING_FORWARD && direction != HCOMM_CP_RING_BACKWARD)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "direction=%d is not HCOMM_CP_RING_FORWARD (0) or "
                          "HCOMM_CP_RING_BACKWARD (1)",
                          direction);
    (void)g;
    return HCOMM_OK;
}

/* The ring's buffers and its all_to_allv's counts: one block to `to`, one from `from`. */
static hcomm_result_t ring_alloc(hcomm_comm_t *g, const hcomm_tensor_t *chunk, int direction,
                                 hcomm_cp_ring_t **out) {
    const char *fn = "hcomm_cp_ring_create";
    hcomm_cp_ring_t *r = calloc(1, sizeof *r);
    size_t p = (size_t)g->size, bytes = hcomm__tensor_bytes(chunk);
    if (r) {
        r->buf[0] = malloc(bytes ? bytes : 1);
        r->buf[1] = malloc(bytes ? bytes : 1);
        r->counts = calloc(4 * p, sizeof *r->counts);
    }
    if (!r || !r->buf[0] || !r->buf[1] || !r->counts) {
        hcomm_cp_ring_destroy(r);
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for a ring of %zu-byte chunks",
                          bytes);
    }
    int step = direction == HCOMM_CP_RING_FORWARD ? 1 : g->size - 1;
    int to = (g->rank + step) % g->size, from = (g->rank + g->size - step) % g->size;
    r->counts[to] = bytes;
    r->counts[2 * p + (size_t)from] = bytes;
    *r = (hcomm_cp_ring_t){.g = g,
                           .chunk = *chunk,
                           .bytes = bytes,
                           .buf = {r->buf[0], r->buf[1]},
                           .counts = r->counts};
    r->chunk.data = NULL;
    *out = r;
    return HCOMM_OK;
}

static hcomm_result_t ring_create(hcomm_comm_t *g, const hcomm_tensor_t *chunk, int direction,
                                  hcomm_cp_ring_t **ring) {
    CP_CHECK(g, check_create(g, chunk, direction, ring));
    cp_desc_t mine = hcomm__cp_desc(chunk, direction, 0, 0);
    HCOMM__TRY(hcomm__cp_agree(g, g->call_fn, &mine, "chunk", "direction"));
    return ring_alloc(g, chunk, direction, ring);
}

hcomm_result_t hcomm_cp_ring_create(hcomm_comm_t *group, const hcomm_tensor_t *chunk, int direction,
                                    hcomm_cp_ring_t **ring) {
    HCOMM__CHECK_NULL(group);
    hcomm__enter(group, __func__);
    return hcomm__leave(group, ring_create(group, chunk, direction, ring));
}

/* cur must be shaped as the chunk, and be a ring buffer or share no byte with either. */
static hcomm_result_t check_cur(const hcomm_cp_ring_t *r, const hcomm_tensor_t *cur) {
    const char *fn = "hcomm_cp_ring_start";
    HCOMM__TRY(hcomm__tensor_check(fn, "cur", cur, NULL));
    HCOMM__TRY(hcomm__same_dtype(fn, "cur", cur, "the ring's chunk", &r->chunk));
    HCOMM__TRY(hcomm__cp_shape_as(fn, "cur", cur, &r->chunk, -1, 0, -1, 0));
    for (int i = 0; i < 2; i++)
        if (cur->data != r->buf[i] && hcomm__overlaps(cur->data, r->bytes, r->buf[i], r->bytes))
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                              "cur->data overlaps the ring's buffer %d without being it", i);
    return HCOMM_OK;
}

static hcomm_result_t ring_start(hcomm_cp_ring_t *r, const hcomm_tensor_t *cur) {
    hcomm_comm_t *g = r->g;
    hcomm_result_t chk = check_cur(r, cur);
    if (chk != HCOMM_OK)
        return hcomm__icoll_fail_now(g, chk);
    r->into = cur->data == r->buf[0] ? 1 : 0;
    r->started = true;
    if (g->size == 1) { /* the identity: the step hands back a copy */
        if (r->bytes)
            memcpy(r->buf[r->into], cur->data, r->bytes);
        return HCOMM_OK;
    }
    ring_step_t s = {r, cur->data, r->buf[r->into]};
    hcomm_result_t res = hcomm__icall(g, run_step, &s, sizeof s, &r->req);
    r->started = res == HCOMM_OK;
    return res;
}

hcomm_result_t hcomm_cp_ring_start(hcomm_cp_ring_t *ring, const hcomm_tensor_t *cur) {
    HCOMM__CHECK_NULL(ring);
    if (ring->started)
        return hcomm__err(HCOMM_ERR_STATE, __func__,
                          "a step is already started on this ring; call hcomm_cp_ring_wait "
                          "before starting the next");
    hcomm__enter(ring->g, __func__);
    return hcomm__leave(ring->g, ring_start(ring, cur));
}

hcomm_result_t hcomm_cp_ring_wait(hcomm_cp_ring_t *ring, hcomm_tensor_t *next) {
    HCOMM__CHECK_NULL(ring);
    HCOMM__CHECK_NULL(next);
    next->data = NULL;
    if (!ring->started)
        return hcomm__err(HCOMM_ERR_STATE, __func__,
                          "no step started on this ring; call hcomm_cp_ring_start first");
    hcomm_request_t *q = ring->req;
    ring->req = NULL;
    ring->started = false;
    HCOMM__TRY(q ? hcomm__request_wait(q) : HCOMM_OK);
    *next = ring->chunk;
    next->data = ring->buf[ring->into];
    return HCOMM_OK;
}

hcomm_result_t hcomm_cp_ring_step(hcomm_cp_ring_t *ring, const hcomm_tensor_t *cur,
                                  hcomm_tensor_t *next) {
    HCOMM__CHECK_NULL(next);
    HCOMM__TRY(hcomm_cp_ring_start(ring, cur));
    return hcomm_cp_ring_wait(ring, next);
}

hcomm_result_t hcomm_cp_ring_destroy(hcomm_cp_ring_t *ring) {
    if (ring == NULL)
        return HCOMM_OK;
    hcomm_result_t res = ring->req ? hcomm__request_wait(ring->req) : HCOMM_OK;
    free(ring->buf[0]);
    free(ring->buf[1]);
    free(ring->counts);
    free(ring);
    return res;
}
