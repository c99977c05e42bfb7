/* Edges of the mpi lane (recursive doubling in 3968-byte pieces, the signature agreement) and
 * of twoshot all_reduce (default on mpi on one host from 8 KiB with 2 processes, 16 KiB with
 * more; forced on local), on the
 * local backend (world sizes 2..5) and under mpirun (HCOMM_TEST_MPI: np 2, 3 and 4):
 *   (a) counts, dtypes and ops that differ across ranks at the rd / native / twoshot size
 *       boundaries (and reduce_scatter's and all_gather's across direct and rd) fail with
 *       HCOMM_ERR_MISMATCH on every rank and one wording; the next call works;
 *   (b) twoshot (and whatever the default picks) equals the serial rank-order reduction:
 *       in place, f16/bf16, AVG, counts below the group size, zero, counts that don't divide,
 *       and blocks of 16 MiB and more at offsets that are not multiples of 16 bytes;
 *   (c) a rank that fails its own checks at those sizes: peers get HCOMM_ERR_PEER within 1 s
 *       and the next call works. */
#include "harness.h"

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* all_reduce SUM of f32[8]: the communicator still works and gives the right values. */
static hcomm_result_t works(hcomm_comm_t *c, const char *after) {
    float s[8], d[8];
    int p = t_size(c), r = t_rank(c);
    for (int i = 0; i < 8; i++)
        s[i] = (float)((r + 1) * (i + 1));
    hcomm_result_t res = hcomm_all_reduce(c, s, d, 8, HCOMM_F32, HCOMM_SUM);
    T_CHECK(res == HCOMM_OK, "all_reduce after %s (world %d, rank %d): %s (%s)", after, p, r,
            hcomm_result_name(res), hcomm_last_error());
    for (int i = 0; res == HCOMM_OK && i < 8; i++)
        T_CHECK(d[i] == (float)((i + 1) * p * (p + 1) / 2),
                "all_reduce after %s (world %d, rank %d): [%d]=%g", after, p, r, i, (double)d[i]);
    return res;
}

/* --- (a) mismatches at the size boundaries --- */

typedef struct mm {
    size_t n0, n1;          /* count on rank 0, on the others */
    hcomm_dtype_t dt0, dt1; /* dtype on rank 0, on the others */
    hcomm_op_t op0, op1;
    const char *a, *b; /* "<a> on rank 0 but <b> on rank " */
} mm_t;

