/* One rank's run: sessions on fresh communicators split from the world, one call kind after
 * another, and after each call an exchange over the fuzzer's own communicator that makes every
 * rank stop together (a finding, ranks that disagree on success, or time up). */
#include "fuzz_main.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { X_COLOR, X_OKMASK, X_NSTEPS, X_FINDING, X_TIMEUP, X_COUNT };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int weight(const fz_kind_t *k) {
    return strstr(fz_avoid_names, k->name) ? 0 : k->weight;
}

/* The call kinds of every table, drawn by weight from the agreed stream. */
static const fz_kind_t *pick(fz_t *f) {
    const fz_kind_t *tables[] = {fz_coll_kinds,  fz_pp_kinds, fz_prim_kinds,
                                 fz_collv_kinds, fz_tp_kinds, fz_moe_kinds};
    const int counts[] = {fz_coll_nkinds,  fz_pp_nkinds, fz_prim_nkinds,
                          fz_collv_nkinds, fz_tp_nkinds, fz_moe_nkinds};
    const int NT = fz_opt.gen >= 2 ? 6 : 3; /* gen 1: the tables before the later kinds */
    int total = 0;
    for (int t = 0; t < NT; t++)
        for (int k = 0; k < counts[t]; k++)
            total += weight(&tables[t][k]);
    int w = (int)fz_below(&f->ag, (uint64_t)total);
    for (int t = 0; t < NT; t++)
        for (int k = 0; k < counts[t]; k++)
            if ((w -= weight(&tables[t][k])) < 0)
                return &tables[t][k];
    return &fz_coll_kinds[0];
}

/* Session options every member agrees on: an algorithm choice and deterministic mode. */
static void session_options(fz_t *f, fz_rng_t *g) {
    static const char *algos[] = {"allreduce:ring",
                                  "allreduce:rhd",
                                  "allreduce:naive",
                                  "allreduce:rd",
                                  "allgather:bruck;reducescatter:ring",
                                  "reduce:tree;gather:tree;scatter:tree",
                                  "alltoallv:pairwise",
                                  "alltoallv:bruck",
                                  "broadcast:chain",
                                  "allreduce:twoshot"};
    int a = fz_chance(g, 25) ? (int)fz_below(g, sizeof algos / sizeof algos[0]) : -1;
    int det = fz_chance(g, 20);
    if (!f->comm)
        return;
    if (a >= 0)
        fz_check(f, "hcomm_comm_set_algo", hcomm_comm_set_algo(f->comm, algos[a]), FZ_EXPECT_OK);
    if (det)
        fz_check(f, "hcomm_comm_set_deterministic", hcomm_comm_set_deterministic(f->comm, 1),
                 FZ_EXPECT_OK);
}

/* A fresh communicator: the whole world, two halves, or a random subset, in a random order. */
static void new_session(fz_t *f) {
    fz_rng_t g = fz_rank_rng(f, -1, 1);
    uint64_t mode = fz_below(&g, 3), keys = fz_next(&g), subset = fz_next(&g);
    int color = 0;
    if (mode == 1)
        color = f->wrank % 2;
    else if (mode == 2 && !((subset >> f->wrank) & 1))
        color = -1;
    int key = (int)((keys >> (4 * f->wrank)) & 15);
    fz_describe(f, "hcomm_comm_split(color %d, key %d)", color, key);
    fz_check(f, "hcomm_comm_split", hcomm_comm_split(f->world, color, key, &f->comm), FZ_EXPECT_OK);
    f->color = f->comm ? color : -1;
    f->rank = f->size = 0;
    if (f->comm) {
        hcomm_comm_rank(f->comm, &f->rank);
        hcomm_comm_size(f->comm, &f->size);
        hcomm_comm_members(f->comm, f->members, FZ_MAX_RANKS);
    }
    session_options(f, &g);
}

static void end_session(fz_t *f) {
    if (f->comm)
        fz_check(f, "hcomm_comm_destroy", hcomm_comm_destroy(f->comm), FZ_EXPECT_OK);
    f->comm = NULL;
}

/* Returns whether the call ended the communicator. */
static int run_one(fz_t *f) {
    f->ag = fz_rank_rng(f, -1, 0);
    f->nsteps = 0;
    f->okmask = 0;
    f->what[0] = '\0';
    const fz_kind_t *k = pick(f);
    f->kind = k->name;
    fz_progress(f->wrank, f->idx, k->name);
    if (f->comm)
        k->run(f);
    fz_free_all(f);
    if (fz_opt.verbose && f->comm)
        printf("fuzz: rank %d call %ld %s: %s\n", f->wrank, f->idx, k->name, f->what);
    return k->ends_comm;
}

/* Members of one communicator must agree on which collective steps succeeded. */
static int disagree(const int64_t *all, int wsize, char *text, size_t cap) {
    for (int a = 0; a < wsize; a++)
        for (int b = a + 1; b < wsize; b++) {
            const int64_t *x = all + a * X_COUNT, *y = all + b * X_COUNT;
            if (x[X_COLOR] < 0 || x[X_COLOR] != y[X_COLOR] || x[X_OKMASK] == y[X_OKMASK])
                continue;
            snprintf(text, cap,
                     "members disagree on success: world rank %d's steps ok=0x%llx of %lld, "
                     "rank %d's ok=0x%llx",
                     a, (unsigned long long)x[X_OKMASK], (long long)x[X_NSTEPS], b,
                     (unsigned long long)y[X_OKMASK]);
            return 1;
        }
    return 0;
}

