/* hcomm-bench: bandwidth tables in the style of nccl-tests (doc/PERFORMANCE.md there).
 *
 * Each row is one (size, algorithm): out-of-place then in-place time, algbw = bytes / time and
 * busbw = algbw times nccl-tests' factor for the op (all_reduce 2(p-1)/p; all_gather,
 * reduce_scatter, gather, scatter, all_to_all (p-1)/p; broadcast, reduce, send_recv 1), so
 * busbw compares with the hardware's bandwidth whatever the rank count. Time is the median over
 * iterations of the slowest rank's time (-a chooses rank 0, mean, min or max); each timed call
 * starts after a barrier. With several algorithms the rows take turns (BLOCK_CALLS calls each),
 * so their medians see the same noise; "auto" is hcomm's own choice, named in brackets, and its
 * regret is its time over the best algorithm's. On mpi, "raw" calls MPI directly
 * on the same buffers (from 32 MiB timed after the other rows: ENGINE_APART_BYTES). */
#include "bench.h"
#include "compare.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { KIND_AUTO, KIND_NAMED, KIND_RAW, KIND_VARIANT };

typedef struct algo_row {
    int kind;
    char name[24], spec[64];
    bool dead;             /* failed once: left out from then on */
    bool bypass;           /* loads outside a simulated machine's links: not in regret */
    const char *ran;       /* named rows: what the last call ran (another name: a fallback) */
    double *t;             /* per-iteration seconds */
    bench_record_t rec[2]; /* out-of-place, in-place */
} algo_row_t;

