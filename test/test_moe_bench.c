/* Bench figures for top-k dispatch + combine on the local backend (issue 8, section 6), all in
 * one run so their ratios mean something on a shared machine:
 *   - microseconds per dispatch + combine (bf16, identity experts) and the bytes each rank
 *     receives per second (dispatch: R rows, combine: T * k rows);
 *   - a plain baseline in the same run: sort the T * k slots by expert, exchange the counts
 *     with one all_to_allv and the rows with another, send them back, unsort (no weighted
 *     sum, each slot sent separately);
 *   - the local permutation (hcomm__moe_gather_rows, what dispatch and combine use) against
 *     memcpy of the same bytes.
 * The first step checks combine(dispatch(x)) = x * sum(w). Defaults are small (CI machines);
 * HCOMM_MOE_BENCH_T, _H, _K, _E, _EP (comma list of EP sizes) and _ITERS set the shape, e.g.
 * T=4096 H=7168 K=8 E=256 EP=2,4 for the figures. No timing is asserted. */
#include "harness.h"

#include "prims/moe_common.h"

#include <math.h>
#include <time.h>

typedef struct shape {
    int64_t t, h;
    int k, e, iters;
} shape_t;

static long env_or(const char *name, long dflt) {
    const char *s = getenv(name);
    return s && *s ? atol(s) : dflt;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    return x * 0x846ca68bu;
}

typedef struct batch {
    hcomm_tensor_t x, out;
    int32_t *ids;
    float *w;
} batch_t;

/* k distinct experts per token (offsets j * 7 modulo E, E >= 7k), weights 1/k. */
static batch_t make_batch(const shape_t *s, int rank) {
    batch_t b;
    int64_t shp[2] = {s->t, s->h};
    hcomm_tensor_init(&b.x, malloc((size_t)(s->t * s->h) * 2 + 2), HCOMM_BF16, 2, shp);
    hcomm_tensor_init(&b.out, calloc((size_t)(s->t * s->h) * 2 + 2, 1), HCOMM_BF16, 2, shp);
    b.ids = malloc(sizeof(int32_t) * (size_t)(s->t * s->k + 1));
    b.w = malloc(sizeof(float) * (size_t)(s->t * s->k + 1));
    for (int64_t t = 0; t < s->t; t++) {
        for (int j = 0; j < s->k; j++) {
            b.ids[t * s->k + j] =
                (int32_t)((mix((uint32_t)(rank * 100003 + t)) + (uint32_t)j * 7u) % (uint32_t)s->e);
            b.w[t * s->k + j] = 1.0f / (float)s->k;
        }
        for (int64_t c = 0; c < s->h; c++)
            t_set_val(HCOMM_BF16, b.x.data, (size_t)(t * s->h + c), (double)((t + c) % 13) - 6);
    }
    return b;
}

/* One dispatch + combine with identity experts; *bytes gets what this rank received. */
static hcomm_result_t moe_step(hcomm_comm_t *g, const shape_t *s, batch_t *b, double *bytes) {
    hcomm_moe_handle_t *hd = NULL;
    hcomm_tensor_t recv;
    T_TRY(hcomm_moe_dispatch_topk(g, &b->x, b->ids, b->w, s->k, s->e, NULL, &hd));
    T_TRY(hcomm_moe_received(hd, &recv, NULL));
    T_TRY(hcomm_moe_combine_topk(hd, &recv, &b->out));
    *bytes = (double)(recv.shape[0] + s->t * s->k) * (double)s->h * 2;
    return hcomm_moe_handle_free(hd);
}

static void check_round_trip(const shape_t *s, const batch_t *b) {
    int64_t bad = -1;
    for (int64_t i = 0; i < s->t * s->h && bad < 0; i++) {
        double want = t_get_val(HCOMM_BF16, b->x.data, (size_t)i); /* sum(w) = 1 */
        if (fabs(t_get_val(HCOMM_BF16, b->out.data, (size_t)i) - want) > 1e-2 * fabs(want))
            bad = i;
    }
    T_CHECK(bad < 0, "combine(dispatch(x)) != x * sum(w) at element %lld", (long long)bad);
}

