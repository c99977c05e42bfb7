/* hcomm-bench's command line, in the style of nccl-tests (one binary, the operation first):
 *   hcomm-bench OP -b MIN -e MAX -f FACTOR | -i STEP -n ITERS -w WARMUP -c CHECK -o REDOP
 *               -d DTYPE -r ROOT -a 0|1|2|3 -F CSV -t NRANKS --algo NAME|all|auto ...
 * Every flag also takes --flag=value; sizes take K, M and G suffixes. */
#include "bench.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum { K_SIZE, K_INT, K_FACTOR, K_STR, K_OP, K_DTYPE, K_REDOP, K_ALGO } kind_t;

typedef struct flag {
    const char *s, *l, *alt; /* short, long, another long spelling */
    kind_t kind;
    int min, max;
} flag_t;

enum {
    F_BACKEND,
    F_RANKS,
    F_OP,
    F_MIN,
    F_MAX,
    F_FACTOR,
    F_STEP,
    F_ITERS,
    F_WARMUP,
    F_CHECK,
    F_REDOP,
    F_DTYPE,
    F_ROOT,
    F_AVG,
    F_CSV,
    F_ALGO,
    F_JSON,
    F_PLOT,
    F_MOE_H,
    F_MOE_K,
    F_MOE_E,
    F_DP_N,
    F_MEM,
    F_TIMING,
    F_GPUS,
    F_CYCLES,
    F_BLOCKING,
    F_AGG,
    F_GRAPH,
    F_CPUTIME,
    F_COUNT
};
_Static_assert(F_COUNT <= 32, "the flags given fit one uint32_t mask");

static const flag_t flags[F_COUNT] = {
    [F_BACKEND] = {NULL, "--backend", NULL, K_STR, 0, 0},
    [F_RANKS] = {"-t", "--ranks", "--nthreads", K_INT, 1, 4096},
    [F_OP] = {NULL, "--op", NULL, K_OP, 0, 0},
    [F_MIN] = {"-b", "--minbytes", NULL, K_SIZE, 0, 0},
    [F_MAX] = {"-e", "--maxbytes", NULL, K_SIZE, 0, 0},
    [F_FACTOR] = {"-f", "--stepfactor", NULL, K_FACTOR, 0, 0},
    [F_STEP] = {"-i", "--stepbytes", NULL, K_SIZE, 0, 0},
    [F_ITERS] = {"-n", "--iters", NULL, K_INT, 1, 1 << 20},
    [F_WARMUP] = {"-w", "--warmup_iters", "--warmup", K_INT, 0, 1 << 20},
    [F_CHECK] = {"-c", "--check", NULL, K_INT, 0, 1 << 20},
    [F_REDOP] = {"-o", "--redop", NULL, K_REDOP, 0, 0},
    [F_DTYPE] = {"-d", "--datatype", "--dtype", K_DTYPE, 0, 0},
    [F_ROOT] = {"-r", "--root", NULL, K_INT, 0, 4095},
    [F_AVG] = {"-a", "--average", NULL, K_INT, 0, 3},
    [F_CSV] = {"-F", "--csv", NULL, K_STR, 0, 0},
    [F_ALGO] = {NULL, "--algo", NULL, K_ALGO, 0, 0},
    [F_JSON] = {NULL, "--json", NULL, K_STR, 0, 0},
    [F_PLOT] = {NULL, "--plot", NULL, K_STR, 0, 0},
    [F_MOE_H] = {NULL, "--moe-hidden", NULL, K_INT, 1, 1 << 20},
    [F_MOE_K] = {NULL, "--moe-topk", NULL, K_INT, 1, 64},
    [F_MOE_E] = {NULL, "--moe-experts", NULL, K_INT, 1, 1 << 16},
    [F_DP_N] = {NULL, "--dp-buffers", NULL, K_INT, 1, 4096},
    [F_MEM] = {NULL, "--mem", NULL, K_STR, 0, 0},
    [F_TIMING] = {NULL, "--timing", NULL, K_STR, 0, 0},
    [F_GPUS] = {"-g", "--ngpus", NULL, K_INT, 1, 4096},
    [F_CYCLES] = {"-N", "--run_cycles", NULL, K_INT, 0, 1 << 20},
    [F_BLOCKING] = {"-z", "--blocking", NULL, K_INT, 0, 1},
    [F_AGG] = {"-m", "--agg_iters", NULL, K_INT, 1, 1 << 20},
    [F_GRAPH] = {"-G", "--cudagraph", NULL, K_INT, 0, 1 << 20},
    [F_CPUTIME] = {"-C", "--report_cputime", NULL, K_INT, 0, 1},
};

