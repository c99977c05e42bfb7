/* Lost ranks (hcomm/fault.h): a rank stops for good before, between or during a call of every
 * kind (all_reduce of each algorithm, all_gather, reduce_scatter, all_to_allv, PP receive,
 * nonblocking all_reduce pending, barrier, DP gradient buckets); every survivor's call fails
 * with HCOMM_ERR_PEER_LOST (or HCOMM_ERR_REVOKED, when a faster survivor revoked first) within
 * HCOMM_FAILURE_DETECT plus a margin, then the survivors revoke, agree (the flag ANDed over
 * the live members, PEER_LOST returned) and shrink, and the shrunk communicator's all_reduce
 * gives the survivors' sum. Also: two ranks lost at once, a slow rank never declared lost, and
 * memory flat over 20 revoke + agree + shrink cycles with no rank lost.
 *
 * Local: every case on 3..8 ranks, each its own launch. mpi: one case per job (FAULT_CASE),
 * run by test_fault_mpi.sh under mpirun --enable-recovery, which also kills a rank during a
 * call and during the shrink itself (FAULT_WHEN). Each survivor prints its totals. */
#define _GNU_SOURCE
#include "harness.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

enum {
    OP_AR_RD,
    OP_AR_RING,
    OP_AR_RHD,
    OP_AR_TWOSHOT,
    OP_AR_NAIVE,
    OP_AR_NATIVE,
    OP_ALL_GATHER,
    OP_REDUCE_SCATTER,
    OP_ALL_TO_ALLV,
    OP_PP_RECV,
    OP_IALL_REDUCE,
    OP_BARRIER,
    OP_DP_BUCKETS,
    OP_MOE,
    OP_COUNT
};
static const char *const OP_NAMES[OP_COUNT] = {"all_reduce rd",    "all_reduce ring",
                                               "all_reduce rhd",   "all_reduce twoshot",
                                               "all_reduce naive", "all_reduce native",
                                               "all_gather",       "reduce_scatter",
                                               "all_to_allv",      "pp_recv",
                                               "iall_reduce",      "barrier",
                                               "dp buckets",       "moe dispatch+combine"};
static const char *const OP_ALGO[OP_COUNT] = {"allreduce:rd",    "allreduce:ring",
                                              "allreduce:rhd",   "allreduce:twoshot",
                                              "allreduce:naive", "allreduce:native"};

/* When the victim stops: before the call, after one good call (between), or while its peers
 * are inside it (mpi only: a thread kills the process), or inside the shrink (mpi only). */
enum { WHEN_BEFORE, WHEN_BETWEEN, WHEN_DURING, WHEN_SHRINK };

enum { N = 4096 }; /* floats per rank */

typedef struct fcase {
    int op, when;
    int victims[2], nvict;
} fcase_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double detect_s(void) {
    const char *s = getenv("HCOMM_FAILURE_DETECT");
    return s && *s ? atof(s) : 2.0;
}

static bool is_victim(const fcase_t *fc, int rank) {
    for (int i = 0; i < fc->nvict; i++)
        if (fc->victims[i] == rank)
            return true;
    return false;
}

/* --- the calls --- */

static hcomm_result_t a2av(hcomm_comm_t *c, const float *a, float *b) {
    int p = t_size(c);
    size_t *cnt = calloc((size_t)p * 2, sizeof *cnt), *dsp = cnt + p;
    for (int r = 0; r < p; r++)
        cnt[r] = (N / 8) * sizeof(float), dsp[r] = (size_t)r * cnt[r];
    hcomm_result_t res = hcomm_all_to_allv(c, a, cnt, dsp, b, cnt, dsp);
    free(cnt);
    return res;
}

static hcomm_result_t dp_buckets(hcomm_comm_t *c, float *a) {
    hcomm_tensor_t t[4];
    for (int i = 0; i < 4; i++) {
        int64_t shape[1] = {N / 4};
        hcomm_tensor_init(&t[i], a + i * (N / 4), HCOMM_F32, 1, shape);
    }
    return hcomm_dp_all_reduce_grads(c, t, 4, HCOMM_SUM, 4096);
}

