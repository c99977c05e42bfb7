/* hcomm_comm_abort() from a watchdog thread while every rank loops hcomm_iall_reduce +
 * hcomm_wait: each rank's first failing call returns HCOMM_ERR_ABORTED or HCOMM_ERR_PEER with a
 * message that names the abort (never a mismatch or a size a peer never sent), and quickly,
 * not at the timeout; every call that returns HCOMM_OK has every element right, though a rank
 * overwrites its buffers as soon as its calls have failed (as a caller that frees them does),
 * which peers still reading them directly (twoshot) would see. Repeated on fresh communicators,
 * the aborting rank and the delay varied, so the abort lands at every point of a call.
 * HCOMM_TEST_MPI */
#include "harness.h"

#include <pthread.h>
#include <stdbool.h>
#include <time.h>

/* COUNT: 256 KiB, which one host's ranks reduce by reading each other's buffers (twoshot). */
enum { ROUNDS = 32, COUNT = 65536, DEPTH = 3, MAX_CALLS = 200000 };

/* Each round's communicator times out after this long: an abort its peers never learn of
 * shows as a timeout, far past the bound checked below. */
#define ROUND_TIMEOUT_S 15.0
/* How soon after the abort every rank's call must have failed. */
#define FAIL_WITHIN_S 5.0

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct watchdog {
    hcomm_comm_t *comm;
    long delay_us;
    hcomm_result_t res;
} watchdog_t;