typedef struct run {
    hcomm_comm_t *w;
    const bench_opts_t *o;
    const bench_op_t *op;
    bench_report_t *rep;
    int rank, size;
    bool mpi;
    bool window; /* timed calls start at one instant of the host's clock (start_together) */
    algo_row_t algos[BENCH_MAX_ALGOS];
    int nalgos;
    double start, last_progress;
    double memcpy_gbs;             /* at the size being measured */
    size_t last_bytes, last_count; /* the previous row's shape: sizes that round alike run once */
    double busbw_sum[BENCH_MAX_ALGOS];
    int busbw_n[BENCH_MAX_ALGOS];
} run_t;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Combines each iteration's time across ranks as -a says: rank 0's, the mean, min or max. */
static hcomm_result_t across_ranks(run_t *R, double *t, int n) {
    static const hcomm_op_t ops[4] = {HCOMM_SUM, HCOMM_SUM, HCOMM_MIN, HCOMM_MAX};
    int a = R->o->report;
    hcomm_result_t r = a == 0 ? hcomm_broadcast(R->w, t, sizeof *t * (size_t)n, 0)
                              : hcomm_all_reduce(R->w, t, t, (size_t)n, HCOMM_F64, ops[a]);
    for (int i = 0; a == 1 && i < n; i++)
        t[i] /= R->size;
    return r;
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static const char *dtype_name(hcomm_dtype_t dt) {
    const char *n = "?";
    hcomm_dtype_name(dt, &n);
    return n;
}

/* Set when a rank stops on a bad option (its message printed): exit status 2. */
static atomic_int usage_error; /* rank threads of the local backend set it together */

/* --- which algorithms run --- */

/* The name hcomm_comm_set_algo knows the op's collective by: op->coll, or the first of its
 * '|'-separated spellings that the algorithms layer knows (all_to_all: alltoall); "" if
 * none. */
static const char *coll_of(const bench_op_t *op, char *buf, size_t cap) {
    for (const char *s = op->coll; s && *s;) {
        const char *bar = strchr(s, '|');
        size_t len = bar ? (size_t)(bar - s) : strlen(s);
        for (int k = 0; k < hcomm__bench_algos(); k++)
            if (hcomm__bench_algo_valid(s, len, k)) {
                snprintf(buf, cap, "%.*s", (int)len, s);
                return buf;
            }
        s = bar ? bar + 1 : s + len;
    }
    buf[0] = '\0';
    return buf;
}

static bool valid_for(const bench_op_t *op, int algo) {
    char coll[64];
    coll_of(op, coll, sizeof coll);
    return coll[0] && hcomm__bench_algo_valid(coll, strlen(coll), algo);
}

static void add_algo(run_t *R, int kind, const char *name) {
    algo_row_t *a = &R->algos[R->nalgos++];
    memset(a, 0, sizeof *a);
    a->kind = kind;
    snprintf(a->name, sizeof a->name, "%s", name);
    char coll[64];
    if (kind == KIND_NAMED)
        snprintf(a->spec, sizeof a->spec, "%s:%s", coll_of(R->op, coll, sizeof coll), name);
    for (int k = 0; kind == KIND_NAMED && k < hcomm__bench_algos(); k++)
        if (!strcmp(hcomm__bench_algo_name(k), name))
            a->bypass = hcomm__bench_bypasses_links(R->w, coll, k);
}

static void list_valid(const bench_op_t *op) {
    fprintf(stderr, "auto, all");
    for (int k = 0; k < hcomm__bench_algos(); k++)
        if (valid_for(op, k))
            fprintf(stderr, ", %s", hcomm__bench_algo_name(k));
    fprintf(stderr, ", raw (mpi)\n");
}

/* --algo NAME must run every op asked for, raw needs mpi, and -o/-d must suit the op. Checked
 * before launching. */
static int check_algo_option(const bench_opts_t *o, bool mpi) {
    int n;
    const bench_op_t *ops = bench_ops(&n);
    const char *want = o->algo ? o->algo : "auto";
    for (int i = 0; i < o->nops; i++) {
        const bench_op_t *op = &ops[o->ops[i]];
        if (op->sum_avg_only && !o->all_redops && o->redop != HCOMM_SUM && o->redop != HCOMM_AVG) {
            fprintf(stderr, "hcomm-bench: %s reduces with sum or avg, not -o %s\n", op->name,
                    bench_op_names[o->redop]);
            return -1;
        }
        if (o->redop_given && !o->all_redops && !op->reduces && !o->ops_from_all &&
            o->redop != HCOMM_SUM) {
            fprintf(stderr, "hcomm-bench: %s does not reduce; -o %s does not apply\n", op->name,
                    bench_op_names[o->redop]);
            return -1;
        }
        if (op->float_only && o->dtype_given && !o->all_dtypes &&
            !hcomm__bench_dtype_is_float(o->dtype)) {
            fprintf(stderr, "hcomm-bench: %s combines f32, f64, f16 or bf16, not -d %s\n", op->name,
                    dtype_name(o->dtype));
            return -1;
        }
        if (!strcmp(want, "raw") && !(mpi && op->raw)) {
            fprintf(stderr,
                    "hcomm-bench: --algo raw needs the mpi backend and an MPI call for "
                    "%s\n",
                    op->name);
            return -1;
        }
        if (!strcmp(want, "auto") || !strcmp(want, "all") || !strcmp(want, "raw"))
            continue;
        int k = 0;
        while (k < hcomm__bench_algos() && strcmp(hcomm__bench_algo_name(k), want))
            k++;
        if (k == hcomm__bench_algos() || !valid_for(op, k)) {
            fprintf(stderr, "hcomm-bench: --algo %s does not run %s%s; valid: ", want, op->name,
                    o->ops_from_all ? " (OP all, the default, runs every collective: name one)"
                                    : "");
            list_valid(op);
            return -1;
        }
    }
    return 0;
}

/* auto (default), all (every algorithm valid for the op, auto, raw, the op's own variant), or
 * one name; raw joins on mpi wherever MPI has the call. */
static int choose_algos(run_t *R) {
    const char *want = R->o->algo ? R->o->algo : "auto";
    bool all = !strcmp(want, "all"),
         raw_ok =
             R->mpi && R->op->raw && bench_raw_supported(R->o->dtype, R->o->redop, R->op->reduces);
    R->nalgos = 0;
    if (all)
        for (int k = 0; k < hcomm__bench_algos(); k++)
            if (valid_for(R->op, k))
                add_algo(R, KIND_NAMED, hcomm__bench_algo_name(k));
    if (all || !strcmp(want, "auto"))
        add_algo(R, KIND_AUTO, "auto");
    else if (strcmp(want, "raw"))
        add_algo(R, KIND_NAMED, want);
    else if (!raw_ok) {
        if (R->rank == 0)
            fprintf(stderr, "hcomm-bench: --algo raw: MPI has no %s of %s with %s\n", R->op->name,
                    dtype_name(R->o->dtype), bench_op_names[R->o->redop]);
        return -1;
    }
    if (raw_ok)
        add_algo(R, KIND_RAW, "raw");
    if (R->op->own_variant && (all || !strcmp(want, "auto")))
        add_algo(R, KIND_VARIANT, R->op->own_variant);
    return 0;
}

/* --- one call of one algorithm --- */

static hcomm_result_t call(run_t *R, algo_row_t *a, bench_case_t *c) {
    switch (a->kind) {
    case KIND_RAW:
        return R->op->raw(c);
    case KIND_VARIANT:
        return R->op->variant(c);
    default:
        return R->op->run(c);
    }
}

static hcomm_result_t select_algo(run_t *R, algo_row_t *a) {
    return hcomm_comm_set_algo(R->w, a->kind == KIND_NAMED ? a->spec : NULL);
}

/* HCOMM_BENCH_CORRUPT=1 spoils one element of rank 0's output before each check; =2 reverses
 * its first block (count / ranks elements), values all in place but in the wrong order: the
 * test's proof that #wrong sees misplaced data, which a periodic input pattern hid. */
static void corrupt(const run_t *R, bench_case_t *c) {
    const char *v = getenv("HCOMM_BENCH_CORRUPT");
    if (!v || R->rank != 0)
        return;
    if (!strcmp(v, "1"))
        bench_put(c->dt, c->recv, 0, -7.0);
    for (size_t i = 0, n = c->count / (size_t)c->size; !strcmp(v, "2") && i < n / 2; i++) {
        double x = bench_get(c->dt, c->recv, i);
        bench_put(c->dt, c->recv, i, bench_get(c->dt, c->recv, n - 1 - i));
        bench_put(c->dt, c->recv, n - 1 - i, x);
    }
}

/* The -c checked iterations of one algorithm: #wrong summed over ranks and iterations. With
 * -c 0 one unchecked call still finds an algorithm that cannot run this size. */
static hcomm_result_t check_algo(run_t *R, algo_row_t *a, bench_case_t *c, long *wrong) {
    long mine = 0;
    for (int i = 0; i < (R->o->check > 0 ? R->o->check : 1); i++) {
        R->op->fill(c);
        BENCH_TRY(select_algo(R, a));
        BENCH_TRY(call(R, a, c));
        corrupt(R, c);
        mine += R->o->check > 0 ? R->op->wrong(c) : 0;
    }
    *wrong = 0;
    return R->o->check ? hcomm_all_reduce(R->w, &mine, wrong, 1, HCOMM_I64, HCOMM_SUM) : HCOMM_OK;
}

/* Agrees on whether a failed algorithm fails everywhere (then it is left out) or not. */
static hcomm_result_t drop_failed(run_t *R, algo_row_t *a, hcomm_result_t res) {
    int bad = res != HCOMM_OK, any = 0;
    BENCH_TRY(hcomm_all_reduce(R->w, &bad, &any, 1, HCOMM_I32, HCOMM_MAX));
    if (!any)
        return HCOMM_OK;
    if (a->kind == KIND_AUTO)
        return res != HCOMM_OK ? res : HCOMM_ERR_PEER;
    if (R->rank == 0)
        printf("# %s left out of %s: %s (%s)\n", a->name, R->op->name,
               res != HCOMM_OK ? hcomm_strerror(res) : "failed on another rank",
               res != HCOMM_OK ? hcomm_last_error() : "");
    a->dead = true;
    return HCOMM_OK;
}

/* The order of turn i's rows (time_all): a shuffle every rank computes alike (the seed is i). A
 * fixed order would give each row's first call the cache state one predecessor leaves: at 128
 * KiB-2 MiB auto after bruck measured 10-20% behind the same native call after raw. */
static void shuffle(int *order, int n, int i) {
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    for (int k = 0; k < n; k++)
        order[k] = k;
    for (int k = n - 1; k > 0; k--) {
        x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
        int j = (int)(x % (uint64_t)(k + 1)), t = order[k];
        order[k] = order[j];
        order[j] = t;
    }
}

/* From 32 MiB (glibc's largest mmap threshold on 64-bit) a temporary buffer MPI allocates of the
 * message's size is a fresh mapping each call, and Open MPI's cross-memory attach crawls on
 * memory mapped that recently (0.3 GB/s against 9 into a buffer used before, in a plain MPI
 * program). Interleaved with such calls (raw MPI, and native: Open MPI's collective under
 * hcomm), hcomm's rows slowed down though their own code and buffers were unchanged: 2
 * processes, twoshot out of place took 24 ms at 256 MiB in a run without raw and 100-167 ms
 * interleaved with it (128 MiB: 13 against 17-150 ms; 32 MiB: 2.5-3.4 ms without raw, 12
 * interleaved in one run of three); a 32 MiB reduce_scatter sweep had auto(direct) at 13-28 ms
 * beside direct's own row at 4. A malloc, memset and free of 256 MiB between calls did not do
 * it (9 ms at 128 MiB), so the cause is in the engine's call, not in hcomm. From there the rows
 * that run Open MPI's collectives are timed after the others, in a block of their own: the
 * same run and buffers, without the engine's side effects in hcomm's times (and without
 * hcomm's in the engine's). */
#define ENGINE_APART_BYTES ((size_t)32 << 20)

static bool runs_engine(const run_t *R, const algo_row_t *a) {
    return a->kind == KIND_RAW || (R->mpi && a->kind == KIND_NAMED && !strcmp(a->name, "native"));
}

static bool timed_now(const run_t *R, const algo_row_t *a, const bench_case_t *c,
                      bool engine_pass) {
    bool apart = c->bytes >= ENGINE_APART_BYTES && runs_engine(R, a);
    return !a->dead && apart == engine_pass;
}

/* How far ahead of rank 0's clock the timed call starts: a barrier and an 8-byte broadcast
 * take 1-3 us here. */
#define WINDOW_AHEAD_S 10e-6

/* Every rank starts the timed call at once. A barrier releases its ranks one line transfer
 * apart (the last to arrive leaves first), and that rank's time then holds the wait for the
 * others' posts: 2 threads' 8 B all_reduce 0.96 us where a line takes 300 ns each way (the
 * host's slow placement; raw ping-pong 600 ns a round trip). Where every rank reads the same
 * clock and has a core, rank 0 names a start instant a little ahead and each rank spins until
 * it (ReproMPI's window-based start: Hunold and Carpen-Amarie, "Reproducible MPI
 * benchmarking is still not as easy as you think", IEEE TPDS 2016); else the barrier alone. */
static hcomm_result_t start_together(run_t *R) {
    BENCH_TRY(hcomm_barrier(R->w));
    if (!R->window)
        return HCOMM_OK;
    double t = hcomm__bench_now() + WINDOW_AHEAD_S;
    BENCH_TRY(hcomm_broadcast(R->w, &t, sizeof t, 0));
    while (hcomm__bench_now() < t)
        ;
    return HCOMM_OK;
}

/* Whether start_together may use a start instant: every rank on this host (one clock) and no
 * more ranks than cores (a rank spinning for the instant would keep another off its core). */
static hcomm_result_t decide_window(run_t *R) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    uint64_t h = hcomm__bench_hash(host, strlen(host));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t mine[3] = {(int64_t)(h >> 2), -(int64_t)(h >> 2), cores >= R->size}, all[3];
    BENCH_TRY(hcomm_all_reduce(R->w, mine, all, 3, HCOMM_I64, HCOMM_MIN));
    R->window = all[0] == -all[1] && all[2] == 1;
    return HCOMM_OK;
}

