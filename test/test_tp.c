/* Tensor-parallel primitives against serial references. HCOMM_TEST_MPI
 * Every rank can compute every other rank's input from (rank, flat index), so each rank checks
 * its own result against a reference built locally. Values are small integers: every dtype
 * holds them and every reduction order gives the same result. */
#include "harness.h"

#include "core/internal.h"

#define MAX_WORLD 8

typedef struct shape {
    int ndim;
    int64_t s[4];
} shape_t;

/* 1-D to 4-D, with zero extents and extents that are not multiples of anything useful. */
static const shape_t SHAPES[] = {
    {1, {5}},       {1, {0}},       {2, {3, 2}},       {2, {0, 3}},
    {3, {2, 3, 1}}, {3, {2, 0, 2}}, {4, {2, 1, 3, 2}}, {4, {1, 2, 2, 3}},
};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

static double val(int rank, size_t i, hcomm_dtype_t dt) {
    int v = (int)(((size_t)rank * 5 + i * 3) % 11) - 5;
    return dt == HCOMM_U8 ? v + 5 : v;
}

static double reduce_ref(hcomm_op_t op, double acc, double v) {
    switch (op) {
    case HCOMM_MAX:
        return acc > v ? acc : v;
    case HCOMM_MIN:
        return acc < v ? acc : v;
    default:
        return acc + v;
    }
}

static size_t numel(const shape_t *sh) {
    size_t n = 1;
    for (int i = 0; i < sh->ndim; i++)
        n *= (size_t)sh->s[i];
    return n;
}

static void unravel(size_t flat, const shape_t *sh, int64_t *c) {
    for (int i = sh->ndim - 1; i >= 0; i--) {
        c[i] = (int64_t)(flat % (size_t)sh->s[i]);
        flat /= (size_t)sh->s[i];
    }
}

static size_t ravel(const int64_t *c, const shape_t *sh) {
    size_t f = 0;
    for (int i = 0; i < sh->ndim; i++)
        f = f * (size_t)sh->s[i] + (size_t)c[i];
    return f;
}

static shape_t scaled(const shape_t *sh, int d, int k) {
    shape_t r = *sh;
    r.s[d] *= k;
    return r;
}

static hcomm_tensor_t make(hcomm_dtype_t dt, const shape_t *sh) {
    hcomm_tensor_t t;
    hcomm_tensor_init(&t, calloc(numel(sh) * 8 + 1, 1), dt, sh->ndim, sh->s);
    return t;
}

/* This rank's input over shape sh: val(rank, flat index). */
static hcomm_tensor_t make_input(hcomm_dtype_t dt, const shape_t *sh, int rank) {
    hcomm_tensor_t t = make(dt, sh);
    for (size_t i = 0; i < numel(sh); i++)
        t_set_val(dt, t.data, i, val(rank, i, dt));
    return t;
}

/* One check per tensor: reports the first element that differs from ref. */
static void expect_values(const hcomm_tensor_t *t, const double *ref, size_t n, const char *what,
                          int dim, int p) {
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (t_get_val(t->dtype, t->data, i) != ref[i])
            bad = i;
    T_CHECK(bad == n, "%s dtype %d dim %d size %d: element %zu is %g, expected %g", what,
            (int)t->dtype, dim, p, bad, bad < n ? t_get_val(t->dtype, t->data, bad) : 0.0,
            bad < n ? ref[bad] : 0.0);
}

/* gathered[c] = input of rank c[d] / base[d] at c with c[d] taken mod base[d]. */
static void ref_gather(const shape_t *base, int d, int p, hcomm_dtype_t dt, double *ref) {
    shape_t out = scaled(base, d, p);
    int64_t c[4] = {0};
    for (size_t i = 0; i < numel(&out); i++) {
        unravel(i, &out, c);
        int src = (int)(c[d] / base->s[d]);
        c[d] %= base->s[d];
        ref[i] = val(src, ravel(c, base), dt);
    }
}

