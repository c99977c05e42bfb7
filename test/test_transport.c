/* Transport conformance: the point-to-point contract of p2p/p2p.h, which every transport must
 * keep, called directly on the world communicator. Local backend: world sizes 2..8; under
 * mpirun (HCOMM_TEST_MPI): np 2, 3 and 4. test/CMakeLists.txt also registers this file as
 * test_transport_rndv with HCOMM_EAGER_LIMIT=0 (every message rendezvous), so no case may
 * assume that a send completes before its receive is posted.
 *
 * Cases (MPI matching rules, as p2p.h states them):
 *   1. several irecvs outstanding on one (peer, channel, tag), waited in reverse order: the
 *      first posted gets the first message;
 *   2. a blocking recv behind an irecv of the same key: the irecv gets the first message;
 *   3. any-order posting within a group (sends before receives on even ranks, the reverse on
 *      odd ones);
 *   4. non-overtaking: 1000 messages of 0 B .. 1 MiB on one key arrive in order;
 *   5. channels isolate: user tag 5 never matches collective tag 5;
 *   6. receive by envelope: probe gives bytes, dtype and shape first; RECV_ALLOC receives;
 *   7. an EXACT receive of the wrong size fails with HCOMM_ERR_MISMATCH, consumes the message,
 *      and the next message of that key arrives intact;
 *   8. send/send cycle of 4 MiB messages completes (the rescue path);
 *   9. leak check: 100,000 small messages and 10,000 all_reduces keep VmRSS flat (< 8 MiB)
 *      and leave no unexpected bytes;
 *  10. eager messages whose sends completed arrive while the sender waits in a barrier. */
#include "p2p/p2p.h"
#include "harness.h"

#include <stdint.h>
#include <time.h>

/* Tags of the cases, far apart so a stray message of one case never matches another's. */
enum {
    TAG_REVERSE = 100,
    TAG_BEHIND = 200,
    TAG_GROUP = 300,
    TAG_ORDER = 400,
    TAG_CHANNEL = 5,
    TAG_ENVELOPE = 600,
    TAG_MISMATCH = 700,
    TAG_CYCLE = 800,
    TAG_LEAK = 900,
    TAG_BURST = 1000,
};

/* Every wait here takes milliseconds; a lost message fails the world after this long instead
 * of HCOMM_TIMEOUT (120 s in tests), so one hang cannot eat the CTest budget. */
#define CASE_TIMEOUT_S 20.0
#define BURST_TIMEOUT_S 5.0

/* Words per message: small (always eager by default) and past the default 8 KiB eager limit. */
enum { SMALL_WORDS = 4, LARGE_WORDS = 20000 };

static int next_of(const hcomm_comm_t *c) {
    return (c->rank + 1) % c->size;
}

static int prev_of(const hcomm_comm_t *c) {
    return (c->rank + c->size - 1) % c->size;
}

/* Payload word j of message m sent by rank r: distinct per sender, message and position. */
static int32_t word(int r, int m, size_t j) {
    return (int32_t)((uint32_t)r * 1000003u + (uint32_t)m * 7919u + (uint32_t)j);
}

static void fill(int32_t *buf, size_t n, int r, int m) {
    for (size_t j = 0; j < n; j++)
        buf[j] = word(r, m, j);
}

/* Checks a received payload against message m of rank r; reports the first wrong word only.
 * Returns whether it matched. */
