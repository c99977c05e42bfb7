/* hcomm_version: the numbers CMake put into hcomm/version.h when this library was built. */
#include "core/internal.h"
#include "hcomm/version.h"

hcomm_result_t hcomm_version(int *major, int *minor, int *patch, const char **backends) {
    if (major != NULL)
        *major = HCOMM_VERSION_MAJOR;
    if (minor != NULL)
        *minor = HCOMM_VERSION_MINOR;
    if (patch != NULL)
        *patch = HCOMM_VERSION_PATCH;
#ifdef HCOMM_C_HAVE_MPI
    if (backends != NULL)
        *backends = "local mpi";
#else
    if (backends != NULL)
        *backends = "local";
#endif
    return HCOMM_OK;
}
