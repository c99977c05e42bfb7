/* The mpi backend's board (HCOMM_TEST_MPI: np 2, 3 and 4 on one host; on the local backend,
 * which has none, world sizes 2..5 run the same calls through its own shared memory):
 *   (a) every communicator of ranks on one host has one (the world and a split of it);
 *   (b) a long mixed sequence (broadcast, reduce, gather and scatter from every root,
 *       all_reduce, all_gather and reduce_scatter, of sizes from 0 to several 64 KiB board
 *       pieces, by shm and by the default choice) keeps every value right: the two halves of
 *       each rank's region are reused only once no peer reads them;
 *   (c) ranks in different calls, one on shm and one meeting before another algorithm (twoshot,
 *       native), fail with HCOMM_ERR_MISMATCH on every rank, not a timeout, and the
 *       communicator works afterwards;
 *   (d) a rank whose own checks fail (a NULL buffer) makes its peers in an shm call fail with
 *       HCOMM_ERR_PEER naming it, and the next call works;
 *   (e) on mpi the defaults run shm up to their measured sizes and other algorithms above
 *       (all_reduce, broadcast, gather);
 *   (f) (a), (b) and (e) hold under HCOMM_CHECK=off too (test_board_off_*), where a root
 *       whose payload its peers read does not wait for them, and ranks that only feed a root
 *       leave at once;
 *   (g) near shm's switch the first calls of a size alternate between shm and the algorithm
 *       on the other side in runs (tune.h), every rank alike, then every rank keeps one and
 *       the same; a call that failed (a mismatch of counts between the ranks, in the middle
 *       of the runs) leaves the schedule where it was on every rank. */
#include "harness.h"

#include "algo/coll.h"
#include "algo/tune.h"
#include "core/env.h"
#include "p2p/p2p.h"

#include <sys/statvfs.h>

enum { BIG = 3 * 16384 + 77 }; /* floats: three 64 KiB pieces and a tail */

/* A board needs /dev/shm room (it falls back to messages without): 16 MiB free is plenty. */
static bool shm_room(void) {
    struct statvfs v;
    return statvfs("/dev/shm", &v) == 0 && (double)v.f_bavail * (double)v.f_frsize > 16e6;
}

static hcomm_result_t has_board(hcomm_comm_t *w) {
    bool mpi = strcmp(t_backend(), "mpi") == 0;
    if (mpi && !shm_room()) {
        printf("test_board: /dev/shm is (nearly) full, the board checks are skipped\n");
        return HCOMM_OK;
    }
    T_CHECK(hcomm__board_on(w) == (mpi && t_size(w) > 1), "world of %d: board %d on %s", t_size(w),
            (int)hcomm__board_on(w), t_backend());
    hcomm_comm_t *half = NULL;
    T_TRY(hcomm_comm_split(w, t_rank(w) % 2, t_rank(w), &half));
    int n = 0;
    T_TRY(hcomm_comm_size(half, &n));
    T_CHECK(hcomm__board_on(half) == (mpi && n > 1), "split of %d: board %d", n,
            (int)hcomm__board_on(half));
    float one = 1.0f, sum = 0.0f;
    T_TRY(hcomm_all_reduce(half, &one, &sum, 1, HCOMM_F32, HCOMM_SUM));
    T_CHECK(sum == (float)n, "split all_reduce: %g, expected %d", (double)sum, n);
    return hcomm_comm_destroy(half);
}

static float val(int rank, size_t i) {
    return (float)((rank * 131 + (int)(i % 1009)) % 61) - 30.0f;
}