/* ---- the baseline: sort by expert, counts, rows there and back, unsort ---- */

typedef struct base {
    int64_t *perm; /* [T * k] slots sorted by expert */
    size_t *v;     /* [8][p] byte counts and offsets: counts exchange, then rows */
    int64_t *cnt;  /* [2][p] slots to and from each rank */
    char *sendbuf, *recvbuf;
    size_t recv_cap;
} base_t;

/* Counting sort of the slots by expert (stable), and the slots for each rank. */
static void sort_by_expert(const shape_t *s, const int32_t *ids, int p, base_t *bs) {
    int64_t *next = calloc((size_t)s->e + 1, sizeof *next);
    for (int64_t i = 0; i < s->t * s->k; i++)
        next[ids[i] + 1]++;
    for (int e = 0; e < s->e; e++)
        next[e + 1] += next[e];
    for (int q = 0; q < p; q++)
        bs->cnt[q] = next[(q + 1) * (s->e / p)] - next[q * (s->e / p)];
    for (int64_t i = 0; i < s->t * s->k; i++)
        bs->perm[next[ids[i]]++] = i / s->k;
    free(next);
}

static hcomm_result_t baseline_step(hcomm_comm_t *g, const shape_t *s, batch_t *b, base_t *bs) {
    int p = t_size(g);
    size_t rb = (size_t)s->h * 2, *v = bs->v, one = sizeof(int64_t);
    sort_by_expert(s, b->ids, p, bs);
    hcomm__moe_gather_rows(bs->sendbuf, b->x.data, bs->perm, s->t * s->k, rb);
    for (int q = 0; q < p; q++) {
        v[q] = one;
        v[p + q] = (size_t)q * one;
    }
    T_TRY(hcomm_all_to_allv(g, bs->cnt, v, v + p, bs->cnt + p, v, v + p));
    size_t so = 0, ro = 0;
    for (int q = 0; q < p; q++) {
        v[2 * p + q] = (size_t)bs->cnt[q] * rb;
        v[3 * p + q] = so;
        so += v[2 * p + q];
        v[4 * p + q] = (size_t)bs->cnt[p + q] * rb;
        v[5 * p + q] = ro;
        ro += v[4 * p + q];
    }
    T_CHECK(ro <= bs->recv_cap, "baseline receives %zu bytes, buffer %zu", ro, bs->recv_cap);
    if (ro > bs->recv_cap)
        return HCOMM_ERR_SHAPE;
    T_TRY(
        hcomm_all_to_allv(g, bs->sendbuf, v + 2 * p, v + 3 * p, bs->recvbuf, v + 4 * p, v + 5 * p));
    T_TRY(
        hcomm_all_to_allv(g, bs->recvbuf, v + 4 * p, v + 5 * p, bs->sendbuf, v + 2 * p, v + 3 * p));
    /* unsort: each slot's row back to its token (the last slot wins: no arithmetic) */
    hcomm__moe_scatter_rows(b->out.data, bs->sendbuf, bs->perm, s->t * s->k, rb);
    return HCOMM_OK;
}

/* ---- the permutation against memcpy ---- */

static double best_of(double a, double b) {
    return a < b ? a : b;
}

