/* hcomm-bench internals shared by its files: options (args.c), the operations it measures
 * (ops.c, moe.c), the measuring loop (main.c) and the reports (report.c). */
#ifndef HCOMM_TOOLS_BENCH_BENCH_H_
#define HCOMM_TOOLS_BENCH_BENCH_H_

#include "hcomm/api.h"
#include "bench/bench_internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum { BENCH_MAX_ALGOS = 24, BENCH_MAX_OPS = 24 };

/* Returns a failed call's result from the function that made it. */
#define BENCH_TRY(call)                                                                            \
    do {                                                                                           \
        hcomm_result_t bench_r_ = (call);                                                          \
        if (bench_r_ != HCOMM_OK)                                                                  \
            return bench_r_;                                                                       \
    } while (0)

typedef struct bench_opts {
    const char *backend;
    int legacy; /* 1: compare (compare.c) */
    int ops[BENCH_MAX_OPS], nops;
    int nranks, iters, warmup, check, report; /* report: -a 0 rank 0, 1 mean, 2 min, 3 max */
    int root;
    size_t min_bytes, max_bytes, step_bytes; /* step_bytes > 0: -i, else factor */
    double factor;
    hcomm_dtype_t dtype;
    bool dtype_given;
    hcomm_op_t redop;
    const char *algo; /* NULL: auto; "all"; or one name */
    const char *json, *csv, *plot;
    int moe_hidden, moe_topk, moe_experts;
    int dp_buffers;
    bool host_mem;                         /* --mem host: malloc'd buffers, not hcomm_mem_alloc's */
    bool calibrate;                        /* --calibrate [FILE] (calibrate.c) */
    const char *calibrate_file;            /* NULL: print only */
    bool min_given, max_given, step_given; /* -b, -e, -f or -i on the command line (compare) */
    bool iters_given;                      /* -n on the command line (compare) */
    bool redop_given;                      /* -o on the command line */
    bool ops_from_all;                     /* OP all (or none): every collective */
    bool wrap;  /* --wrap: the ranks run on hcomm_comm_wrap_mpi(MPI_COMM_WORLD) */
    bool b2b;   /* --timing b2b: a sample is the mean of B2B_CALLS calls back to back */
    int gpus;   /* -g: ranks per thread (nccl-tests' GPUs per thread): -t x -g ranks */
    int cycles; /* -N: times the whole run repeats; 0: until interrupted */
    bool all_dtypes, all_redops; /* -d all, -o all: every one that suits each operation */
} bench_opts_t;

/* --wrap (wrap.c): MPI started here, fn run on hcomm_comm_wrap_mpi(MPI_COMM_WORLD), MPI ended. */
hcomm_result_t bench_run_wrapped(hcomm_rank_fn_t fn, void *arg);

/* One operation's buffers and shape at one size on one rank. */
typedef struct bench_op bench_op_t;

typedef struct bench_case {
    hcomm_comm_t *w;
    const bench_op_t *op;
    const bench_opts_t *o;
    int rank, size;
    hcomm_dtype_t dt;
    size_t es;         /* element size */
    size_t count;      /* the table's count: elements of the largest buffer */
    size_t bytes;      /* the table's size: count * es */
    void *send, *recv; /* capacity: cap bytes each */
    size_t cap;        /* bytes allocated per buffer */
    size_t *counts, *displs, *rcounts, *rdispls; /* per peer: v-collectives, all_to_all */
    bool inplace;
    void *extra; /* an op's own state (moe) */
} bench_case_t;

/* How an op runs: "auto"/a named algorithm go through hcomm; "raw" calls MPI directly; an
 * op may have its own variants (moe: "baseline"). */
