/* Pipeline point-to-point: rings, pairs in every call order, tags, mismatches. HCOMM_TEST_MPI
 * Every rank can compute what any peer sends from (sender, message number, index). Messages
 * are small so a blocking send completes eagerly where a test needs it (tag reordering). */
#include "harness.h"

#include <stdbool.h>

#define MAX_WORLD 8

/* Byte i of message msg from rank src: differs by sender, message and position. */
static uint8_t byte_of(int src, int msg, size_t i) {
    return (uint8_t)(src * 41 + msg * 13 + (int)i * 7 + 1);
}

static size_t nbytes(const hcomm_tensor_t *t) {
    size_t n = 0;
    hcomm_dtype_size(t->dtype, &n);
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

/* A tensor of dt and shape; filled as message msg of rank src, or zeroed when src < 0. */
static hcomm_tensor_t make(hcomm_dtype_t dt, int ndim, const int64_t *shape, int src, int msg) {
    hcomm_tensor_t t;
    hcomm_tensor_init(&t, NULL, dt, ndim, shape);
    size_t n = nbytes(&t);
    uint8_t *b = calloc(n + 1, 1);
    for (size_t i = 0; src >= 0 && i < n; i++)
        b[i] = byte_of(src, msg, i);
    t.data = b;
    return t;
}

/* Checks t holds message msg of rank src byte for byte. */
static void expect_msg(const hcomm_tensor_t *t, int src, int msg, const char *what) {
    size_t n = nbytes(t), bad = n;
    const uint8_t *b = t->data;
    for (size_t i = 0; i < n && bad == n; i++)
        if (b[i] != byte_of(src, msg, i))
            bad = i;
    T_CHECK(bad == n, "%s: byte %zu of message %d from rank %d is %d, expected %d", what, bad, msg,
            src, bad < n ? b[bad] : 0, bad < n ? byte_of(src, msg, bad) : 0);
}

static const int64_t SHAPE_A[3] = {3, 2, 5}, SHAPE_EMPTY[2] = {4, 0};

/* Rank 0 sends first, every other rank receives first: a ring of blocking calls that cannot
 * deadlock. Every dtype, a 3-D and a 0-element tensor. */
static void test_ring(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g), next = (rank + 1) % p, prev = (rank + p - 1) % p;
    if (p < 2)
        return;
    for (int dt = 0; dt < HCOMM_DTYPE_COUNT; dt++)
        for (int e = 0; e < 2; e++) {
            const int64_t *shape = e ? SHAPE_EMPTY : SHAPE_A;
            int nd = e ? 2 : 3;
            hcomm_tensor_t s = make((hcomm_dtype_t)dt, nd, shape, rank, dt);
            hcomm_tensor_t r = make((hcomm_dtype_t)dt, nd, shape, -1, 0);
            if (rank == 0)
                T_OK(hcomm_pp_send(g, &s, next, dt));
            T_OK(hcomm_pp_recv(g, &r, prev, dt));
            if (rank != 0)
                T_OK(hcomm_pp_send(g, &s, next, dt));
            expect_msg(&r, prev, dt, "ring send/recv");
            free(s.data);
            free(r.data);
        }
}

/* Every rank sends forward and receives from behind at the same time. */
static void test_ring_send_recv(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g), next = (rank + 1) % p, prev = (rank + p - 1) % p;
    if (p < 2)
        return;
    for (int dt = 0; dt < HCOMM_DTYPE_COUNT; dt++) {
        hcomm_tensor_t s = make((hcomm_dtype_t)dt, 3, SHAPE_A, rank, 100 + dt);
        hcomm_tensor_t r = make((hcomm_dtype_t)dt, 3, SHAPE_A, -1, 0);
        T_OK(hcomm_pp_send_recv(g, &s, next, 7, &r, prev, 7));
        expect_msg(&r, prev, 100 + dt, "ring send_recv");
        free(s.data);
        free(r.data);
    }
}

/* Pairs (0,1), (2,3), ...: one side calls send_recv, the other send_recv, recv-then-send or
 * send-then-recv; then the roles swap. None of these orders may deadlock. */
