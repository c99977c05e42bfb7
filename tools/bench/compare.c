/* hcomm-bench --op compare: hcomm against the engine underneath, measured in the same run on
 * the same buffers, as ratios (timings on a shared machine are noisy; ratios from one run are
 * what can be compared).
 *   all_reduce 8 B      hcomm_all_reduce vs raw MPI_Allreduce (mpi) on MPI_COMM_WORLD
 *   p2p 8 B one way     hcomm_pp_send/recv ping-pong (half the round trip) vs MPI_Send/Recv
 *   send_recv 8 B       hcomm_pp_send_recv between ranks 0 and 1, both directions at once, vs
 *                       MPI_Sendrecv (one exchange per step)
 *   p2p 16 MiB          a rendezvous hcomm_pp_send between rank pairs (all pairs at once) vs
 *                       memcpy of the same size with every rank copying at once
 *   pp_send_recv N B    hcomm_pp_send/recv ping-pong vs the p2p layer's own send/recv under it
 *                       (PP's overhead), 8 B to 64 MiB or -b..-e, and raw MPI_Send/Recv on mpi
 * Each figure is the median over iterations (-n, or each row's own count) of the slowest rank's
 * time. */
#include "compare.h"

#include "bench.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(HCOMM_BENCH_MPI)
#include <mpi.h>
#endif

enum { LAT_ITERS = 20000, BW_ITERS = 10 };
#define BW_BYTES ((size_t)16 << 20)
#define COPY_BYTES (BW_BYTES * 4) /* room for the 64 MiB pp_send_recv row */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* The slowest rank's value of each sample. */
static hcomm_result_t slowest(hcomm_comm_t *w, double *t, int n) {
    return hcomm_all_reduce(w, t, t, (size_t)n, HCOMM_F64, HCOMM_MAX);
}

typedef hcomm_result_t (*step_fn)(hcomm_comm_t *w, void *ctx);

/* Median seconds of each of n steps over iters, after a warm-up. The steps run interleaved, one
 * of each per iteration with the first rotating, so the machine's drift (this field's timings
 * move by tens of percent between phases of a run) falls on all of them alike and their ratio
 * is fair. A NULL step is skipped and its median left at 0. */
static hcomm_result_t time_steps(hcomm_comm_t *w, const step_fn *steps, int n, void *ctx, int iters,
                                 double *med) {
    double *t = calloc((size_t)iters * (size_t)n, sizeof *t);
    hcomm_result_t r = t ? HCOMM_OK : HCOMM_ERR_NOMEM;
    for (int i = 0; r == HCOMM_OK && i < (iters / 10 + 1) * n; i++)
        r = steps[i % n] ? steps[i % n](w, ctx) : HCOMM_OK;
    if (r == HCOMM_OK)
        r = hcomm_barrier(w);
    for (int i = 0; r == HCOMM_OK && i < iters; i++)
        for (int k = 0; r == HCOMM_OK && k < n; k++) {
            int s = (i + k) % n;
            if (!steps[s])
                continue;
            double t0 = hcomm__bench_now();
            r = steps[s](w, ctx);
            t[(size_t)s * (size_t)iters + (size_t)i] = hcomm__bench_now() - t0;
        }
    if (r == HCOMM_OK)
        r = slowest(w, t, iters * n);
    for (int s = 0; r == HCOMM_OK && s < n; s++)
        med[s] = steps[s] ? median(t + (size_t)s * (size_t)iters, iters) : 0;
    free(t);
    return r;
}

typedef struct ctx {
    const bench_opts_t *o;
    const bench_opts_t *sizes; /* the pp_send_recv sizes from -b/-e/-f/-i; NULL: none given */
    int rank, size;
    double in, out;
    hcomm_tensor_t small, small_back, big, sized; /* small_back: send_recv's receive */
    size_t sized_bytes;                           /* sized: a u8 vector of this many bytes */
    void *copy_dst;
} ctx_t;

/* -n where given, else the row's own count. */
static int iters_of(const ctx_t *c, int own) {
    return c->o->iters_given ? c->o->iters : own;
}

static hcomm_result_t hcomm_ar(hcomm_comm_t *w, void *p) {
    ctx_t *c = p;
    return hcomm_all_reduce(w, &c->in, &c->out, 1, HCOMM_F64, HCOMM_SUM);
}