/* GB/s of gathering rows rows of rb bytes by a shuffled index, and of memcpy of the same. */
static void permute_bandwidth(int64_t rows, size_t rb, double *perm_gbs, double *copy_gbs) {
    char *src = malloc((size_t)rows * rb + 1), *dst = malloc((size_t)rows * rb + 1);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(rows + 1));
    memset(src, 1, (size_t)rows * rb);
    memset(dst, 2, (size_t)rows * rb);
    for (int64_t i = 0; i < rows; i++)
        idx[i] = i;
    for (int64_t i = rows - 1; i > 0; i--) { /* Fisher-Yates with the bench's hash */
        int64_t j = (int64_t)(mix((uint32_t)i) % (uint32_t)(i + 1)), tmp = idx[i];
        idx[i] = idx[j];
        idx[j] = tmp;
    }
    double tp = 1e30, tc = 1e30;
    for (int rep = 0; rep < 15; rep++) {
        double t0 = now_s();
        hcomm__moe_gather_rows(dst, src, idx, rows, rb);
        double t1 = now_s();
        memcpy(dst, src, (size_t)rows * rb);
        double t2 = now_s();
        tp = best_of(tp, t1 - t0);
        tc = best_of(tc, t2 - t1);
    }
    double gb = (double)rows * (double)rb / 1e9;
    *perm_gbs = gb / tp;
    *copy_gbs = gb / tc;
    free(src);
    free(dst);
    free(idx);
}

/* ---- the permutation's bytes: cached and streamed paths ---- */

/* gather then scatter of rows rows of rb bytes by a shuffled index, at byte offset off of
 * malloc'd buffers: the gathered rows are the indexed source rows, and scattering them back
 * rebuilds the source exactly. Sizes from 64 MiB on take the streamed path where rb is a multiple
 * of 16 and dst is 16-byte aligned. */
static void check_permutation(int64_t rows, size_t rb, size_t off) {
    size_t bytes = (size_t)rows * rb;
    unsigned char *a = malloc(bytes + off + 1), *b = malloc(bytes + off + 1),
                  *c = malloc(bytes + off + 1);
    int64_t *idx = malloc(sizeof *idx * (size_t)(rows + 1));
    T_CHECK(a && b && c && idx, "out of memory for %zu bytes", bytes);
    if (!a || !b || !c || !idx)
        goto done;
    unsigned char *src = a + off, *dst = b + off, *back = c + off;
    for (size_t i = 0; i < bytes; i++)
        src[i] = (unsigned char)mix((uint32_t)i);
    for (int64_t i = 0; i < rows; i++)
        idx[i] = i;
    for (int64_t i = rows - 1; i > 0; i--) {
        int64_t j = (int64_t)(mix((uint32_t)i * 3u) % (uint32_t)(i + 1)), tmp = idx[i];
        idx[i] = idx[j];
        idx[j] = tmp;
    }
    hcomm__moe_gather_rows(dst, src, idx, rows, rb);
    int64_t bad = -1;
    for (int64_t i = 0; i < rows && bad < 0; i++)
        if (memcmp(dst + (size_t)i * rb, src + (size_t)idx[i] * rb, rb) != 0)
            bad = i;
    T_CHECK(bad < 0, "gather of %lld rows of %zu B (offset %zu): row %lld is not source row %lld",
            (long long)rows, rb, off, (long long)bad, (long long)(bad < 0 ? 0 : idx[bad]));
    memset(back, 0, bytes);
    hcomm__moe_scatter_rows(back, dst, idx, rows, rb);
    T_CHECK(memcmp(back, src, bytes) == 0,
            "scatter of %lld rows of %zu B (offset %zu) does not give the source back",
            (long long)rows, rb, off);
done:
    free(a);
    free(b);
    free(c);
    free(idx);
}

