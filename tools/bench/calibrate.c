/* hcomm-bench --calibrate [FILE]: measures the alpha-beta-gamma link classes hcomm's cost model
 * uses (src/algo/cost.c) on the ranks it runs with, and writes them in the format
 * HCOMM_TUNING_FILE reads (src/core/topo_spec.h):
 *   intra   ping-pong between rank 0 and the next rank on its node (hcomm_comm_node: host
 *           names on mpi, HCOMM_TOPO's declared nodes), through hcomm's p2p layer (the one
 *           every algorithm runs over); absent when no two ranks share a node;
 *   inter   the same between rank 0 and the first rank on another node (under
 *           scripts/multinode.sh, or the local backend's simulated links with
 *           HCOMM_TOPO=nodes=NxG); absent on one node;
 *   reduce  the reduction kernel (f32 sum of two 8 MiB buffers) on rank 0.
 * Each ping-pong size's one-way time is the median over round trips / 2; alpha and beta are
 * the least-squares fit of time = alpha + bytes * beta, weighted by 1/time^2 so that small and
 * large sizes count alike (relative error). Rank 0 measures and formats the file; the text is
 * broadcast, so every rank that writes it (rank 0; on mpi also the first rank of each other
 * node, whose file system may differ) writes the same bytes, as hcomm's launch-time comparison
 * of the tuning file's contents requires. */
#define _XOPEN_SOURCE 700 /* realpath */
#include "bench.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_BYTES ((size_t)8 << 20)
#define TEXT_CAP 4096
enum { NSIZES = 7, TAG = 0x7ca1 };

static const size_t sizes[NSIZES] = {8, 1024, 8192, 65536, 524288, (size_t)2 << 20, MAX_BYTES};

typedef struct link_fit {
    bool measured;
    bool same_host;            /* inter: the other nodes' ranks share rank 0's host (mpi) */
    int a, b;                  /* the pair of ranks */
    double t[NSIZES];          /* one-way seconds per size */
    double alpha, beta, worst; /* worst: largest relative residual of the fit */
} link_fit_t;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Round trips at one size: fewer for large messages, so a slow link stays quick to calibrate. */
static int reps_for(size_t bytes) {
    return bytes <= 65536 ? 300 : bytes <= ((size_t)1 << 20) ? 50 : 20;
}

/* One round trip between me and peer; first: this rank sends first. */
static hcomm_result_t round_trip(hcomm_comm_t *w, int peer, bool first, char *buf, size_t n) {
    if (first) {
        BENCH_TRY(hcomm__bench_send(w, TAG, peer, buf, n));
        return hcomm__bench_recv(w, TAG, peer, buf, n);
    }
    BENCH_TRY(hcomm__bench_recv(w, TAG, peer, buf, n));
    return hcomm__bench_send(w, TAG, peer, buf, n);
}

/* Ping-pong between f->a and f->b; f->t (on f->a) gets the median one-way times. */
static hcomm_result_t ping_pong(hcomm_comm_t *w, int me, link_fit_t *f, char *buf) {
    if (me != f->a && me != f->b)
        return HCOMM_OK;
    int peer = me == f->a ? f->b : f->a;
    double *t = malloc(sizeof *t * 300);
    if (!t)
        return HCOMM_ERR_NOMEM;
    hcomm_result_t r = HCOMM_OK;
    for (int s = 0; r == HCOMM_OK && s < NSIZES; s++) {
        int reps = reps_for(sizes[s]);
        for (int i = -3; r == HCOMM_OK && i < reps; i++) {
            double t0 = hcomm__bench_now();
            r = round_trip(w, peer, me == f->a, buf, sizes[s]);
            if (i >= 0)
                t[i] = (hcomm__bench_now() - t0) / 2.0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        f->t[s] = t[reps / 2] > 1e-9 ? t[reps / 2] : 1e-9; /* the file takes positive values */
    }
    free(t);
    return r;
}

/* Weighted least squares of t = alpha + n beta with weights 1/t^2: relative errors count
 * alike at every size. One line cannot follow a machine whose rate drops once messages leave
 * the cache (here: about 10 GB/s up to 2 MiB, 2 GB/s at 8 MiB); an unweighted slope would
 * follow the largest sizes alone and, measured here, mislead the choice at 4 KiB (twoshot
 * over rd, 2.2x slower) without changing it above 32 KiB. A fit that gives a non-positive
 * alpha (latency lost in the noise) takes the smallest size's time; a non-positive beta, the
 * largest size's rate. */
static void fit(link_fit_t *f) {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int s = 0; s < NSIZES; s++) {
        double x = (double)sizes[s], y = f->t[s], wt = 1.0 / (y * y);
        sw += wt, sx += wt * x, sy += wt * y, sxx += wt * x * x, sxy += wt * x * y;
    }
    double det = sw * sxx - sx * sx;
    f->beta = det > 0 ? (sw * sxy - sx * sy) / det : 0.0;
    f->alpha = det > 0 ? (sy - f->beta * sx) / sw : 0.0;
    if (!(f->beta > 0))
        f->beta = f->t[NSIZES - 1] / (double)sizes[NSIZES - 1];
    if (!(f->alpha > 0))
        f->alpha = f->t[0];
    f->worst = 0;
    for (int s = 0; s < NSIZES; s++) {
        double e = fabs(f->alpha + f->beta * (double)sizes[s] - f->t[s]) / f->t[s];
        f->worst = e > f->worst ? e : f->worst;
    }
}

