/* hcomm-bench: collective bandwidth tables in the style of nccl-tests.
 *
 * algbw = bytes / time; busbw = algbw scaled by the factor nccl-tests uses for each op
 * (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast 1), so that
 * busbw is comparable to the hardware's link bandwidth whatever the rank count.
 * (nccl-tests, doc/PERFORMANCE.md.) Time is the slowest rank's mean over --iters. */
#include "compare.h"
#include "hcomm/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_ALL_TO_ALL } op_t;
static const char *const op_names[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                       "all_to_all"};
#define NUM_OPS 5

typedef struct opts {
    const char *backend;
    int compare;
    int nranks, iters, warmup, check;
    size_t min_bytes, max_bytes;
    double factor;
    int ops[NUM_OPS];
} opts_t;

/* One op's buffers on one rank. bytes is the nccl-tests "size": the total buffer each rank
 * holds (all_gather: output; reduce_scatter: input). */
typedef struct bufs {
    float *send, *recv;
    size_t bytes, count;
    size_t *counts, *displs;
} bufs_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double bus_factor(op_t op, int n) {
    switch (op) {
    case OP_ALL_REDUCE:
        return 2.0 * (n - 1) / n;
    case OP_BROADCAST:
        return 1.0;
    default:
        return (double)(n - 1) / n;
    }
}

static hcomm_result_t run_op(hcomm_comm_t *w, op_t op, bufs_t *b, int n) {
    size_t per = b->count / (size_t)n;
    switch (op) {
    case OP_ALL_REDUCE:
        return hcomm_all_reduce(w, b->send, b->recv, b->count, HCOMM_F32, HCOMM_SUM);
    case OP_ALL_GATHER:
        return hcomm_all_gather(w, b->send, b->recv, per * sizeof(float));
    case OP_REDUCE_SCATTER:
        return hcomm_reduce_scatter(w, b->send, b->recv, per, HCOMM_F32, HCOMM_SUM);
    case OP_BROADCAST:
        return hcomm_broadcast(w, b->recv, b->count * sizeof(float), 0);
    case OP_ALL_TO_ALL:
        return hcomm_all_to_allv(w, b->send, b->counts, b->displs, b->recv, b->counts, b->displs);
    }
    return HCOMM_ERR_INVALID_ARG;
}

/* Inputs are small integers so every reduction order gives the same exact result. */
static void fill(op_t op, bufs_t *b, int rank, int n) {
    for (size_t i = 0; i < b->count; i++) {
        b->send[i] = (float)((rank + (int)(i % 7)) % 5);
        b->recv[i] = op == OP_BROADCAST && rank == 0 ? (float)(i % 11) : -1.0f;
    }
    size_t per = b->count / (size_t)n;
    for (int p = 0; p < n; p++) {
        b->counts[p] = per * sizeof(float);
        b->displs[p] = (size_t)p * per * sizeof(float);
    }
}

static float expect_at(op_t op, size_t i, int rank, int n, size_t per) {
    float s = 0;
    switch (op) {
    case OP_ALL_REDUCE:
        for (int r = 0; r < n; r++)
            s += (float)((r + (int)(i % 7)) % 5);
        return s;
    case OP_ALL_GATHER: {
        size_t src = i / per, j = i % per;
        return (float)(((int)src + (int)(j % 7)) % 5);
    }
    case OP_REDUCE_SCATTER:
        return expect_at(OP_ALL_REDUCE, (size_t)rank * per + i, rank, n, per);
    case OP_BROADCAST:
        return (float)(i % 11);
    case OP_ALL_TO_ALL: {
        size_t src = i / per, j = (size_t)rank * per + i % per;
        return (float)(((int)src + (int)(j % 7)) % 5);
    }
    }
    return 0;
}

static long count_wrong(op_t op, const bufs_t *b, int rank, int n) {
    size_t per = b->count / (size_t)n;
    size_t len = op == OP_REDUCE_SCATTER ? per : (op == OP_BROADCAST ? b->count : per * (size_t)n);
    long wrong = 0;
    for (size_t i = 0; i < len; i++)
        wrong += b->recv[i] != expect_at(op, i, rank, n, per);
    return wrong;
}

static hcomm_result_t time_op(hcomm_comm_t *w, const opts_t *o, op_t op, bufs_t *b, int n,
                              double *usec) {
    for (int i = 0; i < o->warmup; i++) {
        hcomm_result_t r = run_op(w, op, b, n);
        if (r != HCOMM_OK)
            return r;
    }
    hcomm_result_t r = hcomm_barrier(w);
    double t0 = now_s();
    for (int i = 0; r == HCOMM_OK && i < o->iters; i++)
        r = run_op(w, op, b, n);
    double t = (now_s() - t0) / o->iters * 1e6;
    if (r == HCOMM_OK)
        r = hcomm_all_reduce(w, &t, usec, 1, HCOMM_F64, HCOMM_MAX);
    return r;
}

