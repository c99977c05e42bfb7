/* A bench figure for top-k dispatch + combine on the local backend: microseconds per
 * dispatch + combine of a bf16 batch against a plain baseline in the same run (two
 * all_to_allv of the same k rows per token, forward and back, no layout or permutation), and
 * the round trip with identity experts: combine(dispatch(x)) = x * sum of the weights.
 * Sizes are kept small (shared CI machines); HCOMM_MOE_BENCH_T raises T. */
#include "harness.h"

#include <math.h>
#include <time.h>

#define H 1024
#define K 8
#define E 64
#define ITERS 5

static int64_t tokens_per_rank(void) {
    const char *s = getenv("HCOMM_MOE_BENCH_T");
    return s ? atoll(s) : 256;
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

/* One dispatch + combine with identity experts; checks the round trip on the first. */
static hcomm_result_t moe_step(hcomm_comm_t *g, const hcomm_tensor_t *x, const int32_t *ids,
                               const float *w, hcomm_tensor_t *out) {
    hcomm_moe_handle_t *hd = NULL;
    hcomm_tensor_t recv;
    T_TRY(hcomm_moe_dispatch_topk(g, x, ids, w, K, E, NULL, &hd));
    T_TRY(hcomm_moe_received(hd, &recv, NULL));
    T_TRY(hcomm_moe_combine_topk(hd, &recv, out));
    return hcomm_moe_handle_free(hd);
}

/* The baseline: the k rows of every token out and back with two all_to_allv, equal split. */
static hcomm_result_t baseline_step(hcomm_comm_t *g, const char *send, char *recv,
                                    const size_t *v) {
    int p = t_size(g);
    T_TRY(hcomm_all_to_allv(g, send, v, v + p, recv, v, v + p));
    return hcomm_all_to_allv(g, recv, v, v + p, (char *)send, v, v + p);
}

static void check_round_trip(const hcomm_tensor_t *x, const float *w, const hcomm_tensor_t *out) {
    int64_t n = x->shape[0], bad = -1;
    for (int64_t t = 0; t < n && bad < 0; t++) {
        float ws = 0;
        for (int j = 0; j < K; j++)
            ws += w[t * K + j];
        for (int64_t c = 0; c < H && bad < 0; c++) {
            double want = t_get_val(HCOMM_BF16, x->data, (size_t)(t * H + c)) * ws;
            double got = t_get_val(HCOMM_BF16, out->data, (size_t)(t * H + c));
            if (fabs(got - want) > 1e-2 * fabs(want) + 1e-6)
                bad = t * H + c;
        }
    }
    T_CHECK(bad < 0, "combine(dispatch(x)) != x * sum(w) at element %lld", (long long)bad);
}

static hcomm_result_t bench_world(hcomm_comm_t *g, void *arg) {
    (void)arg;
    int p = t_size(g), rank = t_rank(g);
    if (p != 2 && p != 4)
        return HCOMM_OK;
    int64_t n = tokens_per_rank(), shape[2] = {n, H};
    hcomm_tensor_t x, out;
    hcomm_tensor_init(&x, calloc((size_t)(n * H), 2), HCOMM_BF16, 2, shape);
    hcomm_tensor_init(&out, calloc((size_t)(n * H), 2), HCOMM_BF16, 2, shape);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n * K));
    float *w = malloc(sizeof(float) * (size_t)(n * K));
    for (int64_t t = 0; t < n; t++) {
        for (int j = 0; j < K; j++) { /* k distinct experts per token */
            ids[t * K + j] = (int32_t)((mix((uint32_t)(rank * 100003 + t)) + (uint32_t)j * 7u) % E);
            w[t * K + j] = 1.0f / K;
        }
        for (int64_t c = 0; c < H; c++)
            t_set_val(HCOMM_BF16, x.data, (size_t)(t * H + c), (double)((t + c) % 13) - 6);
    }
    size_t per = (size_t)(n * K / p) * H * 2, *v = malloc(sizeof(size_t) * 2 * (size_t)p);
    for (int i = 0; i < p; i++) {
        v[i] = per;
        v[p + i] = (size_t)i * per;
    }
    char *sb = calloc(per * (size_t)p, 1), *rb = calloc(per * (size_t)p, 1);
    T_TRY(moe_step(g, &x, ids, w, &out)); /* warm-up, checked */
    check_round_trip(&x, w, &out);
    double t0 = now_s();
    for (int i = 0; i < ITERS; i++)
        T_TRY(moe_step(g, &x, ids, w, &out));
    T_TRY(hcomm_barrier(g));
    double t1 = now_s();
    for (int i = 0; i < ITERS; i++)
        T_TRY(baseline_step(g, sb, rb, v));
    T_TRY(hcomm_barrier(g));
    double t2 = now_s(), moe_us = (t1 - t0) / ITERS * 1e6, base_us = (t2 - t1) / ITERS * 1e6;
    if (rank == 0)
        printf("moe bench: ep=%d bf16 T=%lld H=%d k=%d E=%d: dispatch+combine %.0f us, "
               "2x all_to_allv alone %.0f us (x%.2f)\n",
               p, (long long)n, H, K, E, moe_us, base_us, moe_us / base_us);
    T_CHECK(moe_us > 0 && base_us > 0, "timings %g / %g us", moe_us, base_us);
    free(x.data);
    free(out.data);
    free(ids);
    free(w);
    free(v);
    free(sb);
    free(rb);
    return HCOMM_OK;
}

int main(void) {
    if (strcmp(t_backend(), "local") == 0)
        t_for_each_world(bench_world, NULL, 4);
    return t_finish("test_moe_bench");
}
