/* Which backend hcomm_launch runs: the program's choice, else HCOMM_BACKEND, else what the
 * process was started by. mpirun (Open MPI, MPICH/PMI, PMIx) and srun leave variables in every
 * process they start; without them a job of N processes would silently run N separate local
 * worlds, each "succeeding". */
#include "transport/transport.h"
#include "core/log.h"

#include <stdlib.h>
#include <string.h>

/* The first of @p names that is set to an integer, or -1. */
static long env_int(const char *const *names, const char **which) {
    for (; *names != NULL; names++) {
        const char *s = getenv(*names);
        char *end = NULL;
        long v = s != NULL ? strtol(s, &end, 10) : -1;
        if (s != NULL && s[0] != '\0' && *end == '\0' && v >= 0) {
            *which = *names;
            return v;
        }
    }
    return -1;
}

/* Processes in the MPI job that started this one (set in *var), 0 when no launcher variable is
 * there, -1 when started by a launcher that does not say the size (PMIx without a size). */
static long mpi_job_size(const char **var) {
    static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
                                        "SLURM_STEP_NUM_TASKS", NULL};
    static const char *const ranks[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", NULL};
    long n = env_int(sizes, var);
    if (n >= 0)
        return n;
    return env_int(ranks, var) >= 0 ? -1 : 0;
}

long hcomm__launch_job_size(void) {
    const char *var = NULL;
    return mpi_job_size(&var);
}

static bool env_set(const char *name) {
    const char *s = getenv(name);
    return s != NULL && s[0] != '\0';
}

hcomm_result_t hcomm__launch_detect(const char *fn, const char *requested, const char **backend) {
    const char *env = getenv("HCOMM_BACKEND"), *var = NULL;
    const bool env_local = env != NULL && strcmp(env, "local") == 0;
    const long procs = mpi_job_size(&var);
    const char *why = requested != NULL ? "named by the program" : "from HCOMM_BACKEND";
    if (requested == NULL && env != NULL && env[0] != '\0')
        requested = env;
    if (requested == NULL && procs != 0 && procs != 1) {
        HCOMM__LOG(HCOMM__LOG_INFO, HCOMM__SUB_LAUNCH,
                   "backend mpi: started by an MPI launcher (%s=%s) and HCOMM_BACKEND is unset",
                   var, getenv(var));
        *backend = "mpi";
        return HCOMM_OK;
    }
    if (requested == NULL && env_set("RANK") && env_set("WORLD_SIZE") && env_set("LOCAL_RANK") &&
        strcmp(getenv("WORLD_SIZE"), "1") != 0)
        return hcomm__err(
            HCOMM_ERR_INVALID_ARG, fn,
            "started by torchrun (RANK=%s, WORLD_SIZE=%s, LOCAL_RANK=%s), which hcomm "
            "cannot join: each process would run its own world. Launch with mpirun "
            "-np %s (the mpi backend), or run one process with HCOMM_BACKEND=local",
            getenv("RANK"), getenv("WORLD_SIZE"), getenv("LOCAL_RANK"), getenv("WORLD_SIZE"));
    if (requested == NULL || requested[0] == '\0') {
        why = procs == 1 ? "a 1-process MPI job runs the default" : "no MPI launcher variables";
        requested = "local";
    }
    if (strcmp(requested, "local") == 0 && procs > 1 && !env_local)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "the local backend inside an MPI job of %ld processes (%s) would run %ld "
                          "separate worlds; use the mpi backend, or set HCOMM_BACKEND=local to "
                          "mean it",
                          procs, var, procs);
    HCOMM__LOG(HCOMM__LOG_INFO, HCOMM__SUB_LAUNCH, "backend %s: %s", requested, why);
    *backend = requested;
    return HCOMM_OK;
}

hcomm_result_t hcomm_launch_backend(const char *backend, const char **chosen) {
    HCOMM__CHECK_NULL(chosen);
    return hcomm__launch_detect(__func__, backend, chosen);
}
