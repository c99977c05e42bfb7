/* Reductions users can trust (issue 6, section 1b), with the issue's own examples, on every
 * algorithm that reduces (the default, and each one forced with hcomm_comm_set_algo):
 *   - 8 ranks' bf16 SUM of 1.0 and seven 2^-8, the 1.0 on rank i % size for element i: every
 *     element gives the bits of the f32 sum rounded once, wherever the 1.0 sits;
 *   - 3 ranks' f32 MIN / MAX of {1, NaN, 3} (and f64, f16, bf16) is NaN whichever rank holds it;
 *   - 3 ranks' f16 AVG of 40000 is 40000 (the f16 sum, 120000, would overflow);
 *   - i8 AVG of 100 is the sum wrapped in i8, divided (integers keep their documented wrap).
 * Under mpirun (HCOMM_TEST_MPI) the same checks run on the job's processes. */
#include "algo/coll.h"
#include "harness.h"

#include <math.h>
#include <stdint.h>

static const char *const specs[] = {
    "", "allreduce:native", "allreduce:rd", "allreduce:ring", "allreduce:rhd", "allreduce:naive"};
enum { NSPECS = sizeof specs / sizeof specs[0], COUNT = 1000 };

/* Element i: 1.0 on rank i % p, 2^-8 elsewhere; the exact sum 1 + (p-1)/256 rounded once. */
static hcomm_result_t bf16_positions(hcomm_comm_t *w, const char *spec, size_t count) {
    int p = t_size(w), me = t_rank(w);
    uint16_t *buf = malloc(count * sizeof *buf);
    T_CHECK(buf != NULL, "out of memory");
    if (!buf)
        return HCOMM_ERR_NOMEM;
    for (size_t i = 0; i < count; i++)
        buf[i] = hcomm__f32_to_bf16((int)(i % (size_t)p) == me ? 1.0f : 0x1p-8f);
    hcomm_result_t r = hcomm_all_reduce(w, buf, buf, count, HCOMM_BF16, HCOMM_SUM);
    T_CHECK(r == HCOMM_OK, "bf16 sum (%s): %s (%s)", spec, hcomm_result_name(r),
            hcomm_last_error());
    uint16_t want = hcomm__f32_to_bf16(1.0f + (float)(p - 1) * 0x1p-8f);
    size_t bad = 0;
    while (r == HCOMM_OK && bad < count && buf[bad] == want)
        bad++;
    T_CHECK(r != HCOMM_OK || bad == count,
            "bf16 sum of 1 and %d x 2^-8 on %d ranks (%s): element %zu is %.9g (0x%04x), "
            "expected %.9g (0x%04x)",
            p - 1, p, spec[0] ? spec : "default", bad, (double)hcomm__bf16_to_f32(buf[bad % count]),
            buf[bad % count], (double)hcomm__bf16_to_f32(want), want);
    free(buf);
    return r;
}

static double value_of(hcomm_dtype_t dt, const void *b) {
    return t_get_val(dt, b, 0);
}

/* MIN and MAX of {1, NaN, 3, 4, ...} with the NaN on rank nan_rank: NaN on every rank. */
static hcomm_result_t nan_case(hcomm_comm_t *w, hcomm_dtype_t dt, hcomm_op_t op, int nan_rank,
                               const char *spec) {
    int me = t_rank(w);
    _Alignas(8) unsigned char v[8];
    t_set_val(dt, v, 0, me == nan_rank ? NAN : me == 0 ? 1.0 : (double)(me + 2));
    if (me == nan_rank && dt == HCOMM_F32) { /* exactly the f32 NaN */
        float f = NAN;
        memcpy(v, &f, 4);
    }
    hcomm_result_t r = hcomm_all_reduce(w, v, v, 1, dt, op);
    const char *dname = "?";
    hcomm_dtype_name(dt, &dname);
    T_CHECK(r == HCOMM_OK, "%s %s: %s (%s)", dname, op == HCOMM_MIN ? "min" : "max",
            hcomm_result_name(r), hcomm_last_error());
    T_CHECK(r != HCOMM_OK || isnan(value_of(dt, v)),
            "%s %s on %d ranks with the NaN on rank %d (%s): got %g, expected NaN", dname,
            op == HCOMM_MIN ? "min" : "max", t_size(w), nan_rank, spec[0] ? spec : "default",
            value_of(dt, v));
    return r;
}

static hcomm_result_t nan_all(hcomm_comm_t *w, const char *spec) {
    static const hcomm_dtype_t dts[] = {HCOMM_F32, HCOMM_F64, HCOMM_F16, HCOMM_BF16};
    for (int nan_rank = 0; nan_rank < t_size(w); nan_rank++)
        for (int d = 0; d < 4; d++) {
            T_TRY(nan_case(w, dts[d], HCOMM_MIN, nan_rank, spec));
            T_TRY(nan_case(w, dts[d], HCOMM_MAX, nan_rank, spec));
        }
    return HCOMM_OK;
}