/* The rooted calls of step s: reduce, gather and scatter of about n / p floats to root. */
static hcomm_result_t rooted_round(hcomm_comm_t *w, int s, int root, float *a, float *b) {
    int p = t_size(w), me = t_rank(w);
    size_t m = (size_t)(s * 7919) % BIG / (size_t)p;
    for (size_t i = 0; i < m * (size_t)p; i++)
        a[i] = val(me, i);
    b[0] = -99.0f;
    T_TRY(hcomm_reduce(w, a, b, m, HCOMM_F32, HCOMM_MIN, root));
    for (size_t i = 0; me == root && i < m; i++) {
        float want = val(0, i);
        for (int r = 1; r < p; r++)
            want = val(r, i) < want ? val(r, i) : want;
        T_CHECK(b[i] == want, "step %d: reduce of %zu to %d: [%zu]=%g", s, m, root, i,
                (double)b[i]);
    }
    T_TRY(hcomm_gather(w, a, b, m * sizeof(float), root));
    for (size_t i = 0; me == root && i < m * (size_t)p; i++)
        T_CHECK(b[i] == val((int)(i / m), i % m), "step %d: gather of %zu to %d: [%zu]=%g", s, m,
                root, i, (double)b[i]);
    for (size_t i = 0; i < m * (size_t)p; i++)
        a[i] = val(me == root ? (int)(i / m) : -1, i);
    T_TRY(hcomm_scatter(w, a, b, m * sizeof(float), root));
    for (size_t i = 0; i < m; i++)
        T_CHECK(b[i] == val(me, (size_t)me * m + i), "step %d: scatter of %zu from %d: [%zu]=%g", s,
                m, root, i, (double)b[i]);
    return HCOMM_OK;
}

/* One round of step s: every collective at a size that changes with s. */
static hcomm_result_t round_of(hcomm_comm_t *w, int s, float *a, float *b) {
    int p = t_size(w), me = t_rank(w), root = s % p;
    size_t n = (size_t)(s * 7919) % BIG;
    for (size_t i = 0; i < n; i++)
        a[i] = val(me == root ? root : -1, i);
    T_TRY(hcomm_broadcast(w, a, n * sizeof(float), root));
    for (size_t i = 0; i < n; i++)
        T_CHECK(a[i] == val(root, i), "step %d: broadcast of %zu floats from %d: [%zu]=%g", s, n,
                root, i, (double)a[i]);
    size_t m = n / (size_t)p;
    for (size_t i = 0; i < m * (size_t)p; i++)
        a[i] = val(me, i);
    T_TRY(hcomm_all_reduce(w, a, b, m * (size_t)p, HCOMM_F32, HCOMM_SUM));
    for (size_t i = 0; i < m * (size_t)p; i += 7) {
        float want = 0.0f;
        for (int r = 0; r < p; r++)
            want += val(r, i);
        T_CHECK(b[i] == want, "step %d: all_reduce of %zu: [%zu]=%g, expected %g", s, m * (size_t)p,
                i, (double)b[i], (double)want);
    }
    T_TRY(hcomm_reduce_scatter(w, a, b, m, HCOMM_F32, HCOMM_MAX));
    for (size_t i = 0; i < m; i++) {
        float want = val(0, (size_t)me * m + i);
        for (int r = 1; r < p; r++)
            if (val(r, (size_t)me * m + i) > want)
                want = val(r, (size_t)me * m + i);
        T_CHECK(b[i] == want, "step %d: reduce_scatter of %zu: [%zu]=%g", s, m, i, (double)b[i]);
    }
    T_TRY(hcomm_all_gather(w, a, b, m * sizeof(float)));
    for (size_t i = 0; i < m * (size_t)p; i++)
        T_CHECK(b[i] == val((int)(i / m), i % m), "step %d: all_gather of %zu: [%zu]=%g", s, m, i,
                (double)b[i]);
    return rooted_round(w, s, root, a, b);
}

static hcomm_result_t mixed_sequence(hcomm_comm_t *w) {
    float *a = calloc(BIG, sizeof(float)), *b = calloc(BIG, sizeof(float));
    if (!a || !b)
        return HCOMM_ERR_NOMEM;
    for (int pass = 0; pass < 2; pass++) {
        T_TRY(hcomm_comm_set_algo(w, pass ? ""
                                          : "allreduce:shm;broadcast:shm;allgather:shm;"
                                            "reducescatter:shm;reduce:shm;gather:shm;scatter:shm"));
        for (int s = 0; s < 40; s++)
            T_TRY(round_of(w, s, a, b));
    }
    free(a);
    free(b);
    return HCOMM_OK;
}