/* Calls per sample: one (window), or a loop long enough that a small call's time is not a
 * clock read (--timing b2b, as OSU's benchmarks time a loop and divide). The same on every
 * rank: it depends on the size alone. */
static int sample_calls(const run_t *R, const bench_case_t *c) {
    if (!R->o->b2b)
        return 1;
    return c->bytes < (64u << 10) ? 100 : c->bytes < (1u << 20) ? 10 : 1;
}

/* One timed sample of a: every rank starts together. */
static hcomm_result_t time_one(run_t *R, algo_row_t *a, bench_case_t *c, int i,
                               const char **chosen) {
    BENCH_TRY(select_algo(R, a));
    /* The previous algorithm's imbalance between ranks (a root that finishes last) must not land
     * in this one's time. */
    BENCH_TRY(start_together(R));
    hcomm__bench_take_algo(R->w);
    int calls = sample_calls(R, c);
    double t0 = hcomm__bench_now();
    for (int k = 0; k < calls; k++)
        BENCH_TRY(call(R, a, c));
    double dt = (hcomm__bench_now() - t0) / calls;
    if (i >= 0)
        a->t[i] = dt;
    const char *got = hcomm__bench_take_algo(R->w);
    /* A primitive without rows of collective algorithms (moe, pp) has no choice to name: the
     * collective run inside it is not a row --algo could pick. */
    if (got && R->op->coll && a->kind == KIND_AUTO)
        *chosen = got;
    if (got && R->op->coll && a->kind == KIND_NAMED)
        a->ran = got;
    return HCOMM_OK;
}

/* Calls each row makes back to back before the next row's turn: a row's median is then the
 * time of its own calls one after another, as a run of that algorithm alone (nccl-tests' way)
 * and a program's loop of one size measure it, while the rows still take turns against the
 * machine's drift. With one call per turn every call found the buffers as another algorithm had
 * left them, and that state, not the algorithm, decided: 2 mpi processes, 128 KiB, twoshot 5.5
 * us alone against hier's 7.5, but interleaved call by call 14-15 against 10-13 (twoshot after
 * hier 15.8, after ring 5.3; hier after twoshot 10.4, after ring 9.6, after native 18.8); in
 * turns of 10 calls 4.4 against 17. The first call of a turn still pays its predecessor's state
 * and is one sample in BLOCK_CALLS. */
#define BLOCK_CALLS 5

/* The row of the algorithm auto runs (chosen), or -1. Auto and that row (its twin) share their
 * turns, one call of each in turn (the first alternating between turns): they are the same code,
 * so each then finds the buffers as the same algorithm left them, at the same moment of the
 * machine's noise. In turns of their own, the medians of 20 calls on 2 shared cores differed by
 * 10-26% (mpi, 4 processes, 2-8 MiB) in either direction, which read as auto's regret. */
static int twin_of(const run_t *R, const char *chosen) {
    for (int k = 0; chosen && k < R->nalgos; k++)
        if (R->algos[k].kind == KIND_NAMED && !strcmp(R->algos[k].name, chosen))
            return k;
    return -1;
}

/* Row a's calls of one turn (iterations i0 .. i0 + BLOCK_CALLS), with its twin's (-1: none). */
static hcomm_result_t time_turn(run_t *R, bench_case_t *c, int a, int twin, bool twin_first, int i0,
                                bool pass, const char **chosen) {
    for (int i = i0; i < i0 + BLOCK_CALLS && i < R->o->iters; i++)
        for (int step = 0; step < 2; step++) {
            int k = (step == 0) == twin_first ? twin : a;
            if (k >= 0 && timed_now(R, &R->algos[k], c, pass))
                BENCH_TRY(time_one(R, &R->algos[k], c, i, chosen));
        }
    return HCOMM_OK;
}