static hcomm_result_t bench_size(hcomm_comm_t *w, const opts_t *o, op_t op, bufs_t *b, int rank,
                                 int n) {
    double usec = 0;
    fill(op, b, rank, n);
    hcomm_result_t r = run_op(w, op, b, n);
    long wrong = r == HCOMM_OK ? count_wrong(op, b, rank, n) : -1, total = 0;
    if (r == HCOMM_OK)
        r = hcomm_all_reduce(w, &wrong, &total, 1, HCOMM_I64, HCOMM_SUM);
    if (r == HCOMM_OK)
        r = time_op(w, o, op, b, n, &usec);
    if (r != HCOMM_OK || rank != 0)
        return r;
    double algbw = (double)b->bytes / usec / 1e3; /* bytes/us = MB/s; /1e3 = GB/s */
    printf("%12zu %12zu  float %14s %10.2f %8.3f %8.3f %7ld\n", b->bytes, b->count, op_names[op],
           usec, algbw, algbw * bus_factor(op, n), o->check ? total : 0L);
    return HCOMM_OK;
}

static hcomm_result_t bench_op(hcomm_comm_t *w, const opts_t *o, op_t op, int rank, int n) {
    size_t max_count = o->max_bytes / sizeof(float) + (size_t)n;
    bufs_t b = {.send = malloc(max_count * sizeof(float)),
                .recv = malloc(max_count * sizeof(float)),
                .counts = malloc(sizeof(size_t) * (size_t)n),
                .displs = malloc(sizeof(size_t) * (size_t)n)};
    hcomm_result_t r = (b.send && b.recv && b.counts && b.displs) ? HCOMM_OK : HCOMM_ERR_NOMEM;
    const char *backend = "?";
    hcomm_comm_backend(w, &backend);
    if (rank == 0 && r == HCOMM_OK)
        printf("#\n# %s, %d rank%s on %s\n#%11s %12s %6s %14s %10s %8s %8s %7s\n", op_names[op], n,
               n == 1 ? "" : "s", backend, "size(B)", "count", "type", "op", "time(us)", "algbw",
               "busbw", "#wrong");
    for (size_t bytes = o->min_bytes; r == HCOMM_OK && bytes <= o->max_bytes;) {
        b.count = bytes / sizeof(float) / (size_t)n * (size_t)n; /* divisible by n */
        b.bytes = b.count * sizeof(float);
        r = bench_size(w, o, op, &b, rank, n);
        size_t next = (size_t)((double)bytes * o->factor);
        bytes = next > bytes ? next : bytes + 1;
    }
    free(b.send);
    free(b.recv);
    free(b.counts);
    free(b.displs);
    return r;
}

static hcomm_result_t rank_main(hcomm_comm_t *w, void *arg) {
    const opts_t *o = arg;
    int rank, n;
    hcomm_comm_rank(w, &rank);
    hcomm_comm_size(w, &n);
    if (o->compare)
        return hcomm_bench_compare(w, o->compare == 2);
    for (int op = 0; op < NUM_OPS; op++) {
        if (!o->ops[op])
            continue;
        hcomm_result_t r = bench_op(w, o, (op_t)op, rank, n);
        if (r != HCOMM_OK)
            return r;
    }
    return HCOMM_OK;
}

static void print_version(void) {
    int major, minor, patch;
    const char *backends;
    hcomm_version(&major, &minor, &patch, &backends);
    printf("hcomm-bench %s (hcomm library %d.%d.%d; backends: %s)\n", HCOMM_VERSION_STRING, major,
           minor, patch, backends);
}

static void usage(FILE *f) {
    fprintf(f, "usage: hcomm-bench [options]\n"
               "  --backend B     local or mpi (default: $HCOMM_BACKEND, else mpi under "
               "mpirun/srun, else local)\n"
               "  -n, --ranks N   ranks for the local backend (default 8; mpi: the job's size)\n"
               "  --op OP         all_reduce, all_gather, reduce_scatter, broadcast, all_to_all "
               "or all (default all);\n"
               "                  pp_send_recv: PP ping-pong 8 B..64 MiB against the p2p layer "
               "under it (and raw MPI)\n"
               "                  compare: 8 B all_reduce and p2p latency against raw MPI, 16 MiB "
               "p2p\n"
               "                  bandwidth against memcpy, as ratios from one run\n"
               "  -b BYTES        smallest size (default 1024)\n"
               "  -e BYTES        largest size (default 4194304)\n"
               "  -f FACTOR       size multiplier between rows (default 4)\n"
               "  --iters N       timed iterations per size (default 20)\n"
               "  --warmup N      untimed iterations per size (default 3)\n"
               "  --check 0|1     report wrong elements (default 1)\n"
               "  --version       print the version and the backends built\n");
}

