/* hcomm_fuzz: random sequences of hcomm's public calls, checked against the contract
 * (docs/fuzz.md). Usage:
 *   hcomm_fuzz [--seed S] [--calls N | --seconds T] [--backend local|mpi] [--ranks R]
 *              [--corpus-dir DIR] [--verbose]
 *   hcomm_fuzz --replay FILE      (a corpus file: seed, calls, backend, ranks)
 * Prints the seed first and "calls=N errors=E ok_checked=K" last; on a failure the seed, the
 * failing call's index and a corpus file to replay it. Exit 0: nothing found. */
#include "fuzz_main.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

fz_opts_t fz_opt = {.backend = "local", .ranks = 4, .corpus_dir = ".", .gen = FZ_GEN};
atomic_int fz_failed;
unsigned fz_avoid;
const char *fz_avoid_names = "";
const char *const fz_mut_names[FZ_MUT_COUNT_] = {"none", "null", "huge",      "count",  "dtype",
                                                 "op",   "root", "unaligned", "overlap"};
atomic_long fz_calls, fz_errors, fz_ok_checked;

/* What each world rank of this process is doing, for the watchdog. */
static struct {
    atomic_long idx;
    atomic_long since; /* seconds (CLOCK_MONOTONIC) the call started; 0: idle */
    const char *_Atomic kind;
} progress[FZ_MAX_RANKS];
static atomic_int corpus_written;

static long now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec;
}

void fz_progress(int wrank, long idx, const char *kind) {
    atomic_store(&progress[wrank].idx, idx);
    atomic_store(&progress[wrank].kind, kind);
    atomic_store(&progress[wrank].since, kind ? now_s() : 0);
}

static long current_idx(void) {
    long idx = 0;
    for (int r = 0; r < FZ_MAX_RANKS; r++)
        if (atomic_load(&progress[r].since) && atomic_load(&progress[r].idx) > idx)
            idx = atomic_load(&progress[r].idx);
    return idx;
}

void fz_write_corpus(long idx, const char *found) {
    if (atomic_exchange(&corpus_written, 1))
        return;
    char path[512];
    snprintf(path, sizeof path, "%s/%s-%llu-%ld.txt", fz_opt.corpus_dir, fz_opt.backend,
             (unsigned long long)fz_opt.seed, idx);
    FILE *fp = fopen(path, "w");
    if (fp) {
        fprintf(fp, "seed=%llu\ncalls=%ld\nbackend=%s\nranks=%d\navoid=%s\ngen=%d\nfound=%s\n",
                (unsigned long long)fz_opt.seed, idx + 1, fz_opt.backend, fz_opt.ranks,
                fz_avoid_names, fz_opt.gen, found);
        fclose(fp);
    }
    fprintf(stderr,
            "fuzz: FAILED seed=%llu call=%ld: %s\nfuzz: corpus file %s%s (replay: "
            "test/fuzz/run.sh hcomm_fuzz --replay FILE)\n",
            (unsigned long long)fz_opt.seed, idx, found, path, fp ? "" : " could not be written");
}

/* A crash or sanitizer report: name the call that was running. */
static void on_death(void) {
    char found[160];
    long idx = current_idx();
    const char *kind = atomic_load(&progress[0].kind);
    snprintf(found, sizeof found, "crash or sanitizer report in call %ld (%s)", idx,
             kind ? kind : "?");
    fz_write_corpus(idx, found);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FZ_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FZ_SANITIZED 1
#endif
#endif
#ifdef FZ_SANITIZED
void __sanitizer_set_death_callback(void (*callback)(void));
#endif

static void on_signal(int sig) {
    signal(sig, SIG_DFL);
    on_death();
    raise(sig);
}

/* Aborts (naming the call) when a rank's call outlasts every timeout the fuzzer set. */
static void *watchdog(void *arg) {
    long limit = (long)(*(double *)arg * 3) + 30;
    for (;;) {
        sleep(1);
        long t = now_s();
        for (int r = 0; r < FZ_MAX_RANKS; r++) {
            long since = atomic_load(&progress[r].since);
            if (!since || t - since < limit)
                continue;
            char found[160];
            const char *kind = atomic_load(&progress[r].kind);
            snprintf(found, sizeof found, "hang: world rank %d in call %ld (%s) for %ld s", r,
                     atomic_load(&progress[r].idx), kind ? kind : "?", t - since);
            fz_write_corpus(atomic_load(&progress[r].idx), found);
            abort();
        }
    }
    return NULL;
}

/* "unaligned,huge": the mutations a run leaves out (known defects not fixed yet). */
static unsigned avoid_mask(const char *list) {
    unsigned mask = 0;
    for (int m = 1; m < FZ_MUT_COUNT_; m++) {
        const char *p = strstr(list, fz_mut_names[m]);
        if (p)
            mask |= 1u << m;
    }
    return mask;
}

/* Reads seed, calls, backend and ranks from a corpus file. */
static int read_corpus(const char *path) {
    FILE *fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "fuzz: cannot open %s\n", path);
        return -1;
    }
    static char backend[16];
    char line[1024];
    unsigned long long seed = 0;
    fz_opt.gen = 1; /* files from before gen= lines */
    while (fgets(line, sizeof line, fp)) {
        if (sscanf(line, "seed=%llu", &seed) == 1)
            fz_opt.seed = seed;
        sscanf(line, "calls=%ld", &fz_opt.calls);
        sscanf(line, "ranks=%d", &fz_opt.ranks);
        sscanf(line, "gen=%d", &fz_opt.gen);
        static char avoid[256];
        if (sscanf(line, "avoid=%255s", avoid) == 1)
            fz_avoid = avoid_mask(fz_avoid_names = avoid);
        if (sscanf(line, "backend=%15s", backend) == 1)
            fz_opt.backend = backend;
        if (strncmp(line, "found=", 6) == 0)
            printf("fuzz: replaying %s (%.*s)\n", path, (int)strcspn(line + 6, "\n"), line + 6);
    }
    fclose(fp);
    return fz_opt.calls > 0 ? 0 : -1;
}