/* Gathers every rank's findings so world rank 0 can write one corpus file. */
static void report(fz_t *f, const int64_t *all, const char *agree_text) {
    char *texts = calloc((size_t)f->wsize, sizeof f->text);
    if (f->finding)
        fprintf(stderr, "fuzz: FINDING seed=%llu call=%ld world rank %d (%s): %s\n",
                (unsigned long long)f->seed, f->idx, f->wrank, f->kind, f->text);
    hcomm_all_gather(f->ctl, f->text, texts, sizeof f->text);
    if (f->wrank == 0) {
        const char *found = agree_text;
        for (int r = 0; r < f->wsize && !found; r++)
            if (all[r * X_COUNT + X_FINDING])
                found = texts + (size_t)r * sizeof f->text;
        fz_write_corpus(f->idx, found ? found : "?");
    }
    free(texts);
    atomic_store(&fz_failed, 1);
}

/* Returns 1 when every rank stops here. */
static int exchange(fz_t *f, double deadline) {
    int64_t mine[X_COUNT] = {f->color, f->okmask, f->nsteps, f->finding,
                             deadline > 0 && now() > deadline};
    int64_t all[FZ_MAX_RANKS * X_COUNT];
    hcomm_result_t r = hcomm_all_gather(f->ctl, mine, all, sizeof mine);
    if (r != HCOMM_OK) {
        fz_finding(f, "the fuzzer's own exchange failed: %s (%s)", hcomm_result_name(r),
                   hcomm_last_error());
        fz_write_corpus(f->idx, f->text);
        atomic_store(&fz_failed, 1);
        return 1;
    }
    char agree_text[256];
    int found = disagree(all, f->wsize, agree_text, sizeof agree_text), timeup = 0;
    for (int q = 0; q < f->wsize; q++) {
        found |= all[q * X_COUNT + X_FINDING] != 0;
        timeup |= all[q * X_COUNT + X_TIMEUP] != 0;
    }
    if (found)
        report(f, all, disagree(all, f->wsize, agree_text, sizeof agree_text) ? agree_text : NULL);
    return found || timeup;
}

static void setup(fz_t *f, hcomm_comm_t *world, double timeout_s) {
    f->world = world;
    hcomm_comm_rank(world, &f->wrank);
    hcomm_comm_size(world, &f->wsize);
    hcomm_comm_split(world, 0, f->wrank, &f->ctl);
    /* past the fuzzed communicators' timeout, so theirs shows first */
    hcomm_comm_set_timeout(f->ctl, 2 * timeout_s + 10);
    f->timeout_s = timeout_s;
    uint64_t seed = fz_opt.seed; /* rank 0's, where each process drew its own */
    hcomm_broadcast(f->ctl, &seed, sizeof seed, 0);
    f->seed = seed;
    /* for the corpus file any rank may write: each process's copy, or once for the threads
     * that share it (after the broadcast, which orders it after every rank's read above) */
    if (f->wrank == 0 || strcmp(fz_opt.backend, "mpi") == 0) {
        fz_opt.seed = seed;
        fz_opt.ranks = f->wsize;
    }
    if (f->wrank == 0) {
        printf("fuzz: seed=%llu backend=%s ranks=%d %s=%g\n", (unsigned long long)seed,
               fz_opt.backend, f->wsize, fz_opt.calls ? "calls" : "seconds",
               fz_opt.calls ? (double)fz_opt.calls : fz_opt.seconds);
        fflush(stdout);
    }
}

static void totals(fz_t *f) {
    int64_t mine[3] = {atomic_exchange(&fz_calls, 0), atomic_exchange(&fz_errors, 0),
                       atomic_exchange(&fz_ok_checked, 0)},
            sum[3] = {0};
    if (strcmp(fz_opt.backend, "mpi") != 0) { /* threads share the counters */
        atomic_fetch_add(&fz_calls, mine[0]);
        atomic_fetch_add(&fz_errors, mine[1]);
        atomic_fetch_add(&fz_ok_checked, mine[2]);
    }
    hcomm_barrier(f->ctl);
    if (strcmp(fz_opt.backend, "mpi") == 0)
        hcomm_all_reduce(f->ctl, mine, sum, 3, HCOMM_I64, HCOMM_SUM);
    else
        sum[0] = atomic_load(&fz_calls), sum[1] = atomic_load(&fz_errors),
        sum[2] = atomic_load(&fz_ok_checked);
    if (f->wrank == 0)
        printf("fuzz: seed=%llu calls=%lld errors=%lld ok_checked=%lld steps=%ld%s\n",
               (unsigned long long)f->seed, (long long)sum[0], (long long)sum[1], (long long)sum[2],
               f->idx, atomic_load(&fz_failed) ? " FAILED" : "");
}

hcomm_result_t fz_rank_main(hcomm_comm_t *world, void *arg) {
    fz_t *f = calloc(1, sizeof *f);
    setup(f, world, *(double *)arg);
    double deadline = fz_opt.seconds > 0 ? now() + fz_opt.seconds : 0;
    long session_end = 0;
    for (f->idx = 0; !fz_opt.calls || f->idx < fz_opt.calls; f->idx++) {
        if (f->idx >= session_end) {
            end_session(f);
            new_session(f);
            fz_rng_t g = fz_rank_rng(f, -1, 2);
            session_end = f->idx + 5 + (long)fz_below(&g, 60);
        }
        if (run_one(f)) /* the call ended the communicator: the next call gets a fresh one */
            session_end = f->idx + 1;
        int stop = exchange(f, deadline);
        fz_progress(f->wrank, f->idx, NULL);
        if (stop) {
            if (atomic_load(&fz_failed))
                break;
            f->idx++;
            break;
        }
    }
    if (!atomic_load(&fz_failed))
        end_session(f);
    totals(f);
    hcomm_comm_destroy(f->ctl);
    free(f);
    return HCOMM_OK;
}