static void print_version(void) {
    int major, minor, patch;
    const char *backends;
    hcomm_version(&major, &minor, &patch, &backends);
    printf("hcomm-bench %s (hcomm library %d.%d.%d; backends: %s)\n", HCOMM_VERSION_STRING, major,
           minor, patch, backends);
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: hcomm-bench [OP...] [options]   (nccl-tests style; every flag also as "
        "--flag=value)\n"
        "  OP                all_reduce, all_gather, reduce_scatter, broadcast, reduce, gather,\n"
        "                    scatter, all_to_all, all_to_allv, all_gatherv, reduce_scatterv,\n"
        "                    tp_all_reduce, tp_all_gather, tp_reduce_scatter, pp_send_recv,\n"
        "                    moe_dispatch_combine, dp_all_reduce, cp_ring, cp_a2a, all (every\n"
        "                    collective; the\n"
        "                    default; several OPs run one after another), or compare (hcomm "
        "against raw MPI and memcpy as ratios;\n"
        "                    -b/-e/-f/-i set its pp_send_recv sizes, 8 B to 64 MiB by default,\n"
        "                    and -n every row's iterations, else its own per row)\n"
        "  --op OP           the same as OP\n"
        "  -b, --minbytes N  smallest size in bytes, K/M/G suffixes; 0 for empty calls (default "
        "1K)\n"
        "  -e, --maxbytes N  largest size (default 4M)\n"
        "  -f, --stepfactor F  size multiplier between rows (default 4)\n"
        "  -i, --stepbytes N   size increment between rows instead of -f\n"
        "  -n, --iters N     timed iterations per size (default 20)\n"
        "  -w, --warmup_iters N  untimed iterations per size (default 3); auto first runs\n"
        "                    past the calls in which hcomm times two candidates near a switch\n"
        "                    (one host, the first 18 of a size; a program's loop pays them once)\n"
        "  -c, --check N     checked iterations per size against a reference (default 1; 0: "
        "#wrong N/A)\n"
        "  -o, --redop OP    sum, prod, max, min, avg, or all (each that the op takes; default "
        "sum)\n"
        "  -d, --datatype T  f32 (float), f64 (double), f16 (half), bf16, i8, u8, i32, i64, all\n"
        "                    (default f32; moe_dispatch_combine: bf16)\n"
        "  -r, --root R      root of broadcast, reduce, gather, scatter (default 0)\n"
        "  -a, --average A   time across ranks: 0 rank 0, 1 mean, 2 min, 3 max (default 3: the\n"
        "                    slowest rank; each figure is the median over iterations)\n"
        "  -t, --ranks N     ranks as threads on the local backend (default 8); under mpirun or\n"
        "                    srun the job's processes are the ranks (1 too, unless -t is given)\n");
    fprintf(
        f,
        "  -g, --ngpus G     ranks per thread (nccl-tests' GPUs per thread): -t x -g ranks in\n"
        "                    all (-g alone: -t 1); under mpirun only 1\n"
        "  -N, --run_cycles N  run everything N times (default 1; 0: until interrupted)\n"
        "  -z, --blocking 0|1, -C, --report_cputime 0|1  accepted for nccl-tests' command lines:\n"
        "                    hcomm's calls block and their times are the CPU's either way\n"
        "  -m, --agg_iters 1, -G, --cudagraph 0  only these: grouped launches and CUDA graphs\n"
        "                    are not applicable on CPU\n"
        "  --algo A          auto (default: hcomm's choice), all (every algorithm valid for the\n"
        "                    op, plus auto and its regret), one name (native, ring, ...), or raw\n"
        "                    (MPI alone); on mpi a raw row (MPI called directly) joins auto's\n"
        "  -F, --csv FILE    write the rows as CSV\n"
        "  --json FILE       write the rows as one JSON array\n"
        "  --plot FILE.png   draw busbw against size per algorithm (needs gnuplot)\n"
        "  --moe-hidden H --moe-topk K --moe-experts E   moe_dispatch_combine shape (7168, 8, "
        "256)\n"
        "  --dp-buffers N    dp_all_reduce: gradient buffers per call (default 16)\n"
        "  --mem M           where the buffers come from: shared (hcomm_mem_alloc, the default:\n"
        "                    mpi processes on one node load from each other's) or host (malloc:\n"
        "                    read with cross-memory attach)\n"
        "  --timing T        window (default: every timed call starts at one instant of the\n"
        "                    host's clock, ReproMPI's window) or b2b (back to back, as OSU's\n"
        "                    osu_allreduce: a sample is the mean of 100 calls in a loop below\n"
        "                    64 KiB, 10 below 1 MiB, else 1)\n"
        "  --wrap            under mpirun: the ranks run on hcomm_comm_wrap_mpi(MPI_COMM_WORLD),\n"
        "                    as an MPI application adopting hcomm does, not on hcomm_launch's\n"
        "  --backend B       local or mpi (default: $HCOMM_BACKEND, else mpi under mpirun or\n"
        "                    srun, else local)\n"
        "  --calibrate [FILE]  instead of tables: measure the link classes of hcomm's cost model\n"
        "                    on these ranks (intra: ping-pong of rank 0 with a rank on its node;\n"
        "                    inter: with a rank on another node, real or HCOMM_TOPO=nodes=NxG\n"
        "                    simulated; 8 B to 8 MiB, least-squares fit of alpha + bytes*beta;\n"
        "                    reduce: the f32 sum kernel), print them and write FILE in the\n"
        "                    format HCOMM_TUNING_FILE reads (rank 0 decides; same bytes on\n"
        "                    every rank); then run with HCOMM_TUNING_FILE=FILE\n"
        "  --version         print the version and the backends built\n");
    fprintf(
        f,
        "table (nccl-tests' columns in its order, then hcomm's algo): size (B: the whole\n"
        "  vector, result or input), count (elements), type, redop, root, then out-of-place and\n"
        "  in-place: time (us, the median over iterations of the slowest rank's time; -a), algbw\n"
        "  (bytes / time, GB/s), busbw (algbw x nccl-tests' factor: all_reduce 2(p-1)/p;\n"
        "  all_gather, reduce_scatter, all_to_all, gather, scatter (p-1)/p; broadcast, reduce,\n"
        "  send_recv 1), #wrong; last algo (auto(X): hcomm chose X). Under\n"
        "  each size: auto's regret (its time over the best algorithm's), hcomm/raw on mpi and\n"
        "  busbw over the memcpy bandwidth measured in the same run (every rank copying at once);\n"
        "  last, the average busbw per algorithm.\n"
        "--json: one array of records {op, algo, bytes, count, dtype, redop, world, inplace,\n"
        "  time_us, algbw, busbw, wrong (null: unchecked), memcpy_gbs}; auto's add chosen, "
        "regret,\n"
        "  best and hcomm_over_raw; a named algorithm that fell back to another adds ran (the\n"
        "  table shows NAME->RAN, and regret leaves it out where that algorithm has its own\n"
        "  row); one record with op \"memcpy\" is the baseline; memcpy_gbs is null for empty\n"
        "  calls. -F: the same fields as CSV columns, empty where a record has none (chosen:\n"
        "  auto's choice, or what a named row ran instead; auto_over_NAME: variant and\n"
        "  auto_over_variant). A progress line goes to stderr in runs longer than a few "
        "seconds.\n");
}

