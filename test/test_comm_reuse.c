/* A destroyed communicator's messages never reach a later one. HCOMM_TEST_MPI
 * Open MPI hands a freed communicator's context id to the next one it makes; a message still
 * in flight on the old one (a failure notice nobody waited for, a send never received) was then
 * delivered on the new one: a later call there failed with a peer's old error, or took the old
 * message for its own. Here rank 0 sends a message on A that rank 1 never receives, after rank
 * 1 has begun destroying A (eager sends only: a rendezvous send waits for its receiver), or
 * fails its own checks in an all_reduce on A that its peers leave on the board without reading
 * its notice; then every rank makes B and rank 0 sends there with the same tag. */
#include "harness.h"

#include <time.h>

static void nap_ms(long ms) {
    nanosleep(&(struct timespec){0, ms * 1000000L}, NULL);
}

/* A send of 64 bytes completes without its receiver (HCOMM_EAGER_LIMIT, default 64 KiB). */
static int sends_eagerly(void) {
    const char *e = getenv("HCOMM_EAGER_LIMIT");
    return !e || atol(e) >= 64;
}

enum { TAG = 7, N = 16 };

static void fill(int32_t *v, int32_t base) {
    for (int i = 0; i < N; i++)
        v[i] = base + i;
}

/* Rank 0's message on A (value base 1000), sent once rank 1 is likely inside its destroy. */
static hcomm_result_t unreceived_on(hcomm_comm_t *a) {
    int32_t v[N];
    int64_t shape[1] = {N};
    hcomm_tensor_t t;
    fill(v, 1000);
    T_TRY(hcomm_tensor_init(&t, v, HCOMM_I32, 1, shape));
    nap_ms(200);
    T_TRY(hcomm_pp_send(a, &t, 1, TAG));
    return HCOMM_OK;
}

/* Rank 0 comes late with a NULL sendbuf: its peers read its failure on the board and go on to
 * destroy A while its notice may still be on the way. */
static void failed_on(hcomm_comm_t *a) {
    int32_t x = 1;
    if (t_rank(a) == 0)
        nap_ms(200);
    T_CHECK(hcomm_all_reduce(a, t_rank(a) == 0 ? NULL : &x, &x, 1, HCOMM_I32, HCOMM_SUM) !=
                HCOMM_OK,
            "an all_reduce with a NULL sendbuf on rank 0 succeeded");
}

/* B carries its own messages only: rank 1 gets rank 0's B message (base 2000), and a barrier
 * and an all_reduce on B succeed on every rank. */
static hcomm_result_t check_fresh(hcomm_comm_t *b) {
    int rank = t_rank(b);
    int32_t v[N], sum = rank, expect = t_size(b) * (t_size(b) - 1) / 2;
    int64_t shape[1] = {N};
    hcomm_tensor_t t;
    fill(v, rank == 0 ? 2000 : 0);
    T_TRY(hcomm_tensor_init(&t, v, HCOMM_I32, 1, shape));
    if (rank == 0)
        T_OK(hcomm_pp_send(b, &t, 1, TAG));
    if (rank == 1) {
        T_OK(hcomm_pp_recv(b, &t, 0, TAG));
        for (int i = 0; i < N; i++)
            T_CHECK(v[i] == 2000 + i, "B's message: element %d is %d, expected %d", i, (int)v[i],
                    2000 + i);
    }
    T_OK(hcomm_barrier(b));
    T_OK(hcomm_all_reduce(b, &sum, &sum, 1, HCOMM_I32, HCOMM_SUM));
    T_EQ_INT(sum, expect);
    return HCOMM_OK;
}

static hcomm_result_t reuse_world(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int rank = t_rank(world);
    if (t_size(world) < 2)
        return HCOMM_OK;
    for (int round = 0; round < 4; round++) {
        hcomm_comm_t *a = NULL, *b = NULL;
        T_TRY(hcomm_comm_split(world, 0, rank, &a));
        T_TRY(hcomm_comm_set_timeout(a, 20.0));
        if (round % 2)
            failed_on(a);
        else if (rank == 0 && sends_eagerly())
            T_TRY(unreceived_on(a));
        T_OK(hcomm_comm_destroy(a));
        T_TRY(hcomm_comm_split(world, 0, rank, &b));
        T_TRY(hcomm_comm_set_timeout(b, 20.0));
        hcomm_result_t r = check_fresh(b);
        T_OK(hcomm_comm_destroy(b));
        if (r != HCOMM_OK)
            return r;
    }
    return hcomm_barrier(world);
}

int main(void) {
    t_for_each_world(reuse_world, NULL, 4);
    return t_finish("test_comm_reuse");
}
