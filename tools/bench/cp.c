/* The context-parallel exchanges hcomm-bench measures: cp_ring (one forward step of ring
 * attention's KV ring, hcomm_cp_ring_step) and cp_a2a (Ulysses' sequence-to-head all-to-all).
 * Beside the table each size reports how much of the exchange a compute of the exchange's own
 * length hides: the exchange is started, the caller sleeps that long (the simulated attention
 * of one block), then waits; the wait's remainder is the exposed time. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

enum { PROBE_WARMUP = 3, PROBE_REPS = 21, A2A_DIM = 64 };

typedef struct cp_bench {
    hcomm_cp_ring_t *ring;
    hcomm_tensor_t in, out, got; /* ring: in = the chunk, got = the received one */
    int64_t seq, heads;          /* cp_a2a: a rank's rows and heads */
    double exch_us, compute_us, exposed_us;
} cp_bench_t;

static double val(int r, size_t g) {
    return (double)bench_pattern(r, g, 61);
}

static void shape_elems(bench_case_t *c, size_t req) {
    c->count = req / c->es > 0 || req == 0 ? req / c->es : 1;
    c->bytes = c->count * c->es;
}

/* cp_a2a: [1, S/P, 2P, 64] per rank, S/P whole rows (at least one). */
static void shape_a2a(bench_case_t *c, size_t req) {
    size_t row = (size_t)(2 * c->size * A2A_DIM), rows = req / c->es / row;
    c->count = (rows ? rows : 1) * row;
    c->bytes = c->count * c->es;
}

static size_t cap_bytes(const bench_case_t *c) {
    return c->bytes;
}

static void fill_cp(bench_case_t *c) {
    for (size_t i = 0; i < c->count; i++) {
        bench_put(c->dt, c->send, i, val(c->rank, i));
        bench_put(c->dt, c->recv, i, 120.0);
    }
}

/* --- the two exchanges, blocking (the table) and started (the probe) --- */

static hcomm_result_t ring_run(bench_case_t *c) {
    cp_bench_t *b = c->extra;
    return hcomm_cp_ring_step(b->ring, &b->in, &b->got);
}

static long ring_wrong(const bench_case_t *c) {
    const cp_bench_t *b = c->extra;
    int prev = (c->rank + c->size - 1) % c->size;
    long w = 0;
    for (size_t i = 0; b->got.data && i < c->count; i++)
        w += bench_get(c->dt, b->got.data, i) != val(prev, i);
    return b->got.data ? w : (long)c->count;
}

static hcomm_result_t a2a_run(bench_case_t *c) {
    cp_bench_t *b = c->extra;
    return hcomm_cp_a2a_seq_to_head(c->w, &b->in, &b->out, 1, 2);
}

/* out [1, S, 2, 64]: row s, head h of this rank = rank s / (S/P)'s row s % (S/P), head
 * 2 * rank + h. */
static long a2a_wrong(const bench_case_t *c) {
    const cp_bench_t *b = c->extra;
    size_t rows = (size_t)b->seq, H = (size_t)b->heads, hl = 2, w = 0;
    for (size_t s = 0; s < rows * (size_t)c->size; s++)
        for (size_t h = 0; h < hl; h++)
            for (size_t d = 0; d < A2A_DIM; d++) {
                size_t src = s / rows,
                       i = ((s % rows) * H + (size_t)c->rank * hl + h) * A2A_DIM + d;
                size_t o = (s * hl + h) * A2A_DIM + d;
                w += bench_get(c->dt, b->out.data, o) != val((int)src, i);
            }
    return (long)w;
}

typedef hcomm_result_t (*start_fn)(bench_case_t *c, hcomm_request_t **q);

static hcomm_result_t ring_start(bench_case_t *c, hcomm_request_t **q) {
    *q = NULL;
    return hcomm_cp_ring_start(((cp_bench_t *)c->extra)->ring, &((cp_bench_t *)c->extra)->in);
}

static hcomm_result_t ring_finish(bench_case_t *c, hcomm_request_t *q) {
    (void)q;
    cp_bench_t *b = c->extra;
    return hcomm_cp_ring_wait(b->ring, &b->got);
}

static hcomm_result_t a2a_start(bench_case_t *c, hcomm_request_t **q) {
    cp_bench_t *b = c->extra;
    return hcomm_cp_ia2a_seq_to_head(c->w, &b->in, &b->out, 1, 2, q);
}

static hcomm_result_t a2a_finish(bench_case_t *c, hcomm_request_t *q) {
    (void)c;
    return hcomm_wait(q);
}

/* --- the overlap probe --- */

/* Sleeps sec, the last stretch in sched_yield calls: nanosleep alone overshoots by tens of
 * microseconds, which would lengthen the simulated compute and hide more than it should. */