/* MoE dispatch then combine of 64 tokens of 32 floats, expert e on rank e / 2. */
static hcomm_result_t moe(hcomm_comm_t *c, const float *a, float *b) {
    int p = t_size(c);
    int32_t ids[64];
    for (int i = 0; i < 64; i++)
        ids[i] = (i * 7 + t_rank(c)) % (2 * p);
    hcomm_tensor_t tok, out, got;
    int64_t shape[2] = {64, 32};
    hcomm_tensor_init(&tok, (void *)(uintptr_t)a, HCOMM_F32, 2, shape);
    hcomm_tensor_init(&out, b, HCOMM_F32, 2, shape);
    hcomm_moe_handle_t *h = NULL;
    hcomm_result_t r = hcomm_moe_dispatch(c, &tok, ids, 2 * p, &h);
    if (r == HCOMM_OK)
        r = hcomm_moe_received(h, &got, NULL);
    if (r == HCOMM_OK)
        r = hcomm_moe_combine(h, &got, &out);
    hcomm_moe_handle_free(h);
    return r;
}

static hcomm_result_t pp_recv(hcomm_comm_t *c, const fcase_t *fc, float *b) {
    int me = t_rank(c), p = t_size(c), from = fc->victims[0];
    if (me != (from + 1) % p)
        return HCOMM_ERR_PEER_LOST; /* only the victim's next stage waits on it */
    hcomm_tensor_t t;
    int64_t shape[1] = {N};
    hcomm_tensor_init(&t, b, HCOMM_F32, 1, shape);
    return hcomm_pp_recv(c, &t, from, 7);
}

static hcomm_result_t pp_send(hcomm_comm_t *c, float *a) {
    int me = t_rank(c), p = t_size(c);
    hcomm_tensor_t t;
    int64_t shape[1] = {N};
    hcomm_tensor_init(&t, a, HCOMM_F32, 1, shape);
    return hcomm_pp_send(c, &t, (me + 1) % p, 7);
}

static hcomm_result_t run_op(hcomm_comm_t *c, const fcase_t *fc, bool victim, float *a, float *b) {
    switch (fc->op) {
    case OP_ALL_GATHER:
        return hcomm_all_gather(c, a, b, (N / 8) * sizeof(float));
    case OP_REDUCE_SCATTER:
        return hcomm_reduce_scatter(c, a, b, N / 8, HCOMM_F32, HCOMM_SUM);
    case OP_ALL_TO_ALLV:
        return a2av(c, a, b);
    case OP_PP_RECV:
        return victim ? pp_send(c, a) : pp_recv(c, fc, b);
    case OP_IALL_REDUCE: {
        hcomm_request_t *q = NULL;
        hcomm_result_t r = hcomm_iall_reduce(c, a, b, N, HCOMM_F32, HCOMM_SUM, &q);
        return r == HCOMM_OK ? hcomm_wait(q) : r;
    }
    case OP_BARRIER:
        return hcomm_barrier(c);
    case OP_DP_BUCKETS:
        return dp_buckets(c, a);
    case OP_MOE:
        return moe(c, a, b);
    default:
        return hcomm_all_reduce(c, a, b, N, HCOMM_F32, HCOMM_SUM);
    }
}

/* --- one case --- */

static void fill(float *a, int me) {
    for (int i = 0; i < N; i++)
        a[i] = (float)(me + 1);
}

/* mpi, WHEN_DURING and WHEN_SHRINK: the process dies from another thread after delay_us. */
static void *killer(void *arg) {
    long us = (long)(intptr_t)arg;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
    raise(SIGKILL);
    return NULL;
}

static void kill_later(long us) {
    pthread_t t;
    pthread_create(&t, NULL, killer, (void *)(intptr_t)us);
}

/* The victim's part: stop at the case's point (never returns on mpi). */
static hcomm_result_t victim_part(hcomm_comm_t *c, const fcase_t *fc, float *a, float *b) {
    if (fc->when == WHEN_BETWEEN) { /* a good call, which every rank has left */
        run_op(c, fc, true, a, b);
        hcomm_barrier(c);
    }
    if (fc->when == WHEN_DURING) {
        kill_later(2000);
        for (;;)
            if (run_op(c, fc, true, a, b) != HCOMM_OK)
                break;
    }
    if (fc->when == WHEN_SHRINK) {
        int flag = t_rank(c) == 0 ? 3 : 7;
        hcomm_comm_revoke(c);
        hcomm_comm_agree(c, &flag);
        kill_later(100000); /* inside the shrink: the survivors join it 300 ms later */
        hcomm_comm_t *s = NULL;
        hcomm_comm_shrink(c, &s);
        for (;;)
            pause();
    }
    return hcomm_fault_stop(c);
}