struct bench_op {
    const char *name;
    /* collective name for hcomm_comm_set_algo ('|' between spellings to try), NULL: none */
    const char *coll;
    double (*busbw)(int p); /* nccl-tests factor */
    bool inplace_only, no_inplace, rooted, reduces, primitive;
    bool sum_avg_only, float_only; /* what -o and -d may be */
    const char *own_variant;       /* an extra row beside auto (moe: "baseline"), NULL: none */
    /* Sets count/bytes (rounding as the op needs) from the requested byte size. */
    void (*shape)(bench_case_t *c, size_t req_bytes);
    /* Bytes each of send and recv needs for count elements on p ranks. */
    size_t (*capacity)(const bench_case_t *c);
    void (*fill)(bench_case_t *c);
    hcomm_result_t (*run)(bench_case_t *c);
    long (*wrong)(const bench_case_t *c);
    /* Raw MPI form (NULL: none); returns HCOMM_ERR_UNSUPPORTED when dtype/op have no MPI
     * equivalent. */
    hcomm_result_t (*raw)(bench_case_t *c);
    hcomm_result_t (*variant)(bench_case_t *c);
    hcomm_result_t (*setup)(bench_case_t *c); /* once per size (moe), may be NULL */
    void (*teardown)(bench_case_t *c);
    /* Bytes a rank receives per call on average, where that differs from the size (moe: the
     * expanded rows); a line per size then gives them and the rate of each row. */
    size_t (*received)(const bench_case_t *c);
    /* A header line saying what the rows measure (NULL: none). */
    void (*describe)(const bench_case_t *c, char *line, size_t cap);
    /* A line per size after the rows, on rank 0 (moe: its permutation's bandwidth against
     * memcpy, its bound against auto's time, auto_s: 0 when not measured, and the collective
     * calls of one dispatch), NULL: none. */
    void (*note)(const bench_case_t *c, double auto_s, char *line, size_t cap);
};

const bench_op_t *bench_ops(int *n);
/* hcomm-bench zero ... (zero.c): argv[0] is "zero". Returns the exit status. */
int bench_zero_main(int argc, char **argv);
int bench_op_find(const char *name);

/* Element access in any dtype (values are small integers, exact in every dtype). */
double bench_get(hcomm_dtype_t dt, const void *buf, size_t i);
void bench_put(hcomm_dtype_t dt, void *buf, size_t i, double v);
/* A well-mixed integer in [0, range) for rank r's element g, with no period in g or r. */
unsigned bench_pattern(int r, size_t g, unsigned range);
bool bench_raw_supported(hcomm_dtype_t dt, hcomm_op_t op, bool reduces);

extern const char *const bench_op_names[HCOMM_OP_COUNT];

/* One measured row. */
typedef struct bench_record {
    const char *op, *algo, *chosen, *dtype, *redop; /* redop NULL: none */
    size_t bytes, count;
    int world;
    bool inplace, measured;
    double time_us, algbw, busbw;
    long wrong; /* -1: not checked */
    /* auto only (0: not measured): time over the best named algorithm's (named best), over
     * raw MPI's, over the op's own variant's */
    double regret, vs_raw, vs_variant;
    char best[24];
    const char *variant_name;
    double memcpy_gbs; /* memcpy with every rank copying at once, at this size */
} bench_record_t;

/* args.c: 0 run, 1 done (help/version), -1 bad (message printed). */
int bench_parse_args(int argc, char **argv, bench_opts_t *o);
/* The size after bytes: times -f, or plus -i. */
size_t bench_next_size(const bench_opts_t *o, size_t bytes);

/* calibrate.c: measures the link classes and writes the tuning file (--calibrate). */
hcomm_result_t bench_calibrate(hcomm_comm_t *w, const bench_opts_t *o);

/* report.c */
typedef struct bench_report bench_report_t;
bench_report_t *bench_report_open(const bench_opts_t *o);
void bench_report_add(bench_report_t *r, const bench_record_t *rec);
/* Writes the json/csv files and the plot (when write), frees r; 0 on success (messages
 * printed). */
int bench_report_close(bench_report_t *r, bool write);

#endif /* HCOMM_TOOLS_BENCH_BENCH_H_ */
