/* HCOMM_CHECK=first (set here, before the launch) narrows only the checks before Open MPI's
 * collectives: hcomm's own algorithms still check every call. On the local backend (world
 * sizes 2..5) and under mpirun (HCOMM_TEST_MPI: np 2, 3 and 4), after a signature was agreed
 * once, a call that differs across ranks in that way fails with HCOMM_ERR_MISMATCH on every
 * rank (not HCOMM_TIMEOUT): rank 0 has seen its signature, its peers have not, so only rank 0
 * would skip the agreement; twoshot (forced here, the default on one host from 16 KiB) and
 * ring must still meet their peers. */
#include "harness.h"

static hcomm_result_t sum_works(hcomm_comm_t *c, float *a, float *b, size_t n) {
    int p = t_size(c), r = t_rank(c);
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(r + 1);
    T_TRY(hcomm_all_reduce(c, a, b, n, HCOMM_F32, HCOMM_SUM));
    for (size_t i = 0; i < n; i += 997)
        T_CHECK(b[i] == (float)(p * (p + 1) / 2), "all_reduce n=%zu (world %d, rank %d): [%zu]=%g",
                n, p, r, i, (double)b[i]);
    return HCOMM_OK;
}

static hcomm_result_t seen_then_mismatch(hcomm_comm_t *c, const char *algo) {
    enum { N = 16384 }; /* 64 KiB of f32 */
    int r = t_rank(c), p = t_size(c);
    float *a = calloc(N, sizeof(float)), *b = calloc(N, sizeof(float));
    if (!a || !b)
        return HCOMM_ERR_NOMEM;
    T_TRY(hcomm_comm_set_algo(c, algo));
    T_TRY(sum_works(c, a, b, N)); /* count=16384 agreed once on every rank */
    hcomm_result_t res = hcomm_all_reduce(c, a, b, r == 0 ? N : N - 1, HCOMM_F32, HCOMM_SUM);
    const char *head = "hcomm_all_reduce: count=16384 on rank 0 but count=16383 on rank ";
    T_CHECK(res == HCOMM_ERR_MISMATCH && strstr(hcomm_last_error(), head) == hcomm_last_error(),
            "%s, HCOMM_CHECK=first, a seen count on rank 0 only (world %d, rank %d): %s '%s', "
            "expected HCOMM_ERR_MISMATCH '%s...'",
            algo, p, r, hcomm_result_name(res), hcomm_last_error(), head);
    T_TRY(sum_works(c, a, b, 8));
    T_TRY(hcomm_comm_set_algo(c, ""));
    free(a);
    free(b);
    return HCOMM_OK;
}

static hcomm_result_t rank_main(hcomm_comm_t *c, void *arg) {
    (void)arg;
    T_TRY(seen_then_mismatch(c, "allreduce:twoshot"));
    T_TRY(seen_then_mismatch(c, "allreduce:ring"));
    return hcomm_barrier(c);
}

int main(void) {
    setenv("HCOMM_CHECK", "first", 1);
    setenv("HCOMM_TIMEOUT", "20", 1); /* a hang fails by far, but ends */
    if (strcmp(t_backend(), "mpi") == 0)
        T_OK(hcomm_launch("mpi", 0, rank_main, NULL));
    else
        for (int n = 2; n <= 5; n++)
            T_OK(hcomm_launch("local", n, rank_main, NULL));
    return t_finish("test_check_first");
}
