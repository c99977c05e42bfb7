/* Point-to-point conformance of hcomm's p2p layer (p2p.h) on the user channel: send, recv,
 * isend, irecv and wait, plus split, for world sizes 1..8 (local) or the MPI world
 * (HCOMM_TEST_MPI: also runs under mpirun with HCOMM_BACKEND=mpi). */
#include "p2p/p2p.h"
#include "harness.h"

#include <stdint.h>

/* The old backend-level calls, now over hcomm's p2p layer on the user channel. */
#define HCOMM__TAG_MAX 0x3fffffff /* any int tag works: tags live in the envelope */
static hcomm_result_t t_send(hcomm_comm_t *c, const void *b, size_t n, int peer, int tag) {
    return hcomm__send(c, HCOMM__CH_USER, tag, peer, b, n, NULL);
}
static hcomm_result_t t_recv(hcomm_comm_t *c, void *b, size_t n, int peer, int tag) {
    return hcomm__recv(c, HCOMM__CH_USER, tag, peer, b, n, HCOMM__RECV_EXACT, NULL);
}
static hcomm_result_t t_isend(hcomm_comm_t *c, const void *b, size_t n, int peer, int tag,
                              hcomm__req_t **r) {
    return hcomm__isend(c, HCOMM__CH_USER, tag, peer, b, n, NULL, r);
}
static hcomm_result_t t_irecv(hcomm_comm_t *c, void *b, size_t n, int peer, int tag,
                              hcomm__req_t **r) {
    return hcomm__irecv(c, HCOMM__CH_USER, tag, peer, b, n, HCOMM__RECV_EXACT, r);
}
static hcomm_result_t t_wait(hcomm_comm_t *c, hcomm__req_t *r) {
    (void)c;
    return hcomm__wait(r, NULL, NULL);
}