/* Warm-up and timed iterations, BLOCK_CALLS calls of each live algorithm in turn, in shuffled
 * order (auto with its twin); then, at large sizes, those of the rows that run Open MPI's
 * collectives (ENGINE_APART_BYTES). Every rank knows the same chosen name: the choice is
 * collective. */
static hcomm_result_t time_all(run_t *R, bench_case_t *c, const char **chosen) {
    int n = R->nalgos, order[BENCH_MAX_ALGOS], passes = 1;
    for (int k = 0; k < n; k++)
        passes = timed_now(R, &R->algos[k], c, true) ? 2 : passes;
    for (int pass = 0; pass < passes; pass++)
        for (int turn = 0, i0 = -R->o->warmup; i0 < R->o->iters; turn++, i0 += BLOCK_CALLS) {
            int twin = twin_of(R, *chosen); /* known from the first turn on */
            shuffle(order, n, turn);
            for (int j = 0; j < n; j++) {
                bool with_twin = R->algos[order[j]].kind == KIND_AUTO;
                if (order[j] != twin)
                    BENCH_TRY(time_turn(R, c, order[j], with_twin ? twin : -1, turn & 1, i0, pass,
                                        chosen));
            }
        }
    return HCOMM_OK;
}

/* ran names the algorithm called name (in deterministic mode as "NAME+deterministic"). */
static bool names_algo(const char *ran, const char *name) {
    size_t n = strlen(name);
    return !strncmp(ran, name, n) && (ran[n] == 0 || ran[n] == '+');
}

/* What a named row ran where its algorithm fell back to another (local has no shm, and its
 * native gather is direct, say), else NULL. */
static const char *ran_instead(const algo_row_t *a) {
    return a->kind == KIND_NAMED && a->ran && !names_algo(a->ran, a->name) ? a->ran : NULL;
}

static void set_record(run_t *R, algo_row_t *a, const bench_case_t *c, long wrong, double sec,
                       const char *chosen) {
    bench_record_t *rec = &a->rec[c->inplace];
    rec->op = R->op->name;
    rec->algo = a->name;
    rec->dtype = dtype_name(c->dt);
    rec->redop = R->op->reduces ? bench_op_names[R->o->redop] : NULL;
    rec->chosen = a->kind == KIND_AUTO ? chosen : ran_instead(a);
    rec->bytes = c->bytes;
    rec->count = c->count;
    rec->world = R->size;
    rec->inplace = c->inplace;
    rec->measured = true;
    rec->time_us = sec * 1e6;
    rec->algbw = sec > 0 ? (double)c->bytes / sec / 1e9 : 0;
    rec->busbw = rec->algbw * R->op->busbw(R->size);
    rec->wrong = R->o->check ? wrong : -1;
    rec->memcpy_gbs = R->memcpy_gbs;
}

/* Bound on auto's untimed calls in settle_auto; the tuner's probe takes 18 calls (src/algo/tune.h).
 */
#define SETTLE_MAX_CALLS 64

/* On one host, auto's first calls of a size near a switch time two candidates against each
 * other (hcomm__bench_take_probed, the same on every rank); a program's loop of one size pays
 * them once, so they run before auto is timed. Otherwise the rival's calls fall among auto's
 * samples, and in the warm-up and the first turns of auto and its twin the twin is unknown.
 * They start together as the timed calls do: back to back, 4 processes on 2 cores timed
 * another regime than the rows' (a call's ranks arrive apart), and the tuner kept the
 * slower there in 3 of 4 runs (16 KiB twoshot 29 us against shm 18; 64 KiB shm 50 against
 * twoshot 37); started together, 5 runs and 4 more came out within 1.13 of the faster. */
static hcomm_result_t settle_auto(run_t *R, bench_case_t *c) {
    for (int k = 0; k < R->nalgos; k++) {
        algo_row_t *a = &R->algos[k];
        if (a->kind != KIND_AUTO || a->dead)
            continue;
        (void)hcomm__bench_take_probed(R->w);
        for (int i = 0; i < SETTLE_MAX_CALLS; i++) {
            BENCH_TRY(select_algo(R, a));
            BENCH_TRY(start_together(R));
            BENCH_TRY(call(R, a, c));
            if (!hcomm__bench_take_probed(R->w))
                break;
        }
    }
    return HCOMM_OK;
}

/* Every algorithm at one size and placement. */
static hcomm_result_t measure(run_t *R, bench_case_t *c) {
    const char *chosen = NULL;
    long wrong[BENCH_MAX_ALGOS] = {0};
    for (int k = 0; k < R->nalgos; k++) {
        algo_row_t *a = &R->algos[k];
        a->rec[c->inplace].measured = false;
        if (!a->dead)
            BENCH_TRY(drop_failed(R, a, check_algo(R, a, c, &wrong[k])));
    }
    BENCH_TRY(settle_auto(R, c));
    R->op->fill(c);
    BENCH_TRY(time_all(R, c, &chosen));
    BENCH_TRY(hcomm_comm_set_algo(R->w, NULL));
    for (int k = 0; k < R->nalgos; k++) {
        algo_row_t *a = &R->algos[k];
        if (a->dead)
            continue;
        BENCH_TRY(across_ranks(R, a->t, R->o->iters));
        set_record(R, a, c, wrong[k], median(a->t, R->o->iters), chosen);
    }
    return HCOMM_OK;
}

/* --- printing (rank 0) --- */

/* Names the rows that a simulated topology cannot slow down (hcomm__bench_bypasses_links). */
static void print_bypass_note(const run_t *R) {
    char names[128] = "";
    for (int k = 0; k < R->nalgos; k++)
        if (R->algos[k].bypass)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                     names[0] ? ", " : "", R->algos[k].name);
    if (names[0])
        printf("# %s: direct loads outside the simulated links (HCOMM_TOPO), so not in regret\n",
               names);
}

static void print_header(run_t *R, const bench_case_t *c) {
    const char *backend = "?";
    hcomm_comm_backend(R->w, &backend);
    printf("#\n# %s, %d rank%s on %s\n", R->op->name, R->size, R->size == 1 ? "" : "s", backend);
    printf("# buffers from %s\n", R->o->host_mem ? "malloc (--mem host)" : "hcomm_mem_alloc");
    if (R->op->describe) {
        char line[512];
        R->op->describe(c, line, sizeof line);
        printf("# %s\n", line);
    }
    print_bypass_note(R);
    if (R->mpi && R->op->raw && !bench_raw_supported(R->o->dtype, R->o->redop, R->op->reduces))
        printf("# no raw row: MPI has no %s of %s with %s\n", R->op->name, dtype_name(R->o->dtype),
               bench_op_names[R->o->redop]);
    /* nccl-tests' columns in their order (its parsers read them by position), then hcomm's */
    printf("#%105s\n", "out-of-place                         in-place          ");
    printf("#%11s %12s %6s %6s %5s %10s %8s %8s %6s %10s %8s %8s %6s %s\n", "size(B)", "count",
           "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong", "time(us)", "algbw",
           "busbw", "#wrong", "algo");
}

