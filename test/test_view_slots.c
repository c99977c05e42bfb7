/* More hcomm_mem_alloc buffers than a process keeps views of (HCOMM_TEST_MPI: mpi processes
 * map 64 of their peers' objects and reach the others with cross-memory attach): twoshot
 * all_reduce, which reads its peers' inputs and writes its block into their outputs where every
 * output comes from hcomm_mem_alloc, gives every value right on each of 80 buffer pairs, in
 * place and not, and again on the first pairs once the views are full. On the local backend
 * (world sizes 2..4) views are the addresses themselves, so the same calls run without limit. */
#include "harness.h"

#include <stdbool.h>

enum { PAIRS = 80, COUNT = 3001 }; /* a count that does not divide among the ranks */

static float val(int rank, int pair, size_t i) {
    return (float)((rank * 7 + pair * 3 + (int)(i % 101)) % 53) - 26.0f;
}

static hcomm_result_t check_pair(hcomm_comm_t *w, float *in, float *out, int pair, bool in_place) {
    int p = t_size(w), me = t_rank(w);
    float *recv = in_place ? in : out;
    for (size_t i = 0; i < COUNT; i++) {
        in[i] = val(me, pair, i);
        out[i] = -1.0f;
    }
    T_TRY(hcomm_all_reduce(w, in, recv, COUNT, HCOMM_F32, HCOMM_SUM));
    for (size_t i = 0; i < COUNT; i++) {
        float want = 0.0f;
        for (int r = 0; r < p; r++)
            want += val(r, pair, i);
        T_CHECK(recv[i] == want, "pair %d %s: rank %d [%zu]=%g, expected %g", pair,
                in_place ? "in place" : "out of place", me, i, (double)recv[i], (double)want);
        if (recv[i] != want)
            break;
    }
    return HCOMM_OK;
}

static hcomm_result_t rank_main(hcomm_comm_t *w, void *arg) {
    (void)arg;
    float *in[PAIRS] = {0}, *out[PAIRS] = {0};
    for (int k = 0; k < PAIRS; k++) {
        T_TRY(hcomm_mem_alloc(COUNT * sizeof(float), (void **)&in[k]));
        T_TRY(hcomm_mem_alloc(COUNT * sizeof(float), (void **)&out[k]));
    }
    T_TRY(hcomm_comm_set_algo(w, "allreduce:twoshot"));
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < PAIRS; k++)
            T_TRY(check_pair(w, in[k], out[k], k, (k + round) % 2 == 0));
    T_TRY(hcomm_comm_set_algo(w, ""));
    for (int k = 0; k < PAIRS; k++) {
        T_TRY(hcomm_mem_free(in[k]));
        T_TRY(hcomm_mem_free(out[k]));
    }
    return hcomm_barrier(w);
}

int main(void) {
    if (strcmp(t_backend(), "mpi") == 0)
        T_OK(hcomm_launch("mpi", 0, rank_main, NULL));
    else
        for (int n = 2; n <= 4; n++)
            T_OK(hcomm_launch("local", n, rank_main, NULL));
    return t_finish("test_view_slots");
}
