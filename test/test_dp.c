/* Bucketed data-parallel gradient all-reduce against a serial reference. HCOMM_TEST_MPI
 * Mixed dtypes and sizes (with empty tensors and one larger than the small buckets), bucket
 * sizes from "every tensor alone" to "everything in one bucket", SUM and AVG. */
#include "harness.h"

#include "core/internal.h"

#define MAX_WORLD 8

typedef struct grad_spec {
    hcomm_dtype_t dt;
    int ndim;
    int64_t shape[3];
} grad_spec_t;

static const grad_spec_t SPECS[] = {
    {HCOMM_F32, 1, {5}},      {HCOMM_I32, 2, {3, 2}}, {HCOMM_F32, 1, {0}},
    {HCOMM_F64, 1, {7}},      {HCOMM_F32, 2, {2, 3}}, {HCOMM_BF16, 1, {4}},
    {HCOMM_I32, 1, {10}},     {HCOMM_F32, 0, {0}},    {HCOMM_I8, 3, {1, 2, 3}},
    {HCOMM_F16, 1, {3}},      {HCOMM_U8, 1, {5}},     {HCOMM_I64, 2, {2, 2}},
    {HCOMM_F32, 2, {10, 10}}, {HCOMM_F64, 1, {1}},    {HCOMM_I32, 2, {0, 4}},
};
#define NSPECS (int)(sizeof SPECS / sizeof SPECS[0])

static double val(int rank, int t, size_t i, hcomm_dtype_t dt) {
    int v = (int)(((size_t)rank * 7 + (size_t)t * 5 + i * 3) % 11) - 5;
    return dt == HCOMM_U8 ? v + 5 : v;
}

static size_t numel(const hcomm_tensor_t *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

/* This rank's gradients: SPECS in order, tensor t filled with val(rank, t, i). */
static void make_grads(hcomm_tensor_t *g, int rank) {
    for (int t = 0; t < NSPECS; t++) {
        hcomm_tensor_init(&g[t], NULL, SPECS[t].dt, SPECS[t].ndim, SPECS[t].shape);
        g[t].data = calloc(numel(&g[t]) * 8 + 1, 1);
        for (size_t i = 0; i < numel(&g[t]); i++)
            t_set_val(g[t].dtype, g[t].data, i, val(rank, t, i, g[t].dtype));
    }
}

static void expect_reduced(const hcomm_tensor_t *g, int p, hcomm_op_t op, size_t bucket) {
    for (int t = 0; t < NSPECS; t++) {
        size_t n = numel(&g[t]), bad = n;
        double got = 0, want = 0;
        for (size_t i = 0; i < n && bad == n; i++) {
            double sum = 0;
            for (int r = 0; r < p; r++)
                sum += val(r, t, i, g[t].dtype);
            want = op == HCOMM_AVG ? t_avg_ref(g[t].dtype, sum, p) : sum;
            got = t_get_val(g[t].dtype, g[t].data, i);
            if (got != want)
                bad = i;
        }
        T_CHECK(bad == n,
                "grads[%d] (dtype %d) op %d bucket %zu size %d: element %zu is %g, "
                "expected %g",
                t, (int)g[t].dtype, (int)op, bucket, p, bad, got, want);
    }
}

static void test_buckets(hcomm_comm_t *g) {
    const size_t buckets[] = {0, 1, 8, 20, 24, 64, 399, 400, 1 << 20};
    const hcomm_op_t ops[] = {HCOMM_SUM, HCOMM_AVG};
    hcomm_tensor_t grads[NSPECS];
    for (int o = 0; o < 2; o++)
        for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++) {
            make_grads(grads, t_rank(g));
            T_OK(hcomm_dp_all_reduce_grads(g, grads, NSPECS, ops[o], buckets[b]));
            expect_reduced(grads, t_size(g), ops[o], buckets[b]);
            for (int t = 0; t < NSPECS; t++)
                free(grads[t].data);
        }
}

