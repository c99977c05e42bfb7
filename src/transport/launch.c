/* hcomm_launch: runs the rank function on the backend that hcomm__launch_detect picks, through
 * that backend's launcher. Above comm.c and both backends, which create communicators through
 * comm.c and never call back up here. */
#include "transport/transport.h"

#include "core/topo_spec.h"

#include <string.h>

hcomm_result_t hcomm_launch(const char *backend, int nranks, hcomm_rank_fn_t fn, void *arg) {
    HCOMM__CHECK_NULL(fn);
    const char *named = backend; /* NULL: HCOMM_BACKEND or detection chooses */
    double t;
    size_t e, u;
    HCOMM__TRY(hcomm__comm_settings(__func__, &t, &e, &u));
    HCOMM__TRY(hcomm__launch_detect(__func__, backend, &backend));
    if (strcmp(backend, "local") == 0) {
        if (nranks < 1 || nranks > 4096)
            return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__,
                              "nranks=%d outside 1..4096 for the local backend", nranks);
        HCOMM__TRY(hcomm__topo_spec_env_fits(__func__, nranks));
        return hcomm__local_launch(nranks, fn, arg);
    }
    if (strcmp(backend, "mpi") == 0) {
        if (nranks < 0)
            return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "nranks=%d is negative", nranks);
        return hcomm__mpi_launch(nranks, fn, arg);
    }
    return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__,
                      "%s=\"%s\" is unknown (expected \"local\" or \"mpi\")",
                      named ? "backend" : "HCOMM_BACKEND", backend);
}