/* A survivor's call on c: fails with PEER_LOST (or REVOKED) soon after the victim stopped. */
static void survivor_call(hcomm_comm_t *c, const fcase_t *fc, float *a, float *b) {
    hcomm_result_t r = HCOMM_OK;
    if (fc->when == WHEN_BETWEEN) {
        hcomm_result_t good = run_op(c, fc, false, a, b);
        T_CHECK(good == HCOMM_OK || (fc->op == OP_PP_RECV && good == HCOMM_ERR_PEER_LOST),
                "%s before the loss returned %s", OP_NAMES[fc->op], hcomm_result_name(good));
        T_OK(hcomm_barrier(c));
    }
    double t0 = now_s();
    for (int i = 0; r == HCOMM_OK && i < 1000000; i++)
        r = run_op(c, fc, false, a, b);
    double dt = now_s() - t0;
    T_CHECK(r == HCOMM_ERR_PEER_LOST || r == HCOMM_ERR_REVOKED,
            "%s: a survivor's call returned %s (%s), expected HCOMM_ERR_PEER_LOST",
            OP_NAMES[fc->op], hcomm_result_name(r), hcomm_last_error());
    T_CHECK(dt < detect_s() + 2.0,
            "%s: the loss was noticed after %.2f s (HCOMM_FAILURE_DETECT %g)", OP_NAMES[fc->op], dt,
            detect_s());
    if (r == HCOMM_ERR_PEER_LOST && fc->op != OP_PP_RECV)
        T_CHECK(strstr(hcomm_last_error(), "was lost") != NULL, "message: %s", hcomm_last_error());
}

/* Revoke, agree, shrink; the shrunk comm holds exactly the survivors, in order, and works. */
static void recover(hcomm_comm_t *c, const fcase_t *fc) {
    int p = t_size(c), me = t_rank(c), flag = me == 0 ? 3 : 7, n = 0;
    T_OK(hcomm_comm_revoke(c));
    if (fc->when == WHEN_SHRINK) { /* the victim is alive until it is inside the shrink */
        T_OK(hcomm_comm_agree(c, &flag));
        T_EQ_INT(flag, 3);
        usleep(300000);
    } else {
        T_ERR(hcomm_comm_agree(c, &flag), HCOMM_ERR_PEER_LOST);
        T_EQ_INT(flag, is_victim(fc, 0) ? 7 : 3);
    }
    hcomm_comm_t *s = NULL;
    T_OK(hcomm_comm_shrink(c, &s));
    if (!s)
        return;
    T_EQ_INT(t_size(s), p - fc->nvict);
    int members[8], want = 0;
    T_OK(hcomm_comm_members(s, members, 8));
    for (int r = 0; r < p; r++)
        if (!is_victim(fc, r)) {
            T_EQ_INT(members[n++], r);
            want += r;
        }
    int got = -1;
    T_OK(hcomm_all_reduce(s, &me, &got, 1, HCOMM_I32, HCOMM_SUM));
    T_EQ_INT(got, want);
    T_OK(hcomm_comm_lost(c, NULL, 0, &n));
    T_EQ_INT(n, fc->nvict);
    T_OK(hcomm_comm_destroy(s));
}

static hcomm_result_t case_rank(hcomm_comm_t *world, void *arg) {
    const fcase_t *fc = arg;
    int me = t_rank(world);
    hcomm_comm_t *c = NULL;
    float *a = calloc(N, sizeof *a), *b = calloc((size_t)N * 8, sizeof *b);
    T_TRY(hcomm_comm_split(world, 0, me, &c));
    if (fc->op < OP_ALL_GATHER)
        T_OK(hcomm_comm_set_algo(c, OP_ALGO[fc->op]));
    fill(a, me);
    T_OK(hcomm_barrier(c));
    hcomm_result_t r = HCOMM_OK;
    if (is_victim(fc, me)) {
        r = victim_part(c, fc, a, b);
    } else {
        survivor_call(c, fc, a, b);
        recover(c, fc);
    }
    hcomm_comm_destroy(c);
    free(a);
    free(b);
    return r;
}

/* --- a slow rank, and memory over cycles --- */

/* Rank 1 joins the all_reduce 1.5 x HCOMM_FAILURE_DETECT late: alive, so never declared lost. */
static hcomm_result_t slow_rank(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int me = t_rank(world), p = t_size(world), got = -1;
    if (me == 1)
        usleep((useconds_t)(1.5e6 * detect_s()));
    T_OK(hcomm_all_reduce(world, &me, &got, 1, HCOMM_I32, HCOMM_SUM));
    T_EQ_INT(got, p * (p - 1) / 2);
    int lost = -1;
    T_OK(hcomm_comm_lost(world, NULL, 0, &lost));
    T_EQ_INT(lost, 0);
    return HCOMM_OK;
}

