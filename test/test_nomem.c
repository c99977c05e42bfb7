/* One rank out of memory inside a collective: every rank returns promptly (the failing rank
 * HCOMM_ERR_NOMEM, its peers an error naming it, never HCOMM_ERR_TIMEOUT), and the group's next
 * call works. Two ways the peers used to wait out HCOMM_TIMEOUT: rhd's peers had sent the
 * failed rank rendezvous messages that it only drained once it polled its p2p layer, which the
 * local backend's meetings of its next call never did; and naive's scratch failure told nobody.
 * HCOMM_TEST_MPI */
#include "harness.h"

#include "core/internal.h"

#include <stdint.h>

enum { COUNT = 1 << 18 }; /* 1 MiB of f32: rendezvous on every backend */

/* The failing call, then an 8-byte all_reduce on the default algorithm. */
static hcomm_result_t one_case(hcomm_comm_t *w, const char *spec, float *buf) {
    int me = t_rank(w), p = t_size(w);
    for (size_t i = 0; i < COUNT; i++)
        buf[i] = (float)(me + 1);
    T_TRY(hcomm_comm_set_algo(w, spec));
    hcomm__scratch_fails_next = me == 0;
    double t0 = hcomm__now();
    hcomm_result_t r = hcomm_all_reduce(w, buf, buf, COUNT, HCOMM_F32, HCOMM_SUM);
    hcomm__scratch_fails_next = false;
    double took = hcomm__now() - t0;
    if (me == 0)
        T_CHECK(r == HCOMM_ERR_NOMEM, "%s on %d ranks: rank 0 got %s (%s), expected NOMEM", spec, p,
                hcomm_result_name(r), hcomm_last_error());
    else
        T_CHECK(r == HCOMM_ERR_PEER || r == HCOMM_ERR_NOMEM || r == HCOMM_OK,
                "%s on %d ranks: rank %d got %s (%s)", spec, p, me, hcomm_result_name(r),
                hcomm_last_error());
    T_CHECK(took < 5.0, "%s on %d ranks: rank %d took %.1f s to fail", spec, p, me, took);
    T_TRY(hcomm_comm_set_algo(w, NULL));
    int64_t one = 1, sum = 0;
    T_TRY(hcomm_all_reduce(w, &one, &sum, 1, HCOMM_I64, HCOMM_SUM));
    T_EQ_INT(sum, p);
    return HCOMM_OK;
}

static hcomm_result_t rank_fn(hcomm_comm_t *w, void *arg) {
    (void)arg;
    static const char *const specs[] = {"allreduce:rhd", "allreduce:naive"};
    if (t_size(w) < 2)
        return HCOMM_OK;
    float *buf = malloc(sizeof(float) * COUNT);
    if (!buf)
        return HCOMM_ERR_NOMEM;
    hcomm_result_t r = HCOMM_OK;
    for (size_t i = 0; r == HCOMM_OK && i < sizeof specs / sizeof *specs; i++)
        r = one_case(w, specs[i], buf);
    free(buf);
    return r;
}

int main(void) {
    /* a hang shows as a failed check long before ctest's timeout */
    setenv("HCOMM_TIMEOUT", "20", 1);
    t_for_each_world(rank_fn, NULL, 5);
    return t_finish("test_nomem");
}
