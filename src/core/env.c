#include "core/env.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

hcomm_result_t hcomm__env_timeout(const char *fn, double *seconds) {
    const char *s = getenv("HCOMM_TIMEOUT");
    *seconds = 300.0;
    if (s == NULL || s[0] == '\0')
        return HCOMM_OK;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v <= 0.0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "HCOMM_TIMEOUT=\"%s\" is not a positive number of seconds", s);
    *seconds = v;
    return HCOMM_OK;
}

double hcomm__env_failure_detect(void) {
    const char *s = getenv("HCOMM_FAILURE_DETECT");
    if (s == NULL || s[0] == '\0')
        return 2.0;
    char *end = NULL;
    double v = strtod(s, &end);
    return end != s && *end == '\0' && isfinite(v) && v >= 0.0 ? v : 2.0;
}

hcomm_result_t hcomm__env_bytes(const char *fn, const char *name, size_t dflt, size_t lo, size_t hi,
                                size_t *out) {
    const char *s = getenv(name);
    *out = dflt;
    if (s == NULL || s[0] == '\0')
        return HCOMM_OK;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned long long mul = 1;
    if (end != s && *end != '\0' && end[1] == '\0') {
        const char *units = "KMG";
        const char *u = strchr(units, *end);
        if (u != NULL) {
            mul = 1ull << (10 * (1 + (u - units)));
            end++;
        }
    }
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v > (unsigned long long)hi / mul ||
        v * mul < lo)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "%s=\"%s\" is not a byte count in %zu..%zu (suffixes K, M, G allowed)",
                          name, s, lo, hi);
    *out = (size_t)(v * mul);
    return HCOMM_OK;
}

hcomm_result_t hcomm__env_eager_limit(const char *fn, size_t *bytes) {
    return hcomm__env_bytes(fn, "HCOMM_EAGER_LIMIT", 8192, 0, (size_t)1 << 20, bytes);
}

hcomm_result_t hcomm__env_choice(const char *fn, const char *name, const char *const *choices,
                                 int n, int dflt, int *out) {
    const char *s = getenv(name);
    *out = dflt;
    if (s == NULL || s[0] == '\0')
        return HCOMM_OK;
    for (int i = 0; i < n; i++)
        if (strcmp(s, choices[i]) == 0) {
            *out = i;
            return HCOMM_OK;
        }
    char list[256] = "";
    for (int i = 0; i < n; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, choices[i], sizeof list - strlen(list) - 1);
    }
    return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s=\"%s\" is not one of: %s", name, s, list);
}

hcomm_result_t hcomm__env_check(const char *fn, int *mode) {
    static const char *const names[] = {"always", "first", "off"};
    return hcomm__env_choice(fn, "HCOMM_CHECK", names, 3, 0, mode);
}

static int check_mode_value = HCOMM__CHECK_ALWAYS;
static pthread_once_t check_once = PTHREAD_ONCE_INIT;

static void read_check_mode(void) {
    if (hcomm__env_check("hcomm", &check_mode_value) != HCOMM_OK)
        check_mode_value = HCOMM__CHECK_ALWAYS;
}

int hcomm__check_mode(void) {
    pthread_once(&check_once, read_check_mode);
    return check_mode_value;
}

const char *hcomm__check_hint(bool compared) {
    int mode = hcomm__check_mode();
    if (compared || mode == HCOMM__CHECK_ALWAYS)
        return "";
    return mode == HCOMM__CHECK_FIRST
               ? "; HCOMM_CHECK=first lets a rank skip the check of a call it made before"
               : "; HCOMM_CHECK=off: calls are not compared before they run, so ranks whose calls "
                 "differ can wait in different algorithms (HCOMM_CHECK=always names the "
                 "difference)";
}

hcomm_result_t hcomm__env_deterministic(const char *fn, bool *on) {
    static const char *const names[] = {"0", "1"};
    int v;
    HCOMM__TRY(hcomm__env_choice(fn, "HCOMM_DETERMINISTIC", names, 2, 0, &v));
    *on = v == 1;
    return HCOMM_OK;
}

const char *hcomm__strip(const char *s, size_t *len) {
    while (*len > 0 && isspace((unsigned char)*s))
        s++, (*len)--;
    while (*len > 0 && isspace((unsigned char)s[*len - 1]))
        (*len)--;
    return s;
}

const char *hcomm__dump_dir(void) {
    const char *s = getenv("HCOMM_DUMP_DIR");
    struct stat st;
    return s && s[0] && stat(s, &st) == 0 && S_ISDIR(st.st_mode) ? s : NULL;
}

hcomm_result_t hcomm__env_dump_dir(const char *fn, const char **dir) {
    const char *s = getenv("HCOMM_DUMP_DIR");
    *dir = NULL;
    if (s == NULL || s[0] == '\0')
        return HCOMM_OK;
    if (!hcomm__dump_dir())
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "HCOMM_DUMP_DIR=\"%s\" is not a directory", s);
    *dir = s;
    return HCOMM_OK;
}