/* Expects a receive to fail with HCOMM_ERR_MISMATCH and say so in the last error. */
#define R_MISMATCH(call)                                                                           \
    do {                                                                                           \
        hcomm_result_t r_mm_ = (call);                                                             \
        T_CHECK(r_mm_ == HCOMM_ERR_MISMATCH, "%s returned %s, expected HCOMM_ERR_MISMATCH", #call, \
                hcomm_result_name(r_mm_));                                                         \
        T_CHECK(hcomm_last_error()[0] != '\0', "%s failed without a message", #call);              \
        if (r_mm_ != HCOMM_ERR_MISMATCH && r_mm_ != HCOMM_OK)                                      \
            return r_mm_;                                                                          \
    } while (0)

static int next_of(const hcomm_comm_t *c) {
    return (c->rank + 1) % c->size;
}

static int prev_of(const hcomm_comm_t *c) {
    return (c->rank + c->size - 1) % c->size;
}

/* Payload word j of message m sent by rank r: distinct per sender, message and position. */
static int32_t word(int r, int m, size_t j) {
    return (int32_t)(r * 1000003 + m * 7919 + (int)j);
}

static void fill(int32_t *buf, size_t n, int r, int m) {
    for (size_t j = 0; j < n; j++)
        buf[j] = word(r, m, j);
}

/* Checks a received payload; reports the first wrong word only. */
static void expect_words(const int32_t *buf, size_t n, int r, int m, const char *what, int size) {
    size_t j = 0;
    while (j < n && buf[j] == word(r, m, j))
        j++;
    int got = j < n ? (int)buf[j] : 0, want = j < n ? (int)word(r, m, j) : 0;
    T_CHECK(j == n, "%s (world %d): word %zu of message %d from rank %d is %d, expected %d", what,
            size, j, m, r, got, want);
}

/* Ring with blocking calls: odd ranks receive first, so no rank waits on a send whose
 * receiver is itself sending (the message is small, so a send to self completes too). */
static hcomm_result_t ring_blocking(hcomm_comm_t *c) {
    enum { N = 64 };
    int32_t out[N], in[N] = {0};
    fill(out, N, c->rank, 1);
    if (c->rank % 2 == 1)
        T_TRY(t_recv(c, in, sizeof in, prev_of(c), 3));
    T_TRY(t_send(c, out, sizeof out, next_of(c), 3));
    if (c->rank % 2 == 0)
        T_TRY(t_recv(c, in, sizeof in, prev_of(c), 3));
    expect_words(in, N, prev_of(c), 1, "blocking ring", c->size);
    return HCOMM_OK;
}

/* Ring of a large message (past any eager limit): isend, blocking recv, wait. */
static hcomm_result_t ring_large(hcomm_comm_t *c) {
    size_t n = 100000;
    int32_t *out = malloc(n * 4), *in = calloc(n, 4);
    hcomm__req_t *req = NULL;
    hcomm_result_t r = HCOMM_ERR_NOMEM;
    T_CHECK(out && in, "out of memory");
    if (out && in) {
        fill(out, n, c->rank, 2);
        r = t_isend(c, out, n * 4, next_of(c), 4, &req);
        if (r == HCOMM_OK)
            r = t_recv(c, in, n * 4, prev_of(c), 4);
        hcomm_result_t rw = req ? t_wait(c, req) : HCOMM_OK;
        r = r != HCOMM_OK ? r : rw;
        T_CHECK(r == HCOMM_OK, "large ring: %s (%s)", hcomm_result_name(r), hcomm_last_error());
        if (r == HCOMM_OK)
            expect_words(in, n, prev_of(c), 2, "large ring", c->size);
    }
    free(out);
    free(in);
    return r;
}

/* Receive posted before the send (a barrier orders them), then send before receive, with the
 * waits in both orders. */
static hcomm_result_t nonblocking_orders(hcomm_comm_t *c) {
    enum { N = 33 };
    int32_t out[N], in[N] = {0};
    hcomm__req_t *rs = NULL, *rr = NULL;
    fill(out, N, c->rank, 3);
    T_TRY(t_irecv(c, in, sizeof in, prev_of(c), 5, &rr));
    T_TRY(hcomm_barrier(c));
    T_TRY(t_isend(c, out, sizeof out, next_of(c), 5, &rs));
    T_TRY(t_wait(c, rr));
    T_TRY(t_wait(c, rs));
    expect_words(in, N, prev_of(c), 3, "irecv before isend", c->size);

    memset(in, 0, sizeof in);
    fill(out, N, c->rank, 4);
    T_TRY(t_isend(c, out, sizeof out, next_of(c), 6, &rs));
    T_TRY(hcomm_barrier(c));
    T_TRY(t_irecv(c, in, sizeof in, prev_of(c), 6, &rr));
    T_TRY(t_wait(c, rs));
    T_TRY(t_wait(c, rr));
    expect_words(in, N, prev_of(c), 4, "isend before irecv", c->size);
    return HCOMM_OK;
}

/* Messages of one (source, tag) pair arrive in the order sent; their sizes differ so a
 * reordering also shows as a size mismatch. */
static hcomm_result_t same_tag_in_order(hcomm_comm_t *c) {
    enum { M = 40, MAXW = 8 };
    int32_t out[M][MAXW], in[MAXW];
    hcomm__req_t *reqs[M] = {0};
    for (int m = 0; m < M; m++) {
        size_t n = (size_t)(m % MAXW) + 1;
        fill(out[m], n, c->rank, 100 + m);
        T_TRY(t_isend(c, out[m], n * 4, next_of(c), 7, &reqs[m]));
    }
    for (int m = 0; m < M; m++) {
        size_t n = (size_t)(m % MAXW) + 1;
        memset(in, 0, sizeof in);
        T_TRY(t_recv(c, in, n * 4, prev_of(c), 7));
        expect_words(in, n, prev_of(c), 100 + m, "same tag in order", c->size);
    }
    for (int m = 0; m < M; m++)
        T_TRY(t_wait(c, reqs[m]));
    return HCOMM_OK;
}

/* Tags are matched independently: tag 2 is received before the earlier tag 1; the maximum
 * tag works. */
static hcomm_result_t tags_independent(hcomm_comm_t *c) {
    int32_t a[3], b[5], tmax[1], ia[3] = {0}, ib[5] = {0}, itmax[1] = {0};
    hcomm__req_t *r1 = NULL, *r2 = NULL, *r3 = NULL;
    fill(a, 3, c->rank, 11);
    fill(b, 5, c->rank, 12);
    fill(tmax, 1, c->rank, 13);
    T_TRY(t_isend(c, a, sizeof a, next_of(c), 1, &r1));
    T_TRY(t_isend(c, b, sizeof b, next_of(c), 2, &r2));
    T_TRY(t_isend(c, tmax, sizeof tmax, next_of(c), HCOMM__TAG_MAX, &r3));
    T_TRY(t_recv(c, itmax, sizeof itmax, prev_of(c), HCOMM__TAG_MAX));
    T_TRY(t_recv(c, ib, sizeof ib, prev_of(c), 2));
    T_TRY(t_recv(c, ia, sizeof ia, prev_of(c), 1));
    T_TRY(t_wait(c, r1));
    T_TRY(t_wait(c, r2));
    T_TRY(t_wait(c, r3));
    expect_words(ia, 3, prev_of(c), 11, "tag 1 after tag 2", c->size);
    expect_words(ib, 5, prev_of(c), 12, "tag 2 before tag 1", c->size);
    expect_words(itmax, 1, prev_of(c), 13, "tag HCOMM__TAG_MAX", c->size);
    return HCOMM_OK;
}

/* A receive of the wrong size (longer or shorter, blocking or not) fails with MISMATCH and
 * consumes the message: the next message on the same tag arrives intact. */
static hcomm_result_t size_mismatch(hcomm_comm_t *c) {
    enum { M = 6 };
    static const size_t sent_words[M] = {4, 1, 2, 4, 1, 2}; /* receives expect 2 words each */
    int32_t out[M][4], in[4];
    hcomm__req_t *reqs[M] = {0}, *rr = NULL;
    for (int m = 0; m < M; m++) {
        fill(out[m], sent_words[m], c->rank, 200 + m);
        T_TRY(t_isend(c, out[m], sent_words[m] * 4, next_of(c), 9, &reqs[m]));
    }
    memset(in, 0, sizeof in);
    R_MISMATCH(t_recv(c, in, 8, prev_of(c), 9));
    R_MISMATCH(t_recv(c, in, 8, prev_of(c), 9));
    T_TRY(t_recv(c, in, 8, prev_of(c), 9));
    expect_words(in, 2, prev_of(c), 202, "recv after mismatches", c->size);
    for (int m = 3; m < 5; m++) {
        T_TRY(t_irecv(c, in, 8, prev_of(c), 9, &rr));
        R_MISMATCH(t_wait(c, rr));
    }
    memset(in, 0, sizeof in);
    T_TRY(t_irecv(c, in, 8, prev_of(c), 9, &rr));
    T_TRY(t_wait(c, rr));
    expect_words(in, 2, prev_of(c), 205, "irecv after mismatches", c->size);
    for (int m = 0; m < M; m++)
        T_TRY(t_wait(c, reqs[m]));
    return HCOMM_OK;
}

/* Zero-byte messages (NULL buffers) are real messages: matched in order with others, and a
 * non-empty receive of one is a mismatch. */
static hcomm_result_t zero_bytes(hcomm_comm_t *c) {
    int32_t one = word(c->rank, 300, 0), in = 0;
    hcomm__req_t *r1 = NULL, *r2 = NULL, *r3 = NULL, *rr = NULL;
    T_TRY(t_isend(c, NULL, 0, next_of(c), 10, &r1));
    T_TRY(t_isend(c, &one, 4, next_of(c), 10, &r2));
    T_TRY(t_isend(c, NULL, 0, next_of(c), 10, &r3));
    T_TRY(t_recv(c, NULL, 0, prev_of(c), 10));
    R_MISMATCH(t_recv(c, NULL, 0, prev_of(c), 10)); /* the 4-byte one */
    T_TRY(t_irecv(c, &in, 4, prev_of(c), 10, &rr));
    R_MISMATCH(t_wait(c, rr)); /* the last empty one */
    T_TRY(t_wait(c, r1));
    T_TRY(t_wait(c, r2));
    T_TRY(t_wait(c, r3));

    T_TRY(t_irecv(c, NULL, 0, prev_of(c), 11, &rr));
    if (c->rank % 2 == 0)
        T_TRY(t_send(c, NULL, 0, next_of(c), 11));
    T_TRY(t_wait(c, rr));
    if (c->rank % 2 == 1)
        T_TRY(t_send(c, NULL, 0, next_of(c), 11));
    return HCOMM_OK;
}

/* Group members of a split by color = rank % 2, key = -rank: same parity, highest rank
 * first. */
static int expected_members(int size, int rank, int *members) {
    int n = 0;
    for (int r = size - 1; r >= 0; r--)
        if (r % 2 == rank % 2)
            members[n++] = r;
    return n;
}

static hcomm_result_t split_parity(hcomm_comm_t *w) {
    int members[8], got[8] = {0};
    int n = expected_members(w->size, w->rank, members), my = -1;
    for (int i = 0; i < n; i++)
        if (members[i] == w->rank)
            my = i;
    hcomm_comm_t *g = NULL;
    T_TRY(hcomm_comm_split(w, w->rank % 2, -w->rank, &g));
    T_CHECK(g != NULL, "split with color %d gave NULL", w->rank % 2);
    if (!g)
        return HCOMM_ERR_INTERNAL;
    T_EQ_INT(g->size, n);
    T_EQ_INT(g->rank, my);
    T_TRY(hcomm_comm_members(g, got, 8));
    for (int i = 0; i < n; i++)
        T_CHECK(got[i] == members[i], "world %d rank %d: member %d is world rank %d, expected %d",
                w->size, w->rank, i, got[i], members[i]);

    /* The group's messages never match the world's, even on the same tag and peer. */
    int32_t gw = word(w->rank, 400, 0), ww = word(w->rank, 401, 0), gin = 0, win = 0;
    hcomm__req_t *rg = NULL, *rw = NULL;
    int gnext = next_of(g);
    T_TRY(t_isend(w, &ww, 4, members[gnext], 12, &rw));
    T_TRY(t_isend(g, &gw, 4, gnext, 12, &rg));
    T_TRY(t_recv(g, &gin, 4, prev_of(g), 12));
    T_TRY(t_recv(w, &win, 4, members[prev_of(g)], 12));
    T_TRY(t_wait(g, rg));
    T_TRY(t_wait(w, rw));
    T_EQ_INT(gin, word(members[prev_of(g)], 400, 0));
    T_EQ_INT(win, word(members[prev_of(g)], 401, 0));

    T_TRY(ring_blocking(g));
    T_TRY(nonblocking_orders(g));
    T_ERR(hcomm_comm_destroy(w), HCOMM_ERR_STATE);
    T_TRY(hcomm_comm_destroy(g));
    return HCOMM_OK;
}

/* color < 0 leaves a rank out: it gets NULL, the others a group without it. */
static hcomm_result_t split_leave_out(hcomm_comm_t *w) {
    hcomm_comm_t *g = (hcomm_comm_t *)w; /* must be overwritten */
    T_TRY(hcomm_comm_split(w, w->rank == 0 ? -1 : 5, w->rank, &g));
    if (w->rank == 0) {
        T_CHECK(g == NULL, "color -1 gave a communicator");
        return HCOMM_OK;
    }
    T_CHECK(g != NULL, "color 5 gave NULL");
    if (!g)
        return HCOMM_ERR_INTERNAL;
    T_EQ_INT(g->size, w->size - 1);
    T_EQ_INT(g->rank, w->rank - 1);
    for (int i = 0; i < g->size; i++)
        T_EQ_INT(g->world_ranks[i], i + 1);
    T_TRY(ring_blocking(g));
    /* A split of a split: world_ranks still name world ranks. */
    hcomm_comm_t *h = NULL;
    T_TRY(hcomm_comm_split(g, 0, -g->rank, &h));
    T_CHECK(h != NULL, "split of a split gave NULL");
    if (h) {
        T_EQ_INT(h->size, g->size);
        T_EQ_INT(h->world_ranks[h->rank], w->rank);
        T_EQ_INT(h->world_ranks[0], w->size - 1);
        T_TRY(hcomm_comm_destroy(h));
    }
    T_TRY(hcomm_comm_destroy(g));
    return HCOMM_OK;
}

static hcomm_result_t rank_main(hcomm_comm_t *w, void *arg) {
    (void)arg;
    const char *name = NULL;
    T_TRY(hcomm_comm_backend(w, &name));
    T_CHECK(name && strcmp(name, t_backend()) == 0, "backend is %s, expected %s", name,
            t_backend());
    T_EQ_INT(w->world_ranks[w->rank], w->rank);
    T_TRY(ring_blocking(w));
    T_TRY(ring_large(w));
    T_TRY(nonblocking_orders(w));
    T_TRY(same_tag_in_order(w));
    T_TRY(tags_independent(w));
    T_TRY(size_mismatch(w));
    T_TRY(zero_bytes(w));
    T_TRY(split_parity(w));
    T_TRY(split_leave_out(w));
    return hcomm_barrier(w);
}

int main(void) {
    t_for_each_world(rank_main, NULL, 8);
    return t_finish("test_p2p");
}
