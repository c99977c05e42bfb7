/* hcomm-bench zero: the shard plan's collectives (hcomm/zero.h) on one plan of a given total
 * size and bucket size over every rank, against a plain all_reduce of the same bytes in the
 * same run: all_gather_params and reduce_scatter_grads per bucket (time and busbw), ZeRO-1/2's
 * step (one reduce_scatter + one all_gather) and ZeRO-3's (two gathers + one reduce_scatter)
 * as ratios of that all_reduce, and the same step issued nonblocking (every bucket at once,
 * then one wait), as an overlapped backward issues it, and the plain reduce_scatter +
 * all_gather of the whole buffer (what the plan's buckets cost beyond them). Bytes moved by the
 * reduction are the reduction dtype's. Times are the slowest rank's, medians over the iterations,
 * each iteration timing every row once in turn.
 *
 *   hcomm-bench zero [-t RANKS] [--backend B] [--size BYTES] [--bucket BYTES]
 *                    [--dtype f32|bf16|f64] [--reduce-dtype f32|f64|param] [-n ITERS]
 */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

typedef struct zopts {
    const char *backend;
    int ranks, iters;
    size_t size, bucket;
    hcomm_dtype_t dt;
    int rd;
} zopts_t;

static int zero_usage(FILE *f) {
    fputs("usage: hcomm-bench zero [-t RANKS] [--backend local|mpi] [--size BYTES] "
          "[--bucket BYTES]\n"
          "                        [--dtype f32|bf16|f64] [--reduce-dtype f32|f64|param] "
          "[-n ITERS]\n"
          "  a shard plan of --size bytes of parameters (default 64 MiB) in buckets of --bucket\n"
          "  bytes (default 4 MiB) over every rank; times against hcomm_all_reduce of the same\n"
          "  bytes; -t ranks on the local backend (default 4); -n iterations (default 10)\n",
          f);
    return f == stdout ? 0 : 2;
}

static bool zero_dtype(const char *s, int *out, bool param_ok) {
    const char *const names[] = {"f32", "f64", "bf16", "f16"};
    const hcomm_dtype_t dts[] = {HCOMM_F32, HCOMM_F64, HCOMM_BF16, HCOMM_F16};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (int)dts[i];
            return true;
        }
    if (param_ok && strcmp(s, "param") == 0) {
        *out = HCOMM_ZERO_PARAM_DTYPE;
        return true;
    }
    return false;
}

static bool zero_size(const char *s, size_t *out) {
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned long long mul = *end == 'K' ? 1ull << 10 : *end == 'M' ? 1ull << 20 : 1;
    if (end == s || v == 0 || (mul > 1 && end[1] != '\0') || (mul == 1 && *end != '\0'))
        return false;
    *out = (size_t)(v * mul);
    return true;
}

static int zero_parse(int argc, char **argv, zopts_t *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
            return zero_usage(stdout) - 1;
        int dt = 0;
        bool ok = v != NULL;
        if (ok && (strcmp(a, "-t") == 0 || strcmp(a, "--ranks") == 0))
            ok = (o->ranks = atoi(v)) >= 1;
        else if (ok && strcmp(a, "-n") == 0)
            ok = (o->iters = atoi(v)) >= 1;
        else if (ok && strcmp(a, "--backend") == 0)
            o->backend = v;
        else if (ok && strcmp(a, "--size") == 0)
            ok = zero_size(v, &o->size);
        else if (ok && strcmp(a, "--bucket") == 0)
            ok = zero_size(v, &o->bucket);
        else if (ok && strcmp(a, "--dtype") == 0)
            ok = zero_dtype(v, &dt, false) && (o->dt = (hcomm_dtype_t)dt, true);
        else if (ok && strcmp(a, "--reduce-dtype") == 0)
            ok = zero_dtype(v, &o->rd, true);
        else
            ok = false;
        if (!ok) {
            fprintf(stderr, "hcomm-bench zero: bad or unknown option %s %s\n", a, v ? v : "");
            return zero_usage(stderr);
        }
        i++;
    }
    return 0;
}

/* The slowest rank's seconds for one call of fn, every rank starting together. */
typedef hcomm_result_t (*zstep_fn)(hcomm_comm_t *w, hcomm_zero_plan_t *p, void *buf, size_t n,
                                   hcomm_dtype_t dt);

static hcomm_result_t z_ar(hcomm_comm_t *w, hcomm_zero_plan_t *p, void *buf, size_t n,
                           hcomm_dtype_t dt) {
    (void)p;
    return hcomm_all_reduce(w, buf, buf, n, dt, HCOMM_SUM);
}

