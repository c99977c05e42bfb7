/* Deterministic mode (hcomm_comm_set_deterministic, HCOMM_DETERMINISTIC): every reduction
 * algorithm, forced with hcomm_comm_set_algo, gives in every position the bits of the serial
 * reduction in rank order computed here, (((x0 op x1) op x2) ...): f32 and f64 in their own
 * precision, f16/bf16 accumulated in f32 and rounded once, AVG the sum divided by the group
 * size (before rounding). Inputs are random floats over 21 binades, so any other association
 * would change low bits; group sizes 1..9 (local) or the mpirun job (HCOMM_TEST_MPI); counts 0,
 * 1, p-1, p+1, 1009 and 5000 (past rd's 4 KiB pieces), in place and out of place (CI thins
 * these above 4 ranks, see skipped); one count past the owner's receive segment. Also: the
 * test can fail (ring without the mode differs from the serial bits somewhere for p >= 3),
 * HCOMM_DETERMINISTIC turns it on, a bad value fails hcomm_launch naming it, split
 * communicators inherit it, and ranks that disagree fail with HCOMM_ERR_MISMATCH. */
#include "algo/coll.h"
#include "harness.h"

#include <math.h>
#include <stdint.h>

typedef struct spec {
    const char *algo;
    int kind; /* 0 all_reduce, 1 reduce_scatter, 2 reduce_scatterv, 3 reduce */
} spec_t;

static const spec_t specs[] = {
    {"", 0},
    {"allreduce:native", 0},
    {"allreduce:rd", 0},
    {"allreduce:ring", 0},
    {"allreduce:rhd", 0},
    {"allreduce:naive", 0},
    {"allreduce:twoshot", 0},
    {"allreduce:hier", 0},
    {"reducescatter:native", 1},
    {"reducescatter:ring", 1},
    {"reducescatter:rhd", 1},
    {"reducescatter:hier", 1},
    {"reducescatter:direct", 1},
    {"reducescatterv:ring", 2},
    {"reducescatterv:rhd", 2},
    {"reducescatterv:direct", 2},
    {"reduce:tree", 3},
    {"reduce:direct", 3},
};
enum { NSPECS = sizeof specs / sizeof specs[0] };

static const hcomm_dtype_t dtypes[] = {HCOMM_F32, HCOMM_F64, HCOMM_F16, HCOMM_BF16};
static const char *const op_names[HCOMM_OP_COUNT] = {"sum", "prod", "max", "min", "avg"};

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Input element i of rank r: a random float in +-[2^-10, 2^11) (PROD: [0.5, 1.5)), exact in
 * every dtype once stored (t_set_val rounds it), read back as stored. */
static double input(hcomm_dtype_t dt, hcomm_op_t op, int r, size_t i) {
    uint64_t h = mix(((uint64_t)r << 40) ^ (uint64_t)i ^ ((uint64_t)dt << 56) ^ 0x5eed);
    double u = (double)(h >> 11) * 0x1p-53;
    double v = op == HCOMM_PROD ? 0.5 + u : ldexp(1.0 + u, (int)(h % 21) - 10) * (h & 1 ? -1 : 1);
    _Alignas(8) unsigned char b[8];
    t_set_val(dt, b, 0, v);
    return t_get_val(dt, b, 0);
}

static float apply_f(float a, float b, hcomm_op_t op) {
    return op == HCOMM_PROD  ? a * b
           : op == HCOMM_MAX ? (b > a ? b : a)
           : op == HCOMM_MIN ? (b < a ? b : a)
                             : a + b;
}

static double apply_d(double a, double b, hcomm_op_t op) {
    return op == HCOMM_PROD  ? a * b
           : op == HCOMM_MAX ? (b > a ? b : a)
           : op == HCOMM_MIN ? (b < a ? b : a)
                             : a + b;
}

/* The serial reduction of element i in rank order, stored in dt at ref[0]. */
static void serial(hcomm_dtype_t dt, hcomm_op_t op, int p, size_t i, void *ref) {
    if (dt == HCOMM_F64) {
        double acc = input(dt, op, 0, i);
        for (int r = 1; r < p; r++)
            acc = apply_d(acc, input(dt, op, r, i), op);
        *(double *)ref = op == HCOMM_AVG ? acc / (double)p : acc;
        return;
    }
    float acc = (float)input(dt, op, 0, i); /* f16/bf16: widened to f32, exactly */
    for (int r = 1; r < p; r++)
        acc = apply_f(acc, (float)input(dt, op, r, i), op);
    if (op == HCOMM_AVG)
        acc = acc / (float)p;
    if (dt == HCOMM_F32)
        *(float *)ref = acc;
    else
        *(uint16_t *)ref = dt == HCOMM_BF16 ? hcomm__f32_to_bf16(acc) : hcomm__f32_to_f16(acc);
}