static int parse(int argc, char **argv) {
    int seeded = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--verbose") == 0) {
            fz_opt.verbose = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "fuzz: %s needs a value (see the top of test/fuzz/main.c)\n", a);
            return -1;
        }
        i++;
        if (strcmp(a, "--seed") == 0)
            fz_opt.seed = strtoull(v, NULL, 0), seeded = 1;
        else if (strcmp(a, "--calls") == 0)
            fz_opt.calls = atol(v);
        else if (strcmp(a, "--seconds") == 0)
            fz_opt.seconds = atof(v);
        else if (strcmp(a, "--backend") == 0)
            fz_opt.backend = v;
        else if (strcmp(a, "--ranks") == 0)
            fz_opt.ranks = atoi(v);
        else if (strcmp(a, "--avoid") == 0)
            fz_avoid = avoid_mask(fz_avoid_names = v);
        else if (strcmp(a, "--corpus-dir") == 0)
            fz_opt.corpus_dir = v;
        else if (strcmp(a, "--replay") == 0) {
            if (read_corpus(v) != 0)
                return -1;
            seeded = 1;
        } else {
            fprintf(stderr, "fuzz: unknown option %s (see the top of test/fuzz/main.c)\n", a);
            return -1;
        }
    }
    if (!seeded) /* a fresh seed each run; printed, so any run can be replayed */
        fz_opt.seed = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    if (fz_opt.ranks < 1 || fz_opt.ranks > FZ_MAX_RANKS) {
        fprintf(stderr, "fuzz: --ranks %d outside 1..%d\n", fz_opt.ranks, FZ_MAX_RANKS);
        return -1;
    }
    if (!fz_opt.calls && !fz_opt.seconds)
        fz_opt.calls = 1000;
    return 0;
}

int main(int argc, char **argv) {
    if (parse(argc, argv) != 0)
        return 2;
    /* The mpi job agrees on the seed: every process got the same command line, or rank 0's
     * time-based seed travels in the first exchange (session.c). */
    setenv("HCOMM_TIMEOUT", "20", 0);
    static double timeout_s;
    timeout_s = atof(getenv("HCOMM_TIMEOUT"));
    /* The sanitizers keep their own handlers of faults and end with abort() (abort_on_error=1,
     * as the tests set it) or their death callback. */
    signal(SIGABRT, on_signal);
#ifdef FZ_SANITIZED
    __sanitizer_set_death_callback(on_death);
#else
    signal(SIGSEGV, on_signal);
    signal(SIGBUS, on_signal);
    signal(SIGFPE, on_signal);
#endif
    pthread_t wd;
    pthread_create(&wd, NULL, watchdog, &timeout_s);
    pthread_detach(wd);
    int nranks = strcmp(fz_opt.backend, "mpi") == 0 ? 0 : fz_opt.ranks;
    hcomm_result_t r = hcomm_launch(fz_opt.backend, nranks, fz_rank_main, &timeout_s);
    if (r != HCOMM_OK) {
        fprintf(stderr, "fuzz: hcomm_launch: %s (%s)\n", hcomm_result_name(r), hcomm_last_error());
        return 2;
    }
    return atomic_load(&fz_failed) ? 1 : 0;
}
