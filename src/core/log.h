/* Logging: HCOMM_LOG_LEVEL (error, warn, info, debug; default warn) and HCOMM_LOG_SUBSYS (a
 * comma list of transport, p2p, algo, domain, pp, moe, dp, launch; default all), as NCCL_DEBUG
 * and NCCL_DEBUG_SUBSYS. Each line goes to stderr prefixed "hcomm host:pid [subsys] LEVEL". */
#ifndef HCOMM_C_LOG_H_
#define HCOMM_C_LOG_H_

#include "core/internal.h"

typedef enum { HCOMM__LOG_ERROR, HCOMM__LOG_WARN, HCOMM__LOG_INFO, HCOMM__LOG_DEBUG } hcomm__log_level_t;

typedef enum {
    HCOMM__SUB_TRANSPORT,
    HCOMM__SUB_P2P,
    HCOMM__SUB_ALGO,
    HCOMM__SUB_DOMAIN,
    HCOMM__SUB_PP,
    HCOMM__SUB_MOE,
    HCOMM__SUB_DP,
    HCOMM__SUB_LAUNCH,
    HCOMM__SUB_COUNT
} hcomm__subsys_t;

/* Reads the two variables once (later calls return the first outcome); a malformed value is
 * HCOMM_ERR_INVALID_ARG naming it. Thread-safe. */
hcomm_result_t hcomm__log_init(const char *fn);
/* True when a line of level for subsys would be printed (cheap: two loads after init). */
bool hcomm__log_on(hcomm__log_level_t level, hcomm__subsys_t subsys);
void hcomm__log(hcomm__log_level_t level, hcomm__subsys_t subsys, const char *fmt, ...)
    HCOMM__PRINTF(3, 4);

#define HCOMM__LOG(level, subsys, ...)                                                             \
    do {                                                                                           \
        if (hcomm__log_on(level, subsys))                                                          \
            hcomm__log(level, subsys, __VA_ARGS__);                                                \
    } while (0)

#endif /* HCOMM_C_LOG_H_ */