typedef struct tcase {
    hcomm_comm_t *w;
    const spec_t *s;
    hcomm_dtype_t dt;
    hcomm_op_t op;
    size_t count;
    bool in_place;
} tcase_t;

/* got[0..n) against the serial bits of elements first..; the first difference is reported.
 * Returns the number of differing elements. */
static size_t compare(const tcase_t *t, const void *got, size_t first, size_t n, bool report) {
    size_t es = hcomm__dtype_size(t->dt), bad = 0;
    int p = t_size(t->w);
    for (size_t i = 0; i < n; i++) {
        _Alignas(8) unsigned char want[8];
        serial(t->dt, t->op, p, first + i, want);
        if (memcmp((const char *)got + i * es, want, es) == 0)
            continue;
        if (bad++ == 0 && report) {
            const char *dname = "?";
            hcomm_dtype_name(t->dt, &dname);
            T_FAIL_("[%s] %s %s count=%zu %s (world %d, rank %d): element %zu is %.17g, the "
                    "serial rank-order reduction is %.17g",
                    t->s->algo[0] ? t->s->algo : "default", dname, op_names[t->op], t->count,
                    t->in_place ? "in place" : "out of place", p, t_rank(t->w), first + i,
                    t_get_val(t->dt, got, i), t_get_val(t->dt, want, 0));
        }
    }
    if (report)
        atomic_fetch_add(&t_checks, 1);
    return bad;
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes + 16);
    if (p)
        memset(p, 0x5a, bytes + 16);
    return p;
}

/* Runs one case; *bad gets the number of elements that differ from the serial bits. */
static hcomm_result_t run_case(const tcase_t *t, bool report, size_t *bad) {
    int p = t_size(t->w), me = t_rank(t->w);
    size_t es = hcomm__dtype_size(t->dt), total = 0, mine = 0,
           *counts = malloc(sizeof(size_t) * (size_t)p);
    if (!counts)
        return HCOMM_ERR_NOMEM;
    for (int r = 0; r < p; r++) {
        counts[r] = t->s->kind == 2 ? (t->count + (size_t)r) % (t->count + 2) : t->count;
        mine = r == me ? total : mine;
        total += counts[r];
    }
    if (t->s->kind == 0 || t->s->kind == 3)
        total = t->count, mine = 0;
    size_t out_n = t->s->kind == 0 || t->s->kind == 3 ? t->count : counts[me];
    char *in = xmalloc(total * es), *out = t->in_place ? in : xmalloc(out_n * es);
    hcomm_result_t res = in && out ? HCOMM_OK : HCOMM_ERR_NOMEM;
    for (size_t i = 0; in && i < total; i++)
        t_set_val(t->dt, in, i, input(t->dt, t->op, me, i));
    if (res == HCOMM_OK) {
        switch (t->s->kind) {
        case 0:
            res = hcomm_all_reduce(t->w, in, out, t->count, t->dt, t->op);
            break;
        case 1:
            res = hcomm_reduce_scatter(t->w, in, out, t->count, t->dt, t->op);
            break;
        case 2:
            res = hcomm_reduce_scatterv(t->w, in, out, counts, t->dt, t->op);
            break;
        default:
            res = hcomm_reduce(t->w, in, out, t->count, t->dt, t->op, p - 1);
        }
        T_CHECK(res == HCOMM_OK, "[%s] count=%zu: %s (%s)", t->s->algo, t->count,
                hcomm_result_name(res), hcomm_last_error());
    }
    *bad = 0;
    if (res == HCOMM_OK && (t->s->kind != 3 || me == p - 1))
        *bad = compare(t, out, mine, out_n, report);
    if (out != in)
        free(out);
    free(in);
    free(counts);
    return res;
}

/* HCOMM_TEST_FULL=1 (scripts/test-algorithms.sh): every count, in place and not, on every
 * group size; CI's default thins the groups above 4 ranks (2-core machine) to counts 0, p+1
 * and 1009, alternating in place and out of place. */
static bool full;

static bool skipped(int p, int ci, int ip) {
    return !full && p > 4 && (ci == 1 || ci == 2 || ci == 5 || ip != ci % 2);
}