static const mm_t mms[] = {
    {992, 993, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=992", "count=993"},
    {993, 992, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=993", "count=992"},
    {1024, 1025, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=1024", "count=1025"},
    {1025, 1024, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=1025", "count=1024"},
    {1500, 1501, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=1500", "count=1501"},
    {2048, 2047, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=2048", "count=2047"},
    {2047, 2048, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=2047", "count=2048"},
    {4096, 4095, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=4096", "count=4095"},
    {4095, 4096, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=4095", "count=4096"},
    {16384, 16383, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=16384", "count=16383"},
    {16383, 16384, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=16383", "count=16384"},
    {16384, 8, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=16384", "count=8"},
    {8, 16384, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=8", "count=16384"},
    {0, 16384, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=0", "count=16384"},
    {100003, 1, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_SUM, "count=100003", "count=1"},
    {16384, 16384, HCOMM_F32, HCOMM_I32, HCOMM_SUM, HCOMM_SUM, "dtype=f32", "dtype=i32"},
    {16384, 16384, HCOMM_F32, HCOMM_F32, HCOMM_SUM, HCOMM_AVG, "op=sum", "op=avg"},
    {32768, 32768, HCOMM_BF16, HCOMM_F16, HCOMM_SUM, HCOMM_SUM, "dtype=bf16", "dtype=f16"},
    {1000, 1000, HCOMM_F16, HCOMM_F32, HCOMM_AVG, HCOMM_AVG, "dtype=f16", "dtype=f32"},
};

/* res must be HCOMM_ERR_MISMATCH with a message that starts with head. */
static void expect_head(hcomm_comm_t *c, hcomm_result_t res, const char *head, const char *what) {
    const char *msg = hcomm_last_error();
    T_CHECK(res == HCOMM_ERR_MISMATCH && strstr(msg, head) == msg,
            "%s (world %d, rank %d): %s '%s', expected HCOMM_ERR_MISMATCH '%s...'", what, t_size(c),
            t_rank(c), hcomm_result_name(res), msg, head);
}

/* reduce_scatter and all_gather across the direct / rd boundaries: direct's address exchange
 * carries the signature, so ranks on different algorithms must still meet and fail. */
static hcomm_result_t other_mismatches(hcomm_comm_t *c, double *a, double *b) {
    int r = t_rank(c);
    const char *head = "hcomm_reduce_scatter: recvcount=8192 on rank 0 but recvcount=8 on rank ";
    /* f32: fits */
    expect_head(c, hcomm_reduce_scatter(c, a, b, r == 0 ? 8192 : 8, HCOMM_F32, HCOMM_SUM), head,
                "reduce_scatter mismatch");
    T_TRY(works(c, head));
    head = "hcomm_all_gather: bytes=8 on rank 0 but bytes=40000 on rank ";
    expect_head(c, hcomm_all_gather(c, a, b, r == 0 ? 8 : 40000), head, "all_gather mismatch");
    return works(c, head);
}

static hcomm_result_t mismatches(hcomm_comm_t *c) {
    int r = t_rank(c);
    double *a = calloc(100003, sizeof(double)), *b = calloc(100003, sizeof(double));
    if (!a || !b)
        return HCOMM_ERR_NOMEM;
    for (size_t i = 0; i < sizeof mms / sizeof mms[0]; i++) {
        const mm_t *m = &mms[i];
        char head[160];
        snprintf(head, sizeof head, "hcomm_all_reduce: %s on rank 0 but %s on rank ", m->a, m->b);
        char what[32];
        snprintf(what, sizeof what, "mismatch %zu", i);
        expect_head(c,
                    hcomm_all_reduce(c, a, b, r == 0 ? m->n0 : m->n1, r == 0 ? m->dt0 : m->dt1,
                                     r == 0 ? m->op0 : m->op1),
                    head, what);
        T_TRY(works(c, head));
    }
    T_TRY(other_mismatches(c, a, b));
    free(a);
    free(b);
    return HCOMM_OK;
}

/* --- (b) values against the serial rank-order reduction --- */

/* Rank r's element i: small integers (and halves), exact in every dtype and sum here. */
static double val(int r, size_t i, hcomm_op_t op) {
    if (op == HCOMM_PROD)
        return (double)((r + (int)i) % 3 == 0 ? 2 : 1);
    return (double)((r * 7 + (int)(i % 13)) % 11) - 3.0;
}

static double reference(int p, size_t i, hcomm_op_t op) {
    double acc = val(0, i, op);
    for (int q = 1; q < p; q++) {
        double v = val(q, i, op);
        acc = op == HCOMM_PROD  ? acc * v
              : op == HCOMM_MAX ? (v > acc ? v : acc)
              : op == HCOMM_MIN ? (v < acc ? v : acc)
                                : acc + v;
    }
    return op == HCOMM_AVG ? acc / p : acc;
}

static void check_values(hcomm_comm_t *c, const char *what, size_t n, hcomm_dtype_t dt,
                         hcomm_op_t op, bool in_place) {
    int r = t_rank(c), p = t_size(c);
    size_t es = 8;
    char *s = malloc(n * es + 1), *d = in_place ? s : malloc(n * es + 1);
    if (!s || !d)
        return;
    for (size_t i = 0; i < n; i++)
        t_set_val(dt, s, i, val(r, i, op));
    hcomm_result_t res = hcomm_all_reduce(c, s, d, n, dt, op);
    T_CHECK(res == HCOMM_OK, "%s n=%zu dt=%d op=%d%s (world %d, rank %d): %s (%s)", what, n, dt, op,
            in_place ? " in place" : "", p, r, hcomm_result_name(res), hcomm_last_error());
    int bad = 0;
    for (size_t i = 0; res == HCOMM_OK && i < n && bad < 3; i++) {
        double want = reference(p, i, op), got = t_get_val(dt, d, i);
        if (dt == HCOMM_F32)
            want = (float)want; /* the mean rounds once */
        bool ok = dt == HCOMM_F16 || dt == HCOMM_BF16 ? got - want < 0.07 && want - got < 0.07
                                                      : got == want;
        if (!ok && ++bad)
            T_FAIL_("%s n=%zu dt=%d op=%d%s (world %d, rank %d): [%zu]=%g, expected %g", what, n,
                    dt, op, in_place ? " in place" : "", p, r, i, got, want);
    }
    if (!in_place)
        free(d);
    free(s);
}

/* Blocks of 4 Mi elements and more, larger than the caches (the odd count puts every block but
 * the first at an offset that is not a multiple of 16 bytes); from 64 MiB a vector's results
 * are written with non-temporal stores (peer_reduce.c), so the f32 vector is at least that. */
static hcomm_result_t streamed(hcomm_comm_t *c, const char *what) {
    size_t n = (size_t)t_size(c) * ((size_t)4 << 20) + 3, mi16 = (size_t)16 << 20;
    size_t n32 = n > mi16 ? n : mi16 + 3;
    check_values(c, what, n32, HCOMM_F32, HCOMM_SUM, false);
    check_values(c, what, n32, HCOMM_F32, HCOMM_SUM, true);
    check_values(c, what, n, HCOMM_F64, HCOMM_MAX, false);
    return works(c, what);
}

static hcomm_result_t values(hcomm_comm_t *c, const char *what) {
    int p = t_size(c);
    const size_t ns[] = {0,    1,    (size_t)p - 1, (size_t)p + 1, 992,  993,
                         1500, 2048, 16384,         16387,         65539};
    const hcomm_dtype_t dts[] = {HCOMM_F32, HCOMM_F64, HCOMM_I32, HCOMM_I64, HCOMM_F16, HCOMM_BF16};
    const hcomm_op_t ops[] = {HCOMM_SUM, HCOMM_AVG, HCOMM_MAX, HCOMM_MIN, HCOMM_PROD};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof dts / sizeof dts[0]; b++)
            for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
                if (dts[b] == HCOMM_I32 && ops[o] == HCOMM_AVG)
                    continue; /* integer AVG rounding is tested elsewhere */
                if (dts[b] == HCOMM_I64 && ops[o] == HCOMM_AVG)
                    continue;
                check_values(c, what, ns[a], dts[b], ops[o], false);
                check_values(c, what, ns[a], dts[b], ops[o], true);
            }
    return streamed(c, what);
}

/* --- (c) one rank fails its own checks --- */

static hcomm_result_t own_failures(hcomm_comm_t *c) {
    int r = t_rank(c), p = t_size(c), bad = p - 1;
    const size_t ns[] = {8, 993, 1025, 16384, 100003};
    float *a = calloc(100004, sizeof(float)), *b = calloc(100004, sizeof(float));
    if (!a || !b)
        return HCOMM_ERR_NOMEM;
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (int kind = 0; kind < 2; kind++) {
            T_TRY(hcomm_barrier(c));
            double t0 = now_s();
            const float *send = a;
            float *recv = b;
            if (r == bad)
                kind == 0 ? (void)(send = NULL) : (void)(recv = a + 1); /* partial overlap */
            hcomm_result_t res = hcomm_all_reduce(c, send, recv, ns[i], HCOMM_F32, HCOMM_SUM);
            double secs = now_s() - t0;
            if (r == bad) {
                T_CHECK(res == (kind == 0 ? HCOMM_ERR_NULL : HCOMM_ERR_INVALID_ARG),
                        "own failure n=%zu kind %d: %s (%s)", ns[i], kind, hcomm_result_name(res),
                        hcomm_last_error());
            } else {
                char name[32];
                snprintf(name, sizeof name, "rank %d", bad);
                T_CHECK(res == HCOMM_ERR_PEER && strstr(hcomm_last_error(), name),
                        "peer failure n=%zu kind %d (world %d, rank %d): %s (%s)", ns[i], kind, p,
                        r, hcomm_result_name(res), hcomm_last_error());
                T_CHECK(secs < 1.0, "peer failure n=%zu kind %d (world %d, rank %d): %.3f s", ns[i],
                        kind, p, r, secs);
            }
            T_TRY(works(c, "a rank's own failure"));
        }
    free(a);
    free(b);
    return HCOMM_OK;
}

static hcomm_result_t rank_main(hcomm_comm_t *c, void *arg) {
    (void)arg;
    T_TRY(mismatches(c));
    T_TRY(own_failures(c));
    if (strcmp(t_backend(), "mpi") == 0) /* local's default (native) is tested elsewhere */
        T_TRY(values(c, "default"));
    T_TRY(hcomm_comm_set_algo(c, "allreduce:twoshot"));
    T_TRY(values(c, "twoshot"));
    T_TRY(mismatches(c));
    T_TRY(own_failures(c));
    T_TRY(hcomm_comm_set_algo(c, ""));
    return hcomm_barrier(c);
}

int main(void) {
    if (strcmp(t_backend(), "mpi") == 0)
        T_OK(hcomm_launch("mpi", 0, rank_main, NULL));
    else
        for (int n = 2; n <= 5; n++)
            T_OK(hcomm_launch("local", n, rank_main, NULL));
    return t_finish("test_lane_twoshot");
}
