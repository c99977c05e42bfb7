/* Every HCOMM_* variable the C library reads, checked at once (env.h): hcomm_launch runs this
 * before any rank starts, so a typo'd value fails there, not in the middle of a job. */
#include "core/env.h"
#include "core/log.h"
#include "core/topo_spec.h"

#include <stdatomic.h>

static _Atomic(hcomm__env_check_fn) upper_check;

hcomm_result_t hcomm__env_validate(const char *fn) {
    double t;
    int mode;
    bool det;
    const char *dir;
    HCOMM__TRY(hcomm__env_timeout(fn, &t));
    HCOMM__TRY(hcomm__env_dump_dir(fn, &dir));
    HCOMM__TRY(hcomm__env_check(fn, &mode));
    HCOMM__TRY(hcomm__env_deterministic(fn, &det));
    HCOMM__TRY(hcomm__log_init(fn));
    HCOMM__TRY(hcomm__topo_spec_env_validate(fn));
    HCOMM__TRY(hcomm__tuning_validate(fn));
    hcomm__env_check_fn upper = atomic_load(&upper_check);
    return upper ? upper(fn) : HCOMM_OK;
}

void hcomm__env_register_check(hcomm__env_check_fn check) {
    atomic_store(&upper_check, check);
}
