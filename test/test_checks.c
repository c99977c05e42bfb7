/* Call checks of the public API, on the local backend (world sizes 2..8) and under mpirun
 * (HCOMM_TEST_MPI: np 2, 3 and 4):
 *   (a) a mismatch (count, dtype, op SUM vs AVG, broadcast root) fails on every rank with
 *       HCOMM_ERR_MISMATCH and one wording, "hcomm_all_reduce: count=8 on rank 0 but count=5
 *       on rank 1"; the next all_reduce on the comm works;
 *   (b) a bad argument on one rank: that rank gets its own error, every other rank gets
 *       HCOMM_ERR_PEER within 1 s, naming the failing rank; the next call works;
 *   (c) partial overlaps of send and receive buffers fail with HCOMM_ERR_INVALID_ARG;
 *   (d) DP tensor lists in another order fail with HCOMM_ERR_MISMATCH on every rank;
 *   (e) hcomm_comm_abort() from another thread ends a barrier no peer joins with
 *       HCOMM_ERR_ABORTED, quickly.
 * Tests run with HCOMM_TIMEOUT=120, so a wait that only ends by timing out fails the 1 s
 * bounds by far. */
#include "harness.h"

#include <pthread.h>
#include <time.h>

/* How soon a peer's failure or an abort must end a wait: far below HCOMM_TIMEOUT (120 s under
 * CTest), which is what a missed notice would cost, and above what a sanitized build on two
 * loaded cores takes to schedule every rank once more. */
#define PROMPT_S 5.0

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Expects result want and a last-error message containing every one of the n strings. */
static void expect_error(hcomm_result_t got, hcomm_result_t want, const char *what, int rank,
                         int size, const char *const *parts, int n) {
    const char *msg = hcomm_last_error();
    T_CHECK(got == want, "%s (world %d, rank %d): returned %s, expected %s (message: '%s')", what,
            size, rank, hcomm_result_name(got), hcomm_result_name(want), msg);
    for (int i = 0; i < n; i++)
        T_CHECK(strstr(msg, parts[i]) != NULL,
                "%s (world %d, rank %d): message '%s' does not contain '%s'", what, size, rank, msg,
                parts[i]);
}

/* all_reduce SUM of f32[8] = (rank + 1) * (i + 1): the communicator still works and gives
 * the right values. */
static hcomm_result_t all_reduce_works(hcomm_comm_t *c, const char *after) {
    enum { N = 8 };
    float send[N], recv[N];
    int p = t_size(c), r = t_rank(c);
    for (int i = 0; i < N; i++)
        send[i] = (float)((r + 1) * (i + 1));
    hcomm_result_t res = hcomm_all_reduce(c, send, recv, N, HCOMM_F32, HCOMM_SUM);
    T_CHECK(res == HCOMM_OK, "all_reduce after %s (world %d, rank %d): %s (%s)", after, p, r,
            hcomm_result_name(res), hcomm_last_error());
    if (res != HCOMM_OK)
        return res;
    for (int i = 0; i < N; i++) {
        float want = (float)((i + 1) * p * (p + 1) / 2);
        T_CHECK(recv[i] == want, "all_reduce after %s (world %d, rank %d): [%d]=%g, expected %g",
                after, p, r, i, (double)recv[i], (double)want);
    }
    return HCOMM_OK;
}

/* --- (a) mismatches --- */

/* Rank 0 passes the first value of a field, every other rank the second; the message on
 * every rank reads "<fn>: <a> on rank 0 but <b> on rank <r>". */
static void expect_mismatch(hcomm_comm_t *c, hcomm_result_t got, const char *fn, const char *a,
                            const char *b) {
    char head[160];
    snprintf(head, sizeof head, "%s: %s on rank 0 but %s on rank ", fn, a, b);
    const char *parts[1] = {head};
    expect_error(got, HCOMM_ERR_MISMATCH, head, t_rank(c), t_size(c), parts, 1);
}

/* The calls two mpi processes run as one exchange (all_gather, reduce_scatter, broadcast):
 * counts that differ in the first message and only after several lane pieces (BIG / 2 bytes
 * and more); the receive buffer stays untouched. */
