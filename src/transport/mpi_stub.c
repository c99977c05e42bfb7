/* Built when hcomm is configured without MPI: the mpi backend reports itself unavailable. */
#include "transport/transport.h"

hcomm_result_t hcomm__mpi_launch(int nranks, hcomm_rank_fn_t fn, void *arg) {
    (void)nranks;
    (void)fn;
    (void)arg;
    return hcomm__err(HCOMM_ERR_UNSUPPORTED, "hcomm_launch",
                      "backend=\"mpi\" is not available: hcomm was built without MPI "
                      "(install Open MPI with scripts/deps.sh and reconfigure)");
}