/* This rank's slice: input of in_rank (or op over all ranks when op >= 0) at c[d] + rank*k. */
static void ref_slice(const shape_t *base, int d, int p, int rank, hcomm_dtype_t dt, int op,
                      int in_rank, double *ref) {
    shape_t in = scaled(base, d, p);
    int64_t c[4] = {0};
    for (size_t i = 0; i < numel(base); i++) {
        unravel(i, base, c);
        c[d] += rank * base->s[d];
        size_t f = ravel(c, &in);
        if (op < 0) {
            ref[i] = val(in_rank, f, dt);
            continue;
        }
        double acc = val(0, f, dt);
        for (int r = 1; r < p; r++)
            acc = reduce_ref((hcomm_op_t)op, acc, val(r, f, dt));
        ref[i] = op == HCOMM_AVG ? t_avg_ref(dt, acc, p) : acc;
    }
}

static void check_gather(hcomm_comm_t *g, const shape_t *base, int d, int dim, hcomm_dtype_t dt) {
    int p = t_size(g);
    shape_t osh = scaled(base, d, p);
    hcomm_tensor_t in = make_input(dt, base, t_rank(g)), out = make(dt, &osh);
    double *ref = calloc(numel(&osh) + 1, sizeof *ref);
    T_OK(hcomm_tp_all_gather(g, &in, &out, dim));
    ref_gather(base, d, p, dt, ref);
    expect_values(&out, ref, numel(&osh), "all_gather", dim, p);
    free(ref);
    free(in.data);
    free(out.data);
}

static void check_reduce_scatter(hcomm_comm_t *g, const shape_t *base, int d, int dim,
                                 hcomm_dtype_t dt, hcomm_op_t op) {
    int p = t_size(g);
    shape_t ish = scaled(base, d, p);
    hcomm_tensor_t in = make_input(dt, &ish, t_rank(g)), out = make(dt, base);
    double *ref = calloc(numel(base) + 1, sizeof *ref);
    T_OK(hcomm_tp_reduce_scatter(g, &in, &out, dim, op));
    ref_slice(base, d, p, t_rank(g), dt, (int)op, 0, ref);
    expect_values(&out, ref, numel(base), "reduce_scatter", dim, p);
    free(ref);
    free(in.data);
    free(out.data);
}

static void check_split(hcomm_comm_t *g, const shape_t *base, int d, int dim, hcomm_dtype_t dt) {
    int p = t_size(g);
    shape_t ish = scaled(base, d, p);
    hcomm_tensor_t in = make_input(dt, &ish, t_rank(g)), out = make(dt, base);
    double *ref = calloc(numel(base) + 1, sizeof *ref);
    T_OK(hcomm_tp_split(g, &in, &out, dim));
    ref_slice(base, d, p, t_rank(g), dt, -1, t_rank(g), ref);
    expect_values(&out, ref, numel(base), "split", dim, p);
    free(ref);
    free(in.data);
    free(out.data);
}

/* Every shape, every dim (as d and as d - ndim), every dtype. */
static void test_gather_scatter_split(hcomm_comm_t *g) {
    for (int s = 0; s < NSHAPES; s++)
        for (int d = 0; d < SHAPES[s].ndim; d++)
            for (int dt = 0; dt < HCOMM_DTYPE_COUNT; dt++) {
                int dim = (dt % 2) ? d - SHAPES[s].ndim : d; /* alternate negative dims */
                check_gather(g, &SHAPES[s], d, dim, (hcomm_dtype_t)dt);
                check_gather(g, &SHAPES[s], d, d - SHAPES[s].ndim, (hcomm_dtype_t)dt);
                check_reduce_scatter(g, &SHAPES[s], d, dim, (hcomm_dtype_t)dt, HCOMM_SUM);
                check_split(g, &SHAPES[s], d, dim, (hcomm_dtype_t)dt);
                check_split(g, &SHAPES[s], d, d - SHAPES[s].ndim, (hcomm_dtype_t)dt);
            }
}

