/* Sequence-parallel TP regions (tp.h) against serial references. HCOMM_TEST_MPI
 * Rank q's tensors hold val(q, flat index), so every rank builds the reference of its own
 * result locally; small integers keep every dtype and every summation order exact. */
#include "harness.h"

#include <stdbool.h>

#define MAX_WORLD 8

static double val(int rank, size_t i, hcomm_dtype_t dt) {
    int v = (int)(((size_t)rank * 7 + i * 5) % 13) - 6;
    return dt == HCOMM_U8 ? v + 6 : v;
}

static hcomm_tensor_t make(hcomm_dtype_t dt, int ndim, const int64_t *s, int rank) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)s[i];
    hcomm_tensor_t t;
    hcomm_tensor_init(&t, calloc(n * 8 + 1, 1), dt, ndim, s);
    for (size_t i = 0; rank >= 0 && i < n; i++)
        t_set_val(dt, t.data, i, val(rank, i, dt));
    return t;
}

static size_t numel(const hcomm_tensor_t *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

static void expect(const hcomm_tensor_t *t, const double *ref, const char *what, int p) {
    size_t n = numel(t), bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (t_get_val(t->dtype, t->data, i) != ref[i])
            bad = i;
    T_CHECK(bad == n, "%s dtype %d size %d: element %zu is %g, expected %g", what, (int)t->dtype, p,
            bad, bad < n ? t_get_val(t->dtype, t->data, bad) : 0.0, bad < n ? ref[bad] : 0.0);
}

/* The full tensor [a, p*s, b] viewed along dim 1: element i of rank r's part is full
 * element full_of(i). */
static size_t full_of(size_t i, int r, int p, const int64_t *part) {
    size_t b = (size_t)part[2], s = (size_t)part[1];
    size_t o = i / (s * b), t = (i / b) % s, k = i % b;
    return (o * s * (size_t)p + (size_t)r * s + t) * b + k;
}

typedef hcomm_result_t (*region_fn)(hcomm_comm_t *, const hcomm_tensor_t *, hcomm_tensor_t *, int);

/* part -> full by all_gather: full[j] = val(owner of j, its index in the owner's part). */
static void check_gather(hcomm_comm_t *g, region_fn fn, const char *what, hcomm_dtype_t dt,
                         const int64_t *part) {
    int p = t_size(g), r = t_rank(g);
    const int64_t full[3] = {part[0], part[1] * p, part[2]};
    hcomm_tensor_t in = make(dt, 3, part, r), out = make(dt, 3, full, -1);
    size_t np = numel(&in);
    double *ref = calloc(numel(&out) + 1, sizeof *ref);
    for (int q = 0; q < p; q++)
        for (size_t i = 0; i < np; i++)
            ref[full_of(i, q, p, part)] = val(q, i, dt);
    T_OK(fn(g, &in, &out, 1));
    expect(&out, ref, what, p);
    free(ref);
    free(in.data);
    free(out.data);
}

/* full -> part by reduce_scatter(sum) (or split, when split is set). */
static void check_scatter(hcomm_comm_t *g, region_fn fn, const char *what, hcomm_dtype_t dt,
                          const int64_t *part, bool split) {
    int p = t_size(g), r = t_rank(g);
    const int64_t full[3] = {part[0], part[1] * p, part[2]};
    hcomm_tensor_t in = make(dt, 3, full, r), out = make(dt, 3, part, -1);
    size_t np = numel(&out);
    double *ref = calloc(np + 1, sizeof *ref);
    for (size_t i = 0; i < np; i++)
        for (int q = 0; q < p; q++)
            ref[i] += split && q != r ? 0 : val(q, full_of(i, r, p, part), dt);
    T_OK(fn(g, &in, &out, -2));
    expect(&out, ref, what, p);
    free(ref);
    free(in.data);
    free(out.data);
}

static void test_regions(hcomm_comm_t *g) {
    const int64_t parts[3][3] = {{2, 3, 4}, {1, 2, 1}, {3, 0, 2}};
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < HCOMM_DTYPE_COUNT; d++) {
            hcomm_dtype_t dt = (hcomm_dtype_t)d;
            check_gather(g, hcomm_tp_gather_from_sp_fwd, "gather_from_sp_fwd", dt, parts[s]);
            check_gather(g, hcomm_tp_reduce_scatter_to_sp_bwd, "reduce_scatter_to_sp_bwd", dt,
                         parts[s]);
            check_gather(g, hcomm_tp_scatter_to_sp_bwd, "scatter_to_sp_bwd", dt, parts[s]);
            check_scatter(g, hcomm_tp_gather_from_sp_bwd, "gather_from_sp_bwd", dt, parts[s],
                          false);
            check_scatter(g, hcomm_tp_reduce_scatter_to_sp_fwd, "reduce_scatter_to_sp_fwd", dt,
                          parts[s], false);
            check_scatter(g, hcomm_tp_scatter_to_sp_fwd, "scatter_to_sp_fwd", dt, parts[s], true);
        }
}

/* The messages name the region call and its gradient arguments. */
static void test_errors(hcomm_comm_t *g) {
    int p = t_size(g);
    const int64_t odd[2] = {2 * p + 1, 3}, one[2] = {2, 3};
    hcomm_tensor_t a = make(HCOMM_F32, 2, odd, 0), b = make(HCOMM_F32, 2, one, 0);
    if (p > 1) {
        T_ERR(hcomm_tp_gather_from_sp_bwd(g, &a, &b, 0), HCOMM_ERR_SHAPE);
        T_CHECK(strstr(hcomm_last_error(), "hcomm_tp_gather_from_sp_bwd: grad_out->shape[0]=") !=
                    NULL,
                "got '%s'", hcomm_last_error());
        T_ERR(hcomm_tp_scatter_to_sp_fwd(g, &a, &b, 0), HCOMM_ERR_SHAPE);
        T_CHECK(strstr(hcomm_last_error(), "is not divisible by group size") != NULL, "got '%s'",
                hcomm_last_error());
    }
    T_ERR(hcomm_tp_reduce_scatter_to_sp_bwd(g, &b, &a, 3), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), "hcomm_tp_reduce_scatter_to_sp_bwd: dim=3") != NULL,
            "got '%s'", hcomm_last_error());
    free(a.data);
    free(b.data);
}

static hcomm_result_t sp_world(hcomm_comm_t *world, void *arg) {
    (void)arg;
    test_regions(world);
    test_errors(world);
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(sp_world, NULL, MAX_WORLD);
    return t_finish("test_tp_sp");
}
