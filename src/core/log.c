#include "core/log.h"

#include "core/env.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const char *const subsys_names[HCOMM__SUB_COUNT] = {"transport", "p2p", "algo", "domain",
                                                           "pp",        "moe", "dp",   "launch"};

static struct {
    pthread_once_t once;
    hcomm_result_t result;
    char message[512];
    int level;
    unsigned mask;
} log_cfg = {.once = PTHREAD_ONCE_INIT, .level = HCOMM__LOG_WARN, .mask = ~0u};

/* Parses HCOMM_LOG_SUBSYS into a mask; false (with *bad set) on an unknown name. */
static bool parse_subsys(const char *s, unsigned *mask, char *bad, size_t cap) {
    *mask = 0;
    while (*s) {
        size_t n = strcspn(s, ",");
        bool found = n == 3 && strncmp(s, "all", 3) == 0;
        if (found)
            *mask = ~0u;
        for (int i = 0; !found && i < HCOMM__SUB_COUNT; i++)
            if (strlen(subsys_names[i]) == n && strncmp(s, subsys_names[i], n) == 0) {
                *mask |= 1u << i;
                found = true;
            }
        if (!found && n > 0) {
            snprintf(bad, cap, "%.*s", (int)n, s);
            return false;
        }
        s += n + (s[n] == ',');
    }
    return true;
}

static void read_config(void) {
    log_cfg.result = hcomm__env_choice("hcomm", "HCOMM_LOG_LEVEL", level_names, 4, HCOMM__LOG_WARN,
                                       &log_cfg.level);
    const char *s = getenv("HCOMM_LOG_SUBSYS");
    char bad[64];
    if (log_cfg.result == HCOMM_OK && s && s[0] && !parse_subsys(s, &log_cfg.mask, bad, sizeof bad))
        log_cfg.result = hcomm__err(HCOMM_ERR_INVALID_ARG, "hcomm",
                                    "HCOMM_LOG_SUBSYS=\"%s\" names \"%s\", not one of: all, "
                                    "transport, p2p, algo, domain, pp, moe, dp, launch",
                                    s, bad);
    if (log_cfg.result != HCOMM_OK) {
        /* The caller's name goes in front when re-reported. */
        snprintf(log_cfg.message, sizeof log_cfg.message, "%s", hcomm__err_detail("hcomm"));
        log_cfg.level = HCOMM__LOG_WARN;
        log_cfg.mask = ~0u;
    }
}

hcomm_result_t hcomm__log_init(const char *fn) {
    pthread_once(&log_cfg.once, read_config);
    if (log_cfg.result != HCOMM_OK)
        return hcomm__err(log_cfg.result, fn, "%s", log_cfg.message);
    return HCOMM_OK;
}

bool hcomm__log_on(hcomm__log_level_t level, hcomm__subsys_t subsys) {
    pthread_once(&log_cfg.once, read_config);
    return (int)level <= log_cfg.level && (log_cfg.mask & (1u << subsys)) != 0;
}

void hcomm__log(hcomm__log_level_t level, hcomm__subsys_t subsys, const char *fmt, ...) {
    char host[64] = "?", line[1024];
    gethostname(host, sizeof host - 1);
    int n = snprintf(line, sizeof line, "hcomm %s:%d [%s] %s: ", host, (int)getpid(),
                     subsys_names[subsys], level_names[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
