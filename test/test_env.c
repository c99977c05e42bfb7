/* Every HCOMM_* variable the library reads: a malformed value makes hcomm_launch fail with a
 * message naming the variable and the value, never a silent default. */
#include "harness.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static hcomm_result_t nothing(hcomm_comm_t *w, void *arg) {
    (void)w, (void)arg;
    return HCOMM_OK;
}

static void expect_refused(const char *var, const char *value) {
    setenv(var, value, 1);
    T_ERR(hcomm_launch("local", 2, nothing, NULL), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), var) && strstr(hcomm_last_error(), value),
            "%s=%s: message '%s' names neither", var, value, hcomm_last_error());
    unsetenv(var);
}

static void expect_taken(const char *var, const char *value) {
    setenv(var, value, 1);
    T_OK(hcomm_launch("local", 2, nothing, NULL));
    unsetenv(var);
}

/* The log settings are read once per process, so they are tried in a fresh child. */
static void log_settings_in_child(void) {
    pid_t pid = fork();
    if (pid == 0) {
        expect_refused("HCOMM_LOG_SUBSYS", "p2p,nosuch");
        _exit(atomic_load(&t_failures) == 0 ? 0 : 1);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    T_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "HCOMM_LOG_SUBSYS check failed");
}

int main(void) {
    log_settings_in_child();
    unsetenv("HCOMM_TIMEOUT");
    expect_refused("HCOMM_TIMEOUT", "abc");
    expect_refused("HCOMM_TIMEOUT", "-5");
    expect_refused("HCOMM_TIMEOUT", "0");
    expect_taken("HCOMM_TIMEOUT", "2.5");
    expect_refused("HCOMM_EAGER_LIMIT", "lots");
    expect_refused("HCOMM_EAGER_LIMIT", "-1");
    expect_refused("HCOMM_EAGER_LIMIT", "4G");
    expect_taken("HCOMM_EAGER_LIMIT", "64K");
    expect_taken("HCOMM_EAGER_LIMIT", "0");
    expect_refused("HCOMM_UNEXPECTED_BYTES", "12x");
    expect_taken("HCOMM_UNEXPECTED_BYTES", "1M");
    expect_refused("HCOMM_CHECK", "sometimes");
    expect_taken("HCOMM_CHECK", "first");
    return t_finish("test_env");
}