/* Rank 0 broadcasts 8 bytes (shm) while its peers all_reduce count floats by algo. */
static hcomm_result_t differ(hcomm_comm_t *w, const char *algo, size_t count) {
    int me = t_rank(w);
    float *a = calloc(count, sizeof(float)), *b = calloc(count, sizeof(float));
    if (!a || !b)
        return HCOMM_ERR_NOMEM;
    T_TRY(hcomm_comm_set_algo(w, algo));
    hcomm_result_t r = me == 0 ? hcomm_broadcast(w, a, 8, 0)
                               : hcomm_all_reduce(w, a, b, count, HCOMM_F32, HCOMM_SUM);
    T_CHECK(r == HCOMM_ERR_MISMATCH && strstr(hcomm_last_error(), "called"),
            "%s: broadcast on rank 0, all_reduce of %zu elsewhere: rank %d got %s '%s'", algo,
            count, me, hcomm_result_name(r), hcomm_last_error());
    T_TRY(hcomm_comm_set_algo(w, ""));
    a[0] = 1.0f;
    T_TRY(hcomm_all_reduce(w, a, b, 1, HCOMM_F32, HCOMM_SUM));
    T_CHECK(b[0] == (float)t_size(w), "after the mismatch: %g", (double)b[0]);
    free(a);
    free(b);
    return HCOMM_OK;
}

static hcomm_result_t own_check_fails(hcomm_comm_t *w) {
    int me = t_rank(w), p = t_size(w);
    float x[4] = {1, 2, 3, 4}, y[4];
    hcomm_result_t r = hcomm_all_reduce(w, me == p - 1 ? NULL : x, y, 4, HCOMM_F32, HCOMM_SUM);
    if (me == p - 1)
        T_CHECK(r == HCOMM_ERR_NULL, "rank %d with a NULL sendbuf: %s", me, hcomm_result_name(r));
    else {
        char want[64];
        snprintf(want, sizeof want, "rank %d failed its own checks", p - 1);
        T_CHECK(r == HCOMM_ERR_PEER && strstr(hcomm_last_error(), want),
                "rank %d beside a failed rank: %s '%s'", me, hcomm_result_name(r),
                hcomm_last_error());
    }
    T_TRY(hcomm_all_reduce(w, x, y, 4, HCOMM_F32, HCOMM_SUM));
    T_CHECK(y[3] == 4.0f * (float)p, "after the failed call: %g", (double)y[3]);
    return HCOMM_OK;
}

enum { ALL_REDUCE, BROADCAST, GATHER, SCATTER, ALL_GATHER, REDUCE_SCATTER };

/* The algorithm the default picks for a call (above) of bytes in all (for gather, scatter,
 * all_gather and reduce_scatter: bytes / size per rank; buf holds bytes + 4, and all_gather's
 * input and reduce_scatter's output after BOARD_PICK_SEND). */
#define BOARD_PICK_SEND ((size_t)512 << 10)

static const char *picked(hcomm_comm_t *w, int call, size_t bytes, void *buf) {
    size_t per = bytes / (size_t)t_size(w);
    char *mine = (char *)buf + per * (size_t)t_rank(w);
    hcomm__coll_take_algo(w);
    hcomm_result_t r =
        call == BROADCAST        ? hcomm_broadcast(w, buf, bytes, 0)
        : call == GATHER         ? hcomm_gather(w, mine, buf, per, 0)
        : call == SCATTER        ? hcomm_scatter(w, buf, mine, per, 0)
        : call == ALL_GATHER     ? hcomm_all_gather(w, (char *)buf + BOARD_PICK_SEND, buf, per)
        : call == REDUCE_SCATTER ? hcomm_reduce_scatter(w, buf, (char *)buf + BOARD_PICK_SEND,
                                                        per / 4, HCOMM_F32, HCOMM_SUM)
                                 : hcomm_all_reduce(w, buf, buf, bytes / 4, HCOMM_F32, HCOMM_SUM);
    const char *a = hcomm__coll_take_algo(w);
    return r == HCOMM_OK && a ? a : "(failed)";
}