static void print_half(const bench_record_t *r) {
    if (!r->measured) {
        printf(" %10s %8s %8s %6s", "N/A", "N/A", "N/A", "N/A");
        return;
    }
    printf(" %10.2f %8.3f %8.3f", r->time_us, r->algbw, r->busbw);
    if (r->wrong < 0)
        printf(" %6s", "N/A");
    else
        printf(" %6ld", r->wrong);
}

static void print_row(run_t *R, const algo_row_t *a, const bench_case_t *c) {
    const bench_record_t *r = a->rec[0].measured ? &a->rec[0] : &a->rec[1];
    char name[48];
    if (a->kind == KIND_AUTO && r->chosen)
        snprintf(name, sizeof name, "auto(%s)", r->chosen);
    else if (r->chosen)
        snprintf(name, sizeof name, "%s->%s", a->name, r->chosen);
    else
        snprintf(name, sizeof name, "%s", a->name);
    printf("%12zu %12zu %6s %6s %5d", c->bytes, c->count, dtype_name(c->dt),
           R->op->reduces ? bench_op_names[R->o->redop] : "none", R->op->rooted ? R->o->root : -1);
    print_half(&a->rec[0]);
    print_half(&a->rec[1]);
    printf(" %s\n", name);
}

/* A named row that ran another row's algorithm: a second sample of that row, left out of the
 * best (the minimum of several samples of one algorithm would read as auto's regret). */
static bool duplicate_row(const run_t *R, const algo_row_t *a, int ip) {
    const char *ran = a->rec[ip].chosen;
    for (int k = 0; ran && k < R->nalgos; k++) {
        const algo_row_t *b = &R->algos[k];
        if (b != a && b->kind == KIND_NAMED && !b->dead && b->rec[ip].measured &&
            !b->rec[ip].chosen && names_algo(ran, b->name))
            return true;
    }
    return false;
}

/* auto's regret (auto time / the best named algorithm's), hcomm/raw and auto/<variant>, per
 * placement, into auto's records (0: not measured); for the one algorithm asked for (--algo
 * NAME), hcomm/raw alone. */
static void compare_auto(run_t *R, algo_row_t *au) {
    for (int ip = 0; ip < 2; ip++) {
        bench_record_t *x = &au->rec[ip];
        x->regret = x->vs_raw = x->vs_variant = 0;
        if (!x->measured)
            continue;
        double best = 0;
        for (int k = 0; k < R->nalgos; k++) {
            const algo_row_t *a = &R->algos[k];
            const bench_record_t *y = &a->rec[ip];
            if (a->dead || !y->measured)
                continue;
            if (a->kind == KIND_NAMED && !a->bypass && !duplicate_row(R, a, ip) &&
                (best == 0 || y->time_us < best)) {
                best = y->time_us;
                snprintf(x->best, sizeof x->best, "%s", a->name);
            }
            if (a->kind == KIND_RAW)
                x->vs_raw = x->time_us / y->time_us;
            if (a->kind == KIND_VARIANT) {
                x->vs_variant = x->time_us / y->time_us;
                x->variant_name = a->name;
            }
        }
        x->regret = best > 0 && au->kind == KIND_AUTO ? x->time_us / best : 0;
    }
}

static void print_summary(run_t *R, const algo_row_t *au) {
    static const char *const place[2] = {"out-of-place", "in-place"};
    char line[512] = "";
    size_t n = 0;
    for (int ip = 0; ip < 2 && au; ip++) {
        const bench_record_t *x = &au->rec[ip];
        if (!x->measured || n >= sizeof line ||
            !(x->regret > 0 || x->vs_raw > 0 || x->vs_variant > 0 || R->memcpy_gbs > 0))
            continue; /* nothing to say about it (an empty call) */
        n += (size_t)snprintf(line + n, sizeof line - n, " %s:", place[ip]);
        if (x->regret > 0 && n < sizeof line)
            n += (size_t)snprintf(line + n, sizeof line - n, " regret %.2f (best %s)", x->regret,
                                  x->best);
        if (x->vs_raw > 0 && n < sizeof line)
            n += (size_t)snprintf(line + n, sizeof line - n, " hcomm/raw %.2f", x->vs_raw);
        if (x->vs_variant > 0 && n < sizeof line)
            n += (size_t)snprintf(line + n, sizeof line - n, " auto/%s %.2f", R->op->own_variant,
                                  x->vs_variant);
        if (R->memcpy_gbs > 0 && n < sizeof line)
            n += (size_t)snprintf(line + n, sizeof line - n, " busbw/memcpy %.2f",
                                  x->busbw / R->memcpy_gbs);
    }
    if (R->memcpy_gbs > 0 && n < sizeof line)
        snprintf(line + n, sizeof line - n, " memcpy %.3f GB/s", R->memcpy_gbs);
    if (line[0])
        printf("#%-28s%s\n", "", line);
}

static void print_received(run_t *R, const bench_case_t *c) {
    size_t bytes = R->op->received(c);
    printf("#%-28s received %zu B per rank (mean):", "", bytes);
    for (int k = 0; k < R->nalgos; k++) {
        const bench_record_t *x = &R->algos[k].rec[0];
        if (x->measured)
            printf(" %s %.3f GB/s", R->algos[k].name, (double)bytes / x->time_us / 1e3);
    }
    printf("\n");
}

static void report_size(run_t *R, const bench_case_t *c) {
    algo_row_t *au = NULL;
    for (int k = 0; k < R->nalgos; k++)
        au = R->algos[k].kind == KIND_AUTO ? &R->algos[k] : au;
    for (int k = 0; !au && k < R->nalgos; k++) /* --algo NAME: that row against raw */
        au = R->algos[k].kind == KIND_NAMED ? &R->algos[k] : au;
    if (au)
        compare_auto(R, au);
    for (int k = 0; k < R->nalgos; k++) {
        algo_row_t *a = &R->algos[k];
        if (!a->rec[0].measured && !a->rec[1].measured)
            continue;
        if (R->rank == 0)
            print_row(R, a, c);
        for (int ip = 0; ip < 2; ip++)
            if (a->rec[ip].measured) {
                if (R->rank == 0)
                    bench_report_add(R->rep, &a->rec[ip]);
                R->busbw_sum[k] += a->rec[ip].busbw;
                R->busbw_n[k]++;
            }
    }
    if (R->rank == 0)
        print_summary(R, au);
    if (R->rank == 0 && R->op->received)
        print_received(R, c);
    if (R->rank == 0 && R->op->note) {
        char line[768];
        bool timed = au && au->kind == KIND_AUTO && au->rec[0].measured;
        R->op->note(c, timed ? au->rec[0].time_us * 1e-6 : 0.0, line, sizeof line);
        printf("#%-28s %s\n", "", line);
    }
}

