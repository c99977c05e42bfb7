/* HCOMM_ALGO from the environment (read once per process, validated at hcomm_launch) against
 * the per-communicator choice (hcomm_comm_set_algo), which must win:
 *   - with HCOMM_ALGO="allreduce:naive;broadcast:chain;allgather:^native,ring" the choice
 *     follows it, and a communicator's own spec overrides it;
 *   - end to end: rank 0 forcing ring while its peers follow the environment's naive fails on
 *     every rank with HCOMM_ERR_MISMATCH naming both algorithms; after rank 0 clears its spec
 *     every rank runs naive (the result is the serial one) and chain broadcasts;
 *   - bad values fail hcomm_launch naming HCOMM_ALGO and the valid names (each in a child
 *     process, local backend only: the variable is read once per process).
 * HCOMM_TEST_MPI: the first two parts also run under mpirun. */
#include "algo/coll.h"
#include "choose_default.h"
#include "harness.h"

#include <sys/wait.h>
#include <unistd.h>

#define SPEC "allreduce:naive;broadcast:chain;allgather:^native,ring"

static void choices(void) {
    const char *why = NULL;
    int a = choose_default(NULL, HCOMM__COLL_ALLREDUCE, 8, 4, false, &why);
    T_CHECK(a == HCOMM__ALGO_NAIVE && strcmp(why, "HCOMM_ALGO") == 0,
            "HCOMM_ALGO=" SPEC ": allreduce chose %s (%s)", hcomm__algo_name(a), why);
    a = choose_default(NULL, HCOMM__COLL_BROADCAST, 1 << 20, 4, true, &why);
    T_CHECK(a == HCOMM__ALGO_CHAIN, "broadcast chose %s", hcomm__algo_name(a));
    a = choose_default(NULL, HCOMM__COLL_ALLGATHER, 1 << 20, 4, true, &why);
    T_CHECK(a == HCOMM__ALGO_RD || a == HCOMM__ALGO_BRUCK, "allgather:^native,ring chose %s",
            hcomm__algo_name(a));
    a = choose_default(NULL, HCOMM__COLL_REDUCESCATTER, 1 << 20, 4, true, &why);
    T_CHECK(a == HCOMM__ALGO_NATIVE && strcmp(why, "default") == 0,
            "reducescatter (not named) chose %s (%s)", hcomm__algo_name(a), why);
    hcomm__algo_set_t over;
    T_OK(hcomm__algo_parse("test", "spec", "allreduce:rhd", &over));
    a = choose_default(&over, HCOMM__COLL_ALLREDUCE, 8, 4, false, &why);
    T_CHECK(a == HCOMM__ALGO_RHD && strcmp(why, "hcomm_comm_set_algo") == 0,
            "the communicator's allreduce:rhd against HCOMM_ALGO naive chose %s (%s)",
            hcomm__algo_name(a), why);
}

static hcomm_result_t per_comm_wins(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int p = t_size(w), me = t_rank(w);
    double v[5], want = 0;
    for (int r = 0; r < p; r++)
        want += 0.1 * (r + 1); /* rank order, as naive sums */
    if (p >= 2) {
        T_TRY(hcomm_comm_set_algo(w, me == 0 ? "allreduce:ring" : NULL));
        hcomm_result_t r = hcomm_all_reduce(w, v, v, 5, HCOMM_F64, HCOMM_SUM);
        T_CHECK(r == HCOMM_ERR_MISMATCH && strstr(hcomm_last_error(), "algo=ring on rank 0") &&
                    strstr(hcomm_last_error(), "algo=naive on rank"),
                "ring on rank 0 against HCOMM_ALGO's naive: rank %d got %s (%s)", me,
                hcomm_result_name(r), hcomm_last_error());
        T_TRY(hcomm_comm_set_algo(w, NULL));
    }
    for (int i = 0; i < 5; i++)
        v[i] = 0.1 * (me + 1);
    T_TRY(hcomm_all_reduce(w, v, v, 5, HCOMM_F64, HCOMM_SUM));
    for (int i = 0; i < 5; i++)
        T_CHECK(v[i] == want, "naive sum on %d ranks: element %d is %.17g, expected %.17g", p, i,
                v[i], want);
    unsigned char b[300000];
    for (size_t i = 0; i < sizeof b; i++)
        b[i] = me == p - 1 ? (unsigned char)(i * 7) : 0;
    T_TRY(hcomm_broadcast(w, b, sizeof b, p - 1));
    size_t bad = 0;
    while (bad < sizeof b && b[bad] == (unsigned char)(bad * 7))
        bad++;
    T_CHECK(bad == sizeof b, "chain broadcast: rank %d byte %zu differs", me, bad);
    return HCOMM_OK;
}