static void sleep_for(double sec) {
    double end = hcomm__bench_now() + sec;
    for (double rem = sec; rem > 0; rem = end - hcomm__bench_now()) {
        if (rem < 150e-6) {
            sched_yield();
            continue;
        }
        double nap = rem - 100e-6;
        struct timespec ts = {.tv_sec = (time_t)nap,
                              .tv_nsec = (long)((nap - (double)(time_t)nap) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

/* Median exchange alone, then median exposed remainder after a sleep of that length; every
 * rank starts each repetition together (a barrier). */
static hcomm_result_t probe(bench_case_t *c, bool ring) {
    cp_bench_t *b = c->extra;
    start_fn start = ring ? ring_start : a2a_start;
    hcomm_result_t (*finish)(bench_case_t *, hcomm_request_t *) = ring ? ring_finish : a2a_finish;
    double ex[PROBE_REPS], comp[PROBE_REPS], exposed[PROBE_REPS];
    hcomm_request_t *q = NULL;
    for (int i = -PROBE_WARMUP; i < PROBE_REPS; i++) {
        BENCH_TRY(hcomm_barrier(c->w));
        double t0 = hcomm__bench_now();
        BENCH_TRY(start(c, &q));
        BENCH_TRY(finish(c, q));
        if (i >= 0)
            ex[i] = hcomm__bench_now() - t0;
    }
    b->exch_us = median_of(ex, PROBE_REPS) * 1e6;
    for (int i = -PROBE_WARMUP; i < PROBE_REPS; i++) {
        BENCH_TRY(hcomm_barrier(c->w));
        double t0 = hcomm__bench_now();
        BENCH_TRY(start(c, &q));
        sleep_for(b->exch_us * 1e-6);
        double t1 = hcomm__bench_now();
        BENCH_TRY(finish(c, q));
        if (i >= 0) {
            comp[i] = t1 - t0;
            exposed[i] = hcomm__bench_now() - t1;
        }
    }
    b->compute_us = median_of(comp, PROBE_REPS) * 1e6;
    b->exposed_us = median_of(exposed, PROBE_REPS) * 1e6;
    return HCOMM_OK;
}

/* --- per size: the handle or tensors, then the probe --- */

static hcomm_result_t setup_common(bench_case_t *c, cp_bench_t **out) {
#if defined(__linux__)
    prctl(PR_SET_TIMERSLACK, 1000UL); /* the simulated compute sleeps close to its length */
#endif
    cp_bench_t *b = calloc(1, sizeof *b);
    c->extra = b;
    *out = b;
    if (!b)
        return HCOMM_ERR_NOMEM;
    fill_cp(c);
    return HCOMM_OK;
}

static hcomm_result_t ring_setup(bench_case_t *c) {
    cp_bench_t *b = NULL;
    hcomm_result_t mine = setup_common(c, &b);
    const int64_t n = (int64_t)c->count;
    if (mine == HCOMM_OK)
        mine = hcomm_tensor_init(&b->in, c->send, c->dt, 1, &n);
    /* every rank joins the ring's creation, so a rank that failed fails it for all */
    BENCH_TRY(hcomm_cp_ring_create(c->w, mine == HCOMM_OK ? &b->in : NULL, HCOMM_CP_RING_FORWARD,
                                   mine == HCOMM_OK ? &b->ring : NULL));
    return probe(c, true);
}

static hcomm_result_t a2a_setup(bench_case_t *c) {
    cp_bench_t *b = NULL;
    BENCH_TRY(setup_common(c, &b));
    b->heads = 2 * c->size;
    b->seq = (int64_t)(c->count / ((size_t)b->heads * A2A_DIM));
    const int64_t in[4] = {1, b->seq, b->heads, A2A_DIM},
                  out[4] = {1, b->seq * c->size, 2, A2A_DIM};
    BENCH_TRY(hcomm_tensor_init(&b->in, c->send, c->dt, 4, in));
    BENCH_TRY(hcomm_tensor_init(&b->out, c->recv, c->dt, 4, out));
    return probe(c, false);
}

static void cp_teardown(bench_case_t *c) {
    cp_bench_t *b = c->extra;
    if (b)
        hcomm_cp_ring_destroy(b->ring);
    free(b);
    c->extra = NULL;
}

static void cp_note(const bench_case_t *c, double auto_s, char *line, size_t cap) {
    (void)auto_s;
    const cp_bench_t *b = c->extra;
    if (!b || !(b->exch_us > 0)) {
        snprintf(line, cap, "overlap not measured");
        return;
    }
    snprintf(line, cap,
             "overlap: exchange %.1f us alone; started, then a compute of %.1f us (a sleep of the "
             "exchange's length), then the wait: %.1f us exposed = %.1f%% of the exchange",
             b->exch_us, b->compute_us, b->exposed_us, 100 * b->exposed_us / b->exch_us);
}

static void ring_describe(const bench_case_t *c, char *line, size_t cap) {
    snprintf(line, cap,
             "one ring-attention step per iteration: each rank's chunk of size bytes to rank + 1, "
             "rank - 1's into the ring's second buffer (hcomm_cp_ring_step, cp = %d)",
             c->size);
}

static void a2a_describe(const bench_case_t *c, char *line, size_t cap) {
    snprintf(line, cap,
             "Ulysses sequence-to-head all-to-all per iteration: [1, S/P, %d, %d] -> [1, S, 2, %d] "
             "(hcomm_cp_a2a_seq_to_head, P = %d)",
             2 * c->size, A2A_DIM, A2A_DIM, c->size);
}

static double f_ring(int p) {
    return p > 1 ? 1.0 : 0.0;
}

static double f_a2a(int p) {
    return (double)(p - 1) / p;
}

const bench_op_t bench_cp_ring_op = {.name = "cp_ring",
                                     .busbw = f_ring,
                                     .no_inplace = true,
                                     .primitive = true,
                                     .shape = shape_elems,
                                     .capacity = cap_bytes,
                                     .fill = fill_cp,
                                     .run = ring_run,
                                     .wrong = ring_wrong,
                                     .setup = ring_setup,
                                     .teardown = cp_teardown,
                                     .describe = ring_describe,
                                     .note = cp_note};

const bench_op_t bench_cp_a2a_op = {.name = "cp_a2a",
                                    .busbw = f_a2a,
                                    .no_inplace = true,
                                    .primitive = true,
                                    .shape = shape_a2a,
                                    .capacity = cap_bytes,
                                    .fill = fill_cp,
                                    .run = a2a_run,
                                    .wrong = a2a_wrong,
                                    .setup = a2a_setup,
                                    .teardown = cp_teardown,
                                    .describe = a2a_describe,
                                    .note = cp_note};