static hcomm_result_t every_case(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int p = t_size(w);
    size_t counts[] = {0, 1, (size_t)p - 1, (size_t)p + 1, 1009, 5000};
    T_TRY(hcomm_comm_set_deterministic(w, 1));
    for (int si = 0; si < NSPECS; si++) {
        T_TRY(hcomm_comm_set_algo(w, specs[si].algo));
        for (int di = 0; di < 4; di++)
            for (int op = 0; op < HCOMM_OP_COUNT; op++)
                for (int ci = 0; ci < 6; ci++)
                    for (int ip = 0; ip < 2; ip++) {
                        if (((op == HCOMM_MAX || op == HCOMM_MIN) && di > 0) || skipped(p, ci, ip))
                            continue; /* MAX, MIN: exact in any order, one dtype is enough */
                        tcase_t t = {w,          &specs[si], dtypes[di], (hcomm_op_t)op,
                                     counts[ci], ip == 1};
                        size_t bad;
                        T_TRY(run_case(&t, true, &bad));
                    }
    }
    T_TRY(hcomm_comm_set_algo(w, NULL));
    return hcomm_comm_set_deterministic(w, 0);
}

/* Past one receive segment of the owner (4 MiB over p ranks): several rounds. */
static hcomm_result_t long_vectors(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int p = t_size(w);
    size_t count = (size_t)p * (((size_t)4 << 20) / 8 / (size_t)p) + 7;
    static const spec_t rs = {"reducescatter:ring", 1}, ar = {"allreduce:ring", 0},
                        arf = {"allreduce:rhd", 0}, rd = {"reduce:direct", 3};
    T_TRY(hcomm_comm_set_deterministic(w, 1));
    size_t bad;
    T_TRY(hcomm_comm_set_algo(w, ar.algo));
    tcase_t t = {w, &ar, HCOMM_F64, HCOMM_SUM, count, false};
    T_TRY(run_case(&t, true, &bad));
    T_TRY(hcomm_comm_set_algo(w, arf.algo));
    tcase_t t2 = {w, &arf, HCOMM_BF16, HCOMM_SUM, count + ((size_t)1 << 20), true};
    T_TRY(run_case(&t2, true, &bad));
    T_TRY(hcomm_comm_set_algo(w, rs.algo));
    tcase_t t3 = {w, &rs, HCOMM_F32, HCOMM_AVG, count / (size_t)p + 3, false};
    T_TRY(run_case(&t3, true, &bad));
    T_TRY(hcomm_comm_set_algo(w, rd.algo)); /* past the split: every rank reduces its block */
    tcase_t t4 = {w, &rd, HCOMM_F32, HCOMM_SUM, count, true};
    T_TRY(run_case(&t4, true, &bad));
    T_TRY(hcomm_comm_set_algo(w, NULL));
    return hcomm_comm_set_deterministic(w, 0);
}

/* Without the mode, ring on p >= 3 associates differently somewhere: the check above bites. */
static hcomm_result_t can_fail(hcomm_comm_t *w, void *arg) {
    bool env_on = arg != NULL;
    static const spec_t ring = {"allreduce:ring", 0};
    if (t_size(w) < 3)
        return HCOMM_OK;
    T_TRY(hcomm_comm_set_algo(w, ring.algo));
    tcase_t t = {w, &ring, HCOMM_F32, HCOMM_SUM, 1009, false};
    size_t bad;
    T_TRY(run_case(&t, env_on, &bad));
    if (!env_on)
        T_CHECK(bad > 0,
                "ring without deterministic mode matched the serial bits everywhere on "
                "%d ranks: this test could not fail",
                t_size(w));
    return hcomm_comm_set_algo(w, NULL);
}

/* A communicator split from a deterministic one is deterministic. */
static hcomm_result_t inherits(hcomm_comm_t *w, void *arg) {
    (void)arg;
    static const spec_t ring = {"allreduce:ring", 0};
    hcomm_comm_t *half = NULL;
    T_TRY(hcomm_comm_set_deterministic(w, 1));
    T_TRY(hcomm_comm_split(w, t_rank(w) % 2, t_rank(w), &half));
    T_TRY(hcomm_comm_set_deterministic(w, 0));
    T_TRY(hcomm_comm_set_algo(half, ring.algo));
    tcase_t t = {half, &ring, HCOMM_F32, HCOMM_SUM, 1009, false};
    size_t bad;
    hcomm_result_t res = run_case(&t, true, &bad);
    hcomm_comm_destroy(half);
    return res;
}

/* Nonblocking all_reduce runs on a private duplicate made at the first one: it follows the
 * mode its communicator has when each operation is issued, not when the duplicate was made.
 * (The local default reduces in rank order anyway; on mpi the default at 4 KiB is rd.) */
