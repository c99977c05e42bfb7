/* hcomm_launch on the local backend: rank numbering, world members, failure propagation
 * (a failed rank aborts its peers instead of leaving them hanging) and the wait timeout. */
#include "harness.h"

#include "core/internal.h"

static hcomm_result_t check_world(hcomm_comm_t *world, void *arg) {
    int *seen = arg, rank = -1, size = -1, members[64];
    const char *backend = NULL;
    T_OK(hcomm_comm_rank(world, &rank));
    T_OK(hcomm_comm_size(world, &size));
    T_OK(hcomm_comm_backend(world, &backend));
    T_CHECK(backend && strcmp(backend, t_backend()) == 0, "backend %s", backend);
    T_OK(hcomm_comm_members(world, members, 64));
    for (int i = 0; i < size; i++)
        T_EQ_INT(members[i], i);
    T_ERR(hcomm_comm_members(world, members, size - 1), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_comm_destroy(world), HCOMM_ERR_STATE);
    if (strcmp(t_backend(), "local") == 0)
        __atomic_fetch_add(&seen[rank], 1, __ATOMIC_SEQ_CST);
    return hcomm_barrier(world);
}

static void test_every_rank_runs_once(void) {
    for (int n = 1; n <= 8; n++) {
        int seen[8] = {0};
        T_OK(hcomm_launch("local", n, check_world, seen));
        for (int r = 0; r < n; r++)
            T_EQ_INT(seen[r], 1);
    }
}

/* Rank 1 fails at once; the others wait in a barrier it never reaches. */
static hcomm_result_t fail_rank_one(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int rank = 0;
    hcomm_comm_rank(world, &rank);
    if (rank == 1)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, "fail_rank_one", "rank one fails on purpose");
    hcomm_result_t r = hcomm_barrier(world);
    T_EQ_INT(r, HCOMM_ERR_ABORTED);
    return r;
}

static void test_failure_aborts_peers(void) {
    double t0 = hcomm__now();
    T_ERR(hcomm_launch("local", 4, fail_rank_one, NULL), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), "rank 1") && strstr(hcomm_last_error(), "on purpose"),
            "launch error names the failing rank and its message: '%s'", hcomm_last_error());
    T_CHECK(hcomm__now() - t0 < 10.0, "abort took %.1f s", hcomm__now() - t0);
}

/* Rank 0 fails after a barrier; its peers keep calling collectives. None of those may
 * succeed: rank 0 never joins them (a stale arrival count once let them "complete" and read
 * rank 0's dead stack). */
static hcomm_result_t fail_then_peers_continue(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int rank = 0;
    hcomm_comm_rank(world, &rank);
    T_OK(hcomm_barrier(world));
    if (rank == 0)
        return hcomm__err(HCOMM_ERR_IO, "fail_then_peers_continue", "rank 0 fails on purpose");
    int mine = rank, all[8];
    hcomm_result_t last = HCOMM_OK;
    for (int i = 0; i < 3; i++) {
        last = hcomm_all_gather(world, &mine, all, sizeof mine);
        T_CHECK(last == HCOMM_ERR_ABORTED, "all_gather %d without rank 0 returned %s", i,
                hcomm_result_name(last));
    }
    return last;
}

static void test_no_collective_after_abort(void) {
    T_ERR(hcomm_launch("local", 4, fail_then_peers_continue, NULL), HCOMM_ERR_IO);
    T_CHECK(strstr(hcomm_last_error(), "rank 0") != NULL, "got '%s'", hcomm_last_error());
}

/* Rank 0 returns without the barrier its peers wait in: a timeout, not a hang. */
static hcomm_result_t skip_barrier(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int rank = 0;
    hcomm_comm_rank(world, &rank);
    if (rank == 0)
        return HCOMM_OK;
    return hcomm_barrier(world);
}

static void test_missing_peer_times_out(void) {
    setenv("HCOMM_TIMEOUT", "1", 1);
    T_ERR(hcomm_launch("local", 3, skip_barrier, NULL), HCOMM_ERR_TIMEOUT);
    T_CHECK(strstr(hcomm_last_error(), "HCOMM_TIMEOUT") != NULL, "got '%s'", hcomm_last_error());
    setenv("HCOMM_TIMEOUT", "120", 1);
}

static hcomm_result_t split_and_check(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int rank, size;
    hcomm_comm_rank(world, &rank);
    hcomm_comm_size(world, &size);
    hcomm_comm_t *half = NULL, *none = (hcomm_comm_t *)world;
    /* Odd ranks form one group ordered by descending rank; even ranks opt out. */
    T_OK(hcomm_comm_split(world, rank % 2 ? 7 : -1, -rank, &half));
    T_OK(hcomm_comm_split(world, -1, 0, &none));
    T_CHECK(none == NULL, "color -1 gives NULL");
    if (rank % 2 == 0) {
        T_CHECK(half == NULL, "rank %d opted out but got a group", rank);
        return HCOMM_OK;
    }
    int hr, hs, members[8];
    T_OK(hcomm_comm_rank(half, &hr));
    T_OK(hcomm_comm_size(half, &hs));
    T_EQ_INT(hs, size / 2);
    T_OK(hcomm_comm_members(half, members, 8));
    for (int i = 0; i < hs; i++) /* odd ranks, largest first */
        T_EQ_INT(members[i], (size % 2 ? size - 2 : size - 1) - 2 * i);
    T_EQ_INT(members[hr], rank);
    int64_t v = rank, sum = 0;
    T_OK(hcomm_all_reduce(half, &v, &sum, 1, HCOMM_I64, HCOMM_SUM));
    int64_t expect = 0;
    for (int i = 0; i < hs; i++)
        expect += members[i];
    T_EQ_INT(sum, expect);
    return hcomm_comm_destroy(half);
}

static void test_split(void) {
    t_for_each_world(split_and_check, NULL, 8);
}

/* Rank 0 broadcasts while the others all_reduce: everyone gets HCOMM_ERR_MISMATCH, no crash,
 * and the world stays usable. */
static hcomm_result_t mismatched_calls(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int rank, size;
    hcomm_comm_rank(world, &rank);
    hcomm_comm_size(world, &size);
    float v[4] = {1, 2, 3, 4}, out[4];
    hcomm_result_t r = rank == 0 ? hcomm_broadcast(world, v, sizeof v, 0)
                                 : hcomm_all_reduce(world, v, out, 4, HCOMM_F32, HCOMM_SUM);
    if (size > 1)
        T_EQ_INT(r, HCOMM_ERR_MISMATCH);
    r = rank == 0 ? hcomm_barrier(world) : hcomm_all_reduce(world, v, out, 3, HCOMM_F32, HCOMM_SUM);
    if (size > 1)
        T_EQ_INT(r, HCOMM_ERR_MISMATCH);
    T_OK(hcomm_all_reduce(world, v, out, 4, HCOMM_F32, HCOMM_SUM));
    T_CHECK(out[3] == 4.0f * (float)size, "sum after mismatch: %g", out[3]);
    return HCOMM_OK;
}

int main(void) {
    if (strcmp(t_backend(), "local") == 0) {
        test_every_rank_runs_once();
        test_failure_aborts_peers();
        test_missing_peer_times_out();
        test_no_collective_after_abort();
        t_for_each_world(mismatched_calls, NULL, 8);
    } else {
        T_OK(hcomm_launch(NULL, 0, check_world, NULL));
    }
    test_split();
    return t_finish("test_launch");
}
/* HCOMM_TEST_MPI */