/* A communicator's choices are cached per collective, size and override (choose.c): calls of one
 * size that set, change and clear the override in turn must each run what it says, and the
 * same as the first time under it where it does not name all_reduce (which then runs its
 * default, not HCOMM_ALGO's: the communicator's spec replaces the environment's). */
static hcomm_result_t overrides_cached(hcomm_comm_t *w, void *arg) {
    (void)arg;
    static const char *const specs[] = {"allreduce:ring", NULL, "allreduce:rhd",
                                        "allreduce:ring", NULL, "broadcast:tree"};
    const char *ran[] = {"ring", "naive", "rhd", "ring", "naive", NULL};
    int p = t_size(w), me = t_rank(w);
    double v[7];
    for (int round = 0; round < 3; round++)
        for (int s = 0; s < 6; s++) {
            T_TRY(hcomm_comm_set_algo(w, specs[s]));
            for (int i = 0; i < 7; i++)
                v[i] = me + 1;
            hcomm__coll_take_algo(w);
            T_TRY(hcomm_all_reduce(w, v, v, 7, HCOMM_F64, HCOMM_SUM));
            const char *got = hcomm__coll_take_algo(w);
            ran[s] = ran[s] ? ran[s] : got;
            T_CHECK(got && strcmp(got, ran[s]) == 0 && v[6] == p * (p + 1) / 2.0,
                    "round %d, spec %s on %d ranks: ran %s, sum %g", round,
                    specs[s] ? specs[s] : "none", p, got ? got : "nothing", v[6]);
        }
    return hcomm_comm_set_algo(w, NULL);
}

static hcomm_result_t nothing(hcomm_comm_t *w, void *arg) {
    (void)w;
    (void)arg;
    return HCOMM_OK;
}

/* In a child: HCOMM_ALGO=spec must fail hcomm_launch with a message containing must_say. */
static void bad_at_launch(const char *spec, const char *must_say) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("HCOMM_ALGO", spec, 1);
        hcomm_result_t r = hcomm_launch("local", 2, nothing, NULL);
        bool ok = r == HCOMM_ERR_INVALID_ARG && strstr(hcomm_last_error(), "HCOMM_ALGO") &&
                  strstr(hcomm_last_error(), must_say);
        if (!ok)
            fprintf(stderr,
                    "HCOMM_ALGO=\"%s\": hcomm_launch gave %s (%s), expected a message "
                    "saying \"%s\"\n",
                    spec, hcomm_result_name(r), hcomm_last_error(), must_say);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    T_CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
                WEXITSTATUS(status) == 0,
            "HCOMM_ALGO=\"%s\" at hcomm_launch (see the child's message above)", spec);
}

int main(void) {
    /* HCOMM_TEST_MPI */
    bool local = strcmp(t_backend(), "local") == 0;
    if (local) { /* before this process reads HCOMM_ALGO itself */
        bad_at_launch("allreduce:rings", "valid: native, rd, ring, rhd, naive");
        bad_at_launch("allreduse:ring", "is not a collective");
        bad_at_launch("broadcast:^native,tree,chain,scatter_allgather,rd,direct,shm",
                      "leaves no algorithm");
        bad_at_launch("allgather:", "names no algorithm");
        bad_at_launch("allgather:,", "names no algorithm");
        /* empty names and entries are skipped, and parsing goes on past them */
        bad_at_launch("allreduce:,ring,;;allgather:ringg", "\"ringg\" is not an algorithm");
    }
    setenv("HCOMM_ALGO", SPEC, 1);
    choices();
    t_for_each_world(per_comm_wins, NULL, 5);
    t_for_each_world(overrides_cached, NULL, 5);
    return t_finish("test_algo_env");
}