static void test_pairs(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g), partner = rank ^ 1;
    if (partner >= p)
        return;
    for (int order = 0; order < 6; order++) {
        bool plain = (rank % 2) == (order < 3 ? 1 : 0) && order % 3 != 0;
        hcomm_tensor_t s = make(HCOMM_F32, 3, SHAPE_A, rank, 200 + order);
        hcomm_tensor_t r = make(HCOMM_F32, 3, SHAPE_A, -1, 0);
        if (!plain) {
            T_OK(hcomm_pp_send_recv(g, &s, partner, 3, &r, partner, 3));
        } else if (order % 3 == 1) {
            T_OK(hcomm_pp_recv(g, &r, partner, 3));
            T_OK(hcomm_pp_send(g, &s, partner, 3));
        } else {
            T_OK(hcomm_pp_send(g, &s, partner, 3));
            T_OK(hcomm_pp_recv(g, &r, partner, 3));
        }
        expect_msg(&r, partner, 200 + order, "pair exchange");
        free(s.data);
        free(r.data);
    }
}

/* A pipeline step: the first stage only sends, the last only receives (skipped sides). */
static void test_pipeline_skip_sides(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g);
    hcomm_tensor_t s = make(HCOMM_BF16, 3, SHAPE_A, rank, 300);
    hcomm_tensor_t r = make(HCOMM_BF16, 3, SHAPE_A, -1, 0);
    bool first = rank == 0, last = rank == p - 1;
    T_OK(hcomm_pp_send_recv(g, last ? NULL : &s, last ? 5 : rank + 1, 0, &r, first ? -1 : rank - 1,
                            0));
    if (!first)
        expect_msg(&r, rank - 1, 300, "pipeline forward");
    /* Gradients go back: the last stage only sends, the first only receives. */
    for (size_t i = 0; i < nbytes(&s); i++)
        ((uint8_t *)s.data)[i] = byte_of(rank, 301, i);
    T_OK(hcomm_pp_send_recv(g, &s, first ? -1 : rank - 1, HCOMM_PP_TAG_MAX, last ? NULL : &r,
                            last ? -1 : rank + 1, HCOMM_PP_TAG_MAX));
    if (!last)
        expect_msg(&r, rank + 1, 301, "pipeline backward");
    free(s.data);
    free(r.data);
}

/* Tags are separate streams: two messages on tags 5 and 6, taken 6 first. */
static void test_tags(hcomm_comm_t *g) {
    int rank = t_rank(g);
    if (t_size(g) < 2 || rank > 1)
        return;
    const int64_t small[1] = {3};
    hcomm_tensor_t a = make(HCOMM_I32, 3, SHAPE_A, rank, 5), b = make(HCOMM_I64, 1, small, rank, 6);
    if (rank == 0) {
        T_OK(hcomm_pp_send(g, &a, 1, 5));
        T_OK(hcomm_pp_send(g, &b, 1, 6));
    } else {
        hcomm_tensor_t ra = make(HCOMM_I32, 3, SHAPE_A, -1, 0);
        hcomm_tensor_t rb = make(HCOMM_I64, 1, small, -1, 0);
        T_OK(hcomm_pp_recv(g, &rb, 0, 6));
        T_OK(hcomm_pp_recv(g, &ra, 0, 5));
        expect_msg(&rb, 0, 6, "tag 6 taken first");
        expect_msg(&ra, 0, 5, "tag 5 taken second");
        free(ra.data);
        free(rb.data);
    }
    free(a.data);
    free(b.data);
}

/* One mismatched receive of message msg: fails with the text given and drains it, so the
 * next message (msg + 1, same descriptor) arrives intact. */
static void expect_mismatch(hcomm_comm_t *g, int msg, hcomm_tensor_t *sent, hcomm_tensor_t *want,
                            const char *text) {
    hcomm_tensor_t next = make(sent->dtype, sent->ndim, sent->shape, 0, msg + 1);
    if (t_rank(g) == 0) {
        T_OK(hcomm_pp_send(g, sent, 1, 9));
        T_OK(hcomm_pp_send(g, &next, 1, 9));
    } else {
        T_ERR(hcomm_pp_recv(g, want, 0, 9), HCOMM_ERR_MISMATCH);
        T_CHECK(strcmp(hcomm_last_error(), text) == 0, "got '%s', expected '%s'",
                hcomm_last_error(), text);
        memset(next.data, 0, nbytes(&next));
        T_OK(hcomm_pp_recv(g, &next, 0, 9));
        expect_msg(&next, 0, msg + 1, "message after a mismatch");
    }
    free(next.data);
}