static int bad(const char *flag, const char *v, const char *why) {
    fprintf(stderr, "hcomm-bench: %s %s %s\n", flag, v[0] ? v : "\"\"", why);
    return -1;
}

/* Bytes with an optional K, M or G suffix (powers of 1024), 0 to 64 GiB (0: a row of empty
 * calls, which every rank must still enter and leave). */
static int parse_size(const char *flag, const char *v, size_t *out) {
    char *end;
    unsigned long long x = (*v >= '0' && *v <= '9') ? strtoull(v, &end, 10) : 0;
    int shift = 0;
    if (x > 0 && strchr("kK", *end) && *end)
        shift = 10, end++;
    else if (x > 0 && strchr("mM", *end) && *end)
        shift = 20, end++;
    else if (x > 0 && strchr("gG", *end) && *end)
        shift = 30, end++;
    if ((x == 0 && strcmp(v, "0")) || *end != '\0' || x > (1ull << 36) >> shift)
        return bad(flag, v, "is not a size from 0 to 64G bytes (e.g. 0, 4096, 64K, 8M, 1G)");
    *out = (size_t)(x << shift);
    return 0;
}

static int parse_factor(const char *flag, const char *v, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || !(x > 1.0 && x <= 1024.0))
        return bad(flag, v, "must be a number above 1 (and at most 1024)");
    *out = x;
    return 0;
}