/* Rank 0 and 1 ping-pong; a step is one round trip. */
static hcomm_result_t hcomm_pingpong(hcomm_comm_t *w, void *p) {
    ctx_t *c = p;
    if (c->rank == 0) {
        hcomm_result_t r = hcomm_pp_send(w, &c->small, 1, 1);
        return r == HCOMM_OK ? hcomm_pp_recv(w, &c->small, 1, 1) : r;
    }
    if (c->rank == 1) {
        hcomm_result_t r = hcomm_pp_recv(w, &c->small, 0, 1);
        return r == HCOMM_OK ? hcomm_pp_send(w, &c->small, 0, 1) : r;
    }
    return HCOMM_OK;
}

/* Ranks 0 and 1 exchange 8 bytes, both directions at once. */
static hcomm_result_t hcomm_exchange(hcomm_comm_t *w, void *p) {
    ctx_t *c = p;
    if (c->rank > 1)
        return HCOMM_OK;
    int peer = 1 - c->rank;
    return hcomm_pp_send_recv(w, &c->small, peer, 3, &c->small_back, peer, 3);
}

/* Even ranks send BW_BYTES to the next odd rank, all pairs at once. */
static hcomm_result_t hcomm_stream(hcomm_comm_t *w, void *p) {
    ctx_t *c = p;
    if (c->rank % 2 == 0 && c->rank + 1 < c->size)
        return hcomm_pp_send(w, &c->big, c->rank + 1, 2);
    if (c->rank % 2 == 1)
        return hcomm_pp_recv(w, &c->big, c->rank - 1, 2);
    return HCOMM_OK;
}

/* Ping-pong of c->sized between ranks 0 and 1 through the p2p layer directly. */
static hcomm_result_t p2p_pingpong(hcomm_comm_t *w, void *p) {
    ctx_t *c = p;
    size_t n = c->sized_bytes;
    if (c->rank == 0) {
        hcomm_result_t r = hcomm__bench_send(w, 1, 1, c->sized.data, n);
        return r == HCOMM_OK ? hcomm__bench_recv(w, 1, 1, c->sized.data, n) : r;
    }
    if (c->rank == 1) {
        hcomm_result_t r = hcomm__bench_recv(w, 1, 0, c->sized.data, n);
        return r == HCOMM_OK ? hcomm__bench_send(w, 1, 0, c->sized.data, n) : r;
    }
    return HCOMM_OK;
}

static hcomm_result_t pp_pingpong(hcomm_comm_t *w, void *p) {
    ctx_t *c = p;
    if (c->rank == 0) {
        hcomm_result_t r = hcomm_pp_send(w, &c->sized, 1, 1);
        return r == HCOMM_OK ? hcomm_pp_recv(w, &c->sized, 1, 1) : r;
    }
    if (c->rank == 1) {
        hcomm_result_t r = hcomm_pp_recv(w, &c->sized, 0, 1);
        return r == HCOMM_OK ? hcomm_pp_send(w, &c->sized, 0, 1) : r;
    }
    return HCOMM_OK;
}

static hcomm_result_t memcpy_all(hcomm_comm_t *w, void *p) {
    ctx_t *c = p;
    (void)w;
    memcpy(c->copy_dst, c->big.data, BW_BYTES);
    return HCOMM_OK;
}