static void test_mismatch(hcomm_comm_t *g) {
    int rank = t_rank(g);
    if (t_size(g) < 2 || rank > 1)
        return;
    const int64_t s48[2] = {4, 8}, s49[2] = {4, 9}, s22[2] = {2, 2}, s0[1] = {0}, s32[1] = {32};
    hcomm_tensor_t sent = make(HCOMM_F32, 2, s48, rank, 400);
    hcomm_tensor_t w49 = make(HCOMM_F32, 2, s49, -1, 0), w22 = make(HCOMM_F32, 2, s22, -1, 0);
    hcomm_tensor_t wi = make(HCOMM_I32, 2, s48, -1, 0), w0 = make(HCOMM_F32, 1, s0, -1, 0);
    hcomm_tensor_t w32 = make(HCOMM_F32, 1, s32, -1, 0);
    expect_mismatch(g, 400, &sent, &w49,
                    "hcomm_pp_recv: peer 0 sent f32 [4, 8], expected f32 [4, 9]");
    expect_mismatch(g, 400, &sent, &w22,
                    "hcomm_pp_recv: peer 0 sent f32 [4, 8], expected f32 [2, 2]");
    expect_mismatch(g, 400, &sent, &wi,
                    "hcomm_pp_recv: peer 0 sent f32 [4, 8], expected i32 [4, 8]");
    expect_mismatch(g, 400, &sent, &w0, "hcomm_pp_recv: peer 0 sent f32 [4, 8], expected f32 [0]");
    expect_mismatch(g, 400, &sent, &w32,
                    "hcomm_pp_recv: peer 0 sent f32 [4, 8], expected f32 [32]");
    hcomm_tensor_t empty = make(HCOMM_U8, 1, s0, rank, 401);
    hcomm_tensor_t wu = make(HCOMM_U8, 2, s22, -1, 0);
    expect_mismatch(g, 401, &empty, &wu, "hcomm_pp_recv: peer 0 sent u8 [0], expected u8 [2, 2]");
    free(sent.data);
    free(w49.data);
    free(w22.data);
    free(wi.data);
    free(w0.data);
    free(w32.data);
    free(empty.data);
    free(wu.data);
}

static void expect_error_text(const char *want) {
    T_CHECK(strstr(hcomm_last_error(), want) != NULL, "last error '%s' lacks '%s'",
            hcomm_last_error(), want);
}

/* Argument errors fail before any message moves. */
static void test_errors(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g), other = (rank + 1) % p;
    hcomm_tensor_t t = make(HCOMM_F32, 3, SHAPE_A, rank, 0);
    T_ERR(hcomm_pp_send(g, &t, rank, 0), HCOMM_ERR_INVALID_ARG);
    expect_error_text("hcomm_pp_send: peer=");
    T_ERR(hcomm_pp_recv(g, &t, p, 0), HCOMM_ERR_INVALID_ARG);
    expect_error_text("outside 0..");
    T_ERR(hcomm_pp_recv(g, &t, -1, 0), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_pp_send(g, &t, other, -1), HCOMM_ERR_INVALID_ARG);
    if (p > 1) {
        T_ERR(hcomm_pp_send(g, &t, other, HCOMM_PP_TAG_MAX + 1), HCOMM_ERR_INVALID_ARG);
        expect_error_text("tag=1073741824 outside 0..1073741823");
        T_ERR(hcomm_pp_send_recv(g, &t, other, 0, &t, rank, 0), HCOMM_ERR_INVALID_ARG);
        expect_error_text("hcomm_pp_send_recv: recv_peer=");
    }
    T_ERR(hcomm_pp_send(NULL, &t, other, 0), HCOMM_ERR_NULL);
    T_ERR(hcomm_pp_recv(g, NULL, other, 0), HCOMM_ERR_NULL);
    hcomm_tensor_t nodata = t;
    nodata.data = NULL;
    T_ERR(hcomm_pp_send(g, &nodata, other, 0), HCOMM_ERR_NULL);
    expect_error_text("t->data is NULL with 30 elements");
    /* Both sides skipped: nothing to do. */
    T_OK(hcomm_pp_send_recv(g, NULL, -1, 0, NULL, -1, 0));
    free(t.data);
}

static hcomm_result_t pp_world(hcomm_comm_t *world, void *arg) {
    (void)arg;
    test_ring(world);
    test_ring_send_recv(world);
    test_pairs(world);
    test_pipeline_skip_sides(world);
    test_tags(world);
    test_mismatch(world);
    test_errors(world);
    return hcomm_barrier(world);
}

int main(void) {
    t_for_each_world(pp_world, NULL, MAX_WORLD);
    return t_finish("test_pp");
}