static long rss_kib(void) {
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = 0;
    if (f)
        fclose(f);
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* 20 cycles of split, revoke, agree, shrink, all_reduce, destroy with no rank lost. */
static hcomm_result_t cycles(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int me = t_rank(world), p = t_size(world);
    long at5 = 0;
    for (int i = 0; i < 20; i++) {
        hcomm_comm_t *c = NULL, *s = NULL;
        int flag = 1, got = -1;
        T_TRY(hcomm_comm_split(world, 0, me, &c));
        T_OK(hcomm_all_reduce(c, &me, &got, 1, HCOMM_I32, HCOMM_SUM));
        T_OK(hcomm_comm_revoke(c));
        T_ERR(hcomm_all_reduce(c, &me, &got, 1, HCOMM_I32, HCOMM_SUM), HCOMM_ERR_REVOKED);
        T_OK(hcomm_comm_agree(c, &flag));
        T_EQ_INT(flag, 1);
        T_TRY(hcomm_comm_shrink(c, &s));
        T_EQ_INT(t_size(s), p);
        T_OK(hcomm_all_reduce(s, &me, &got, 1, HCOMM_I32, HCOMM_SUM));
        T_EQ_INT(got, p * (p - 1) / 2);
        T_OK(hcomm_comm_destroy(s));
        T_OK(hcomm_comm_destroy(c));
        T_OK(hcomm_barrier(world));
        if (i == 4)
            at5 = rss_kib();
    }
    long grew = rss_kib() - at5;
    if (me == 0)
        printf("test_fault: RSS grew by %ld KiB over 15 revoke+shrink cycles\n", grew);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) /* they keep freed memory */
    if (me == 0)
        T_CHECK(grew < 2048, "RSS grew by %ld KiB over 15 revoke+shrink cycles", grew);
#endif
    return HCOMM_OK;
}

/* --- rebuilding the domains --- */

/* tp 2 x dp 3 (or x dp 2 with victims in both replicas: nothing to rebuild). Survivors shrink
 * the world and rebuild: the victim's replica is dropped (its survivor gets NULL), the others
 * form tp 2 x dp 2 in their old order, and their DP all_reduce sums the kept replicas. */
static hcomm_result_t rebuild_rank(hcomm_comm_t *world, void *arg) {
    const fcase_t *fc = arg;
    int me = t_rank(world), p = t_size(world), flag = 1;
    hcomm_parallel_config_t cfg = {.tp = 2, .pp = 1, .dp = p / 2, .cp = 1, .ep = 1, .etp = 1};
    hcomm_ctx_t *ctx = NULL, *next = NULL;
    T_TRY(hcomm_ctx_create(world, &cfg, &ctx));
    if (is_victim(fc, me)) { /* local: back once every survivor is done */
        hcomm_result_t stopped = hcomm_fault_stop(world);
        hcomm_ctx_destroy(ctx);
        return stopped;
    }
    hcomm_comm_t *dp = NULL, *shrunk = NULL;
    T_OK(hcomm_ctx_group(ctx, HCOMM_GROUP_DP, &dp));
    bool hit = me % 2 == fc->victims[0] % 2 || (fc->nvict > 1 && me % 2 == fc->victims[1] % 2);
    hcomm_result_t dr = hcomm_all_reduce(dp, &me, &flag, 1, HCOMM_I32, HCOMM_SUM);
    T_CHECK(dr == (hit ? HCOMM_ERR_PEER_LOST : HCOMM_OK), "DP all_reduce %s: %s",
            hcomm_result_name(dr), hcomm_last_error());
    T_OK(hcomm_ctx_revoke(ctx));
    T_ERR(hcomm_comm_agree(world, &flag), HCOMM_ERR_PEER_LOST);
    T_TRY(hcomm_comm_shrink(world, &shrunk));
    hcomm_result_t r = hcomm_ctx_rebuild(ctx, shrunk, &next);
    bool dropped =
        (me / 2) == (fc->victims[0] / 2) || (fc->nvict > 1 && me / 2 == fc->victims[1] / 2);
    if (fc->nvict > 1) {
        T_CHECK(r == HCOMM_ERR_STATE && strstr(hcomm_last_error(), "no whole") != NULL,
                "rebuild with no whole replica: %s (%s)", hcomm_result_name(r), hcomm_last_error());
    } else {
        T_OK(r);
        T_CHECK((next == NULL) == dropped, "rank %d: new context %p, dropped %d", me, (void *)next,
                dropped);
    }
    if (next) {
        hcomm_parallel_config_t got;
        int members[8], rank = -1, size = 0, sum = -1;
        T_OK(hcomm_ctx_config(next, &got));
        T_EQ_INT(got.dp, cfg.dp - 1);
        T_EQ_INT(got.tp, 2);
        T_OK(hcomm_ctx_group(next, HCOMM_GROUP_DP, &dp));
        T_OK(hcomm_ctx_rank(next, HCOMM_GROUP_DP, &rank, &size));
        T_EQ_INT(size, cfg.dp - 1);
        T_OK(hcomm_comm_members(dp, members, 8));
        T_OK(hcomm_all_reduce(dp, &me, &sum, 1, HCOMM_I32, HCOMM_SUM));
        int want = 0; /* the old ranks of my TP position in the kept replicas */
        for (int r2 = me % 2; r2 < p; r2 += 2)
            want += r2 / 2 == fc->victims[0] / 2 ? 0 : r2;
        T_EQ_INT(sum, want);
        T_OK(hcomm_ctx_destroy(next));
    }
    T_OK(hcomm_ctx_destroy(ctx));
    T_OK(hcomm_comm_destroy(shrunk));
    return HCOMM_OK;
}

