/* The DDP-style reducer: buckets fixed at registration (reverse order), gradients marked ready
 * in a different order on every rank, buckets of 1 byte, of exactly one tensor and larger than
 * all, mixed dtypes, SUM and AVG, three steps in a row, and a list that differs between ranks.
 * Values are small integers, so the reference sum is exact in every dtype. HCOMM_TEST_MPI */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

enum { NG = 6 };

static const hcomm_dtype_t dts[NG] = {HCOMM_F32,  HCOMM_F32, HCOMM_F64,
                                      HCOMM_BF16, HCOMM_I32, HCOMM_F32};
static const int64_t lens[NG] = {5, 0, 17, 9, 4, 33};

static double val(int rank, int g, int64_t i, int step) {
    return (double)((rank + 3 * g + (int)i + step) % 7);
}

static void make(hcomm_tensor_t *t, void **data, int rank, int step) {
    for (int g = 0; g < NG; g++) {
        size_t es = 0;
        hcomm_dtype_size(dts[g], &es);
        if (!data[g])
            data[g] = calloc((size_t)lens[g] + 1, es);
        hcomm_tensor_init(&t[g], data[g], dts[g], 1, &lens[g]);
        for (int64_t i = 0; i < lens[g]; i++)
            t_set_val(dts[g], data[g], (size_t)i, val(rank, g, i, step));
    }
}

static void check(const hcomm_tensor_t *t, int p, int step, hcomm_op_t op, size_t cap) {
    long bad = 0;
    for (int g = 0; g < NG; g++)
        for (int64_t i = 0; i < lens[g]; i++) {
            double sum = 0;
            for (int s = 0; s < p; s++)
                sum += val(s, g, i, step);
            double want = op == HCOMM_AVG ? t_avg_ref(dts[g], sum, p) : sum;
            bad += t_get_val(dts[g], t[g].data, (size_t)i) != want;
        }
    T_CHECK(bad == 0, "%ld wrong elements (world %d, step %d, bucket_bytes %zu)", bad, p, step,
            cap);
}

static hcomm_result_t steps(hcomm_comm_t *w, size_t cap, hcomm_op_t op) {
    int p = t_size(w), r = t_rank(w);
    hcomm_tensor_t t[NG];
    void *data[NG] = {0};
    make(t, data, r, 0);
    hcomm_dp_reducer_t *red = NULL;
    T_TRY(hcomm_dp_reducer_create(w, t, NG, op, cap, &red));
    for (int step = 0; step < 3; step++) {
        make(t, data, r, step);
        for (int k = 0; k < NG; k++) /* a rank-dependent order: rotate by rank and step */
            T_TRY(hcomm_dp_reducer_mark_ready(red, (k + r + step) % NG));
        double wait_s = -1;
        T_TRY(hcomm_dp_reducer_finish(red, &wait_s));
        T_CHECK(wait_s >= 0, "finish reported no wait time");
        check(t, p, step, op, cap);
    }
    T_ERR(hcomm_dp_reducer_mark_ready(red, NG), HCOMM_ERR_INVALID_ARG);
    T_TRY(hcomm_dp_reducer_mark_ready(red, 2));
    T_ERR(hcomm_dp_reducer_mark_ready(red, 2), HCOMM_ERR_STATE);
    /* grads 0..5 but 2 unmarked: reduced anyway, and the first unmarked one named. */
    T_ERR(hcomm_dp_reducer_finish(red, NULL), HCOMM_ERR_STATE);
    T_CHECK(strstr(hcomm_last_error(), "grads[0] was never marked") != NULL, "got '%s'",
            hcomm_last_error());
    T_TRY(hcomm_dp_reducer_destroy(red));
    for (int g = 0; g < NG; g++)
        free(data[g]);
    return HCOMM_OK;
}

/* Rank 0 registers [f32[3], f32[5]], the others [f32[5], f32[3]]: MISMATCH everywhere. */
static hcomm_result_t other_lists(hcomm_comm_t *w) {
    if (t_size(w) < 2)
        return HCOMM_OK;
    float a[8] = {0};
    int64_t three = 3, five = 5;
    hcomm_tensor_t t[2];
    hcomm_tensor_init(&t[0], a, HCOMM_F32, 1, t_rank(w) == 0 ? &three : &five);
    hcomm_tensor_init(&t[1], a, HCOMM_F32, 1, t_rank(w) == 0 ? &five : &three);
    hcomm_dp_reducer_t *red = (hcomm_dp_reducer_t *)&red;
    T_ERR(hcomm_dp_reducer_create(w, t, 2, HCOMM_SUM, 0, &red), HCOMM_ERR_MISMATCH);
    T_CHECK(red == NULL, "a failed create left a reducer");
    return HCOMM_OK;
}

/* Destroy right after the last mark, while the bucket's all_reduce is in flight: the packed
 * bucket (512 KiB, so freeing it unmaps it) must outlive the worker's use of it. */
static hcomm_result_t destroy_in_flight(hcomm_comm_t *w) {
    enum { N = 64 * 1024 };
    float *a = calloc(2 * N, sizeof *a);
    T_CHECK(a != NULL, "out of memory");
    if (!a)
        return HCOMM_ERR_NOMEM;
    int64_t n = N;
    hcomm_tensor_t t[2];
    hcomm_tensor_init(&t[0], a, HCOMM_F32, 1, &n);
    hcomm_tensor_init(&t[1], a + N, HCOMM_F32, 1, &n);
    for (int rep = 0; rep < 5; rep++) {
        hcomm_dp_reducer_t *red = NULL;
        T_TRY(hcomm_dp_reducer_create(w, t, 2, HCOMM_SUM, 1 << 20, &red));
        T_TRY(hcomm_dp_reducer_mark_ready(red, 1));
        T_TRY(hcomm_dp_reducer_mark_ready(red, 0));
        T_TRY(hcomm_dp_reducer_destroy(red));
    }
    free(a);
    return hcomm_barrier(w);
}

static hcomm_result_t body(hcomm_comm_t *w, void *arg) {
    (void)arg;
    static const size_t caps[] = {1, 20, 68, 0}; /* 1 byte, one tensor, two, default */
    for (size_t c = 0; c < sizeof caps / sizeof *caps; c++) {
        T_TRY(steps(w, caps[c], HCOMM_SUM));
        T_TRY(steps(w, caps[c], HCOMM_AVG));
    }
    T_TRY(other_lists(w));
    T_TRY(destroy_in_flight(w));
    return hcomm_barrier(w);
}

int main(void) {
    t_for_each_world(body, NULL, 8);
    return t_finish("test_dp_reducer");
}
