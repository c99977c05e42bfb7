#include "core/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[512];

const char *hcomm_strerror(hcomm_result_t r) {
    switch (r) {
#define HCOMM_C_TEXT_(name, value, text)                                                           \
    case name:                                                                                     \
        return text;
        HCOMM_RESULT_TABLE(HCOMM_C_TEXT_)
#undef HCOMM_C_TEXT_
    default:
        return "unknown result";
    }
}

const char *hcomm_result_name(hcomm_result_t r) {
    switch (r) {
#define HCOMM_C_NAME_(name, value, text)                                                           \
    case name:                                                                                     \
        return #name;
        HCOMM_RESULT_TABLE(HCOMM_C_NAME_)
#undef HCOMM_C_NAME_
    default:
        return "HCOMM_UNKNOWN";
    }
}

const char *hcomm_last_error(void) {
    return last_error;
}

hcomm_result_t hcomm__err(hcomm_result_t r, const char *fn, const char *fmt, ...) {
    int n = snprintf(last_error, sizeof last_error, "%s: ", fn);
    if (n < 0 || (size_t)n >= sizeof last_error)
        return r;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
    return r;
}

hcomm_result_t hcomm__err_text(hcomm_result_t r, const char *text) {
    snprintf(last_error, sizeof last_error, "%s", text);
    return r;
}

const char *hcomm__err_detail(const char *fn) {
    size_t n = strlen(fn);
    if (strncmp(last_error, fn, n) == 0 && strncmp(last_error + n, ": ", 2) == 0)
        return last_error + n + 2;
    return last_error;
}