static hcomm_result_t defaults(hcomm_comm_t *w) {
    bool two = t_size(w) == 2;
    bool off = hcomm__check_mode() == HCOMM__CHECK_OFF;
    size_t ar = two ? (off ? 4 << 10 : 8 << 10) : 32 << 10, bc = two ? 4 << 10 : 64 << 10;
    float *buf = calloc(2 * BOARD_PICK_SEND, 1);
    if (!buf)
        return HCOMM_ERR_NOMEM;
    const char *a = picked(w, ALL_REDUCE, ar, buf), *b = picked(w, ALL_REDUCE, ar + 4, buf);
    T_CHECK(!strcmp(a, "shm") && strcmp(b, "shm"), "all_reduce of %zu / %zu bytes on %d: %s / %s",
            ar, ar + 4, t_size(w), a, b);
    /* a bf16 sum is sized as f32 of its count: half of shm's bytes already leave it */
    hcomm__coll_take_algo(w);
    hcomm_result_t r = hcomm_all_reduce(w, buf, buf, ar / 2 / 2 + 2, HCOMM_BF16, HCOMM_SUM);
    a = hcomm__coll_take_algo(w);
    T_CHECK(r == HCOMM_OK && a && strcmp(a, "shm"), "bf16 all_reduce of %zu bytes on %d: %s",
            ar / 2 + 4, t_size(w), a ? a : "(failed)");
    size_t ag = two ? (off ? 16 << 10 : 32 << 10) : 256 << 10; /* the total gathered */
    a = picked(w, ALL_GATHER, ag, buf), b = picked(w, ALL_GATHER, ag + 4 * (size_t)t_size(w), buf);
    T_CHECK(!strcmp(a, "shm") && strcmp(b, "shm"), "all_gather of %zu / %zu bytes on %d: %s / %s",
            ag, ag + 4 * (size_t)t_size(w), t_size(w), a, b);
    a = picked(w, BROADCAST, bc, buf), b = picked(w, BROADCAST, bc + 4, buf);
    T_CHECK(!strcmp(a, "shm") && !strcmp(b, "direct"),
            "broadcast of %zu / %zu bytes on %d: %s / %s", bc, bc + 4, t_size(w), a, b);
    size_t rs = two ? 16 << 10 : 128 << 10, rs_step = 4 * (size_t)t_size(w);
    a = picked(w, REDUCE_SCATTER, rs, buf), b = picked(w, REDUCE_SCATTER, rs + rs_step, buf);
    T_CHECK(!strcmp(a, "shm") && !strcmp(b, "direct"),
            "reduce_scatter of %zu / %zu bytes on %d: %s / %s", rs, rs + rs_step, t_size(w), a, b);
    /* shm up to these, direct above */
    size_t ga = two ? 1 << 10 : 32 << 10;
    a = picked(w, GATHER, ga, buf), b = picked(w, GATHER, 2 * ga, buf);
    T_CHECK(!strcmp(a, "shm") && !strcmp(b, "direct"), "gather of %zu / %zu bytes on %d: %s / %s",
            ga, 2 * ga, t_size(w), a, b);
    free(buf);
    return HCOMM_OK;
}

/* The algorithm every rank ran, or NULL where they differ (their names' first letters). */
static const char *same_everywhere(hcomm_comm_t *w, const char *a) {
    int32_t mine = a ? a[0] : 0, hi, lo;
    if (hcomm_all_reduce(w, &mine, &hi, 1, HCOMM_I32, HCOMM_MAX) != HCOMM_OK ||
        hcomm_all_reduce(w, &mine, &lo, 1, HCOMM_I32, HCOMM_MIN) != HCOMM_OK)
        return NULL;
    return hi == lo ? a : NULL;
}

/* (g): an all_reduce just above shm's switch, default and rival alternating in runs. */
/* Whether calls [from, to) ran the probe's runs (tune.h: the default, then its rival) or
 * all ran one algorithm, which *kept names. */
static bool runs_or_one(const char *const *ran, int from, int to, const char **kept) {
    bool runs = true, one = true;
    for (int call = from; call < to; call++) {
        runs = runs && (strcmp(ran[call], ran[0]) == 0) == (call / HCOMM__TUNE_RUN % 2 == 0);
        one = one && strcmp(ran[call], ran[from]) == 0;
    }
    *kept = one ? ran[from] : NULL;
    return runs || one;
}

