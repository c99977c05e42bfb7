/* A communicator whose Open MPI collective timed out stays unusable, and its later calls return
 * that error (core.h) instead of touching MPI again: rank 0 skips a broadcast that runs as
 * MPI_Ibcast (HCOMM_CHECK=off, broadcast:native), so its peers time out in it; then
 * every rank makes a small all_reduce (an hcomm algorithm on the transport's lane), which on the
 * peers used to crash in the lane's cleanup. test_mpi_exit.sh runs it. */
#include "hcomm/api.h"

#include <stdio.h>
#include <unistd.h>

static hcomm_result_t body(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int rank = 0;
    hcomm_comm_rank(w, &rank);
    hcomm_result_t set = hcomm_comm_set_algo(w, "broadcast:native");
    if (set != HCOMM_OK)
        return set;
    static char block[9000];
    hcomm_result_t b = HCOMM_OK;
    if (rank != 0)
        b = hcomm_broadcast(w, block, sizeof block, 0);
    if (rank == 0) /* its peers time out first, at HCOMM_TIMEOUT=2 */
        sleep(1);
    float x = 1, y = 0;
    hcomm_result_t r = hcomm_all_reduce(w, &x, &y, 1, HCOMM_F32, HCOMM_SUM);
    printf("after_timeout: rank %d broadcast %s all_reduce %s (%s)\n", rank, hcomm_result_name(b),
           hcomm_result_name(r), r == HCOMM_OK ? "" : hcomm_last_error());
    fflush(stdout);
    return r;
}

int main(void) {
    hcomm_result_t r = hcomm_launch("mpi", 0, body, NULL);
    return r == HCOMM_OK ? 0 : 3;
}