/* nccl-tests' closing line for the main row (auto, else the one algorithm asked for), then one
 * per other algorithm. */
static void print_average(run_t *R) {
    if (R->rank != 0)
        return;
    int main_row = 0;
    for (int k = 0; k < R->nalgos; k++)
        main_row = R->algos[k].kind == KIND_AUTO ? k : main_row;
    for (int k = 0; k < R->nalgos; k++) {
        if (R->busbw_n[k] == 0)
            continue;
        double avg = R->busbw_sum[k] / R->busbw_n[k];
        if (k == main_row)
            printf("# Avg bus bandwidth    : %.3f\n", avg);
        else
            printf("# Avg bus bandwidth (%s): %.3f\n", R->algos[k].name, avg);
    }
    printf("#\n");
}

static void progress(run_t *R, size_t bytes, int done, int total) {
    double t = hcomm__bench_now();
    if (R->rank != 0 || t - R->start < 3.0 || t - R->last_progress < 2.0)
        return;
    R->last_progress = t;
    fprintf(stderr, "hcomm-bench: %s %zu B done (%d of %d sizes), %.0f s%s", R->op->name, bytes,
            done, total, t - R->start, isatty(2) ? "   \r" : "\n");
    fflush(stderr);
}

/* --- sizes and buffers --- */

static int count_sizes(const bench_opts_t *o) {
    int n = 0;
    for (size_t b = o->min_bytes; b <= o->max_bytes; b = bench_next_size(o, b))
        n++;
    return n;
}

/* From hcomm_mem_alloc (peers on one node map it: no copy), or page-aligned from malloc's
 * heap with --mem host (read with cross-memory attach: one copy). */
static void *alloc_buf(const bench_opts_t *o, size_t bytes) {
    void *p = NULL;
    if (o->host_mem)
        return posix_memalign(&p, 4096, bytes) == 0 ? p : NULL;
    return hcomm_mem_alloc(bytes, &p) == HCOMM_OK ? p : NULL;
}

static void free_buf(const bench_opts_t *o, void *p) {
    if (o->host_mem)
        free(p);
    else
        hcomm_mem_free(p);
}

static hcomm_result_t alloc_case(run_t *R, bench_case_t *c) {
    memset(c, 0, sizeof *c);
    c->w = R->w;
    c->o = R->o;
    c->op = R->op;
    c->rank = R->rank;
    c->size = R->size;
    c->dt = R->o->dtype;
    hcomm_dtype_size(c->dt, &c->es);
    R->op->shape(c, R->o->max_bytes);
    c->cap = R->op->capacity(c) + 64;
    c->send = alloc_buf(R->o, c->cap);
    c->recv = alloc_buf(R->o, c->cap);
    size_t n = (size_t)R->size;
    c->counts = calloc(n, sizeof(size_t));
    c->displs = calloc(n, sizeof(size_t));
    c->rcounts = calloc(n, sizeof(size_t));
    c->rdispls = calloc(n, sizeof(size_t));
    if (!c->send || !c->recv || !c->counts || !c->displs || !c->rcounts || !c->rdispls)
        return HCOMM_ERR_NOMEM;
    for (int k = 0; k < R->nalgos; k++)
        if (!(R->algos[k].t = calloc((size_t)R->o->iters, sizeof(double))))
            return HCOMM_ERR_NOMEM;
    return HCOMM_OK;
}

static void free_case(run_t *R, bench_case_t *c) {
    free_buf(R->o, c->send);
    free_buf(R->o, c->recv);
    free(c->counts);
    free(c->displs);
    free(c->rcounts);
    free(c->rdispls);
    for (int k = 0; k < R->nalgos; k++)
        free(R->algos[k].t);
}

/* Median seconds (slowest rank, as -a says) of copying bytes from src to dst with every rank
 * copying at once. */
static hcomm_result_t time_memcpy(run_t *R, char *dst, char *src, size_t bytes, double *sec) {
    int iters = R->o->iters;
    double *t = calloc((size_t)iters, sizeof *t);
    hcomm_result_t r = t ? hcomm_barrier(R->w) : HCOMM_ERR_NOMEM;
    for (int i = -1; r == HCOMM_OK && i < iters; i++) {
        double t0 = hcomm__bench_now();
        memcpy(dst, src, bytes);
        if (i >= 0)
            t[i] = hcomm__bench_now() - t0;
        if (bytes)
            src[(size_t)i % bytes] = (char)i; /* the copy is not dead code */
    }
    if (r == HCOMM_OK)
        r = across_ranks(R, t, iters);
    if (r == HCOMM_OK)
        *sec = median(t, iters);
    free(t);
    return r;
}

static hcomm_result_t bench_size(run_t *R, bench_case_t *c, size_t req) {
    R->op->shape(c, req);
    if (c->bytes == R->last_bytes && c->count == R->last_count)
        return HCOMM_OK;
    R->last_bytes = c->bytes;
    R->last_count = c->count;
    double sec = 0;
    hcomm_result_t r = time_memcpy(R, c->recv, c->send, c->bytes, &sec);
    R->memcpy_gbs = sec > 0 ? (double)c->bytes / sec / 1e9 : 0;
    if (r == HCOMM_OK && R->op->setup)
        r = R->op->setup(c);
    for (int ip = 0; r == HCOMM_OK && ip < 2; ip++) {
        if ((ip == 0 && R->op->inplace_only) || (ip == 1 && R->op->no_inplace)) {
            for (int k = 0; k < R->nalgos; k++)
                R->algos[k].rec[ip].measured = false;
            continue;
        }
        c->inplace = ip == 1;
        r = measure(R, c);
    }
    if (r == HCOMM_OK) /* before the teardown: an op's note reads its state */
        report_size(R, c);
    if (R->op->teardown)
        R->op->teardown(c);
    return r;
}