static int parse_int(const char *flag, const char *v, int *out, int min, int max) {
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0')
        return bad(flag, v, "is not an integer");
    if (x < min || x > max) {
        fprintf(stderr, "hcomm-bench: %s %s: out of range %d..%d\n", flag, v, min, max);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static const char *const dtype_alias[][2] = {
    {"float", "f32"}, {"float32", "f32"}, {"double", "f64"},    {"float64", "f64"},
    {"half", "f16"},  {"float16", "f16"}, {"bfloat16", "bf16"}, {"int8", "i8"},
    {"uint8", "u8"},  {"int32", "i32"},   {"int", "i32"},       {"int64", "i64"}};

static int parse_dtype(const char *flag, const char *v, hcomm_dtype_t *out) {
    for (size_t i = 0; i < sizeof dtype_alias / sizeof *dtype_alias; i++)
        if (!strcmp(v, dtype_alias[i][0]))
            v = dtype_alias[i][1];
    for (int d = 0; d < HCOMM_DTYPE_COUNT; d++) {
        const char *name = "";
        hcomm_dtype_name((hcomm_dtype_t)d, &name);
        if (!strcmp(v, name)) {
            *out = (hcomm_dtype_t)d;
            return 0;
        }
    }
    return bad(flag, v, "is not a dtype (f32, f64, f16, bf16, i8, u8, i32, i64)");
}

static int parse_redop(const char *flag, const char *v, hcomm_op_t *out) {
    for (int op = 0; op < HCOMM_OP_COUNT; op++)
        if (!strcmp(v, bench_op_names[op])) {
            *out = (hcomm_op_t)op;
            return 0;
        }
    return bad(flag, v, "is not a reduction (sum, prod, max, min, avg)");
}

/* "all" (every collective), compare, or one op. */
static int select_op(bench_opts_t *o, const char *flag, const char *v) {
    int n;
    const bench_op_t *ops = bench_ops(&n);
    if (!strcmp(v, "compare")) {
        o->legacy = 1;
        return 0;
    }
    if (!strcmp(v, "all")) {
        o->ops_from_all = true;
        for (int i = 0; i < n && o->nops < BENCH_MAX_OPS; i++)
            if (!ops[i].primitive)
                o->ops[o->nops++] = i;
        return 0;
    }
    int i = bench_op_find(v);
    if (i < 0) {
        fprintf(stderr, "hcomm-bench: %s%s%s is not an operation; valid:", flag ? flag : "",
                flag ? " " : "", v);
        for (int k = 0; k < n; k++)
            fprintf(stderr, " %s", ops[k].name);
        fprintf(stderr, ", all, compare\n");
        return -1;
    }
    if (o->nops < BENCH_MAX_OPS)
        o->ops[o->nops++] = i;
    return 0;
}

/* auto, all, raw or an algorithm name hcomm knows (whether the op can run it is checked once
 * the op is known). */
static int parse_algo(const char *flag, const char *v, const char **out) {
    if (strcmp(v, "auto") && strcmp(v, "all") && strcmp(v, "raw")) {
        int ok = 0;
        for (int a = 0; a < hcomm__bench_algos(); a++)
            ok |= !strcmp(v, hcomm__bench_algo_name(a));
        if (!ok) {
            fprintf(stderr, "hcomm-bench: %s %s is not an algorithm; valid: auto, all, raw", flag,
                    v);
            for (int a = 0; a < hcomm__bench_algos(); a++)
                fprintf(stderr, ", %s", hcomm__bench_algo_name(a));
            fprintf(stderr, "\n");
            return -1;
        }
    }
    *out = v;
    return 0;
}

/* An output file's name: not "-" (the tables go to stdout), and ending in suffix if given. */
static int output_file(const char *flag, const char *v, const char *suffix, const char **out) {
    size_t n = strlen(v), k = suffix ? strlen(suffix) : 0;
    if (!strcmp(v, "-"))
        return bad(flag, v, "is not a file name (the tables go to stdout)");
    if (suffix && (n <= k || strcasecmp(v + n - k, suffix) != 0)) {
        fprintf(stderr, "hcomm-bench: %s %s: the file name must end in %s (a PNG image)\n", flag,
                v[0] ? v : "\"\"", suffix);
        return -1;
    }
    *out = v;
    return 0;
}

static int find_flag(const char *a, size_t len) {
    for (int f = 0; f < F_COUNT; f++) {
        const char *names[3] = {flags[f].s, flags[f].l, flags[f].alt};
        for (int k = 0; k < 3; k++)
            if (names[k] && strlen(names[k]) == len && !strncmp(a, names[k], len))
                return f;
    }
    return -1;
}

/* -m and -G ask for what a CPU run has not (grouped launches, CUDA graphs): only their
 * neutral values (1 and 0) are accepted. */
static int not_on_cpu(int f, const char *a, const char *v) {
    int n = 0, neutral = f == F_AGG ? 1 : 0;
    if (parse_int(a, v, &n, flags[f].min, flags[f].max) != 0)
        return -1;
    if (n == neutral)
        return 0;
    fprintf(stderr, "hcomm-bench: %s %s: not applicable on CPU (%s); only %s %d\n", a, v,
            f == F_AGG ? "hcomm has no grouped launch of several collectives"
                       : "there are no CUDA graphs",
            a, neutral);
    return -1;
}

static int set_flag(bench_opts_t *o, int f, const char *a, const char *v) {
    const flag_t *fl = &flags[f];
    switch (f) {
    case F_BACKEND:
        if (strcmp(v, "local") != 0 && strcmp(v, "mpi") != 0)
            return bad(a, v, "is not a backend (local or mpi)");
        o->backend = v;
        return 0;
    case F_OP:
        return select_op(o, a, v);
    case F_MIN:
        return parse_size(a, v, &o->min_bytes);
    case F_MAX:
        return parse_size(a, v, &o->max_bytes);
    case F_STEP:
        if (parse_size(a, v, &o->step_bytes) != 0)
            return -1;
        if (o->step_bytes == 0) { /* a step of nothing would repeat -b forever */
            fprintf(stderr, "hcomm-bench: %s %s: the step must be at least 1 byte\n", a, v);
            return -1;
        }
        return 0;
    case F_FACTOR:
        return parse_factor(a, v, &o->factor);
    case F_REDOP:
        o->all_redops = !strcmp(v, "all");
        return o->all_redops ? 0 : parse_redop(a, v, &o->redop);
    case F_DTYPE:
        o->dtype_given = true;
        o->all_dtypes = !strcmp(v, "all");
        return o->all_dtypes ? 0 : parse_dtype(a, v, &o->dtype);
    case F_AGG:
    case F_GRAPH:
        return not_on_cpu(f, a, v);
    case F_ALGO:
        return parse_algo(a, v, &o->algo);
    case F_CSV:
        return output_file(a, v, NULL, &o->csv);
    case F_JSON:
        return output_file(a, v, NULL, &o->json);
    case F_PLOT:
        return output_file(a, v, ".png", &o->plot);
    case F_MEM:
        if (strcmp(v, "shared") != 0 && strcmp(v, "host") != 0) {
            fprintf(stderr, "hcomm-bench: %s=\"%s\" is not shared or host\n", a, v);
            return -1;
        }
        o->host_mem = strcmp(v, "host") == 0;
        return 0;
    case F_TIMING:
        if (strcmp(v, "window") != 0 && strcmp(v, "b2b") != 0) {
            fprintf(stderr, "hcomm-bench: %s=\"%s\" is not window or b2b\n", a, v);
            return -1;
        }
        o->b2b = strcmp(v, "b2b") == 0;
        return 0;
    default:
        break;
    }
    int ignored; /* -z and -C: hcomm's calls block, and their times are the CPU's, either way */
    int *dst[F_COUNT] = {
        [F_RANKS] = &o->nranks,     [F_ITERS] = &o->iters,    [F_WARMUP] = &o->warmup,
        [F_CHECK] = &o->check,      [F_ROOT] = &o->root,      [F_AVG] = &o->report,
        [F_MOE_H] = &o->moe_hidden, [F_MOE_K] = &o->moe_topk, [F_MOE_E] = &o->moe_experts,
        [F_DP_N] = &o->dp_buffers,  [F_GPUS] = &o->gpus,      [F_CYCLES] = &o->cycles,
        [F_BLOCKING] = &ignored,    [F_CPUTIME] = &ignored};
    return parse_int(a, v, dst[f], fl->min, fl->max);
}

/* An operation's name (or all, compare): never --calibrate's FILE. */
static bool names_an_op(const char *v) {
    return bench_op_find(v) >= 0 || !strcmp(v, "all") || !strcmp(v, "compare");
}

/* One argument (and its value, which may be the next one): returns how many were used, or -1. */
static int parse_one(bench_opts_t *o, int i, int argc, char **argv, bool *factor, bool *step,
                     uint32_t *given) {
    const char *a = argv[i];
    if (!strcmp(a, "--wrap")) {
        o->wrap = true;
        return 1;
    }
    if (!strncmp(a, "--calibrate", 11) && (a[11] == '\0' || a[11] == '=')) {
        bool next =
            a[11] == '\0' && i + 1 < argc && argv[i + 1][0] != '-' && !names_an_op(argv[i + 1]);
        o->calibrate = true;
        o->calibrate_file = a[11] == '=' ? a + 12 : next ? argv[i + 1] : NULL;
        if (o->calibrate_file && !o->calibrate_file[0])
            return bad("--calibrate", "\"\"", "is not a file name"), -1;
        return next ? 2 : 1;
    }
    if (a[0] != '-' || a[1] == '\0')
        return select_op(o, NULL, a) ? -1 : 1;
    const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    int f = find_flag(a, len);
    if (f < 0) {
        fprintf(stderr, "hcomm-bench: unknown option %.*s (see --help)\n", (int)len, a);
        return -1;
    }
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)len, a);
    const char *v = eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : NULL;
    /* "-n -3" is a value; "--algo --json x" and "--json -t 2" (a file name or backend that
     * looks like a flag; --json=-t still names one) are missing ones */
    if (v == NULL ||
        (!eq && v[0] == '-' && (v[1] == '-' || (flags[f].kind == K_STR && v[1] != '\0')))) {
        fprintf(stderr, "hcomm-bench: %s needs a value (see --help)\n", name);
        return -1;
    }
    *factor |= f == F_FACTOR;
    *step |= f == F_STEP;
    o->min_given |= f == F_MIN;
    o->max_given |= f == F_MAX;
    o->iters_given |= f == F_ITERS;
    o->redop_given |= f == F_REDOP;
    *given |= 1u << f;
    return set_flag(o, f, name, v) ? -1 : eq ? 1 : 2;
}