/* Seconds per byte of hcomm's reduction kernel (f32 sum, 8 MiB, median of 10). */
static double time_reduce(void) {
    size_t n = MAX_BYTES / 4;
    float *a = malloc(MAX_BYTES), *b = malloc(MAX_BYTES);
    double t[10], g = 0;
    if (a && b) {
        for (size_t i = 0; i < n; i++)
            a[i] = 1.0f, b[i] = (float)(i & 1023);
        hcomm__bench_reduce(a, b, n, HCOMM_F32, HCOMM_SUM); /* warm */
        for (int i = 0; i < 10; i++) {
            double t0 = hcomm__bench_now();
            hcomm__bench_reduce(a, b, n, HCOMM_F32, HCOMM_SUM);
            t[i] = hcomm__bench_now() - t0;
        }
        qsort(t, 10, sizeof *t, cmp_double);
        g = t[5] / (double)MAX_BYTES;
    }
    free(a);
    free(b);
    return g;
}

/* A hash of this host's name: on mpi, nodes that HCOMM_TOPO declares may share a host, and
 * a link between them is shared memory, not the inter-node link the file would claim. */
static int host_id(void) {
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    uint32_t h = 2166136261u;
    for (const char *c = name; *c; c++)
        h = (h ^ (unsigned char)*c) * 16777619u;
    return (int)(h & 0x7fffffff);
}

/* The pairs: rank 0 with the next rank on its node, and with the first rank elsewhere; at[r]
 * is rank r's {node, host}. Only the local backend simulates declared links, so on mpi an
 * inter pair must sit on two hosts. */
static void pick_pairs(const int (*at)[2], int p, bool simulated, link_fit_t *intra,
                       link_fit_t *inter) {
    memset(intra, 0, sizeof *intra);
    memset(inter, 0, sizeof *inter);
    for (int r = 1; r < p; r++) {
        link_fit_t *f = at[r][0] == at[0][0] ? intra : inter;
        if (f == inter && !simulated && at[r][1] == at[0][1]) {
            inter->same_host = true;
            continue;
        }
        if (!f->measured)
            f->measured = true, f->a = 0, f->b = r;
    }
}

static void print_fit(const char *cls, const link_fit_t *f) {
    if (!f->measured) {
        printf("# %s: not measured (%s)\n", cls,
               !strcmp(cls, "intra") ? "no other rank shares rank 0's node"
               : f->same_host        ? "the ranks HCOMM_TOPO puts on other nodes share rank 0's "
                                       "host, and the mpi backend does not simulate declared links"
                                     : "every rank is on one node");
        return;
    }
    printf("# %s: ranks %d <-> %d, one-way time (median of round trips / 2):\n", cls, f->a, f->b);
    printf("#   %10s %12s %12s\n", "size(B)", "time(us)", "fit(us)");
    for (int s = 0; s < NSIZES; s++)
        printf("#   %10zu %12.3f %12.3f\n", sizes[s], f->t[s] * 1e6,
               (f->alpha + f->beta * (double)sizes[s]) * 1e6);
    printf("# %s: alpha %.3f us, beta %.4g s/B (%.3f GB/s); largest fit error %.0f%%\n", cls,
           f->alpha * 1e6, f->beta, 1e-9 / f->beta, f->worst * 100);
}

static int add_class(char *text, int n, const char *cls, const link_fit_t *f, double gamma) {
    if (f->measured)
        n += snprintf(text + n, TEXT_CAP - (size_t)n,
                      "# %s: ranks %d and %d, ping-pong %zu B to %zu B\n%s.alpha_us = %.6g\n"
                      "%s.bw_GBps = %.6g\n",
                      cls, f->a, f->b, sizes[0], sizes[NSIZES - 1], cls, f->alpha * 1e6, cls,
                      1e-9 / f->beta);
    else
        n += snprintf(text + n, TEXT_CAP - (size_t)n,
                      "# %s: latency and bandwidth not measured; hcomm keeps its defaults\n", cls);
    return n +
           snprintf(text + n, TEXT_CAP - (size_t)n, "%s.reduce_GBps = %.6g\n", cls, 1e-9 / gamma);
}

