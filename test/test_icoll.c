/* Nonblocking collectives: several in flight complete in issue order with the blocking calls'
 * results, blocking calls interleave with them, test() reports completion, a bad argument on
 * one rank fails its peers' request with HCOMM_ERR_PEER, a first nonblocking call against a
 * blocking one is a mismatch, hcomm_comm_abort() ends a pending operation. HCOMM_TEST_MPI */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

enum { N = 5, COUNT = 3001 };

static hcomm_result_t in_flight(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int p = t_size(w), r = t_rank(w);
    float *in = malloc(sizeof(float) * N * COUNT), *out = malloc(sizeof(float) * N * COUNT);
    double *g = malloc(sizeof(double) * (size_t)p * 7);
    for (int k = 0; k < N * COUNT; k++)
        in[k] = (float)((r + k) % 13), out[k] = -1.0f;
    hcomm_request_t *q[N + 1];
    for (int i = 0; i < N; i++)
        T_TRY(hcomm_iall_reduce(w, in + i * COUNT, out + i * COUNT, COUNT, HCOMM_F32,
                                i % 2 ? HCOMM_MAX : HCOMM_SUM, &q[i]));
    double mine[7];
    for (int k = 0; k < 7; k++)
        mine[k] = r * 10 + k;
    T_TRY(hcomm_iall_gather(w, mine, g, sizeof mine, &q[N]));
    int32_t one = 1, sum = 0; /* a blocking call on the same comm meanwhile */
    T_TRY(hcomm_all_reduce(w, &one, &sum, 1, HCOMM_I32, HCOMM_SUM));
    T_EQ_INT(sum, p);
    int done = 0;
    hcomm_result_t tr = HCOMM_OK;
    while (!done && tr == HCOMM_OK) /* completion comes from the worker, no progress calls */
        tr = hcomm_test(q[N], &done);
    T_TRY(tr);
    for (int i = 0; i < N; i++)
        T_TRY(hcomm_wait(q[i]));
    long bad = 0;
    for (int i = 0; i < N; i++)
        for (int k = 0; k < COUNT; k++) {
            float want = 0;
            for (int s = 0; s < p; s++) {
                float v = (float)((s + i * COUNT + k) % 13);
                want = i % 2 ? (s == 0 || v > want ? v : want) : want + v;
            }
            bad += out[i * COUNT + k] != want;
        }
    T_CHECK(bad == 0, "%ld wrong elements of in-flight all_reduces", bad);
    for (int s = 0; s < p; s++)
        for (int k = 0; k < 7; k++)
            bad += g[s * 7 + k] != s * 10 + k;
    T_CHECK(bad == 0, "%ld wrong elements of the in-flight all_gather", bad);
    /* reduce_scatter, and a bad argument on the last rank. */
    float rs_out[4] = {0};
    float *rs_in = malloc(sizeof(float) * 4 * (size_t)p);
    for (int k = 0; k < 4 * p; k++)
        rs_in[k] = 1.0f;
    hcomm_request_t *rq = NULL;
    T_TRY(hcomm_ireduce_scatter(w, rs_in, rs_out, 4, HCOMM_F32, HCOMM_SUM, &rq));
    T_TRY(hcomm_wait(rq));
    T_CHECK(rs_out[0] == (float)p && rs_out[3] == (float)p, "reduce_scatter gave %g", rs_out[0]);
    if (p > 1) {
        hcomm_dtype_t dt = r == p - 1 ? (hcomm_dtype_t)99 : HCOMM_F32;
        T_TRY(hcomm_iall_reduce(w, in, out, 4, dt, HCOMM_SUM, &rq));
        hcomm_result_t res = hcomm_wait(rq);
        T_EQ_INT(res, r == p - 1 ? HCOMM_ERR_DTYPE : HCOMM_ERR_PEER);
        if (r == p - 1) /* named as the call the rank made, not its blocking form */
            T_CHECK(strncmp(hcomm_last_error(), "hcomm_iall_reduce: dtype=99", 27) == 0,
                    "a bad dtype gave \"%s\"", hcomm_last_error());
        T_TRY(hcomm_iall_reduce(w, &one, &sum, 1, HCOMM_I32, HCOMM_SUM, &rq));
        T_TRY(hcomm_wait(rq));
        T_EQ_INT(sum, p);
    }
    /* TP forms: gather along an inner dim (the worker also permutes), reduce_scatter along it,
     * compared with the blocking calls' results. */
    int64_t sh_in[2] = {2, 3}, sh_out[2] = {2, 3 * (int64_t)p};
    float xin[6], a_out[64], b_out[64], rs2[6];
    for (int k = 0; k < 6; k++)
        xin[k] = (float)(r * 10 + k);
    hcomm_tensor_t tin, ta, tb;
    hcomm_tensor_init(&tin, xin, HCOMM_F32, 2, sh_in);
    hcomm_tensor_init(&ta, a_out, HCOMM_F32, 2, sh_out);
    hcomm_tensor_init(&tb, b_out, HCOMM_F32, 2, sh_out);
    if (p <= 8) {
        T_TRY(hcomm_tp_iall_gather(w, &tin, &ta, 1, &rq));
        T_TRY(hcomm_wait(rq));
        T_TRY(hcomm_tp_all_gather(w, &tin, &tb, 1));
        T_CHECK(memcmp(a_out, b_out, sizeof(float) * 6 * (size_t)p) == 0,
                "tp_iall_gather differs from tp_all_gather");
        hcomm_tensor_t rs_t;
        hcomm_tensor_init(&rs_t, rs2, HCOMM_F32, 2, sh_in);
        T_TRY(hcomm_tp_ireduce_scatter(w, &ta, &rs_t, 1, HCOMM_SUM, &rq));
        T_TRY(hcomm_wait(rq));
        for (int k = 0; k < 6; k++) /* each column block is the gathered rank's input, summed */
            bad += rs2[k] != (float)p * (float)(r * 10 + k);
        T_CHECK(bad == 0, "tp_ireduce_scatter gave %g, expected %g", rs2[0], (double)p * r * 10);
        T_TRY(hcomm_tp_iall_reduce(w, &tin, &tin, HCOMM_SUM, &rq));
        T_TRY(hcomm_wait(rq));
    }
    free(rs_in);
    free(in);
    free(out);
    free(g);
    return hcomm_barrier(w);
}

