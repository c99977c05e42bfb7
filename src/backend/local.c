/* placeholder: the local backend is being written */
#include "backend/backend.h"
hcomm_result_t hcomm__local_launch(int nranks, hcomm_rank_fn_t fn, void *arg) {
    (void)nranks; (void)fn; (void)arg;
    return HCOMM_ERR_UNSUPPORTED;
}