/* The first flag of mask among those given, by its spelling on the help page. */
static const char *first_given(uint32_t given, uint32_t mask) {
    for (int f = 0; f < F_COUNT; f++)
        if (given & mask & (1u << f))
            return flags[f].s ? flags[f].s : flags[f].l;
    return NULL;
}

/* compare and --calibrate run rows of their own: a flag they would ignore is an error. */
static int check_modes(const bench_opts_t *o, uint32_t given) {
    const uint32_t sizes = 1u << F_MIN | 1u << F_MAX | 1u << F_FACTOR | 1u << F_STEP,
                   common = 1u << F_BACKEND | 1u << F_RANKS | 1u << F_MEM;
    const char *extra;
    if (o->legacy && o->nops > 0) {
        fprintf(stderr, "hcomm-bench: compare runs alone; leave out the other operations\n");
        return -1;
    }
    if (o->legacy && (extra = first_given(given, ~(sizes | common | 1u << F_ITERS | 1u << F_OP)))) {
        fprintf(stderr,
                "hcomm-bench: compare takes -b -e -f -i -n (and -t, --backend, --mem), "
                "not %s\n",
                extra);
        return -1;
    }
    if (o->calibrate && (o->nops > 0 || o->legacy)) {
        fprintf(stderr, "hcomm-bench: --calibrate measures the cost model's links, not an "
                        "operation; leave out OP\n");
        return -1;
    }
    if (o->calibrate && (extra = first_given(given, ~common))) {
        fprintf(stderr, "hcomm-bench: --calibrate takes -t, --backend and --mem, not %s\n", extra);
        return -1;
    }
    return 0;
}

