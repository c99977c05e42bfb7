/* Rank 0 skips one of three all_reduces; under mpirun every process must end with a failure
 * (HCOMM_TIMEOUT), and the job must exit cleanly (test_mpi_exit.sh runs it many times). */
#include "hcomm/api.h"

#include <stdio.h>

static hcomm_result_t body(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int rank = 0;
    hcomm_comm_rank(w, &rank);
    double x = 1, y = 0;
    hcomm_result_t r = HCOMM_OK;
    for (int i = 0; i < 3 && r == HCOMM_OK; i++)
        if (!(rank == 0 && i == 1))
            r = hcomm_all_reduce(w, &x, &y, 1, HCOMM_F64, HCOMM_SUM);
    return r;
}

int main(void) {
    hcomm_result_t r = hcomm_launch("mpi", 0, body, NULL);
    printf("skip_call: launch returned %s\n", hcomm_result_name(r));
    return r == HCOMM_OK ? 0 : 3;
}