/* A duplicate of w without a nonblocking worker yet, its waits bounded by seconds. */
static hcomm_result_t fresh_comm(hcomm_comm_t *w, double seconds, hcomm_comm_t **d) {
    T_TRY(hcomm_comm_split(w, 0, t_rank(w), d));
    return hcomm_comm_set_timeout(*d, seconds);
}

/* A first nonblocking call (it sets up the worker) against a blocking call elsewhere fails at
 * once on every rank, named as what each rank called. */
static hcomm_result_t first_mixed(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int r = t_rank(w);
    hcomm_comm_t *d = NULL;
    if (t_size(w) < 2)
        return HCOMM_OK;
    T_TRY(fresh_comm(w, 30, &d));
    float v = 1.0f;
    hcomm_request_t *q = NULL;
    hcomm_result_t res = r == 0 ? hcomm_iall_reduce(d, &v, &v, 1, HCOMM_F32, HCOMM_SUM, &q)
                                : hcomm_all_reduce(d, &v, &v, 1, HCOMM_F32, HCOMM_SUM);
    T_EQ_INT(res, HCOMM_ERR_MISMATCH);
    T_CHECK(strstr(hcomm_last_error(),
                   "rank 0 called a nonblocking collective but rank 1 called all_reduce") != NULL,
            "gave \"%s\"", hcomm_last_error());
    T_TRY(hcomm_comm_destroy(d));
    return HCOMM_OK;
}

/* hcomm_comm_abort() ends a pending nonblocking operation at once (not at the timeout). */
static hcomm_result_t abort_pending(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int r = t_rank(w);
    hcomm_comm_t *d = NULL;
    if (t_size(w) < 2)
        return HCOMM_OK;
    T_TRY(fresh_comm(w, 60, &d));
    float v = 1.0f;
    hcomm_request_t *q = NULL;
    T_TRY(hcomm_iall_reduce(d, &v, &v, 1, HCOMM_F32, HCOMM_SUM, &q)); /* the worker */
    T_TRY(hcomm_wait(q));
    if (r == 0) { /* its peers never make this call */
        T_TRY(hcomm_iall_reduce(d, &v, &v, 1, HCOMM_F32, HCOMM_SUM, &q));
        T_TRY(hcomm_comm_abort(d));
        hcomm_result_t res = hcomm_wait(q);
        T_EQ_INT(res, HCOMM_ERR_ABORTED);
    }
    T_TRY(hcomm_barrier(w));
    T_TRY(hcomm_comm_destroy(d));
    return HCOMM_OK;
}

/* One rank passes no place for its request (req, or a TP tensor, NULL) to the first nonblocking
 * call of a communicator: it still joins, so its peers fail at once with PEER and the next
 * nonblocking calls run on every rank. */
static hcomm_result_t null_request(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int r = t_rank(w), p = t_size(w);
    if (p < 2)
        return HCOMM_OK;
    hcomm_comm_t *d = NULL;
    T_TRY(fresh_comm(w, 30, &d));
    float v = 1.0f;
    hcomm_request_t *q = NULL;
    if (r == 1) {
        T_ERR(hcomm_iall_reduce(d, &v, &v, 1, HCOMM_F32, HCOMM_SUM, NULL), HCOMM_ERR_NULL);
    } else {
        T_TRY(hcomm_iall_reduce(d, &v, &v, 1, HCOMM_F32, HCOMM_SUM, &q));
        T_ERR(hcomm_wait(q), HCOMM_ERR_PEER);
    }
    int64_t one = 1;
    hcomm_tensor_t t;
    hcomm_tensor_init(&t, &v, HCOMM_F32, 1, &one);
    T_TRY(hcomm_tp_iall_reduce(d, r == 1 ? NULL : &t, &t, HCOMM_SUM, &q));
    T_ERR(hcomm_wait(q), r == 1 ? HCOMM_ERR_NULL : HCOMM_ERR_PEER);
    T_TRY(hcomm_iall_reduce(d, &v, &v, 1, HCOMM_F32, HCOMM_SUM, &q));
    T_TRY(hcomm_wait(q));
    T_CHECK(v == (float)p, "all_reduce after the failures gave %g, expected %d", v, p);
    T_TRY(hcomm_comm_destroy(d));
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(in_flight, NULL, 8);
    t_for_each_world(first_mixed, NULL, 4);
    t_for_each_world(abort_pending, NULL, 4);
    t_for_each_world(null_request, NULL, 4);
    return t_finish("test_icoll");
}