/* The op reaches the backend: MAX, MIN and AVG on an inner dim, every dtype. */
static void test_reduce_scatter_ops(hcomm_comm_t *g) {
    const hcomm_op_t ops[] = {HCOMM_MAX, HCOMM_MIN, HCOMM_AVG};
    for (int o = 0; o < 3; o++)
        for (int dt = 0; dt < HCOMM_DTYPE_COUNT; dt++)
            check_reduce_scatter(g, &SHAPES[4], 1, -2, (hcomm_dtype_t)dt, ops[o]);
}

static void check_all_reduce(hcomm_comm_t *g, hcomm_dtype_t dt, hcomm_op_t op, bool in_place) {
    const shape_t sh = {3, {2, 3, 4}};
    hcomm_tensor_t in = make_input(dt, &sh, t_rank(g)), out = make(dt, &sh);
    hcomm_tensor_t *dst = in_place ? &in : &out;
    double ref[24];
    T_OK(hcomm_tp_all_reduce(g, &in, dst, op));
    for (size_t i = 0; i < 24; i++) {
        double acc = val(0, i, dt);
        for (int r = 1; r < t_size(g); r++)
            acc = reduce_ref(op, acc, val(r, i, dt));
        ref[i] = op == HCOMM_AVG ? t_avg_ref(dt, acc, t_size(g)) : acc;
    }
    expect_values(dst, ref, 24, in_place ? "all_reduce in place" : "all_reduce", 0, t_size(g));
    free(in.data);
    free(out.data);
}

static void test_all_reduce(hcomm_comm_t *g) {
    for (int dt = 0; dt < HCOMM_DTYPE_COUNT; dt++) {
        check_all_reduce(g, (hcomm_dtype_t)dt, HCOMM_SUM, false);
        check_all_reduce(g, (hcomm_dtype_t)dt, HCOMM_SUM, true);
        check_all_reduce(g, (hcomm_dtype_t)dt, HCOMM_MAX, true);
        check_all_reduce(g, (hcomm_dtype_t)dt, HCOMM_AVG, false);
    }
    hcomm_tensor_t empty = make(HCOMM_F32, &SHAPES[1]);
    T_OK(hcomm_tp_all_reduce(g, &empty, &empty, HCOMM_SUM));
    free(empty.data);
}

/* Each region mapping's forward and backward against its definition in mappings.py. */
static void test_regions(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g);
    const shape_t part = {2, {2, 3}};
    shape_t full = scaled(&part, 1, p);
    size_t np = numel(&part), nf = numel(&full);
    double *ref = calloc(nf, sizeof *ref);
    hcomm_tensor_t x = make_input(HCOMM_F32, &part, rank), y = make(HCOMM_F32, &part);
    hcomm_tensor_t xf = make_input(HCOMM_F32, &full, rank), yf = make(HCOMM_F32, &full);

    for (size_t i = 0; i < np; i++)
        ref[i] = val(rank, i, HCOMM_F32);
    T_OK(hcomm_tp_copy_to_fwd(g, &x, &y));
    expect_values(&y, ref, np, "copy_to_fwd", 0, p);
    T_OK(hcomm_tp_reduce_from_bwd(g, &x, &y));
    expect_values(&y, ref, np, "reduce_from_bwd", 0, p);

    for (size_t i = 0; i < np; i++) {
        ref[i] = 0;
        for (int r = 0; r < p; r++)
            ref[i] += val(r, i, HCOMM_F32);
    }
    T_OK(hcomm_tp_copy_to_bwd(g, &x, &y));
    expect_values(&y, ref, np, "copy_to_bwd", 0, p);
    T_OK(hcomm_tp_reduce_from_fwd(g, &x, &y));
    expect_values(&y, ref, np, "reduce_from_fwd", 0, p);

    ref_slice(&part, 1, p, rank, HCOMM_F32, -1, rank, ref);
    T_OK(hcomm_tp_scatter_to_fwd(g, &xf, &y, -1));
    expect_values(&y, ref, np, "scatter_to_fwd", -1, p);
    T_OK(hcomm_tp_gather_from_bwd(g, &xf, &y, 1));
    expect_values(&y, ref, np, "gather_from_bwd", 1, p);

    ref_gather(&part, 1, p, HCOMM_F32, ref);
    T_OK(hcomm_tp_scatter_to_bwd(g, &x, &yf, 1));
    expect_values(&yf, ref, nf, "scatter_to_bwd", 1, p);
    T_OK(hcomm_tp_gather_from_fwd(g, &x, &yf, -1));
    expect_values(&yf, ref, nf, "gather_from_fwd", -1, p);

    /* A tensor replicated on every rank survives scatter then gather unchanged. */
    for (size_t i = 0; i < nf; i++)
        t_set_val(HCOMM_F32, xf.data, i, ref[i] = val(7, i, HCOMM_F32));
    T_OK(hcomm_tp_scatter_to_fwd(g, &xf, &y, 1));
    T_OK(hcomm_tp_scatter_to_bwd(g, &y, &yf, 1));
    expect_values(&yf, ref, nf, "scatter_to fwd+bwd round trip", 1, p);
    free(ref);
    free(x.data);
    free(y.data);
    free(xf.data);
    free(yf.data);
}