/* --- cases --- */

static int victim_of(int k, int p) {
    return 1 + k % (p - 1); /* never rank 0 in half the cases, rank 0 never: see two_lost */
}

static void local_cases(void) {
    for (int p = 3; p <= 8; p++)
        for (int op = 0; op < OP_COUNT; op++)
            for (int when = WHEN_BEFORE; when <= WHEN_BETWEEN; when++) {
                fcase_t fc = {op, when, {victim_of(op + when, p), 0}, 1};
                if (op == OP_BARRIER && p % 2 == 1)
                    fc.victims[0] = 0; /* world rank 0 lost too */
                T_OK(hcomm_launch("local", p, case_rank, &fc));
            }
    for (int p = 4; p <= 8; p++) {
        fcase_t two = {OP_AR_RING, WHEN_BEFORE, {1, p - 1}, 2};
        T_OK(hcomm_launch("local", p, case_rank, &two));
    }
    fcase_t one = {0, WHEN_BEFORE, {3, 0}, 1}, both = {0, WHEN_BEFORE, {1, 2}, 2};
    T_OK(hcomm_launch("local", 6, rebuild_rank, &one));
    T_OK(hcomm_launch("local", 8, rebuild_rank, &one));
    T_OK(hcomm_launch("local", 4, rebuild_rank, &both));
    T_OK(hcomm_launch("local", 3, slow_rank, NULL));
    T_OK(hcomm_launch("local", 4, cycles, NULL));
}

/* mpi: FAULT_CASE=op (or "slow", "cycles"), FAULT_WHEN=before|between|during|shrink,
 * FAULT_VICTIMS=a[,b]. */
static void mpi_case(void) {
    const char *kase = getenv("FAULT_CASE"), *when = getenv("FAULT_WHEN");
    const char *v = getenv("FAULT_VICTIMS");
    if (kase && strcmp(kase, "slow") == 0) {
        T_OK(hcomm_launch("mpi", 0, slow_rank, NULL));
        return;
    }
    if (kase && strcmp(kase, "rebuild") == 0) {
        fcase_t fc = {0, WHEN_BEFORE, {3, 0}, 1};
        if (v)
            fc.nvict = sscanf(v, "%d,%d", &fc.victims[0], &fc.victims[1]);
        T_OK(hcomm_launch("mpi", 0, rebuild_rank, &fc));
        return;
    }
    if (!kase || strcmp(kase, "cycles") == 0) {
        T_OK(hcomm_launch("mpi", 0, cycles, NULL));
        return;
    }
    fcase_t fc = {atoi(kase), WHEN_BEFORE, {1, 0}, 1};
    const char *whens[] = {"before", "between", "during", "shrink"};
    for (int i = 0; when && i < 4; i++)
        if (strcmp(when, whens[i]) == 0)
            fc.when = i;
    if (v)
        fc.nvict = sscanf(v, "%d,%d", &fc.victims[0], &fc.victims[1]);
    T_OK(hcomm_launch("mpi", 0, case_rank, &fc));
}

int main(void) {
    if (strcmp(t_backend(), "mpi") == 0)
        mpi_case();
    else
        local_cases();
    return t_finish("test_fault");
}