/* (g): an all_reduce just above shm's switch. */
static hcomm_result_t timed_choice(hcomm_comm_t *w, bool mismatch) {
    enum { CALLS = HCOMM__TUNE_CALLS + 6, RUN2 = 2 * HCOMM__TUNE_RUN };
    bool two = t_size(w) == 2, off = hcomm__check_mode() == HCOMM__CHECK_OFF;
    size_t n = (two ? (off ? 4 << 10 : 8 << 10) : 32 << 10) / 4 + 3 + mismatch; /* new sizes */
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    const char *ran[CALLS];
    if (!a || !b)
        return HCOMM_ERR_NOMEM;
    for (int call = 0; call < CALLS; call++) {
        if (mismatch && call == HCOMM__TUNE_RUN + 1) { /* fails on every rank */
            hcomm_result_t r =
                hcomm_all_reduce(w, a, b, n - (size_t)t_rank(w) % 2, HCOMM_F32, HCOMM_SUM);
            T_CHECK(r == HCOMM_ERR_MISMATCH, "counts differ: rank %d got %s", t_rank(w),
                    hcomm_result_name(r));
        }
        for (size_t i = 0; i < n; i++)
            a[i] = (float)((t_rank(w) + (int)i) % 5);
        hcomm__coll_take_algo(w);
        T_TRY(hcomm_all_reduce(w, a, b, n, HCOMM_F32, HCOMM_SUM));
        ran[call] = same_everywhere(w, hcomm__coll_take_algo(w));
        T_CHECK(ran[call] != NULL, "call %d of %zu floats: the ranks ran different algorithms",
                call, n);
        for (size_t i = 0; i < n; i += 997) {
            float want = 0;
            for (int q = 0; q < t_size(w); q++)
                want += (float)((q + (int)i) % 5);
            T_CHECK(b[i] == want, "call %d: [%zu] = %g, expected %g", call, i, (double)b[i],
                    (double)want);
        }
        if (!ran[call]) {
            free(a);
            free(b);
            return HCOMM_OK;
        }
    }
    const char *early, *late;
    T_CHECK(strcmp(ran[0], "shm") != 0, "%zu floats on %d ranks began with %s", n, t_size(w),
            ran[0]);
    /* a run of each; then more runs (the check still accepts one algorithm there, as when the
     * tuner decided early, which it no longer does); then one kept */
    T_CHECK(runs_or_one(ran, 0, RUN2, &early) && !early, "calls 0-%d: not a run of each", RUN2 - 1);
    T_CHECK(runs_or_one(ran, RUN2, HCOMM__TUNE_CALLS, &early), "calls %d-%d: %s ... %s", RUN2,
            HCOMM__TUNE_CALLS - 1, ran[RUN2], ran[HCOMM__TUNE_CALLS - 1]);
    runs_or_one(ran, HCOMM__TUNE_CALLS, CALLS, &late);
    T_CHECK(late && (!early || strcmp(early, late) == 0), "after the probe: %s ... %s (early %s)",
            ran[HCOMM__TUNE_CALLS], ran[CALLS - 1], early ? early : "none");
    free(a);
    free(b);
    return HCOMM_OK;
}

/* Under HCOMM_CHECK=off (its own CTest entries) meetings wait only where a call's shape needs
 * it, and mismatches are the caller's to avoid: only (a), (b) and (e) run. */
static bool unchecked(void) {
    const char *v = getenv("HCOMM_CHECK");
    return v && !strcmp(v, "off");
}

static hcomm_result_t rank_main(hcomm_comm_t *w, void *arg) {
    (void)arg;
    T_TRY(has_board(w));
    if (hcomm__board_on(w) && !getenv("HCOMM_ALGO")) {
        T_TRY(defaults(w));
        T_TRY(timed_choice(w, false));
        if (t_size(w) > 1 && !unchecked())
            T_TRY(timed_choice(w, true));
    }
    T_TRY(mixed_sequence(w));
    if (t_size(w) > 1 && !unchecked()) {
        T_TRY(differ(w, "", 4));
        T_TRY(differ(w, "allreduce:twoshot", 1 << 18));
        T_TRY(differ(w, "allreduce:native", 1 << 12));
        T_TRY(own_check_fails(w));
    }
    return hcomm_barrier(w);
}

int main(void) {
    setenv("HCOMM_TIMEOUT", "30", 1); /* a hang fails by far, but ends */
    if (strcmp(t_backend(), "mpi") == 0)
        T_OK(hcomm_launch("mpi", 0, rank_main, NULL));
    else
        for (int n = 2; n <= 5; n++)
            T_OK(hcomm_launch("local", n, rank_main, NULL));
    return t_finish("test_board");
}