static hcomm_result_t small_mismatches(hcomm_comm_t *c, unsigned char *a, unsigned char *b,
                                       size_t cap) {
    int r = t_rank(c), p = t_size(c);
    size_t big = cap / (size_t)p, half = big / 2;
    char want[2][32];
    snprintf(want[0], sizeof want[0], "bytes=%zu", big);
    snprintf(want[1], sizeof want[1], "bytes=%zu", half);
    memset(b, 0xA5, cap);
    expect_mismatch(c, hcomm_all_gather(c, a, b, r == 0 ? 8 : 5), "hcomm_all_gather", "bytes=8",
                    "bytes=5");
    expect_mismatch(c, hcomm_all_gather(c, a, b, r == 0 ? big : half), "hcomm_all_gather", want[0],
                    want[1]);
    size_t changed = 0;
    for (size_t i = 0; i < cap; i++)
        changed += b[i] != 0xA5;
    T_CHECK(changed == 0, "all_gather mismatch (world %d, rank %d): %zu bytes of recvbuf written",
            p, r, changed);
    T_TRY(all_reduce_works(c, "an all_gather bytes mismatch"));
    expect_mismatch(c, hcomm_reduce_scatter(c, a, b, r == 0 ? 8 : 5, HCOMM_F32, HCOMM_SUM),
                    "hcomm_reduce_scatter", "recvcount=8", "recvcount=5");
    T_TRY(all_reduce_works(c, "a reduce_scatter count mismatch"));
    expect_mismatch(c, hcomm_broadcast(c, a, r == 0 ? big : 16, 0), "hcomm_broadcast", want[0],
                    "bytes=16");
    T_TRY(all_reduce_works(c, "a broadcast bytes mismatch"));
    return HCOMM_OK;
}

static hcomm_result_t mismatches(hcomm_comm_t *c) {
    enum { BIG = 2000 }; /* past hcomm's own small all_reduce: the agreement before native */
    int r = t_rank(c);
    float *a = calloc(BIG, sizeof(float)), *b = calloc(BIG, sizeof(float));
    T_CHECK(a && b, "out of memory");
    if (!a || !b)
        return HCOMM_ERR_NOMEM;

    expect_mismatch(c, hcomm_all_reduce(c, a, b, r == 0 ? 8 : 5, HCOMM_F32, HCOMM_SUM),
                    "hcomm_all_reduce", "count=8", "count=5");
    T_TRY(all_reduce_works(c, "a count mismatch"));
    expect_mismatch(c, hcomm_all_reduce(c, a, b, r == 0 ? BIG : BIG / 2, HCOMM_F32, HCOMM_SUM),
                    "hcomm_all_reduce", "count=2000", "count=1000");
    T_TRY(all_reduce_works(c, "a large count mismatch"));
    /* Rank 0's call is small (the local backend's posted path, no barrier), the others' is
     * not: the check still pairs the ranks' waits. */
    expect_mismatch(c, hcomm_all_reduce(c, a, b, r == 0 ? 8 : BIG, HCOMM_F32, HCOMM_SUM),
                    "hcomm_all_reduce", "count=8", "count=2000");
    T_TRY(all_reduce_works(c, "a small against a large all_reduce"));
    hcomm_result_t got =
        r == 0 ? hcomm_all_reduce(c, a, b, 2, HCOMM_F32, HCOMM_SUM) : hcomm_broadcast(c, a, 8, 0);
    const char *called[1] = {"rank 0 called all_reduce but rank 1 called broadcast"};
    expect_error(got, HCOMM_ERR_MISMATCH, "all_reduce against broadcast", r, t_size(c), called, 1);
    T_TRY(all_reduce_works(c, "an all_reduce against a broadcast"));
    expect_mismatch(c, hcomm_all_reduce(c, a, b, 8, r == 0 ? HCOMM_F32 : HCOMM_I32, HCOMM_SUM),
                    "hcomm_all_reduce", "dtype=f32", "dtype=i32");
    T_TRY(all_reduce_works(c, "a dtype mismatch"));
    expect_mismatch(c, hcomm_all_reduce(c, a, b, 8, HCOMM_F32, r == 0 ? HCOMM_SUM : HCOMM_AVG),
                    "hcomm_all_reduce", "op=sum", "op=avg");
    T_TRY(all_reduce_works(c, "a SUM vs AVG mismatch"));
    expect_mismatch(c, hcomm_broadcast(c, a, 16, r == 0 ? 0 : 1), "hcomm_broadcast", "root=0",
                    "root=1");
    T_TRY(all_reduce_works(c, "a broadcast root mismatch"));
    T_TRY(small_mismatches(c, (unsigned char *)a, (unsigned char *)b, BIG * sizeof(float)));
    free(a);
    free(b);
    return HCOMM_OK;
}

/* --- (b) a bad argument on one rank --- */

/* The bad rank's own result is own_err; every other rank must get HCOMM_ERR_PEER within 1 s
 * with a message naming the bad rank. */
static void expect_peer_failure(hcomm_comm_t *c, int bad, hcomm_result_t got,
                                hcomm_result_t own_err, double secs, const char *what) {
    int r = t_rank(c), p = t_size(c);
    if (r == bad) {
        expect_error(got, own_err, what, r, p, NULL, 0);
        return;
    }
    char name[32];
    snprintf(name, sizeof name, "rank %d", bad);
    const char *parts[1] = {name};
    expect_error(got, HCOMM_ERR_PEER, what, r, p, parts, 1);
    T_CHECK(secs < PROMPT_S, "%s (world %d, rank %d): HCOMM_ERR_PEER after %.3f s, expected < %g s",
            what, p, r, secs, PROMPT_S);
}