static void format_text(char *text, int p, int nnodes, const char *backend, const link_fit_t *intra,
                        const link_fit_t *inter, double gamma) {
    int n = snprintf(text, TEXT_CAP,
                     "# hcomm tuning file (HCOMM_TUNING_FILE), written by hcomm-bench "
                     "--calibrate\n# on %d rank%s, %d node%s, %s backend\n",
                     p, p == 1 ? "" : "s", nnodes, nnodes == 1 ? "" : "s", backend);
    n = add_class(text, n, "intra", intra, gamma);
    add_class(text, n, "inter", inter, gamma);
}

static hcomm_result_t write_failed(const char *path, const char *tmp) {
    fprintf(stderr, "hcomm-bench: --calibrate %s: cannot write the file (%s)\n", path,
            strerror(errno));
    if (tmp)
        remove(tmp);
    return HCOMM_ERR_IO;
}

/* Writes text to path through a temporary file and a rename, so that ranks of several nodes
 * sharing one file system never leave a mixed file. A symbolic link keeps pointing where it
 * did (its target is written), and a path that is no regular file (/dev/null) is written in
 * place: a rename would put a regular file where the link or the device was. */
static hcomm_result_t write_file(const char *path, const char *text, int rank) {
    char *real = realpath(path, NULL), tmp[4200];
    const char *dst = real ? real : path;
    struct stat st;
    hcomm_result_t r = HCOMM_OK;
    if (stat(dst, &st) == 0 && !S_ISREG(st.st_mode)) {
        FILE *f = fopen(dst, "w");
        bool ok = f && fputs(text, f) >= 0;
        if (!(f && fclose(f) == 0 && ok))
            r = write_failed(path, NULL);
        free(real);
        return r;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%d", dst, (long)getpid(), rank);
    FILE *f = fopen(tmp, "w");
    bool ok = f && fputs(text, f) >= 0;
    ok = f && fclose(f) == 0 && ok;
    if (!ok || rename(tmp, dst) != 0)
        r = write_failed(path, tmp);
    free(real);
    return r;
}

static hcomm_result_t measure(hcomm_comm_t *w, int me, int p, const int (*at)[2], char *text,
                              int nnodes, const char *backend) {
    link_fit_t f[2];
    pick_pairs(at, p, !strcmp(backend, "local"), &f[0], &f[1]);
    char *buf = malloc(MAX_BYTES);
    hcomm_result_t r = buf ? HCOMM_OK : HCOMM_ERR_NOMEM;
    for (int k = 0; k < 2; k++) {
        if (r == HCOMM_OK)
            r = hcomm_barrier(w); /* one pair at a time: nothing else on the links */
        if (r == HCOMM_OK && f[k].measured)
            r = ping_pong(w, me, &f[k], buf);
    }
    free(buf);
    if (r == HCOMM_OK)
        r = hcomm_barrier(w);
    if (r != HCOMM_OK || me != 0)
        return r;
    double gamma = time_reduce();
    for (int k = 0; k < 2; k++)
        if (f[k].measured)
            fit(&f[k]);
    printf("# hcomm-bench --calibrate: %d rank%s on %s, %d node%s\n", p, p == 1 ? "" : "s", backend,
           nnodes, nnodes == 1 ? "" : "s");
    print_fit("intra", &f[0]);
    print_fit("inter", &f[1]);
    printf("# reduce: f32 sum of %zu B on rank 0: %.3f GB/s\n", MAX_BYTES, 1e-9 / gamma);
    format_text(text, p, nnodes, backend, &f[0], &f[1], gamma > 0 ? gamma : 1e-10);
    return HCOMM_OK;
}

hcomm_result_t bench_calibrate(hcomm_comm_t *w, const bench_opts_t *o) {
    int me = 0, p = 1, nnodes = 1, mynode = 0, local = 0;
    const char *backend = "?";
    hcomm_comm_rank(w, &me);
    hcomm_comm_size(w, &p);
    hcomm_comm_backend(w, &backend);
    BENCH_TRY(hcomm_comm_node(w, &nnodes, &mynode, &local, NULL));
    int mine[2] = {mynode, host_id()}, (*at)[2] = malloc(sizeof *at * (size_t)p);
    char *text = calloc(1, TEXT_CAP);
    hcomm_result_t r = at && text ? HCOMM_OK : HCOMM_ERR_NOMEM;
    if (r == HCOMM_OK)
        r = hcomm_all_gather(w, mine, at, sizeof mine);
    if (r == HCOMM_OK)
        r = measure(w, me, p, (const int(*)[2])at, text, nnodes, backend);
    if (r == HCOMM_OK) /* every rank gets rank 0's text */
        r = hcomm_broadcast(w, text, TEXT_CAP, 0);
    bool writes = o->calibrate_file && (me == 0 || (local == 0 && !strcmp(backend, "mpi")));
    if (r == HCOMM_OK && writes)
        r = write_file(o->calibrate_file, text, me);
    if (r == HCOMM_OK && me == 0 && o->calibrate_file)
        printf("# wrote %s:\n%s", o->calibrate_file, text);
    else if (r == HCOMM_OK && me == 0)
        printf("# no FILE given, not written; its text:\n%s", text);
    free(at);
    free(text);
    return r;
}
