#include "harness.h"

atomic_int t_failures;
atomic_int t_checks;

const char *t_backend(void) {
    const char *b = getenv("HCOMM_BACKEND");
    return (b && strcmp(b, "mpi") == 0) ? "mpi" : "local";
}

void t_for_each_world(hcomm_rank_fn_t fn, void *arg, int max_ranks) {
    if (strcmp(t_backend(), "mpi") == 0) {
        T_OK(hcomm_launch("mpi", 0, fn, arg));
        return;
    }
    for (int n = 1; n <= max_ranks; n++)
        T_OK(hcomm_launch("local", n, fn, arg));
}

int t_finish(const char *name) {
    int f = atomic_load(&t_failures), c = atomic_load(&t_checks);
    printf("%s: %d checks, %d failed\n", name, c, f);
    return f == 0 && c > 0 ? 0 : 1;
}