static hcomm_result_t nonblocking(hcomm_comm_t *w, void *arg) {
    (void)arg;
    static const spec_t dflt = {"", 0};
    int me = t_rank(w);
    size_t n = 1009;
    float *v = malloc(n * sizeof *v);
    if (!v)
        return HCOMM_ERR_NOMEM;
    hcomm_request_t *req = NULL;
    T_TRY(hcomm_comm_set_deterministic(w, 0));
    T_TRY(hcomm_iall_reduce(w, v, v, 1, HCOMM_F32, HCOMM_SUM, &req)); /* makes the duplicate */
    T_TRY(hcomm_wait(req));
    T_TRY(hcomm_comm_set_deterministic(w, 1));
    for (size_t i = 0; i < n; i++)
        v[i] = (float)input(HCOMM_F32, HCOMM_SUM, me, i);
    T_TRY(hcomm_iall_reduce(w, v, v, n, HCOMM_F32, HCOMM_SUM, &req));
    T_TRY(hcomm_wait(req));
    tcase_t t = {w, &dflt, HCOMM_F32, HCOMM_SUM, n, true};
    compare(&t, v, 0, n, true);
    free(v);
    return hcomm_comm_set_deterministic(w, 0);
}

/* Ranks that disagree on the mode fail with MISMATCH naming it; the comm stays usable. */
static hcomm_result_t differ(hcomm_comm_t *w, void *arg) {
    (void)arg;
    if (t_size(w) < 2)
        return HCOMM_OK;
    T_TRY(hcomm_comm_set_algo(w, "allreduce:ring"));
    T_TRY(hcomm_comm_set_deterministic(w, t_rank(w) == 0));
    float v[16] = {0};
    hcomm_result_t r = hcomm_all_reduce(w, v, v, 16, HCOMM_F32, HCOMM_SUM);
    T_CHECK(r == HCOMM_ERR_MISMATCH && strstr(hcomm_last_error(), "deterministic"),
            "deterministic on rank 0 only gave %s (%s)", hcomm_result_name(r), hcomm_last_error());
    T_TRY(hcomm_comm_set_deterministic(w, 0));
    T_OK(hcomm_all_reduce(w, v, v, 16, HCOMM_F32, HCOMM_SUM)); /* still usable */
    T_TRY(hcomm_comm_set_algo(w, NULL));
    /* The default algorithms, also those that run unchanged in the mode (rank-ordered). */
    T_TRY(hcomm_comm_set_deterministic(w, t_rank(w) == 0));
    const char *want = "deterministic=1 on rank 0 but deterministic=0 on rank 1";
    r = hcomm_all_reduce(w, v, v, 16, HCOMM_F32, HCOMM_SUM);
    T_CHECK(r == HCOMM_ERR_MISMATCH && strstr(hcomm_last_error(), want),
            "all_reduce, deterministic on rank 0 only, gave %s (%s)", hcomm_result_name(r),
            hcomm_last_error());
    r = hcomm_reduce_scatter(w, v, v, 16 / (size_t)t_size(w), HCOMM_F32, HCOMM_SUM);
    T_CHECK(r == HCOMM_ERR_MISMATCH && strstr(hcomm_last_error(), want),
            "reduce_scatter, deterministic on rank 0 only, gave %s (%s)", hcomm_result_name(r),
            hcomm_last_error());
    return hcomm_comm_set_deterministic(w, 0);
}

static hcomm_result_t nothing(hcomm_comm_t *w, void *arg) {
    (void)w;
    (void)arg;
    return HCOMM_OK;
}

static void environment(void) {
    T_ERR(hcomm_comm_set_deterministic(NULL, 1), HCOMM_ERR_NULL);
    setenv("HCOMM_DETERMINISTIC", "yes", 1);
    hcomm_result_t r = hcomm_launch(t_backend(), strcmp(t_backend(), "mpi") ? 2 : 0, nothing, NULL);
    T_CHECK(r == HCOMM_ERR_INVALID_ARG && strstr(hcomm_last_error(), "HCOMM_DETERMINISTIC=\"yes\""),
            "HCOMM_DETERMINISTIC=yes gave %s (%s)", hcomm_result_name(r), hcomm_last_error());
    setenv("HCOMM_DETERMINISTIC", "1", 1);
    t_for_each_world(can_fail, (void *)1, 5); /* on without a call: the serial bits */
    unsetenv("HCOMM_DETERMINISTIC");
}

int main(void) {
    /* HCOMM_TEST_MPI */
    full = getenv("HCOMM_TEST_FULL") && strcmp(getenv("HCOMM_TEST_FULL"), "1") == 0;
    const char *env = getenv("HCOMM_DETERMINISTIC");
    if (env && env[0]) /* this test sets the mode itself */
        unsetenv("HCOMM_DETERMINISTIC");
    t_for_each_world(every_case, NULL, 9);
    t_for_each_world(long_vectors, NULL, 3);
    t_for_each_world(can_fail, NULL, 5);
    t_for_each_world(inherits, NULL, 7);
    t_for_each_world(differ, NULL, 3);
    t_for_each_world(nonblocking, NULL, 4);
    environment();
    return t_finish("test_determinism");
}