static hcomm_result_t bench_op(run_t *R) {
    if (choose_algos(R)) {
        atomic_store(&usage_error, 1);
        return HCOMM_ERR_INVALID_ARG;
    }
    bench_case_t c;
    hcomm_result_t r = alloc_case(R, &c);
    if (r == HCOMM_OK && R->rank == 0)
        print_header(R, &c);
    /* alloc_case shaped -e: above it, the op cannot be as small as asked */
    if (r == HCOMM_OK && R->rank == 0 && c.bytes > R->o->max_bytes)
        printf("# -e %zu B is below the smallest %s call on %d ranks: timed at %zu B\n",
               R->o->max_bytes, R->op->name, R->size, c.bytes);
    memset(R->busbw_sum, 0, sizeof R->busbw_sum);
    memset(R->busbw_n, 0, sizeof R->busbw_n);
    R->last_bytes = R->last_count = SIZE_MAX;
    int total = count_sizes(R->o), done = 0;
    for (size_t b = R->o->min_bytes; r == HCOMM_OK && b <= R->o->max_bytes;
         b = bench_next_size(R->o, b)) {
        r = bench_size(R, &c, b);
        progress(R, c.bytes, ++done, total);
    }
    if (r == HCOMM_OK)
        print_average(R);
    free_case(R, &c);
    return r;
}

/* --- memcpy baseline: every rank copying at once --- */

/* The baseline printed first: memcpy at the largest size (1 MiB to 256 MiB). */
static hcomm_result_t bench_memcpy(run_t *R) {
    size_t bytes = R->o->max_bytes;
    bytes = bytes < ((size_t)1 << 20)     ? (size_t)1 << 20
            : bytes > ((size_t)256 << 20) ? (size_t)256 << 20
                                          : bytes;
    char *src = malloc(bytes), *dst = malloc(bytes);
    double sec = 0;
    hcomm_result_t r = src && dst ? HCOMM_OK : HCOMM_ERR_NOMEM;
    if (r == HCOMM_OK) {
        memset(src, 1, bytes);
        memset(dst, 2, bytes);
        r = time_memcpy(R, dst, src, bytes, &sec);
    }
    if (r == HCOMM_OK && R->rank == 0) {
        bench_record_t rec = {.op = "memcpy",
                              .algo = "memcpy",
                              .dtype = "u8",
                              .bytes = bytes,
                              .count = bytes,
                              .world = R->size,
                              .measured = true,
                              .time_us = sec * 1e6,
                              .algbw = (double)bytes / sec / 1e9,
                              .wrong = -1};
        rec.busbw = rec.memcpy_gbs = rec.algbw;
        bench_report_add(R->rep, &rec);
        printf("# memcpy, every rank copying at once: %zu B in %.2f us, %.3f GB/s per rank\n",
               bytes, rec.time_us, rec.algbw);
    }
    free(src);
    free(dst);
    return r;
}

/* -r against the group, before anything runs; ops without a root ignore it, as in nccl-tests. */
static hcomm_result_t check_root(const run_t *R) {
    int n;
    const bench_op_t *ops = bench_ops(&n);
    for (int i = 0; i < R->o->nops; i++)
        if (ops[R->o->ops[i]].rooted && R->o->root >= R->size) {
            if (R->rank == 0)
                fprintf(stderr, "hcomm-bench: -r %d: out of range 0..%d for %d ranks\n", R->o->root,
                        R->size - 1, R->size);
            atomic_store(&usage_error, 1);
            return HCOMM_ERR_INVALID_ARG;
        }
    return HCOMM_OK;
}

/* Whether -d all / -o all run dtype dt and redop op for this operation (what -d and -o
 * given alone would accept). */
static bool variant_fits(const bench_opts_t *o, const bench_op_t *op, int dt, int redop) {
    if (o->all_dtypes && op->float_only && !hcomm__bench_dtype_is_float((hcomm_dtype_t)dt))
        return false;
    if (o->all_redops && op->sum_avg_only && redop != HCOMM_SUM && redop != HCOMM_AVG)
        return false;
    return true;
}

/* One operation at every dtype of -d all and redop of -o all (one each otherwise; an op that
 * does not reduce runs once), in nccl-tests' order: dtypes outer, redops inner. */
static hcomm_result_t bench_variants(run_t *R, const bench_op_t *op) {
    const bench_opts_t *o = R->o;
    int dt0 = o->all_dtypes ? 0 : (int)o->dtype, dt1 = o->all_dtypes ? HCOMM_DTYPE_COUNT : dt0 + 1;
    int op0 = o->all_redops && op->reduces ? 0 : (int)o->redop;
    int op1 = o->all_redops && op->reduces ? HCOMM_OP_COUNT : op0 + 1;
    hcomm_result_t r = HCOMM_OK;
    for (int dt = dt0; r == HCOMM_OK && dt < dt1; dt++)
        for (int red = op0; r == HCOMM_OK && red < op1; red++) {
            if (!variant_fits(o, op, dt, red))
                continue;
            bench_opts_t oo = *o;
            oo.dtype = (hcomm_dtype_t)dt;
            oo.redop = (hcomm_op_t)red;
            if (!strcmp(op->name, "moe_dispatch_combine") && !o->dtype_given)
                oo.dtype = HCOMM_BF16;
            R->op = op;
            R->o = &oo;
            r = bench_op(R);
            R->o = o;
        }
    return r;
}

static hcomm_result_t rank_main(hcomm_comm_t *w, void *arg) {
    const bench_opts_t *o = arg;
    if (o->legacy)
        return hcomm_bench_compare(w, o);
    if (o->calibrate)
        return bench_calibrate(w, o);
    run_t R = {.w = w, .o = o, .start = hcomm__bench_now()};
    hcomm_comm_rank(w, &R.rank);
    hcomm_comm_size(w, &R.size);
    const char *backend = "";
    hcomm_comm_backend(w, &backend);
    R.mpi = !strcmp(backend, "mpi");
    R.rep = R.rank == 0 ? bench_report_open(o) : NULL;
    if (R.rank == 0 && R.mpi && o->nranks > 0 && o->nranks != R.size)
        printf("# -t %d left aside: the %d process%s of the MPI job %s the rank%s\n", o->nranks,
               R.size, R.size == 1 ? "" : "es", R.size == 1 ? "is" : "are", R.size == 1 ? "" : "s");
    hcomm_result_t r = R.rep || R.rank != 0 ? check_root(&R) : HCOMM_ERR_NOMEM;
    if (r == HCOMM_OK)
        r = decide_window(&R);
    if (r == HCOMM_OK)
        r = bench_memcpy(&R);
    int n;
    const bench_op_t *ops = bench_ops(&n);
    for (int c = 0; r == HCOMM_OK && (o->cycles == 0 || c < o->cycles); c++)
        for (int i = 0; r == HCOMM_OK && i < o->nops; i++)
            r = bench_variants(&R, &ops[o->ops[i]]);
    if (R.rep && bench_report_close(R.rep, r == HCOMM_OK) != 0 && r == HCOMM_OK)
        r = hcomm__bench_err(HCOMM_ERR_IO, "hcomm-bench",
                             "an output file could not be written (above)");
    if (r == HCOMM_ERR_NOMEM) /* the bench's own buffers leave no hcomm message */
        fprintf(stderr,
                "hcomm-bench: rank %d ran out of memory (-e %zu: two buffers of about that "
                "size per rank, and the algorithms' scratch)\n",
                R.rank, o->max_bytes);
    return r;
}