/* The plain collectives under ZeRO-1/2's step, one call each over the whole buffer: what the
 * plan's bucketed step costs beyond them. buf holds n elements, then the shard. */
static hcomm_result_t z_plain(hcomm_comm_t *w, hcomm_zero_plan_t *p, void *buf, size_t n,
                              hcomm_dtype_t dt) {
    (void)p;
    int size = 1;
    size_t es = 0;
    BENCH_TRY(hcomm_comm_size(w, &size));
    BENCH_TRY(hcomm_dtype_size(dt, &es));
    size_t shard = n / (size_t)size;
    char *mine = (char *)buf + n * es;
    BENCH_TRY(hcomm_reduce_scatter(w, buf, mine, shard, dt, HCOMM_SUM));
    return hcomm_all_gather(w, mine, buf, shard * es);
}

static hcomm_result_t z_ag(hcomm_comm_t *w, hcomm_zero_plan_t *p, void *buf, size_t n,
                           hcomm_dtype_t dt) {
    (void)w, (void)buf, (void)n, (void)dt;
    BENCH_TRY(hcomm_zero_all_gather_params(p, HCOMM_ZERO_ALL, NULL, 0));
    return hcomm_zero_release(p, HCOMM_ZERO_ALL);
}

static hcomm_result_t z_rs(hcomm_comm_t *w, hcomm_zero_plan_t *p, void *buf, size_t n,
                           hcomm_dtype_t dt) {
    (void)w, (void)buf, (void)n, (void)dt;
    return hcomm_zero_reduce_scatter_grads(p, HCOMM_ZERO_ALL);
}

static hcomm_result_t z_step12(hcomm_comm_t *w, hcomm_zero_plan_t *p, void *buf, size_t n,
                               hcomm_dtype_t dt) {
    BENCH_TRY(z_rs(w, p, buf, n, dt));
    return z_ag(w, p, buf, n, dt);
}

/* ZeRO-3's step as a forward and a backward issue it: each bucket gathered just in time with
 * the next one prefetched and released after its use, the backward's gathers in reverse with
 * each bucket's reduce_scatter issued after it; one wait at the end. */
static hcomm_result_t z_step3(hcomm_comm_t *w, hcomm_zero_plan_t *p, void *buf, size_t n,
                              hcomm_dtype_t dt) {
    (void)w, (void)buf, (void)n, (void)dt;
    int nb = 0;
    BENCH_TRY(hcomm_zero_num_buckets(p, &nb));
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < nb; j++) {
            int k = pass == 0 ? j : nb - 1 - j, next = pass == 0 ? k + 1 : k - 1;
            BENCH_TRY(hcomm_zero_all_gather_params(p, k, NULL, 0));
            if (next >= 0 && next < nb)
                BENCH_TRY(hcomm_zero_iall_gather_params(p, next, NULL, 0));
            if (pass == 1)
                BENCH_TRY(hcomm_zero_ireduce_scatter_grads(p, k));
            BENCH_TRY(hcomm_zero_release(p, k));
        }
    return hcomm_zero_wait(p, HCOMM_ZERO_ALL, NULL);
}

/* ZeRO-1/2's step issued as an overlapped backward does: every bucket's reduce_scatter at
 * once, one wait, then every gather at once and one wait. */