static void *watchdog_main(void *arg) {
    watchdog_t *w = arg;
    struct timespec ts = {w->delay_us / 1000000, (w->delay_us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    w->res = hcomm_comm_abort(w->comm);
    return NULL;
}

static void check_sums(const float *out, int p, long call) {
    float base = (float)(p * (p - 1) / 2);
    int wrong = 0, first = -1;
    for (int k = 0; k < COUNT; k++)
        if (out[k] != base + (float)(p * k) && wrong++ == 0)
            first = k;
    T_CHECK(wrong == 0, "call %ld returned HCOMM_OK with %d wrong elements, the first %d: %g", call,
            wrong, first, first >= 0 ? out[first] : 0.0);
}

/* Keeps the first failure of a rank's calls; any later one must be an abort's too. */
static void later_failure(hcomm_result_t res, hcomm_result_t *first, char *msg, size_t cap) {
    if (res == HCOMM_OK)
        return;
    if (*first == HCOMM_OK) {
        *first = res;
        snprintf(msg, cap, "%s", hcomm_last_error());
        return;
    }
    T_CHECK((res == HCOMM_ERR_ABORTED || res == HCOMM_ERR_PEER) &&
                strstr(hcomm_last_error(), "abort") != NULL,
            "a call after the first failure: %s (%s), expected HCOMM_ERR_ABORTED or "
            "HCOMM_ERR_PEER naming the abort",
            hcomm_result_name(res), hcomm_last_error());
}

/* Loops on d: DEPTH iall_reduce in flight, then their waits, until a call fails; returns the
 * first failure (its message in *msg) and checks every later one of that batch too (the
 * worker runs the queued calls after the failed one) and the sums of the calls that
 * succeeded. */
static hcomm_result_t loop_until_failure(hcomm_comm_t *d, int p, long *calls, char *msg, size_t cap,
                                         float (*in)[COUNT], float (*out)[COUNT]) {
    hcomm_result_t first = HCOMM_OK;
    for (*calls = 0; *calls < MAX_CALLS && first == HCOMM_OK; *calls += DEPTH) {
        hcomm_request_t *q[DEPTH] = {NULL};
        for (int i = 0; i < DEPTH; i++) {
            for (int k = 0; k < COUNT; k++)
                in[i][k] = (float)(t_rank(d) + k), out[i][k] = -1.0f;
            hcomm_result_t res =
                hcomm_iall_reduce(d, in[i], out[i], COUNT, HCOMM_F32, HCOMM_SUM, &q[i]);
            later_failure(res, &first, msg, cap);
        }
        for (int i = 0; i < DEPTH; i++) {
            hcomm_result_t res = q[i] ? hcomm_wait(q[i]) : HCOMM_ERR_ABORTED;
            if (q[i] && res == HCOMM_OK)
                check_sums(out[i], p, *calls + i);
            else if (q[i])
                later_failure(res, &first, msg, cap);
        }
    }
    return first;
}

/* Checks rank r's first failure of round n (aborter: the rank that called abort). */
static void check_failure(hcomm_result_t res, const char *msg, int round, int r, int aborter,
                          long calls) {
    bool named = strstr(msg, "abort") != NULL;
    if (r == aborter)
        T_CHECK(res == HCOMM_ERR_ABORTED && named,
                "round %d, rank %d (the aborter), call %ld: %s (%s), expected HCOMM_ERR_ABORTED",
                round, r, calls, hcomm_result_name(res), msg);
    else
        T_CHECK((res == HCOMM_ERR_ABORTED || res == HCOMM_ERR_PEER) && named,
                "round %d, rank %d, call %ld (rank %d aborted): %s (%s), expected "
                "HCOMM_ERR_ABORTED or HCOMM_ERR_PEER naming the abort",
                round, r, calls, aborter, hcomm_result_name(res), msg);
}

/* Rank r's first failure of the round, its buffers overwritten at once after it. */
static hcomm_result_t fail_and_reuse(hcomm_comm_t *d, int p, long *calls, char *msg, size_t cap) {
    float(*in)[COUNT] = malloc(sizeof(float[DEPTH][COUNT]));
    float(*out)[COUNT] = malloc(sizeof(float[DEPTH][COUNT]));
    if (!in || !out) {
        free(in);
        free(out);
        snprintf(msg, cap, "abort: out of memory in the test");
        return HCOMM_ERR_NOMEM;
    }
    hcomm_result_t res = loop_until_failure(d, p, calls, msg, cap, in, out);
    memset(in, 0x7f, sizeof(float[DEPTH][COUNT]));
    memset(out, 0x7f, sizeof(float[DEPTH][COUNT]));
    free(in);
    free(out);
    return res;
}

static hcomm_result_t one_round(hcomm_comm_t *w, int round) {
    int r = t_rank(w), p = t_size(w), aborter = round % p;
    hcomm_comm_t *d = NULL;
    T_TRY(hcomm_comm_split(w, 0, r, &d));
    T_TRY(hcomm_comm_set_timeout(d, ROUND_TIMEOUT_S));
    float warm = 1.0f; /* the worker exists before the watchdog starts */
    hcomm_request_t *q = NULL;
    T_TRY(hcomm_iall_reduce(d, &warm, &warm, 1, HCOMM_F32, HCOMM_SUM, &q));
    T_TRY(hcomm_wait(q));
    /* A rank still finishing the warm-up when the abort lands fails it, rightly (an abort ends
     * the calls in flight): every rank is past it before the watchdog starts. */
    T_TRY(hcomm_barrier(w));
    watchdog_t wd = {.comm = d, .delay_us = 500 + 731L * round % 4000};
    pthread_t th;
    if (r == aborter)
        T_CHECK(pthread_create(&th, NULL, watchdog_main, &wd) == 0, "pthread_create failed");
    long calls = 0;
    char msg[512] = "";
    hcomm_result_t res = fail_and_reuse(d, p, &calls, msg, sizeof msg);
    double failed_at = now_s();
    if (r == aborter) {
        pthread_join(th, NULL);
        T_OK(wd.res);
    }
    if (p > 1 || r == aborter)
        check_failure(res, msg, round, r, aborter, calls);
    /* The aborter's failure time against everyone's: a rank that only timed out is late. */
    double t[2] = {r == aborter ? failed_at : 0.0, failed_at}, most[2];
    T_TRY(hcomm_all_reduce(w, t, most, 2, HCOMM_F64, HCOMM_MAX));
    T_CHECK(most[1] - most[0] < FAIL_WITHIN_S,
            "round %d: a rank failed %.2f s after the aborter (rank %d), expected within %g s",
            round, most[1] - most[0], aborter, FAIL_WITHIN_S);
    T_TRY(hcomm_comm_destroy(d));
    return HCOMM_OK;
}

/* Stops at the first round with a failed check: each such round costs its timeout. */
static hcomm_result_t abort_rounds(hcomm_comm_t *w, void *arg) {
    (void)arg;
    for (int round = 0; round < ROUNDS; round++) {
        int before = atomic_load(&t_failures);
        T_TRY(one_round(w, round));
        if (atomic_load(&t_failures) != before)
            return HCOMM_ERR_ABORTED;
    }
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(abort_rounds, NULL, 4);
    return t_finish("test_abort_icoll");
}