/* Sizes are bytes with an optional K or M suffix, from 1 byte to 1 GiB. */
static int parse_size(const char *flag, const char *v, size_t *out) {
    char *end;
    unsigned long long x = (*v >= '0' && *v <= '9') ? strtoull(v, &end, 10) : 0;
    int shift = 0;
    if (x > 0 && (*end == 'K' || *end == 'k'))
        shift = 10, end++;
    else if (x > 0 && (*end == 'M' || *end == 'm'))
        shift = 20, end++;
    if (x == 0 || *end != '\0' || x > (1ull << 30) >> shift) {
        fprintf(stderr,
                "hcomm-bench: %s %s is not a size from 1 to 1G bytes (e.g. 4096, 64K, 8M)\n", flag,
                v);
        return -1;
    }
    *out = (size_t)(x << shift);
    return 0;
}

static int parse_factor(const char *flag, const char *v, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || !(x > 1.0 && x <= 1024.0)) {
        fprintf(stderr, "hcomm-bench: %s %s must be a number above 1 (and at most 1024)\n", flag,
                v);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_int(const char *flag, const char *v, int *out, int min) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0') {
        fprintf(stderr, "hcomm-bench: %s %s is not an integer\n", flag, v);
        return -1;
    }
    if (x < min || x > 1 << 20) {
        fprintf(stderr, "hcomm-bench: %s %s: out of range %d..%d\n", flag, v, min, 1 << 20);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int select_op(opts_t *o, const char *v) {
    o->compare = strcmp(v, "compare") == 0 ? 1 : strcmp(v, "pp_send_recv") == 0 ? 2 : 0;
    if (o->compare)
        return 0;
    int all = strcmp(v, "all") == 0, found = 0;
    for (int i = 0; i < NUM_OPS; i++) {
        o->ops[i] = all || strcmp(v, op_names[i]) == 0;
        found |= o->ops[i];
    }
    if (!found)
        fprintf(stderr, "hcomm-bench: --op %s is unknown\n", v);
    return found ? 0 : -1;
}

static int parse_args(int argc, char **argv, opts_t *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad;
        static const char *const known[] = {"--backend", "-n",      "--ranks", "--op",
                                            "-b",        "-e",      "-f",      "--iters",
                                            "--warmup",  "--check", NULL};
        int is_known = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return usage(stdout), 1;
        if (!strcmp(a, "--version"))
            return print_version(), 1;
        for (int k = 0; known[k] != NULL; k++)
            is_known |= !strcmp(a, known[k]);
        if (!is_known) {
            fprintf(stderr, "hcomm-bench: unknown option %s (see --help)\n", a);
            return -1;
        }
        if (v == NULL) {
            fprintf(stderr, "hcomm-bench: %s needs a value (see --help)\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--backend"))
            o->backend = v, bad = 0;
        else if (!strcmp(a, "-n") || !strcmp(a, "--ranks"))
            bad = parse_int(a, v, &o->nranks, 1);
        else if (!strcmp(a, "--op"))
            bad = select_op(o, v);
        else if (!strcmp(a, "-b"))
            bad = parse_size(a, v, &o->min_bytes);
        else if (!strcmp(a, "-e"))
            bad = parse_size(a, v, &o->max_bytes);
        else if (!strcmp(a, "-f"))
            bad = parse_factor(a, v, &o->factor);
        else if (!strcmp(a, "--iters"))
            bad = parse_int(a, v, &o->iters, 1);
        else if (!strcmp(a, "--warmup"))
            bad = parse_int(a, v, &o->warmup, 0);
        else if (!strcmp(a, "--check"))
            bad = parse_int(a, v, &o->check, 0);
        else
            bad = 1; /* not reached: every known flag is handled above */
        if (bad)
            return -1;
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, "hcomm-bench: -b %zu is larger than -e %zu\n", o->min_bytes, o->max_bytes);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    opts_t o = {.nranks = 8,
                .iters = 20,
                .warmup = 3,
                .check = 1,
                .min_bytes = 1024,
                .max_bytes = 4 << 20,
                .factor = 4.0,
                .ops = {1, 1, 1, 1, 1}};
    int p = parse_args(argc, argv, &o);
    if (p != 0)
        return p > 0 ? 0 : 2;
    const char *b = NULL;
    hcomm_result_t r = hcomm_launch_backend(o.backend, &b);
    int n = (r == HCOMM_OK && !strcmp(b, "mpi")) ? 0 : o.nranks;
    if (r == HCOMM_OK)
        r = hcomm_launch(b, n, rank_main, &o);
    if (r != HCOMM_OK) {
        fprintf(stderr, "hcomm-bench: %s (%s)\n", hcomm_strerror(r), hcomm_last_error());
        return 1;
    }
    return 0;
}