static hcomm_result_t bench_world(hcomm_comm_t *g, void *arg) {
    const shape_t *s = arg;
    int p = t_size(g), rank = t_rank(g);
    batch_t b = make_batch(s, rank);
    base_t bs = {0};
    size_t rb = (size_t)s->h * 2;
    bs.perm = malloc(sizeof(int64_t) * (size_t)(s->t * s->k + 1));
    bs.v = malloc(sizeof(size_t) * 6 * (size_t)p);
    bs.cnt = malloc(sizeof(int64_t) * 2 * (size_t)p);
    bs.sendbuf = malloc((size_t)(s->t * s->k) * rb + 1);
    bs.recv_cap = (size_t)(s->t * s->k) * rb * 5 / 4 + (size_t)p * 64 * rb; /* some skew */
    bs.recvbuf = malloc(bs.recv_cap + 1);
    double bytes = 0, moe_bytes = 0;
    T_TRY(moe_step(g, s, &b, &bytes)); /* warm-up, checked */
    check_round_trip(s, &b);
    T_TRY(baseline_step(g, s, &b, &bs));
    T_TRY(hcomm_barrier(g));
    double t0 = now_s();
    for (int i = 0; i < s->iters; i++) {
        T_TRY(moe_step(g, s, &b, &bytes));
        moe_bytes += bytes;
    }
    T_TRY(hcomm_barrier(g));
    double t1 = now_s();
    for (int i = 0; i < s->iters; i++)
        T_TRY(baseline_step(g, s, &b, &bs));
    T_TRY(hcomm_barrier(g));
    double t2 = now_s(), moe_us = (t1 - t0) / s->iters * 1e6, base_us = (t2 - t1) / s->iters * 1e6;
    if (rank == 0) {
        printf("moe bench ep=%d bf16 T=%lld H=%lld k=%d E=%d: dispatch+combine %.0f us "
               "(rank 0 receives %.2f GB/s), baseline sort+a2a counts+a2a+a2a back+unsort "
               "%.0f us: x%.2f\n",
               p, (long long)s->t, (long long)s->h, s->k, s->e, moe_us, moe_bytes / (t1 - t0) / 1e9,
               base_us, moe_us / base_us);
        fflush(stdout);
    }
    T_TRY(hcomm_barrier(g));
    free(b.x.data);
    free(b.out.data);
    free(b.ids);
    free(b.w);
    free(bs.perm);
    free(bs.v);
    free(bs.cnt);
    free(bs.sendbuf);
    free(bs.recvbuf);
    return HCOMM_OK;
}

int main(void) {
    shape_t s = {env_or("HCOMM_MOE_BENCH_T", 256), env_or("HCOMM_MOE_BENCH_H", 1024),
                 (int)env_or("HCOMM_MOE_BENCH_K", 8), (int)env_or("HCOMM_MOE_BENCH_E", 64),
                 (int)env_or("HCOMM_MOE_BENCH_ITERS", 3)};
    const char *eps = getenv("HCOMM_MOE_BENCH_EP");
    if (strcmp(t_backend(), "local") != 0)
        return t_finish("test_moe_bench");
    check_permutation(0, 14336, 0);
    check_permutation(7, 3, 1);
    check_permutation(100, 14336, 0);
    check_permutation(4700, 14336, 0); /* 67 MB: streamed */
    check_permutation(4700, 14336, 8); /* unaligned: cached */
    check_permutation(70000, 1000, 0); /* 70 MB, rows not a multiple of 16: cached */
    check_permutation(1100, 61440, 0); /* 67 MB of 60 KiB rows: streamed */
    for (const char *q = eps && *eps ? eps : "2,4"; *q;) {
        int p = atoi(q);
        if (p >= 1 && s.e % p == 0)
            T_OK(hcomm_launch("local", p, bench_world, &s));
        while (*q && *q != ',')
            q++;
        q += *q == ',';
    }
    /* alone, so no waiting rank shares the cores: the T * k rows a combine permutes */
    double pg, cg;
    permute_bandwidth(s.t * s.k, (size_t)s.h * 2, &pg, &cg);
    printf("moe bench permute of %lld rows of %lld bytes: %.2f GB/s, memcpy %.2f GB/s (%.0f%%)\n",
           (long long)(s.t * s.k), (long long)s.h * 2, pg, cg, 100 * pg / cg);
    T_CHECK(pg > 0 && cg > 0, "bandwidths %g, %g", pg, cg);
    return t_finish("test_moe_bench");
}