static void expect_error_text(const char *want) {
    T_CHECK(strstr(hcomm_last_error(), want) != NULL, "last error '%s' lacks '%s'",
            hcomm_last_error(), want);
}

/* Argument errors: the same on every rank, so no rank enters a collective. */
static void test_errors(hcomm_comm_t *g) {
    int p = t_size(g);
    const shape_t s27 = {2, {2, 7}}, s21 = {2, {2, 1}}, s214 = {2, {2, 14}};
    hcomm_tensor_t a = make(HCOMM_F32, &s27), b = make(HCOMM_F32, &s21);
    hcomm_tensor_t wide = make(HCOMM_F32, &s214), bi = make(HCOMM_I32, &s27);
    char want[160];
    if (7 % p != 0) {
        snprintf(want, sizeof want,
                 "hcomm_tp_reduce_scatter: in->shape[1]=7 is not divisible by group size %d", p);
        T_ERR(hcomm_tp_reduce_scatter(g, &a, &b, -1, HCOMM_SUM), HCOMM_ERR_SHAPE);
        T_CHECK(strcmp(hcomm_last_error(), want) == 0, "got '%s', expected '%s'",
                hcomm_last_error(), want);
        T_ERR(hcomm_tp_split(g, &a, &b, 1), HCOMM_ERR_SHAPE);
        expect_error_text("hcomm_tp_split: in->shape[1]=7 is not divisible by group size");
        T_ERR(hcomm_tp_gather_from_bwd(g, &a, &b, 1), HCOMM_ERR_SHAPE);
        expect_error_text("hcomm_tp_gather_from_bwd: grad_out->shape[1]=7 is not divisible");
    }
    T_ERR(hcomm_tp_all_reduce(g, &a, &bi, HCOMM_SUM), HCOMM_ERR_DTYPE);
    expect_error_text("hcomm_tp_all_reduce: in->dtype=f32 differs from out->dtype=i32");
    T_ERR(hcomm_tp_all_gather(g, &a, &a, 1), p == 1 ? HCOMM_OK : HCOMM_ERR_SHAPE);
    if (p != 2) {
        T_ERR(hcomm_tp_all_gather(g, &a, &wide, 1), HCOMM_ERR_SHAPE);
        expect_error_text("hcomm_tp_all_gather: out shape [2, 14], expected [2, ");
    }
    T_ERR(hcomm_tp_all_gather(g, &a, &wide, 2), HCOMM_ERR_INVALID_ARG);
    expect_error_text("dim=2 out of range for in->ndim=2");
    T_ERR(hcomm_tp_scatter_to_bwd(g, &a, &wide, -3), HCOMM_ERR_INVALID_ARG);
    expect_error_text("hcomm_tp_scatter_to_bwd: dim=-3 out of range for grad_out->ndim=2");
    T_ERR(hcomm_tp_all_reduce(g, &a, &a, (hcomm_op_t)17), HCOMM_ERR_INVALID_ARG);
    expect_error_text("op=17");
    T_ERR(hcomm_tp_all_reduce(g, &a, &b, HCOMM_SUM), HCOMM_ERR_SHAPE);
    T_ERR(hcomm_tp_copy_to_fwd(g, &a, &b), HCOMM_ERR_SHAPE);
    T_ERR(hcomm_tp_all_reduce(NULL, &a, &a, HCOMM_SUM), HCOMM_ERR_NULL);
    expect_error_text("'group'");
    T_ERR(hcomm_tp_split(g, NULL, &b, 0), HCOMM_ERR_NULL);
    T_ERR(hcomm_tp_reduce_from_bwd(g, &a, NULL), HCOMM_ERR_NULL);
    expect_error_text("hcomm_tp_reduce_from_bwd: argument 'grad_in' is NULL");
    /* all_gather and split have no in-place form: one buffer for in and out is refused (it
     * returned wrong data) on every rank alike, except in a group of one. */
    const shape_t s2p7 = {2, {2 * p, 7}};
    hcomm_tensor_t tall = make(HCOMM_F32, &s2p7), head = make(HCOMM_F32, &s27);
    free(head.data);
    head.data = tall.data;
    T_ERR(hcomm_tp_all_gather(g, &head, &tall, 0), p == 1 ? HCOMM_OK : HCOMM_ERR_INVALID_ARG);
    if (p > 1)
        expect_error_text("hcomm_tp_all_gather: in->data and out->data are the same buffer");
    T_ERR(hcomm_tp_split(g, &tall, &head, 0), p == 1 ? HCOMM_OK : HCOMM_ERR_INVALID_ARG);
    if (p > 1)
        expect_error_text("hcomm_tp_split: in->data and out->data are the same buffer");
    free(tall.data);
    hcomm_tensor_t nodata = a;
    nodata.data = NULL;
    T_ERR(hcomm_tp_all_gather(g, &nodata, &wide, 1), HCOMM_ERR_NULL);
    expect_error_text("in->data is NULL with 14 elements");
    free(a.data);
    free(b.data);
    free(wide.data);
    free(bi.data);
}