static hcomm_result_t bad_arguments(hcomm_comm_t *c) {
    int r = t_rank(c), p = t_size(c);
    float a[8] = {0}, b[8];
    int bad = 1;

    T_TRY(hcomm_barrier(c));
    double t0 = now_s();
    hcomm_result_t res =
        hcomm_all_reduce(c, a, b, 8, r == bad ? (hcomm_dtype_t)99 : HCOMM_F32, HCOMM_SUM);
    expect_peer_failure(c, bad, res, HCOMM_ERR_DTYPE, now_s() - t0,
                        "all_reduce with dtype=99 on rank 1");
    T_TRY(all_reduce_works(c, "a bad dtype on rank 1"));

    /* tp_all_gather of f32 [2, 3] along dim 1 into [2, 3p]; rank 1 passes dim=5. */
    float in[6], *out = calloc((size_t)6 * (size_t)p, sizeof(float));
    T_CHECK(out != NULL, "out of memory");
    if (!out)
        return HCOMM_ERR_NOMEM;
    for (int i = 0; i < 6; i++)
        in[i] = (float)(r * 10 + i);
    hcomm_tensor_t tin, tout;
    int64_t sin[2] = {2, 3}, sout[2] = {2, 3 * p};
    T_TRY(hcomm_tensor_init(&tin, in, HCOMM_F32, 2, sin));
    T_TRY(hcomm_tensor_init(&tout, out, HCOMM_F32, 2, sout));
    T_TRY(hcomm_barrier(c));
    t0 = now_s();
    res = hcomm_tp_all_gather(c, &tin, &tout, r == bad ? 5 : 1);
    expect_peer_failure(c, bad, res, HCOMM_ERR_INVALID_ARG, now_s() - t0,
                        "tp_all_gather with dim=5 on rank 1");
    T_TRY(all_reduce_works(c, "a bad dim on rank 1"));
    /* The same call with good arguments everywhere works and concatenates along dim 1. */
    T_TRY(hcomm_tp_all_gather(c, &tin, &tout, 1));
    for (int row = 0; row < 2; row++)
        for (int q = 0; q < p; q++)
            for (int k = 0; k < 3; k++) {
                float got = out[row * 3 * p + q * 3 + k], want = (float)(q * 10 + row * 3 + k);
                T_CHECK(got == want,
                        "tp_all_gather (world %d, rank %d): [%d, %d] = %g, expected %g", p, r, row,
                        q * 3 + k, (double)got, (double)want);
            }
    free(out);

    /* Rank 0 passes a root outside the group to broadcast. */
    bad = 0;
    T_TRY(hcomm_barrier(c));
    t0 = now_s();
    res = hcomm_broadcast(c, a, sizeof a, r == bad ? p : 0);
    expect_peer_failure(c, bad, res, HCOMM_ERR_INVALID_ARG, now_s() - t0,
                        "broadcast with root=size on rank 0");
    return all_reduce_works(c, "a bad root on rank 0");
}

/* --- (c) partial overlaps --- */

static hcomm_result_t overlaps(hcomm_comm_t *c) {
    int r = t_rank(c), p = t_size(c);
    enum { BYTES = 16 };
    unsigned char *buf = calloc((size_t)p * BYTES + 1, 1);
    float f[9] = {0};
    T_CHECK(buf != NULL, "out of memory");
    if (!buf)
        return HCOMM_ERR_NOMEM;
    const char *parts[1] = {"overlap"};
    expect_error(hcomm_all_gather(c, buf, buf + 1, BYTES), HCOMM_ERR_INVALID_ARG,
                 "all_gather with recvbuf = sendbuf + 1 byte", r, p, parts, 1);
    T_TRY(all_reduce_works(c, "an overlapping all_gather"));
    expect_error(hcomm_all_reduce(c, f, f + 1, 8, HCOMM_F32, HCOMM_SUM), HCOMM_ERR_INVALID_ARG,
                 "all_reduce with recvbuf = sendbuf + 1 element", r, p, parts, 1);
    T_TRY(all_reduce_works(c, "an overlapping all_reduce"));
    free(buf);
    return HCOMM_OK;
}

/* --- (d) DP tensor lists in another order --- */

