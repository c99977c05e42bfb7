/* --wrap: hcomm-bench as an MPI application that adopts hcomm. It starts MPI itself, wraps
 * MPI_COMM_WORLD with hcomm_comm_wrap_mpi and runs the ranks' body on that communicator, so the
 * rows time what such an application gets (hcomm/mpi.h), beside raw MPI in the same job. */
#include "bench.h"

#include <stdio.h>

#if defined(HCOMM_BENCH_MPI)
#include <hcomm/mpi.h>
#include <mpi.h>

hcomm_result_t bench_run_wrapped(hcomm_rank_fn_t fn, void *arg) {
    int provided = 0, done = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "hcomm-bench: --wrap: MPI_Init_thread failed\n");
        return HCOMM_ERR_BACKEND;
    }
    hcomm_comm_t *w = NULL;
    hcomm_result_t r = hcomm_comm_wrap_mpi(MPI_COMM_WORLD, &w);
    if (r == HCOMM_OK) {
        r = fn(w, arg);
        hcomm_result_t d = hcomm_comm_destroy(w);
        r = r != HCOMM_OK ? r : d;
    }
    MPI_Finalized(&done);
    if (!done)
        MPI_Finalize();
    return r;
}
#else
hcomm_result_t bench_run_wrapped(hcomm_rank_fn_t fn, void *arg) {
    (void)fn, (void)arg;
    fprintf(stderr, "hcomm-bench: --wrap needs the mpi backend, which this build lacks\n");
    return HCOMM_ERR_UNSUPPORTED;
}
#endif