static int check_combination(const bench_opts_t *o, bool factor, bool step) {
    if (factor && step) {
        fprintf(stderr, "hcomm-bench: -f and -i exclude each other (a factor or a step)\n");
        return -1;
    }
    if (o->min_bytes > o->max_bytes && !o->legacy) { /* compare has defaults of its own */
        fprintf(stderr, "hcomm-bench: -b %zu%s is larger than -e %zu%s\n", o->min_bytes,
                o->min_given ? "" : " (the default)", o->max_bytes,
                o->max_given ? "" : " (the default)");
        return -1;
    }
    return 0;
}

int bench_parse_args(int argc, char **argv, bench_opts_t *o) {
    bool factor = false, step = false;
    uint32_t given = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return usage(stdout), 1;
        if (!strcmp(argv[i], "--version"))
            return print_version(), 1;
    }
    for (int i = 1; i < argc;) {
        int used = parse_one(o, i, argc, argv, &factor, &step, &given);
        if (used < 0)
            return -1;
        i += used;
    }
    if (check_modes(o, given) != 0)
        return -1;
    if (o->nops == 0 && !o->legacy && !o->calibrate)
        select_op(o, NULL, "all");
    o->step_given = factor || step;
    return check_combination(o, factor, step);
}

size_t bench_next_size(const bench_opts_t *o, size_t bytes) {
    if (o->step_bytes)
        return bytes + o->step_bytes;
    size_t next = (size_t)((double)bytes * o->factor);
    return next > bytes ? next : bytes + 1;
}