/* On a split group (members in reverse world order) the group rank, not the world rank,
 * decides the slot: all_gather along dim 1 places member i's block at i. */
static void test_subgroup(hcomm_comm_t *world) {
    hcomm_comm_t *g = NULL;
    T_OK(hcomm_comm_split(world, t_rank(world) % 2, -t_rank(world), &g));
    if (g == NULL)
        return;
    int members[MAX_WORLD];
    T_OK(hcomm_comm_members(g, members, MAX_WORLD));
    const shape_t part = {2, {2, 2}};
    shape_t full = scaled(&part, 1, t_size(g));
    hcomm_tensor_t in = make_input(HCOMM_I64, &part, t_rank(world)), out = make(HCOMM_I64, &full);
    T_OK(hcomm_tp_all_gather(g, &in, &out, 1));
    double ref[2 * 2 * MAX_WORLD];
    int64_t c[4] = {0};
    for (size_t i = 0; i < numel(&full); i++) {
        unravel(i, &full, c);
        int src = members[c[1] / 2];
        c[1] %= 2;
        ref[i] = val(src, ravel(c, &part), HCOMM_I64);
    }
    expect_values(&out, ref, numel(&full), "subgroup all_gather", 1, t_size(g));
    T_EQ_INT(members[t_rank(g)], t_rank(world));
    free(in.data);
    free(out.data);
    T_OK(hcomm_comm_destroy(g));
}

static hcomm_result_t tp_world(hcomm_comm_t *world, void *arg) {
    (void)arg;
    test_gather_scatter_split(world);
    test_reduce_scatter_ops(world);
    test_all_reduce(world);
    test_regions(world);
    test_errors(world);
    test_subgroup(world);
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(tp_world, NULL, MAX_WORLD);
    return t_finish("test_tp");
}
