/* What deterministic mode costs: f32 SUM all_reduce of 8 B and 4 MiB on the world, per
 * algorithm (the default and each forced one), with the mode off and on in alternating
 * iterations of one run, so the load of a shared machine hits both alike; prints the medians
 * over ranks' slowest time and their ratio. Usage: det_cost [ITERS] (local: 2 ranks; under
 * mpirun the job's processes). Not a test: no timing is asserted anywhere. */
#define _POSIX_C_SOURCE 200809L
#include "hcomm/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int iters = 200;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

/* One call's time, the slowest rank's. */
static hcomm_result_t timed(hcomm_comm_t *w, float *buf, size_t n, double *us) {
    hcomm_result_t r = hcomm_barrier(w);
    double t0 = now_us();
    if (r == HCOMM_OK)
        r = hcomm_all_reduce(w, buf, buf, n, HCOMM_F32, HCOMM_SUM);
    double t = now_us() - t0;
    if (r == HCOMM_OK)
        r = hcomm_all_reduce(w, &t, us, 1, HCOMM_F64, HCOMM_MAX);
    return r;
}

static hcomm_result_t body(hcomm_comm_t *w, void *arg) {
    (void)arg;
    static const char *const algos[] = {"", "allreduce:ring", "allreduce:rhd", "allreduce:rd",
                                        "allreduce:naive"};
    static const size_t sizes[] = {8, (size_t)4 << 20};
    int rank = 0, size = 0;
    hcomm_comm_rank(w, &rank);
    hcomm_comm_size(w, &size);
    float *buf = calloc((size_t)1 << 20, sizeof *buf);
    double *t[2] = {malloc(sizeof(double) * (size_t)iters), malloc(sizeof(double) * (size_t)iters)};
    hcomm_result_t r = buf && t[0] && t[1] ? HCOMM_OK : HCOMM_ERR_NOMEM;
    if (rank == 0)
        printf("%-16s %10s %12s %12s %8s   (%d ranks, median of %d)\n", "algo", "bytes", "off us",
               "on us", "on/off", size, iters);
    for (int a = 0; a < 5 && r == HCOMM_OK; a++)
        for (int s = 0; s < 2 && r == HCOMM_OK; s++) {
            size_t n = sizes[s] / sizeof(float);
            r = hcomm_comm_set_algo(w, algos[a]);
            if (sizes[s] > 65536 && a == 3)
                continue; /* rd on MiB: not what it is for */
            for (int i = 0; i < iters + 10 && r == HCOMM_OK; i++)
                for (int d = 0; d < 2 && r == HCOMM_OK; d++) {
                    double us = 0;
                    r = hcomm_comm_set_deterministic(w, d);
                    if (r == HCOMM_OK)
                        r = timed(w, buf, n, &us);
                    if (i >= 10) /* warm-up */
                        t[d][i - 10] = us;
                }
            if (r == HCOMM_OK && rank == 0) {
                double off = median(t[0], iters), on = median(t[1], iters);
                printf("%-16s %10zu %12.2f %12.2f %8.2f\n", algos[a][0] ? algos[a] + 10 : "default",
                       sizes[s], off, on, on / off);
            }
        }
    if (r != HCOMM_OK)
        fprintf(stderr, "det_cost: %s\n", hcomm_last_error());
    free(buf);
    free(t[0]);
    free(t[1]);
    return r;
}

int main(int argc, char **argv) {
    if (argc > 1)
        iters = atoi(argv[1]) > 0 ? atoi(argv[1]) : iters;
    return hcomm_launch(NULL, 2, body, NULL) == HCOMM_OK ? 0 : 1;
}