/* A single tensor, and the list as prefixes: the bucket walk ends right at any length. */
static void test_prefixes(hcomm_comm_t *g) {
    hcomm_tensor_t grads[NSPECS];
    for (int n = 0; n <= NSPECS; n++) {
        make_grads(grads, t_rank(g));
        T_OK(hcomm_dp_all_reduce_grads(g, n ? grads : NULL, n, HCOMM_SUM, 24));
        for (int t = 0; t < NSPECS; t++) {
            size_t bad = numel(&grads[t]);
            for (size_t i = 0; i < numel(&grads[t]) && bad == numel(&grads[t]); i++) {
                double want = 0;
                for (int r = 0; r < (t < n ? t_size(g) : 1); r++)
                    want += val(t < n ? r : t_rank(g), t, i, grads[t].dtype);
                if (t_get_val(grads[t].dtype, grads[t].data, i) != want)
                    bad = i;
            }
            T_CHECK(bad == numel(&grads[t]), "prefix n=%d: grads[%d] element %zu wrong", n, t, bad);
            free(grads[t].data);
        }
    }
}

static void expect_error_text(const char *want) {
    T_CHECK(strstr(hcomm_last_error(), want) != NULL, "last error '%s' lacks '%s'",
            hcomm_last_error(), want);
}

static void test_errors(hcomm_comm_t *g) {
    hcomm_tensor_t grads[NSPECS];
    make_grads(grads, t_rank(g));
    T_ERR(hcomm_dp_all_reduce_grads(g, grads, NSPECS, HCOMM_MAX, 0), HCOMM_ERR_INVALID_ARG);
    expect_error_text("hcomm_dp_all_reduce_grads: op=2 is not HCOMM_SUM or HCOMM_AVG");
    T_ERR(hcomm_dp_all_reduce_grads(g, grads, -1, HCOMM_SUM, 0), HCOMM_ERR_INVALID_ARG);
    expect_error_text("n=-1");
    T_ERR(hcomm_dp_all_reduce_grads(g, NULL, 2, HCOMM_SUM, 0), HCOMM_ERR_NULL);
    T_ERR(hcomm_dp_all_reduce_grads(NULL, grads, 2, HCOMM_SUM, 0), HCOMM_ERR_NULL);
    void *keep = grads[3].data;
    grads[3].data = NULL;
    T_ERR(hcomm_dp_all_reduce_grads(g, grads, NSPECS, HCOMM_SUM, 0), HCOMM_ERR_NULL);
    expect_error_text("grads[3]->data is NULL with 7 elements");
    grads[3].data = keep;
    grads[5].dtype = (hcomm_dtype_t)99;
    T_ERR(hcomm_dp_all_reduce_grads(g, grads, NSPECS, HCOMM_AVG, 0), HCOMM_ERR_DTYPE);
    expect_error_text("grads[5]->dtype=99");
    grads[5].dtype = HCOMM_BF16;
    grads[1].shape[0] = -2;
    T_ERR(hcomm_dp_all_reduce_grads(g, grads, NSPECS, HCOMM_SUM, 0), HCOMM_ERR_SHAPE);
    expect_error_text("grads[1]->shape[0]=-2");
    for (int t = 0; t < NSPECS; t++)
        free(grads[t].data);
}

/* A call that fails on one rank ends there on every rank, though the others have nothing to
 * reduce (n = 0, no bucket): the next call runs clean. */
static void test_one_rank_fails(hcomm_comm_t *g) {
    if (t_size(g) < 2)
        return;
    bool bad = t_rank(g) == 1;
    T_ERR(hcomm_dp_all_reduce_grads(g, NULL, bad ? -1 : 0, HCOMM_SUM, 0),
          bad ? HCOMM_ERR_INVALID_ARG : HCOMM_ERR_PEER);
    T_OK(hcomm_barrier(g));
    hcomm_tensor_t grads[NSPECS];
    make_grads(grads, t_rank(g));
    T_ERR(hcomm_dp_all_reduce_grads(g, grads, bad ? NSPECS : 0, HCOMM_SUM, 0), HCOMM_ERR_MISMATCH);
    T_OK(hcomm_barrier(g));
    for (int t = 0; t < NSPECS; t++)
        free(grads[t].data);
}

static hcomm_result_t dp_world(hcomm_comm_t *world, void *arg) {
    (void)arg;
    test_buckets(world);
    test_prefixes(world);
    test_errors(world);
    test_one_rank_fails(world);
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(dp_world, NULL, MAX_WORLD);
    return t_finish("test_dp");
}