/* f16 AVG of 40000 on every rank is 40000 (sum, 120000 on 3 ranks, is past f16's 65504). */
static hcomm_result_t avg_f16(hcomm_comm_t *w, const char *spec) {
    uint16_t v[COUNT];
    for (size_t i = 0; i < COUNT; i++)
        v[i] = hcomm__f32_to_f16(40000.0f);
    hcomm_result_t r = hcomm_all_reduce(w, v, v, COUNT, HCOMM_F16, HCOMM_AVG);
    T_CHECK(r == HCOMM_OK, "f16 avg: %s (%s)", hcomm_result_name(r), hcomm_last_error());
    size_t i = 0;
    while (r == HCOMM_OK && i < COUNT && v[i] == hcomm__f32_to_f16(40000.0f))
        i++;
    T_CHECK(r != HCOMM_OK || i == COUNT,
            "f16 avg of 40000 on %d ranks (%s): element %zu is %g, expected 40000", t_size(w),
            spec[0] ? spec : "default", i, (double)hcomm__f16_to_f32(v[i % COUNT]));
    return r;
}

/* i8 AVG of 100 on every rank: the sum wraps in i8 as SUM does, then divides, truncating
 * (core.h): trunc(wrap(100 p) / p); 100 where the sum fits (p = 1). Every algorithm alike. */
static hcomm_result_t avg_i8(hcomm_comm_t *w, const char *spec) {
    int p = t_size(w);
    int8_t v[COUNT];
    memset(v, 100, sizeof v);
    int8_t want = (int8_t)((int8_t)(uint8_t)(100 * p) / p);
    hcomm_result_t r = hcomm_all_reduce(w, v, v, COUNT, HCOMM_I8, HCOMM_AVG);
    T_CHECK(r == HCOMM_OK, "i8 avg: %s (%s)", hcomm_result_name(r), hcomm_last_error());
    size_t i = 0;
    while (r == HCOMM_OK && i < COUNT && v[i] == want)
        i++;
    T_CHECK(r != HCOMM_OK || i == COUNT,
            "i8 avg of 100 on %d ranks (%s): element %zu is %d, expected %d", p,
            spec[0] ? spec : "default", i, v[i % COUNT], want);
    return r;
}

/* The same through reduce_scatter (native and ring) and reduce (tree): AVG of 40000. */
static hcomm_result_t avg_f16_rooted(hcomm_comm_t *w) {
    int p = t_size(w);
    uint16_t *v = malloc(sizeof(uint16_t) * 4 * (size_t)p), out[4];
    T_CHECK(v != NULL, "out of memory");
    if (!v)
        return HCOMM_ERR_NOMEM;
    for (int pass = 0; pass < 2; pass++) {
        T_TRY(hcomm_comm_set_algo(w, pass ? "reducescatter:ring" : ""));
        for (int i = 0; i < 4 * p; i++)
            v[i] = hcomm__f32_to_f16(40000.0f);
        T_OK(hcomm_reduce_scatter(w, v, out, 4, HCOMM_F16, HCOMM_AVG));
        T_CHECK(hcomm__f16_to_f32(out[3]) == 40000.0f,
                "reduce_scatter f16 avg of 40000 (%s): got %g", pass ? "ring" : "default",
                (double)hcomm__f16_to_f32(out[3]));
    }
    T_OK(hcomm_reduce(w, v, out, 4, HCOMM_F16, HCOMM_AVG, p - 1));
    T_CHECK(t_rank(w) != p - 1 || hcomm__f16_to_f32(out[0]) == 40000.0f,
            "reduce f16 avg of 40000: got %g", (double)hcomm__f16_to_f32(out[0]));
    free(v);
    return hcomm_comm_set_algo(w, "");
}

static hcomm_result_t run(hcomm_comm_t *w, void *arg) {
    (void)arg;
    for (int s = 0; s < NSPECS; s++) {
        T_TRY(hcomm_comm_set_algo(w, specs[s]));
        T_TRY(bf16_positions(w, specs[s], COUNT));
        T_TRY(nan_all(w, specs[s]));
        T_TRY(avg_f16(w, specs[s]));
        T_TRY(avg_i8(w, specs[s]));
    }
    /* Past the 2^20-element segments that f16/bf16 are widened in, on ring and the default. */
    T_TRY(bf16_positions(w, "", ((size_t)1 << 21) + 3));
    T_TRY(hcomm_comm_set_algo(w, "allreduce:ring"));
    T_TRY(bf16_positions(w, "allreduce:ring", ((size_t)1 << 21) + 3));
    return avg_f16_rooted(w);
}

int main(void) {
    /* HCOMM_TEST_MPI */
    if (strcmp(t_backend(), "mpi") == 0) {
        t_for_each_world(run, NULL, 0);
    } else {
        T_OK(hcomm_launch("local", 8, run, NULL)); /* the sizes */
        T_OK(hcomm_launch("local", 3, run, NULL));
        t_for_each_world(run, NULL, 5);
    }
    return t_finish("test_reduce_trust");
}