#if defined(HCOMM_BENCH_MPI)
static hcomm_result_t mpi_sized_pingpong(hcomm_comm_t *w, void *p) {
    ctx_t *c = p;
    (void)w;
    int n = (int)c->sized_bytes;
    if (c->rank == 0) {
        MPI_Send(c->sized.data, n, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
        MPI_Recv(c->sized.data, n, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (c->rank == 1) {
        MPI_Recv(c->sized.data, n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(c->sized.data, n, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
    }
    return HCOMM_OK;
}

static hcomm_result_t mpi_ar(hcomm_comm_t *w, void *p) {
    ctx_t *c = p;
    (void)w;
    return MPI_Allreduce(&c->in, &c->out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS
               ? HCOMM_OK
               : HCOMM_ERR_BACKEND;
}

static hcomm_result_t mpi_exchange(hcomm_comm_t *w, void *p) {
    ctx_t *c = p;
    (void)w;
    if (c->rank > 1)
        return HCOMM_OK;
    MPI_Sendrecv(c->small.data, 1, MPI_DOUBLE, 1 - c->rank, 3, c->small_back.data, 1, MPI_DOUBLE,
                 1 - c->rank, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return HCOMM_OK;
}

static hcomm_result_t mpi_pingpong(hcomm_comm_t *w, void *p) {
    ctx_t *c = p;
    (void)w;
    double *x = c->small.data;
    if (c->rank == 0) {
        MPI_Send(x, 1, MPI_DOUBLE, 1, 1, MPI_COMM_WORLD);
        MPI_Recv(x, 1, MPI_DOUBLE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (c->rank == 1) {
        MPI_Recv(x, 1, MPI_DOUBLE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(x, 1, MPI_DOUBLE, 0, 1, MPI_COMM_WORLD);
    }
    return HCOMM_OK;
}
#endif

static void line(int rank, const char *what, double hc, const char *ref_name, double ref,
                 const char *unit, double scale) {
    if (rank != 0)
        return;
    if (ref > 0)
        printf("%-28s hcomm %10.3f %s   %-22s %10.3f %s   ratio %.2f\n", what, hc * scale, unit,
               ref_name, ref * scale, unit, hc / ref);
    else
        printf("%-28s hcomm %10.3f %s\n", what, hc * scale, unit);
}

static bool is_mpi(hcomm_comm_t *w) {
    const char *name = "";
    hcomm_comm_backend(w, &name);
    return strcmp(name, "mpi") == 0;
}

#if defined(HCOMM_BENCH_MPI)
#define RAW_STEP(w, f) (is_mpi(w) ? (f) : (step_fn)0)
#else
#define RAW_STEP(w, f) ((step_fn)0)
#endif

static hcomm_result_t latency_rows(hcomm_comm_t *w, ctx_t *c) {
    double t[2] = {0, 0};
    const step_fn ar[2] = {hcomm_ar, RAW_STEP(w, mpi_ar)};
    hcomm_result_t r = time_steps(w, ar, 2, c, iters_of(c, LAT_ITERS), t);
    if (r != HCOMM_OK)
        return r;
    line(c->rank, "all_reduce 8 B", t[0], "MPI_Allreduce", t[1], "us", 1e6);
    if (c->size < 2)
        return HCOMM_OK;
    const step_fn pingpong[2] = {hcomm_pingpong, RAW_STEP(w, mpi_pingpong)};
    r = time_steps(w, pingpong, 2, c, iters_of(c, LAT_ITERS), t);
    if (r == HCOMM_OK)
        line(c->rank, "p2p 8 B one way", t[0] / 2, "MPI_Send/Recv", t[1] / 2, "us", 1e6);
    const step_fn exchange[2] = {hcomm_exchange, RAW_STEP(w, mpi_exchange)};
    if (r == HCOMM_OK)
        r = time_steps(w, exchange, 2, c, iters_of(c, LAT_ITERS), t);
    if (r == HCOMM_OK)
        line(c->rank, "send_recv 8 B", t[0], "MPI_Sendrecv", t[1], "us", 1e6);
    return r;
}

static hcomm_result_t bandwidth_rows(hcomm_comm_t *w, ctx_t *c) {
    if (c->size < 2)
        return HCOMM_OK;
    double t[2];
    const step_fn steps[2] = {hcomm_stream, memcpy_all};
    hcomm_result_t r = time_steps(w, steps, 2, c, iters_of(c, BW_ITERS), t);
    if (r != HCOMM_OK)
        return r;
    /* As bandwidths the ratio inverts: hcomm's share of what memcpy moves. */
    if (c->rank == 0)
        printf("%-28s hcomm %10.3f GB/s   %-22s %10.3f GB/s   share %.2f\n", "p2p 16 MiB (pairs)",
               (double)BW_BYTES / t[0] / 1e9, "memcpy (all ranks)", (double)BW_BYTES / t[1] / 1e9,
               t[1] / t[0]);
    return HCOMM_OK;
}

/* The pp_send_recv sizes: each of -b, -e and -f/-i where given, else 8 B, 64 MiB and x8. */
static bench_opts_t sizes_of(const bench_opts_t *o) {
    bench_opts_t s = *o;
    s.min_bytes = o->min_given ? o->min_bytes : 8;
    s.max_bytes = o->max_given ? o->max_bytes : (size_t)64 << 20;
    if (!o->step_given) {
        s.step_bytes = 0;
        s.factor = 8;
    }
    return s;
}

/* One-way time of a ping-pong of bytes: PP, the p2p layer under it, raw MPI on mpi. */
static hcomm_result_t pp_row(hcomm_comm_t *w, ctx_t *c, size_t bytes) {
    int64_t n = (int64_t)bytes;
    hcomm_tensor_init(&c->sized, c->copy_dst, HCOMM_U8, 1, &n);
    c->sized_bytes = bytes;
    int iters = iters_of(c, bytes >= (1u << 20) ? 20 : bytes >= 65536 ? 200 : 2000);
    double t[3];
    /* MPI_Send counts in int */
    const step_fn steps[3] = {pp_pingpong, p2p_pingpong,
                              bytes <= INT_MAX ? RAW_STEP(w, mpi_sized_pingpong) : (step_fn)0};
    hcomm_result_t r = time_steps(w, steps, 3, c, iters, t);
    double pp = t[0], raw = t[1], mpi = t[2];
    if (r != HCOMM_OK || c->rank != 0)
        return r;
    printf("%12zu %12.3f %12.3f %8.3f %+9.1f%%", bytes, pp / 2 * 1e6, raw / 2 * 1e6,
           (double)bytes / (pp / 2) / 1e9, 100.0 * (pp - raw) / raw);
    if (mpi > 0)
        printf(" %12.3f %8.2f", mpi / 2 * 1e6, pp / mpi);
    printf("\n");
    return HCOMM_OK;
}

static hcomm_result_t pp_rows(hcomm_comm_t *w, ctx_t *c) {
    if (c->size < 2)
        return HCOMM_OK;
    if (c->rank == 0)
        printf("#\n# pp_send_recv (rank 0 <-> 1 ping-pong, one-way time)\n#%11s %12s %12s %8s "
               "%10s %12s %8s\n",
               "size(B)", "pp(us)", "p2p(us)", "GB/s", "pp-p2p", "MPI(us)", "pp/MPI");
    hcomm_result_t r = HCOMM_OK;
    if (c->sizes) {
        for (size_t b = c->sizes->min_bytes; r == HCOMM_OK && b <= c->sizes->max_bytes;
             b = bench_next_size(c->sizes, b))
            r = pp_row(w, c, b);
        return r;
    }
    static const size_t sizes[] = {8, 64, 512, 4096, 65536, 262144, 2 << 20, 16 << 20, 64 << 20};
    for (size_t i = 0; r == HCOMM_OK && i < sizeof sizes / sizeof *sizes; i++)
        r = pp_row(w, c, sizes[i]);
    return r;
}

hcomm_result_t hcomm_bench_compare(hcomm_comm_t *w, const bench_opts_t *o) {
    bench_opts_t s = sizes_of(o);
    ctx_t c = {.o = o, .in = 1.0};
    if (o->min_given || o->max_given || o->step_given)
        c.sizes = &s;
    if (c.sizes && s.min_bytes > s.max_bytes) {
        char text[96];
        snprintf(text, sizeof text, "-b %zu is larger than -e %zu", s.min_bytes, s.max_bytes);
        return hcomm__bench_err(HCOMM_ERR_INVALID_ARG, "hcomm-bench compare", text);
    }
    /* the pp_send_recv rows ping-pong in copy_dst */
    size_t copy_bytes = c.sizes && s.max_bytes > COPY_BYTES ? s.max_bytes : COPY_BYTES;
    hcomm_comm_rank(w, &c.rank);
    hcomm_comm_size(w, &c.size);
    double x = 0, back = 0;
    int64_t one = 1, big = (int64_t)(BW_BYTES / sizeof(float));
    hcomm_tensor_init(&c.small, &x, HCOMM_F64, 1, &one);
    hcomm_tensor_init(&c.small_back, &back, HCOMM_F64, 1, &one);
    void *src = malloc(BW_BYTES);
    c.copy_dst = malloc(copy_bytes);
    if (!src || !c.copy_dst) {
        free(src);
        free(c.copy_dst);
        return HCOMM_ERR_NOMEM;
    }
    memset(src, 1, BW_BYTES);
    memset(c.copy_dst, 2, copy_bytes);
    hcomm_tensor_init(&c.big, src, HCOMM_F32, 1, &big);
    if (c.rank == 0)
        printf("#\n# compare, %d ranks, backend %s: median of the slowest rank per iteration\n",
               c.size, is_mpi(w) ? "mpi" : "local");
    hcomm_result_t r = latency_rows(w, &c);
    if (r == HCOMM_OK)
        r = bandwidth_rows(w, &c);
    if (r == HCOMM_OK)
        r = pp_rows(w, &c);
    free(src);
    free(c.copy_dst);
    return r;
}