static bool on_path(const char *prog) {
    const char *path = getenv("PATH");
    char buf[4096];
    while (path && *path) {
        const char *colon = strchr(path, ':');
        size_t len = colon ? (size_t)(colon - path) : strlen(path);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)len, path, prog);
        if (access(buf, X_OK) == 0)
            return true;
        path = colon ? colon + 1 : NULL;
    }
    return false;
}

/* True when path can be written; checked before the run so that a bad --json, -F or --plot
 * path fails at once instead of after a long run. Leaves no file behind that was not there. */
static bool writable(const char *flag, const char *path) {
    if (!path)
        return true;
    bool existed = access(path, F_OK) == 0;
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "hcomm-bench: %s %s: cannot write the file (%s)\n", flag, path,
                strerror(errno));
        return false;
    }
    fclose(f);
    if (!existed)
        remove(path);
    return true;
}

/* A process of a launched job other than its first (rank variables of Open MPI, PMI, PMIx,
 * Slurm). */
static bool quiet_unless_first(void) {
    static const char *const ranks[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                        "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; i++) {
        const char *v = getenv(ranks[i]);
        if (v && v[0])
            return strcmp(v, "0") != 0;
    }
    return false;
}

/* path's directory into dir (n bytes) and its last name. */
static const char *split_path(const char *path, char *dir, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, n, ".");
    else
        snprintf(dir, n, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    return slash ? slash + 1 : path;
}

/* Whether two names reach one file ("x.json" and "./x.json"): the same inode where both exist,
 * else the same name in the same directory. */
static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    char da[4096], db[4096];
    if (!strcmp(a, b))
        return true;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (strcmp(split_path(a, da, sizeof da), split_path(b, db, sizeof db)) != 0)
        return false;
    return stat(da, &sa) == 0 && stat(db, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* The output files name different paths: a second write would replace the first. */
static bool distinct_files(const bench_opts_t *o) {
    const char *const path[] = {o->json, o->csv, o->plot, o->calibrate_file};
    const char *const flag[] = {"--json", "-F", "--plot", "--calibrate"};
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            if (path[i] && path[j] && same_file(path[i], path[j])) {
                fprintf(stderr, "hcomm-bench: %s %s and %s %s name the same file\n", flag[i],
                        path[i], flag[j], path[j]);
                return false;
            }
    return true;
}

/* Started by mpirun or srun as a job of one process, with HCOMM_BACKEND unset: hcomm_launch
 * would run local threads there (a library's programs may want that), while the bench's
 * ranks are the job's processes, as nccl-tests' are. */
static bool one_process_job(void) {
    const char *env = getenv("HCOMM_BACKEND");
    return !(env && env[0]) && hcomm__bench_launch_job_size() == 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "zero") == 0)
        return bench_zero_main(argc - 1, argv + 1);
    bench_opts_t o = {.iters = 20,
                      .warmup = 3,
                      .check = 1,
                      .report = 3,
                      .min_bytes = 1024,
                      .max_bytes = 4 << 20,
                      .factor = 4.0,
                      .dtype = HCOMM_F32,
                      .redop = HCOMM_SUM,
                      .moe_hidden = 7168,
                      .moe_topk = 8,
                      .moe_experts = 256,
                      .dp_buffers = 16,
                      .cycles = 1};
    /* Under a launcher every process checks the command line; one of them says what is wrong. */
    int saved = quiet_unless_first() ? dup(2) : -1;
    if (saved >= 0 && !freopen("/dev/null", "w", stderr))
        saved = -1;
    int p = bench_parse_args(argc, argv, &o);
    if (p == 0 && o.plot && !on_path("gnuplot")) {
        fprintf(stderr,
                "hcomm-bench: --plot %s needs gnuplot, which is not on PATH (Debian: "
                "apt-get install gnuplot-nox)\n",
                o.plot);
        p = -1;
    }
    if (p == 0 &&
        (!writable("--json", o.json) || !writable("-F", o.csv) || !writable("--plot", o.plot) ||
         !writable("--calibrate", o.calibrate_file) || !distinct_files(&o)))
        p = -1;
    if (saved >= 0) {
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
    }
    if (p != 0)
        return p > 0 ? 0 : 2;
    if (!o.backend && o.nranks == 0 && one_process_job()) /* the job's one process is the rank */
        o.backend = "mpi";
    const char *b = NULL;
    hcomm_result_t r = hcomm_launch_backend(o.backend, &b);
    if (r != HCOMM_OK && o.backend) {
        fprintf(stderr, "hcomm-bench: --backend %s: %s\n", o.backend, hcomm_last_error());
        return 2;
    }
    bool mpi = r == HCOMM_OK && !strcmp(b, "mpi");
    if (r == HCOMM_OK && check_algo_option(&o, mpi))
        return 2;
    if (r == HCOMM_OK && mpi && o.gpus > 1) {
        fprintf(stderr,
                "hcomm-bench: -g %d: under mpirun each process is one rank; not "
                "applicable (ranks per process are nccl-tests' GPUs per thread)\n",
                o.gpus);
        return 2;
    }
    /* -t x -g ranks; -g alone means one thread (nccl-tests' -t default) */
    int n = mpi ? 0 : (o.nranks > 0 ? o.nranks : o.gpus > 0 ? 1 : 8) * (o.gpus > 0 ? o.gpus : 1);
    if (r == HCOMM_OK && o.wrap && !mpi) {
        fprintf(stderr, "hcomm-bench: --wrap runs under mpirun (the mpi backend), not on %s\n", b);
        return 2;
    }
    if (r == HCOMM_OK)
        r = o.wrap ? bench_run_wrapped(rank_main, &o) : hcomm_launch(b, n, rank_main, &o);
    if (atomic_load(&usage_error))
        return 2;
    if (r != HCOMM_OK) {
        const char *why = hcomm_last_error();
        fprintf(stderr, "hcomm-bench: %s\n", why[0] ? why : hcomm_strerror(r));
        return 1;
    }
    return 0;
}