static bool expect_words(const int32_t *buf, size_t n, int r, int m, const char *what, int size) {
    size_t j = 0;
    while (j < n && buf[j] == word(r, m, j))
        j++;
    long long got = j < n ? buf[j] : 0, want = j < n ? word(r, m, j) : 0;
    T_CHECK(j == n, "%s (world %d): word %zu of message %d from rank %d is %lld, expected %lld",
            what, size, j, m, r, got, want);
    return j == n;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    T_CHECK(p != NULL, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

/* Nothing is held as unexpected on this rank once every rank finished a case. The check sits
 * between two barriers: before the first, a peer that is ahead may already have sent the next
 * case's messages (and a rank waiting for its sends pulls rendezvous ones into the unexpected
 * budget); between them, nobody sends. */
static hcomm_result_t expect_no_unexpected(hcomm_comm_t *c, const char *what) {
    T_TRY(hcomm_barrier(c));
    size_t ux = hcomm__unexpected_bytes(c);
    T_CHECK(ux == 0, "after %s (world %d, rank %d): %zu unexpected bytes held, expected 0", what,
            c->size, c->rank, ux);
    return hcomm_barrier(c);
}

/* --- 1. several irecvs on one key, waited in reverse order --- */

enum { K_REVERSE = 5 };

/* Each rank sends K messages of n words to next on one (channel, tag) and has K irecvs from
 * prev outstanding on it, posted before the sends (recvs_first) or after a barrier that
 * follows the sends (the messages are then likely unexpected). Waiting the receives from the
 * last posted to the first must not change which message each gets. */
static hcomm_result_t reverse_waits(hcomm_comm_t *c, size_t n, bool recvs_first) {
    int tag = TAG_REVERSE + (n > SMALL_WORDS) * 2 + recvs_first;
    int32_t *out = xcalloc(K_REVERSE * n, 4), *in = xcalloc(K_REVERSE * n, 4);
    hcomm__req_t *rr[K_REVERSE] = {0}, *rs[K_REVERSE] = {0};
    if (!out || !in)
        return HCOMM_ERR_NOMEM;
    for (int m = 0; m < K_REVERSE; m++)
        fill(out + (size_t)m * n, n, c->rank, tag * 10 + m);
    for (int m = 0; recvs_first && m < K_REVERSE; m++)
        T_TRY(hcomm__irecv(c, HCOMM__CH_USER, tag, prev_of(c), in + (size_t)m * n, n * 4,
                           HCOMM__RECV_EXACT, &rr[m]));
    for (int m = 0; m < K_REVERSE; m++)
        T_TRY(hcomm__isend(c, HCOMM__CH_USER, tag, next_of(c), out + (size_t)m * n, n * 4, NULL,
                           &rs[m]));
    if (!recvs_first) {
        T_TRY(hcomm_barrier(c));
        for (int m = 0; m < K_REVERSE; m++)
            T_TRY(hcomm__irecv(c, HCOMM__CH_USER, tag, prev_of(c), in + (size_t)m * n, n * 4,
                               HCOMM__RECV_EXACT, &rr[m]));
    }
    for (int m = K_REVERSE - 1; m >= 0; m--)
        T_TRY(hcomm__wait(rr[m], NULL, NULL));
    for (int m = 0; m < K_REVERSE; m++) {
        char what[96];
        snprintf(what, sizeof what, "irecv %d of %d (%zu words, %s), waited in reverse order", m,
                 K_REVERSE, n, recvs_first ? "posted before the sends" : "posted after");
        expect_words(in + (size_t)m * n, n, prev_of(c), tag * 10 + m, what, c->size);
    }
    T_TRY(hcomm__wait_all(rs, K_REVERSE));
    free(out);
    free(in);
    return HCOMM_OK;
}

/* --- 2. a blocking recv while an irecv of the same key is posted --- */

static hcomm_result_t blocking_behind_irecv(hcomm_comm_t *c, size_t n) {
    int tag = TAG_BEHIND + (n > SMALL_WORDS);
    int32_t *out = xcalloc(2 * n, 4), *first = xcalloc(n, 4), *second = xcalloc(n, 4);
    hcomm__req_t *rr = NULL, *rs[2] = {0};
    if (!out || !first || !second)
        return HCOMM_ERR_NOMEM;
    fill(out, n, c->rank, tag * 10);
    fill(out + n, n, c->rank, tag * 10 + 1);
    T_TRY(hcomm__irecv(c, HCOMM__CH_USER, tag, prev_of(c), first, n * 4, HCOMM__RECV_EXACT, &rr));
    T_TRY(hcomm__isend(c, HCOMM__CH_USER, tag, next_of(c), out, n * 4, NULL, &rs[0]));
    T_TRY(hcomm__isend(c, HCOMM__CH_USER, tag, next_of(c), out + n, n * 4, NULL, &rs[1]));
    T_TRY(hcomm__recv(c, HCOMM__CH_USER, tag, prev_of(c), second, n * 4, HCOMM__RECV_EXACT, NULL));
    T_TRY(hcomm__wait(rr, NULL, NULL));
    expect_words(first, n, prev_of(c), tag * 10, "irecv posted before a blocking recv", c->size);
    expect_words(second, n, prev_of(c), tag * 10 + 1, "blocking recv behind an irecv", c->size);
    T_TRY(hcomm__wait_all(rs, 2));
    free(out);
    free(first);
    free(second);
    return HCOMM_OK;
}

/* --- 3. any-order posting within a group --- */

/* Every rank exchanges one message with every other rank in one batch; even ranks record
 * their sends before their receives (peers in ascending order), odd ranks their receives
 * first (peers in descending order). group_end completes them all. */
static hcomm_result_t group_any_order(hcomm_comm_t *c, size_t n) {
    int tag = TAG_GROUP + (n > SMALL_WORDS);
    int p = c->size;
    int32_t *out = xcalloc((size_t)p * n, 4), *in = xcalloc((size_t)p * n, 4);
    hcomm__req_t *req = NULL;
    if (!out || !in)
        return HCOMM_ERR_NOMEM;
    for (int q = 0; q < p; q++) /* message to q is numbered by q */
        fill(out + (size_t)q * n, n, c->rank, tag * 10 + q);
    T_TRY(hcomm__group_start(c));
    for (int pass = 0; pass < 2; pass++) {
        bool sends = (pass == 0) == (c->rank % 2 == 0);
        for (int i = 0; i < p; i++) {
            int q = c->rank % 2 == 0 ? i : p - 1 - i;
            if (q == c->rank)
                continue;
            if (sends)
                T_TRY(hcomm__isend(c, HCOMM__CH_USER, tag, q, out + (size_t)q * n, n * 4, NULL,
                                   &req));
            else
                T_TRY(hcomm__irecv(c, HCOMM__CH_USER, tag, q, in + (size_t)q * n, n * 4,
                                   HCOMM__RECV_EXACT, &req));
        }
    }
    T_TRY(hcomm__group_end(c));
    for (int q = 0; q < p; q++)
        if (q != c->rank)
            expect_words(in + (size_t)q * n, n, q, tag * 10 + c->rank, "group, any order", c->size);
    free(out);
    free(in);
    return HCOMM_OK;
}

/* --- 4. non-overtaking over mixed sizes --- */

enum { ORDER_MSGS = 1000, ORDER_WINDOW = 10, ORDER_SIZES = 5 };
static const size_t order_bytes[ORDER_SIZES] = {0, 8, 300, 20 << 10, 1 << 20};

/* 1000 messages on one key, sizes cycling through 0 B, 8 B, 300 B, 20 KiB and 1 MiB, in windows
 * of 10: even windows pre-post their receives, odd ones send first and receive with blocking
 * EXACT receives (a reordering shows as a wrong size or a wrong payload). */
static hcomm_result_t non_overtaking(hcomm_comm_t *c) {
    int32_t *out[ORDER_WINDOW] = {0}, *in[ORDER_WINDOW] = {0};
    size_t max_words = order_bytes[ORDER_SIZES - 1] / 4;
    for (int w = 0; w < ORDER_WINDOW; w++) {
        out[w] = xcalloc(max_words, 4);
        in[w] = xcalloc(max_words, 4);
        if (!out[w] || !in[w])
            return HCOMM_ERR_NOMEM;
    }
    for (int base = 0; base < ORDER_MSGS; base += ORDER_WINDOW) {
        hcomm__req_t *rs[ORDER_WINDOW] = {0}, *rr[ORDER_WINDOW] = {0};
        bool prepost = (base / ORDER_WINDOW) % 2 == 0;
        for (int w = 0; prepost && w < ORDER_WINDOW; w++) {
            size_t bytes = order_bytes[(base + w) % ORDER_SIZES];
            T_TRY(hcomm__irecv(c, HCOMM__CH_USER, TAG_ORDER, prev_of(c), in[w], bytes,
                               HCOMM__RECV_EXACT, &rr[w]));
        }
        for (int w = 0; w < ORDER_WINDOW; w++) {
            size_t bytes = order_bytes[(base + w) % ORDER_SIZES];
            fill(out[w], bytes / 4, c->rank, base + w);
            T_TRY(hcomm__isend(c, HCOMM__CH_USER, TAG_ORDER, next_of(c), out[w], bytes, NULL,
                               &rs[w]));
        }
        for (int w = 0; w < ORDER_WINDOW; w++) {
            size_t bytes = order_bytes[(base + w) % ORDER_SIZES];
            int32_t *dst = prepost ? in[w] : in[0];
            if (prepost)
                T_TRY(hcomm__wait(rr[w], NULL, NULL));
            else
                T_TRY(hcomm__recv(c, HCOMM__CH_USER, TAG_ORDER, prev_of(c), dst, bytes,
                                  HCOMM__RECV_EXACT, NULL));
            if (!expect_words(dst, bytes / 4, prev_of(c), base + w, "non-overtaking", c->size))
                return HCOMM_ERR_MISMATCH;
        }
        T_TRY(hcomm__wait_all(rs, ORDER_WINDOW));
    }
    for (int w = 0; w < ORDER_WINDOW; w++) {
        free(out[w]);
        free(in[w]);
    }
    return HCOMM_OK;
}

/* --- 5. channels isolate --- */

/* On a fresh communicator (no collective has run on it, so collective-channel tags are not
 * yet sequence numbers it has finished): messages on user tag 5 and collective tag 5 from one
 * peer, received in the other order, each reach the receive of its own channel. */
static hcomm_result_t channels_isolate_on(hcomm_comm_t *g) {
    for (int round = 0; round < 2; round++) {
        int first_ch = round == 0 ? HCOMM__CH_USER : HCOMM__CH_COLL;
        int second_ch = round == 0 ? HCOMM__CH_COLL : HCOMM__CH_USER;
        int32_t out[2][SMALL_WORDS], in_first[SMALL_WORDS] = {0}, in_second[SMALL_WORDS] = {0};
        hcomm__req_t *rs[2] = {0}, *r_second = NULL, *r_first = NULL;
        int m_first = 50 + round * 2, m_second = 51 + round * 2;
        fill(out[0], SMALL_WORDS, g->rank, m_first);
        fill(out[1], SMALL_WORDS, g->rank, m_second);
        /* Receives posted for the channel sent second, then the first. */
        T_TRY(hcomm__irecv(g, second_ch, TAG_CHANNEL, prev_of(g), in_second, sizeof in_second,
                           HCOMM__RECV_EXACT, &r_second));
        T_TRY(hcomm__irecv(g, first_ch, TAG_CHANNEL, prev_of(g), in_first, sizeof in_first,
                           HCOMM__RECV_EXACT, &r_first));
        T_TRY(hcomm__isend(g, first_ch, TAG_CHANNEL, next_of(g), out[0], sizeof out[0], NULL,
                           &rs[0]));
        T_TRY(hcomm__isend(g, second_ch, TAG_CHANNEL, next_of(g), out[1], sizeof out[1], NULL,
                           &rs[1]));
        T_TRY(hcomm__wait(r_second, NULL, NULL));
        T_TRY(hcomm__wait(r_first, NULL, NULL));
        expect_words(in_first, SMALL_WORDS, prev_of(g), m_first,
                     round == 0 ? "user tag 5 (receive posted after collective tag 5)"
                                : "collective tag 5 (receive posted after user tag 5)",
                     g->size);
        expect_words(in_second, SMALL_WORDS, prev_of(g), m_second,
                     round == 0 ? "collective tag 5 (its receive posted first)"
                                : "user tag 5 (its receive posted first)",
                     g->size);
        T_TRY(hcomm__wait_all(rs, 2));
        /* The same with both messages unexpected: sent, then received second-channel first. */
        memset(in_first, 0, sizeof in_first);
        memset(in_second, 0, sizeof in_second);
        T_TRY(hcomm__isend(g, first_ch, TAG_CHANNEL, next_of(g), out[0], sizeof out[0], NULL,
                           &rs[0]));
        T_TRY(hcomm__isend(g, second_ch, TAG_CHANNEL, next_of(g), out[1], sizeof out[1], NULL,
                           &rs[1]));
        T_TRY(hcomm__recv(g, second_ch, TAG_CHANNEL, prev_of(g), in_second, sizeof in_second,
                          HCOMM__RECV_EXACT, NULL));
        T_TRY(hcomm__recv(g, first_ch, TAG_CHANNEL, prev_of(g), in_first, sizeof in_first,
                          HCOMM__RECV_EXACT, NULL));
        expect_words(in_first, SMALL_WORDS, prev_of(g), m_first, "channel isolation, sent first",
                     g->size);
        expect_words(in_second, SMALL_WORDS, prev_of(g), m_second,
                     "channel isolation, received first", g->size);
        T_TRY(hcomm__wait_all(rs, 2));
    }
    return expect_no_unexpected(g, "channels isolate");
}

static hcomm_result_t channels_isolate(hcomm_comm_t *w) {
    hcomm_comm_t *g = NULL;
    T_TRY(hcomm_comm_split(w, 0, w->rank, &g));
    T_CHECK(g != NULL, "split with color 0 gave NULL");
    if (!g)
        return HCOMM_ERR_INTERNAL;
    T_TRY(channels_isolate_on(g));
    T_TRY(hcomm_comm_destroy(g));
    return HCOMM_OK;
}

/* --- 6. receive by envelope --- */

static void expect_env(const hcomm__env_t *env, const hcomm__env_t *want, const char *what,
                       int size) {
    T_CHECK(env->bytes == want->bytes, "%s (world %d): bytes %llu, expected %llu", what, size,
            (unsigned long long)env->bytes, (unsigned long long)want->bytes);
    T_CHECK(env->has_desc == 1, "%s (world %d): has_desc %d, expected 1", what, size,
            env->has_desc);
    T_CHECK(env->dtype == want->dtype, "%s (world %d): dtype %d, expected %d", what, size,
            (int)env->dtype, (int)want->dtype);
    T_CHECK(env->ndim == want->ndim, "%s (world %d): ndim %d, expected %d", what, size, env->ndim,
            want->ndim);
    T_CHECK(env->tag == want->tag, "%s (world %d): tag %d, expected %d", what, size, (int)env->tag,
            (int)want->tag);
    T_CHECK(env->channel == HCOMM__CH_USER, "%s (world %d): channel %d, expected %d", what, size,
            env->channel, HCOMM__CH_USER);
    for (int d = 0; d < want->ndim && d < HCOMM_MAX_DIMS; d++)
        T_CHECK(env->shape[d] == want->shape[d], "%s (world %d): shape[%d] %lld, expected %lld",
                what, size, d, (long long)env->shape[d], (long long)want->shape[d]);
}

/* Three messages with a description: a small f32 [2, 3, 5] (probed, then received with
 * RECV_ALLOC), an i32 [3, 4000] past the eager limit (probed, then received EXACT into a
 * buffer sized from the envelope), and an i32 [7] received with RECV_ALLOC without a probe
 * (its envelope comes back from the wait). */
static hcomm_result_t envelope(hcomm_comm_t *c) {
    enum { MSGS = 3 };
    static const int32_t dtypes[MSGS] = {HCOMM_F32, HCOMM_I32, HCOMM_I32};
    static const int ndims[MSGS] = {3, 2, 1};
    static const int64_t shapes[MSGS][3] = {{2, 3, 5}, {3, 4000, 0}, {7, 0, 0}};
    int32_t *out[MSGS] = {0};
    hcomm__env_t want[MSGS];
    hcomm__req_t *rs[MSGS] = {0};
    for (int m = 0; m < MSGS; m++) {
        size_t n = 1;
        want[m] = (hcomm__env_t){
            .has_desc = 1, .dtype = dtypes[m], .ndim = (uint8_t)ndims[m], .tag = TAG_ENVELOPE + m};
        for (int d = 0; d < ndims[m]; d++) {
            want[m].shape[d] = shapes[m][d];
            n *= (size_t)shapes[m][d];
        }
        want[m].bytes = n * 4;
        if (!(out[m] = xcalloc(n, 4)))
            return HCOMM_ERR_NOMEM;
        if (m == 0)
            for (size_t j = 0; j < n; j++)
                ((float *)out[m])[j] = (float)(c->rank * 1000 + (int)j) + 0.5f;
        else
            fill(out[m], n, c->rank, TAG_ENVELOPE + m);
        T_TRY(hcomm__isend(c, HCOMM__CH_USER, TAG_ENVELOPE + m, next_of(c), out[m],
                           (size_t)want[m].bytes, &want[m], &rs[m]));
    }
    int src = prev_of(c);

    /* 0: probe (twice: a probe does not consume), then RECV_ALLOC. */
    hcomm__env_t env;
    memset(&env, 0, sizeof env);
    T_TRY(hcomm__probe(c, HCOMM__CH_USER, TAG_ENVELOPE, src, &env));
    expect_env(&env, &want[0], "probe of f32 [2, 3, 5]", c->size);
    memset(&env, 0, sizeof env);
    T_TRY(hcomm__probe(c, HCOMM__CH_USER, TAG_ENVELOPE, src, &env));
    expect_env(&env, &want[0], "second probe of f32 [2, 3, 5]", c->size);
    hcomm__req_t *rr = NULL;
    void *data = NULL;
    T_TRY(hcomm__irecv(c, HCOMM__CH_USER, TAG_ENVELOPE, src, NULL, 0, HCOMM__RECV_ALLOC, &rr));
    memset(&env, 0, sizeof env);
    T_TRY(hcomm__wait(rr, &env, &data));
    expect_env(&env, &want[0], "RECV_ALLOC of f32 [2, 3, 5]", c->size);
    T_CHECK(data != NULL, "RECV_ALLOC (world %d) returned no buffer", c->size);
    for (int j = 0; data && j < 30; j++) {
        float got = ((float *)data)[j], exp = (float)(src * 1000 + j) + 0.5f;
        T_CHECK(got == exp, "RECV_ALLOC (world %d): element %d is %g, expected %g", c->size, j,
                (double)got, (double)exp);
    }
    hcomm_mem_free(data);

    /* 1: probe, allocate what the envelope says, receive EXACT. */
    memset(&env, 0, sizeof env);
    T_TRY(hcomm__probe(c, HCOMM__CH_USER, TAG_ENVELOPE + 1, src, &env));
    expect_env(&env, &want[1], "probe of i32 [3, 4000]", c->size);
    size_t bytes = (size_t)env.bytes;
    int32_t *in = xcalloc(bytes / 4, 4);
    if (!in)
        return HCOMM_ERR_NOMEM;
    T_TRY(
        hcomm__recv(c, HCOMM__CH_USER, TAG_ENVELOPE + 1, src, in, bytes, HCOMM__RECV_EXACT, NULL));
    expect_words(in, bytes / 4, src, TAG_ENVELOPE + 1, "receive sized by probe", c->size);
    free(in);

    /* 2: RECV_ALLOC without a probe: the shape comes with the data. */
    data = NULL;
    memset(&env, 0, sizeof env);
    T_TRY(hcomm__irecv(c, HCOMM__CH_USER, TAG_ENVELOPE + 2, src, NULL, 0, HCOMM__RECV_ALLOC, &rr));
    T_TRY(hcomm__wait(rr, &env, &data));
    expect_env(&env, &want[2], "RECV_ALLOC of i32 [7], unknown shape", c->size);
    T_CHECK(data != NULL, "RECV_ALLOC (world %d) returned no buffer", c->size);
    if (data)
        expect_words(data, 7, src, TAG_ENVELOPE + 2, "RECV_ALLOC, unknown shape", c->size);
    hcomm_mem_free(data);

    T_TRY(hcomm__wait_all(rs, MSGS));
    for (int m = 0; m < MSGS; m++)
        free(out[m]);
    return HCOMM_OK;
}

/* --- 7. size mismatch --- */

/* Expects a receive to fail with HCOMM_ERR_MISMATCH and a message; other failures stop. */
#define R_MISMATCH(call)                                                                           \
    do {                                                                                           \
        hcomm_result_t r_mm_ = (call);                                                             \
        T_CHECK(r_mm_ == HCOMM_ERR_MISMATCH, "%s returned %s, expected HCOMM_ERR_MISMATCH", #call, \
                hcomm_result_name(r_mm_));                                                         \
        T_CHECK(hcomm_last_error()[0] != '\0', "%s failed without a message", #call);              \
        if (r_mm_ != HCOMM_ERR_MISMATCH && r_mm_ != HCOMM_OK)                                      \
            return r_mm_;                                                                          \
    } while (0)

/* Per key, two messages: n+1 words then n words. An EXACT receive of n words fails on the
 * first and consumes it; the next EXACT receive of n words gets the second intact. Blocking
 * receives on the small key, irecv + wait on the large one. */
static hcomm_result_t size_mismatch(hcomm_comm_t *c, size_t n) {
    int tag = TAG_MISMATCH + (n > SMALL_WORDS);
    int32_t *out = xcalloc(2 * n + 1, 4), *in = xcalloc(n + 1, 4);
    hcomm__req_t *rs[2] = {0}, *rr = NULL;
    if (!out || !in)
        return HCOMM_ERR_NOMEM;
    fill(out, n + 1, c->rank, tag * 10);
    fill(out + n + 1, n, c->rank, tag * 10 + 1);
    T_TRY(hcomm__isend(c, HCOMM__CH_USER, tag, next_of(c), out, (n + 1) * 4, NULL, &rs[0]));
    T_TRY(hcomm__isend(c, HCOMM__CH_USER, tag, next_of(c), out + n + 1, n * 4, NULL, &rs[1]));
    if (n <= SMALL_WORDS) {
        R_MISMATCH(
            hcomm__recv(c, HCOMM__CH_USER, tag, prev_of(c), in, n * 4, HCOMM__RECV_EXACT, NULL));
        memset(in, 0, (n + 1) * 4);
        T_TRY(hcomm__recv(c, HCOMM__CH_USER, tag, prev_of(c), in, n * 4, HCOMM__RECV_EXACT, NULL));
    } else {
        T_TRY(hcomm__irecv(c, HCOMM__CH_USER, tag, prev_of(c), in, n * 4, HCOMM__RECV_EXACT, &rr));
        R_MISMATCH(hcomm__wait(rr, NULL, NULL));
        memset(in, 0, (n + 1) * 4);
        T_TRY(hcomm__irecv(c, HCOMM__CH_USER, tag, prev_of(c), in, n * 4, HCOMM__RECV_EXACT, &rr));
        T_TRY(hcomm__wait(rr, NULL, NULL));
    }
    expect_words(in, n, prev_of(c), tag * 10 + 1, "message after a size mismatch", c->size);
    T_CHECK(in[n] == 0, "receive of %zu words (world %d) wrote past its size: word %zu is %d", n,
            c->size, n, (int)in[n]);
    /* The sender is not told about the receiver's mismatch: both sends complete. */
    T_TRY(hcomm__wait_all(rs, 2));
    free(out);
    free(in);
    return HCOMM_OK;
}

/* --- 8. send/send cycle --- */

/* Every rank does a blocking 4 MiB send to next, then receives from prev: a cycle of blocking
 * sends that only completes because a rank waiting in a send pulls its peer's message. */
static hcomm_result_t send_send_cycle(hcomm_comm_t *c) {
    size_t n = (4u << 20) / 4;
    int32_t *out = xcalloc(n, 4), *in = xcalloc(n, 4);
    if (!out || !in)
        return HCOMM_ERR_NOMEM;
    fill(out, n, c->rank, TAG_CYCLE);
    T_TRY(hcomm__send(c, HCOMM__CH_USER, TAG_CYCLE, next_of(c), out, n * 4, NULL));
    T_TRY(
        hcomm__recv(c, HCOMM__CH_USER, TAG_CYCLE, prev_of(c), in, n * 4, HCOMM__RECV_EXACT, NULL));
    expect_words(in, n, prev_of(c), TAG_CYCLE, "send/send cycle, 4 MiB", c->size);
    free(out);
    free(in);
    return HCOMM_OK;
}

/* --- 10. a completed eager send is delivered while its sender waits elsewhere --- */

enum { BURST = 200 };

/* Rank 0 sends a burst of small messages to rank 1 (more than any transport queue holds) and
 * waits for them: complete, since they go eager. Only then does rank 1 start receiving, while
 * rank 0 already waits in a barrier that rank 1 joins after the last receive. The messages
 * must arrive without rank 0 making another point-to-point call. Skipped when everything goes
 * rendezvous (then the sends complete only once received). */
static hcomm_result_t eager_burst_then_barrier(hcomm_comm_t *c) {
    int32_t out[BURST][2], in[2];
    hcomm__req_t *rs[BURST] = {0};
    if (c->eager_limit < sizeof out[0])
        return HCOMM_OK;
    if (c->rank == 0) {
        for (int m = 0; m < BURST; m++) {
            fill(out[m], 2, 0, 1000 + m);
            T_TRY(
                hcomm__isend(c, HCOMM__CH_USER, TAG_BURST, 1, out[m], sizeof out[m], NULL, &rs[m]));
        }
        T_TRY(hcomm__wait_all(rs, BURST));
    }
    T_TRY(hcomm_barrier(c));
    for (int m = 0; c->rank == 1 && m < BURST; m++) {
        T_TRY(hcomm__recv(c, HCOMM__CH_USER, TAG_BURST, 0, in, sizeof in, HCOMM__RECV_EXACT, NULL));
        if (!expect_words(in, 2, 0, 1000 + m, "eager burst received after the sender moved on",
                          c->size))
            return HCOMM_ERR_MISMATCH;
    }
    return hcomm_barrier(c);
}

static hcomm_result_t conformance_main(hcomm_comm_t *c, void *arg) {
    (void)arg;
    const size_t sizes[2] = {SMALL_WORDS, LARGE_WORDS};
    T_TRY(hcomm_comm_set_timeout(c, CASE_TIMEOUT_S));
    for (int s = 0; s < 2; s++) {
        T_TRY(reverse_waits(c, sizes[s], true));
        T_TRY(expect_no_unexpected(c, "irecvs waited in reverse order"));
        T_TRY(reverse_waits(c, sizes[s], false));
        T_TRY(expect_no_unexpected(c, "irecvs posted late, waited in reverse order"));
        T_TRY(blocking_behind_irecv(c, sizes[s]));
        T_TRY(expect_no_unexpected(c, "blocking recv behind an irecv"));
        T_TRY(group_any_order(c, sizes[s]));
        T_TRY(expect_no_unexpected(c, "group, any order"));
        T_TRY(size_mismatch(c, sizes[s]));
        T_TRY(expect_no_unexpected(c, "size mismatch"));
    }
    T_TRY(non_overtaking(c));
    T_TRY(expect_no_unexpected(c, "non-overtaking"));
    T_TRY(channels_isolate(c));
    T_TRY(envelope(c));
    T_TRY(expect_no_unexpected(c, "receive by envelope"));
    T_TRY(send_send_cycle(c));
    T_TRY(expect_no_unexpected(c, "send/send cycle"));
    /* Last: where it fails, it fails by timing out, which takes the world down. It is
     * deterministic, so one local world size is enough. */
    if (strcmp(t_backend(), "mpi") == 0 || c->size == 2) {
        T_TRY(hcomm_comm_set_timeout(c, BURST_TIMEOUT_S));
        T_TRY(eager_burst_then_barrier(c));
        T_TRY(expect_no_unexpected(c, "eager burst"));
    }
    return HCOMM_OK;
}

/* --- 9. leak check --- */

/* VmRSS of this process in KiB, from /proc/self/status; -1 when it cannot be read. */
static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kib = strtol(line + 6, NULL, 10);
            break;
        }
    fclose(f);
    return kib;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { LEAK_WINDOW = 64, LEAK_WORDS = 4, LEAK_COLL_COUNT = 16 };

/* msgs small messages to next and from prev, in windows of 64 receives pre-posted. */
static hcomm_result_t stream(hcomm_comm_t *c, int msgs) {
    int32_t out[LEAK_WINDOW][LEAK_WORDS], in[LEAK_WINDOW][LEAK_WORDS];
    for (int base = 0; base < msgs; base += LEAK_WINDOW) {
        hcomm__req_t *rr[LEAK_WINDOW] = {0}, *rs[LEAK_WINDOW] = {0};
        int k = msgs - base < LEAK_WINDOW ? msgs - base : LEAK_WINDOW;
        for (int i = 0; i < k; i++)
            T_TRY(hcomm__irecv(c, HCOMM__CH_USER, TAG_LEAK, prev_of(c), in[i], sizeof in[i],
                               HCOMM__RECV_EXACT, &rr[i]));
        for (int i = 0; i < k; i++) {
            fill(out[i], LEAK_WORDS, c->rank, base + i);
            T_TRY(hcomm__isend(c, HCOMM__CH_USER, TAG_LEAK, next_of(c), out[i], sizeof out[i], NULL,
                               &rs[i]));
        }
        T_TRY(hcomm__wait_all(rr, k));
        T_TRY(hcomm__wait_all(rs, k));
        /* Checking the first and last of each window keeps the loop cheap. */
        if (!expect_words(in[0], LEAK_WORDS, prev_of(c), base, "leak stream", c->size) ||
            !expect_words(in[k - 1], LEAK_WORDS, prev_of(c), base + k - 1, "leak stream", c->size))
            return HCOMM_ERR_MISMATCH;
    }
    return HCOMM_OK;
}

/* colls all_reduces (SUM, f32[16]) of rank + 1 + (i % 7), each result checked. */
static hcomm_result_t collectives(hcomm_comm_t *c, int colls) {
    float send[LEAK_COLL_COUNT], recv[LEAK_COLL_COUNT];
    int p = c->size;
    for (int i = 0; i < colls; i++) {
        for (int j = 0; j < LEAK_COLL_COUNT; j++)
            send[j] = (float)(c->rank + 1 + (i % 7) + j);
        T_TRY(hcomm_all_reduce(c, send, recv, LEAK_COLL_COUNT, HCOMM_F32, HCOMM_SUM));
        float want0 = (float)(p * (p + 1) / 2 + p * (i % 7));
        float wantl = want0 + (float)(p * (LEAK_COLL_COUNT - 1));
        if (recv[0] != want0 || recv[LEAK_COLL_COUNT - 1] != wantl) {
            T_CHECK(false, "all_reduce %d (world %d): [0]=%g [15]=%g, expected %g and %g", i, p,
                    (double)recv[0], (double)recv[LEAK_COLL_COUNT - 1], (double)want0,
                    (double)wantl);
            return HCOMM_ERR_MISMATCH;
        }
    }
    return HCOMM_OK;
}

typedef struct leak_cfg {
    int msgs, colls;
} leak_cfg_t;

static hcomm_result_t leak_main(hcomm_comm_t *c, void *arg) {
    const leak_cfg_t *cfg = arg;
    T_TRY(hcomm_comm_set_timeout(c, CASE_TIMEOUT_S));
    /* Warm-up: request pools, rings, malloc arenas of every thread reach their steady size. */
    T_TRY(stream(c, cfg->msgs / 20));
    T_TRY(collectives(c, cfg->colls / 20));
    T_TRY(hcomm_barrier(c));
    long before = rss_kib();
    double t0 = now_s();
    T_TRY(stream(c, cfg->msgs));
    double t1 = now_s();
    T_TRY(collectives(c, cfg->colls));
    double t2 = now_s();
    T_TRY(hcomm_barrier(c));
    long after = rss_kib();
    T_CHECK(before > 0 && after > 0, "VmRSS unreadable: before %ld, after %ld", before, after);
    long grew = after - before;
#if defined(__SANITIZE_ADDRESS__)
    /* ASan keeps freed memory in quarantine, so RSS grows by design; its leak check applies. */
    grew = 0;
#endif
    T_CHECK(grew < 8 * 1024,
            "leak check (world %d, rank %d): VmRSS grew by %ld KiB (%ld -> %ld KiB) over %d "
            "messages and %d all_reduces, expected < 8192 KiB",
            c->size, c->rank, grew, before, after, cfg->msgs, cfg->colls);
    if (c->rank == 0 || strcmp(t_backend(), "mpi") == 0)
        printf("test_transport: leak check, %s world %d rank %d: VmRSS %ld -> %ld KiB (%+ld KiB) "
               "over %d messages (%.2f s) and %d all_reduces (%.2f s)\n",
               t_backend(), c->size, c->rank, before, after, grew, cfg->msgs, t1 - t0, cfg->colls,
               t2 - t1);
    return expect_no_unexpected(c, "leak check");
}

/* Local: one world per size in sizes; mpi: the one MPI world. */
static void run(hcomm_rank_fn_t fn, void *arg, const int *sizes, int nsizes) {
    if (strcmp(t_backend(), "mpi") == 0) {
        T_OK(hcomm_launch("mpi", 0, fn, arg));
        return;
    }
    for (int i = 0; i < nsizes; i++)
        T_OK(hcomm_launch("local", sizes[i], fn, arg));
}

int main(void) {
    static const int conformance_sizes[] = {2, 3, 4, 5, 6, 7, 8};
    static const int leak_sizes[] = {2, 8};
    leak_cfg_t leak = {100000, 10000};
    run(conformance_main, NULL, conformance_sizes, 7);
    run(leak_main, &leak, leak_sizes, 2);
    return t_finish("test_transport");
}