static hcomm_result_t z_step12_nb(hcomm_comm_t *w, hcomm_zero_plan_t *p, void *buf, size_t n,
                                  hcomm_dtype_t dt) {
    (void)w, (void)buf, (void)n, (void)dt;
    int nb = 0;
    BENCH_TRY(hcomm_zero_num_buckets(p, &nb));
    for (int k = nb - 1; k >= 0; k--)
        BENCH_TRY(hcomm_zero_ireduce_scatter_grads(p, k));
    BENCH_TRY(hcomm_zero_wait(p, HCOMM_ZERO_ALL, NULL));
    BENCH_TRY(hcomm_zero_iall_gather_params(p, HCOMM_ZERO_ALL, NULL, 0));
    BENCH_TRY(hcomm_zero_wait(p, HCOMM_ZERO_ALL, NULL));
    return hcomm_zero_release(p, HCOMM_ZERO_ALL);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The backward pass's part, not timed: every gradient written (its pages touched). */
static hcomm_result_t zero_write_grads(hcomm_zero_plan_t *p, size_t per) {
    for (int i = 0;; i++) {
        if (hcomm_zero_locate(p, i, NULL, NULL) != HCOMM_OK)
            return HCOMM_OK; /* past the last parameter */
        void *g = NULL;
        BENCH_TRY(hcomm_zero_grad(p, i, &g));
        if (g)
            memset(g, 0, per);
    }
}

/* One timed call of fn: the slowest rank's seconds, every rank starting together. */
static hcomm_result_t zero_time_one(hcomm_comm_t *w, hcomm_zero_plan_t *p, void *buf, size_t n,
                                    hcomm_dtype_t dt, zstep_fn fn, size_t per, double *d) {
    hcomm_result_t r =
        fn != z_ar && fn != z_ag && fn != z_plain ? zero_write_grads(p, per) : HCOMM_OK;
    r = r == HCOMM_OK ? hcomm_barrier(w) : r;
    double t0 = hcomm__bench_now();
    r = r == HCOMM_OK ? fn(w, p, buf, n, dt) : r;
    *d = hcomm__bench_now() - t0;
    return r == HCOMM_OK ? hcomm_all_reduce(w, d, d, 1, HCOMM_F64, HCOMM_MAX) : r;
}

/* The median of each step over iters rounds; each round times every step once, in turn, so
 * that a machine whose speed drifts (other jobs on its cores) slows all of them alike and
 * their ratios hold. Two untimed rounds first. */
static hcomm_result_t zero_time(hcomm_comm_t *w, hcomm_zero_plan_t *const *plans, void *buf,
                                size_t n, hcomm_dtype_t dt, const zstep_fn *fns, int nfn, int iters,
                                size_t per, double *med) {
    double *t = calloc((size_t)nfn * (size_t)iters, sizeof *t);
    hcomm_result_t r = t ? HCOMM_OK : HCOMM_ERR_NOMEM;
    for (int i = -2; i < iters && r == HCOMM_OK; i++)
        for (int k = 0; k < nfn && r == HCOMM_OK; k++) {
            double d = 0;
            r = zero_time_one(w, plans[k], buf, n, dt, fns[k], per, &d);
            if (i >= 0)
                t[(size_t)k * (size_t)iters + (size_t)i] = d;
        }
    for (int k = 0; k < nfn && r == HCOMM_OK; k++) {
        double *tk = t + (size_t)k * (size_t)iters;
        qsort(tk, (size_t)iters, sizeof *tk, cmp_double);
        med[k] = tk[iters / 2];
    }
    free(t);
    return r;
}

/* The plan: parameters of 1 MiB (or --size, if smaller) each, filled with small integers. */
static hcomm_result_t zero_plan(hcomm_comm_t *w, const zopts_t *o, int stage,
                                hcomm_zero_plan_t **p) {
    size_t es = 0;
    BENCH_TRY(hcomm_dtype_size(o->dt, &es));
    size_t per = o->size < (1u << 20) ? o->size : 1u << 20, n = o->size / per;
    int64_t len = (int64_t)(per / es);
    char *data = calloc(per, 1);
    hcomm_tensor_t *t = calloc(n, sizeof *t);
    hcomm_result_t r = data && t ? HCOMM_OK : HCOMM_ERR_NOMEM;
    for (size_t i = 0; r == HCOMM_OK && i < n; i++)
        r = hcomm_tensor_init(&t[i], data, o->dt, 1, &len);
    /* ZeRO-3's plan keeps every released buffer: its gradients, written for every bucket
     * before each step (as the all_reduce is given them), are as many as the buckets. */
    int spares = stage < 3 ? 4 : HCOMM_ZERO_SPARES_MAX;
    hcomm_zero_config_t c = {stage, o->bucket, HCOMM_SUM, o->rd, 0, spares};
    if (r == HCOMM_OK)
        r = hcomm_zero_create(w, NULL, t, (int)n, &c, p);
    for (size_t i = 0; r == HCOMM_OK && i < n; i++) { /* gradients to reduce */
        void *g = NULL;
        r = hcomm_zero_grad(*p, (int)i, &g);
        if (r == HCOMM_OK && g)
            memset(g, 0, per);
    }
    free(t);
    free(data);
    return r;
}

/* Per-bucket busbw of a gather or reduce_scatter moving bytes (the whole bucket) per call. */
static double zero_busbw(double s, size_t bytes, int nb, int p) {
    return s > 0 ? (double)bytes * (p - 1) / p / (s / nb) / 1e9 : 0.0;
}

static hcomm_result_t zero_rank(hcomm_comm_t *w, void *arg) {
    const zopts_t *o = arg;
    int rank = 0, p = 1, nb = 0;
    BENCH_TRY(hcomm_comm_rank(w, &rank));
    BENCH_TRY(hcomm_comm_size(w, &p));
    /* ZeRO-1's plan keeps its gathered parameters and gradients; ZeRO-3's frees them. */
    hcomm_zero_plan_t *plan = NULL, *plan3 = NULL;
    BENCH_TRY(zero_plan(w, o, 1, &plan));
    BENCH_TRY(zero_plan(w, o, 3, &plan3));
    BENCH_TRY(hcomm_zero_num_buckets(plan, &nb));
    size_t es = 0, bucket_bytes = 0, rs = 0;
    hcomm_dtype_size(o->dt, &es);
    hcomm_dtype_size(o->rd == HCOMM_ZERO_PARAM_DTYPE ? o->dt : (hcomm_dtype_t)o->rd, &rs);
    BENCH_TRY(hcomm_zero_locate(plan, 0, NULL, &bucket_bytes));
    size_t n = o->size / es;
    void *buf = calloc(n + n / (size_t)p + 1, es);
    if (!buf)
        return HCOMM_ERR_NOMEM;
    const zstep_fn fns[] = {z_ar, z_ag, z_rs, z_step12, z_step3, z_step12_nb, z_plain};
    hcomm_zero_plan_t *const plans[] = {plan, plan, plan, plan, plan3, plan, plan};
    double t[7] = {0};
    hcomm_result_t r = zero_time(w, plans, buf, n, o->dt, fns, 7, o->iters,
                                 o->size < (1u << 20) ? o->size : 1u << 20, t);
    free(buf);
    hcomm_zero_destroy(&plan);
    hcomm_zero_destroy(&plan3);
    if (r != HCOMM_OK || rank != 0)
        return r;
    const char *dn = "", *rn = "";
    hcomm_dtype_name(o->dt, &dn);
    hcomm_dtype_name(o->rd == HCOMM_ZERO_PARAM_DTYPE ? o->dt : (hcomm_dtype_t)o->rd, &rn);
    printf("hcomm-bench zero: %d ranks, plan of %zu bytes of %s in %d buckets of %zu bytes, "
           "reduced in %s, median of %d\n",
           p, o->size, dn, nb, bucket_bytes, rn, o->iters);
    printf("  all_reduce of the same bytes     %10.3f ms\n", 1e3 * t[0]);
    printf("  all_gather_params (all buckets)  %10.3f ms   busbw per bucket %7.2f GB/s\n",
           1e3 * t[1], zero_busbw(t[1], bucket_bytes, nb, p));
    printf("  reduce_scatter_grads (all)       %10.3f ms   busbw per bucket %7.2f GB/s\n",
           1e3 * t[2], zero_busbw(t[2], bucket_bytes / es * rs, nb, p));
    printf("  ZeRO-1/2 step (rs + ag)          %10.3f ms   %.2fx the all_reduce\n", 1e3 * t[3],
           t[0] > 0 ? t[3] / t[0] : 0.0);
    printf("  ZeRO-3 step (ag, ag + rs/bucket) %10.3f ms   %.2fx the all_reduce\n", 1e3 * t[4],
           t[0] > 0 ? t[4] / t[0] : 0.0);
    printf("  ZeRO-1/2 step, nonblocking       %10.3f ms   %.2fx the all_reduce\n", 1e3 * t[5],
           t[0] > 0 ? t[5] / t[0] : 0.0);
    printf("  plain reduce_scatter + all_gather %9.3f ms   %.2fx the all_reduce (no plan, one "
           "call each)\n",
           1e3 * t[6], t[0] > 0 ? t[6] / t[0] : 0.0);
    fflush(stdout);
    return HCOMM_OK;
}

int bench_zero_main(int argc, char **argv) {
    zopts_t o = {NULL, 4, 10, 64u << 20, 4u << 20, HCOMM_F32, HCOMM_ZERO_PARAM_DTYPE};
    int rc = zero_parse(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    const char *b = NULL;
    hcomm_result_t r = hcomm_launch_backend(o.backend, &b);
    if (r == HCOMM_OK)
        r = hcomm_launch(b, strcmp(b, "local") == 0 ? o.ranks : 0, zero_rank, &o);
    if (r != HCOMM_OK)
        fprintf(stderr, "hcomm-bench zero: %s\n", hcomm_last_error());
    return r == HCOMM_OK ? 0 : 1;
}