static hcomm_result_t dp_order(hcomm_comm_t *c) {
    int r = t_rank(c), p = t_size(c);
    float g3[3], g5[5];
    hcomm_tensor_t grads[2];
    int64_t s3[1] = {3}, s5[1] = {5};
    for (int i = 0; i < 3; i++)
        g3[i] = (float)(r + i);
    for (int i = 0; i < 5; i++)
        g5[i] = (float)(r * 2 + i);
    /* Rank 0: [f32[3], f32[5]]; the others: [f32[5], f32[3]]. */
    T_TRY(hcomm_tensor_init(&grads[r == 0 ? 0 : 1], g3, HCOMM_F32, 1, s3));
    T_TRY(hcomm_tensor_init(&grads[r == 0 ? 1 : 0], g5, HCOMM_F32, 1, s5));
    expect_error(hcomm_dp_all_reduce_grads(c, grads, 2, HCOMM_SUM, 0), HCOMM_ERR_MISMATCH,
                 "dp_all_reduce_grads with [3, 5] on rank 0 and [5, 3] elsewhere", r, p, NULL, 0);
    T_TRY(all_reduce_works(c, "a DP list mismatch"));
    /* The same list everywhere works. */
    for (int i = 0; i < 3; i++)
        g3[i] = (float)(r + i);
    for (int i = 0; i < 5; i++)
        g5[i] = (float)(r * 2 + i);
    T_TRY(hcomm_tensor_init(&grads[0], g3, HCOMM_F32, 1, s3));
    T_TRY(hcomm_tensor_init(&grads[1], g5, HCOMM_F32, 1, s5));
    T_TRY(hcomm_dp_all_reduce_grads(c, grads, 2, HCOMM_SUM, 0));
    int rsum = p * (p - 1) / 2;
    for (int i = 0; i < 3; i++)
        T_CHECK(g3[i] == (float)(rsum + p * i), "dp (world %d, rank %d): g3[%d] = %g, expected %g",
                p, r, i, (double)g3[i], (double)(rsum + p * i));
    for (int i = 0; i < 5; i++)
        T_CHECK(g5[i] == (float)(2 * rsum + p * i),
                "dp (world %d, rank %d): g5[%d] = %g, expected %g", p, r, i, (double)g5[i],
                (double)(2 * rsum + p * i));
    return HCOMM_OK;
}

/* --- (e) abort from another thread --- */

typedef struct aborter {
    hcomm_comm_t *comm;
    double delay_s, at; /* at: when hcomm_comm_abort was called */
    hcomm_result_t res;
} aborter_t;

static void *abort_later(void *arg) {
    aborter_t *a = arg;
    struct timespec ts = {0, (long)(a->delay_s * 1e9)};
    nanosleep(&ts, NULL);
    a->at = now_s();
    a->res = hcomm_comm_abort(a->comm);
    return NULL;
}

/* On a copy of the world, rank 0 enters a barrier that no peer joins; a thread aborts the copy
 * 0.2 s later and the barrier must fail with HCOMM_ERR_ABORTED within 1 s of it. The peers
 * meet rank 0 again on the world, and every rank frees the copy. */
static hcomm_result_t abort_pending(hcomm_comm_t *w) {
    int r = t_rank(w), p = t_size(w);
    hcomm_comm_t *d = NULL;
    T_TRY(hcomm_comm_split(w, 0, r, &d));
    if (r == 0) {
        aborter_t a = {.comm = d, .delay_s = 0.2};
        pthread_t th;
        T_CHECK(pthread_create(&th, NULL, abort_later, &a) == 0, "pthread_create failed");
        double t0 = now_s();
        hcomm_result_t res = hcomm_barrier(d);
        double t1 = now_s();
        pthread_join(th, NULL);
        T_OK(a.res);
        expect_error(res, HCOMM_ERR_ABORTED, "barrier aborted from another thread", r, p, NULL, 0);
        T_CHECK(t1 - a.at < PROMPT_S && t1 >= a.at,
                "barrier (world %d) returned %.3f s after hcomm_comm_abort, expected within %g s "
                "(it waited %.3f s in all)",
                p, t1 - a.at, PROMPT_S, t1 - t0);
    }
    T_TRY(hcomm_barrier(w));
    T_TRY(hcomm_comm_destroy(d));
    return all_reduce_works(w, "an aborted copy of the world");
}

static hcomm_result_t rank_main(hcomm_comm_t *c, void *arg) {
    (void)arg;
    T_TRY(mismatches(c));
    T_TRY(bad_arguments(c));
    T_TRY(overlaps(c));
    T_TRY(dp_order(c));
    T_TRY(abort_pending(c));
    return hcomm_barrier(c);
}

int main(void) {
    if (strcmp(t_backend(), "mpi") == 0)
        T_OK(hcomm_launch("mpi", 0, rank_main, NULL));
    else
        for (int n = 2; n <= 8; n++)
            T_OK(hcomm_launch("local", n, rank_main, NULL));
    return t_finish("test_checks");
}
