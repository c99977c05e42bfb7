/* The mpi backend inside an MPI application (HCOMM_TEST_MPI): the application initializes
 * and finalizes MPI itself, wraps its communicators with hcomm_comm_wrap_mpi, launches worlds
 * on the MPI job; launch checks nranks, and a failing rank releases peers waiting on it with
 * HCOMM_ERR_ABORTED. Run without mpirun (the plain CTest entry), MPI starts as a singleton. */
#include "transport/transport.h"
#include "harness.h"
#include "p2p/p2p.h"

#include <limits.h>

#if defined(__has_include)
#if __has_include(<mpi.h>)
#define T_HAVE_MPI 1
#endif
#endif

#ifdef T_HAVE_MPI
#include "hcomm/mpi.h"

static int mpi_rank, mpi_size;

/* A wrapped communicator has the application's ranks and works for collectives and split. */
static void wrapped_world(void) {
    hcomm_comm_t *c = NULL;
    const char *name = NULL;
    int rank = -1, size = -1, members[64];
    T_OK(hcomm_comm_wrap_mpi(MPI_COMM_WORLD, &c));
    if (!c)
        return;
    T_OK(hcomm_comm_rank(c, &rank));
    T_OK(hcomm_comm_size(c, &size));
    T_EQ_INT(rank, mpi_rank);
    T_EQ_INT(size, mpi_size);
    T_OK(hcomm_comm_backend(c, &name));
    T_CHECK(name && strcmp(name, "mpi") == 0, "backend %s", name ? name : "(null)");
    T_OK(hcomm_comm_members(c, members, 64));
    for (int i = 0; i < size && i < 64; i++)
        T_EQ_INT(members[i], i);
    int64_t mine = rank + 1, sum = 0;
    T_OK(hcomm_all_reduce(c, &mine, &sum, 1, HCOMM_I64, HCOMM_SUM));
    T_EQ_INT(sum, (int64_t)size * (size + 1) / 2);
    hcomm_comm_t *g = NULL;
    T_OK(hcomm_comm_split(c, rank % 2, -rank, &g));
    if (g) {
        int gsize = 0;
        T_OK(hcomm_comm_size(g, &gsize));
        T_EQ_INT(gsize, (size - rank % 2 + 1) / 2);
        T_OK(hcomm_comm_destroy(g));
    }
    T_OK(hcomm_comm_destroy(c));
}

static bool errors_return(MPI_Comm comm) {
    MPI_Errhandler eh = MPI_ERRHANDLER_NULL;
    MPI_Comm_get_errhandler(comm, &eh);
    bool ret = eh == MPI_ERRORS_RETURN;
    if (eh != MPI_ERRHANDLER_NULL)
        MPI_Errhandler_free(&eh);
    return ret;
}

/* Open MPI reports an error inside a nonblocking collective on MPI_COMM_WORLD, whatever the
 * request's communicator; hcomm sets MPI_ERRORS_RETURN there (and on MPI_COMM_SELF), so such
 * an error comes back as a code instead of killing the job. Here each rank sends 8 bytes to
 * the next one, which expects 4: every rank's MPI_Test must return MPI_ERR_TRUNCATE. */
static void mpi_errors_return(void) {
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_ARE_FATAL);
    hcomm_comm_t *c = NULL;
    T_OK(hcomm_comm_wrap_mpi(MPI_COMM_WORLD, &c));
    T_CHECK(errors_return(MPI_COMM_WORLD), "MPI_COMM_WORLD's error handler is not ERRORS_RETURN");
    T_CHECK(errors_return(MPI_COMM_SELF), "MPI_COMM_SELF's error handler is not ERRORS_RETURN");
    T_OK(hcomm_comm_destroy(c));
    if (mpi_size > 64)
        return;
    MPI_Comm d = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &d);
    MPI_Comm_set_errhandler(d, MPI_ERRORS_RETURN);
    int sc[64], sd[64], rc[64], rd[64];
    char send[64 * 8] = {0}, recv[64 * 8];
    for (int p = 0; p < mpi_size; p++) {
        sc[p] = p == (mpi_rank + 1) % mpi_size ? 8 : 4;
        rc[p] = 4;
        sd[p] = rd[p] = 8 * p;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    int err = MPI_Ialltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, d, &req), done = 0;
    double t0 = hcomm__now();
    while (err == MPI_SUCCESS && !done && hcomm__now() - t0 < 30.0)
        err = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    int cls = MPI_SUCCESS;
    MPI_Error_class(err, &cls);
    T_CHECK(cls == MPI_ERR_TRUNCATE, "rank %d: mismatched MPI_Ialltoallv gave class %d, done %d",
            mpi_rank, cls, done);
    MPI_Barrier(MPI_COMM_WORLD); /* every rank's receives are over before d goes */
    MPI_Comm_free(&d);
}

/* Wrapping an application's sub-communicator: members are named as MPI_COMM_WORLD ranks, and
 * the application's own communicator stays usable (hcomm works on a duplicate). */
static void wrapped_split(void) {
    MPI_Comm odd_even = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, mpi_rank % 2, -mpi_rank, &odd_even);
    hcomm_comm_t *c = NULL;
    T_OK(hcomm_comm_wrap_mpi(odd_even, &c));
    if (c) {
        int size = 0, members[64] = {0};
        T_OK(hcomm_comm_size(c, &size));
        T_OK(hcomm_comm_members(c, members, 64));
        for (int i = 0; i < size && i < 64; i++)
            T_CHECK(members[i] % 2 == mpi_rank % 2 && (i == 0 || members[i] < members[i - 1]),
                    "member %d is world rank %d", i, members[i]);
        T_OK(hcomm_comm_destroy(c));
    }
    int one = 1, n = 0, size = 0;
    MPI_Allreduce(&one, &n, 1, MPI_INT, MPI_SUM, odd_even);
    MPI_Comm_size(odd_even, &size);
    T_EQ_INT(n, size);
    MPI_Comm_free(&odd_even);
}

/* What a comm answers about its node: a board, and one-copy reads or not. */
static hcomm_result_t node_answers(hcomm_comm_t *w, void *arg) {
    int *out = arg;
    out[0] = w->tr->board(w, w->rank) != NULL;
    out[1] = w->tr->peer_read_ok(w);
    return HCOMM_OK;
}

/* Sums at a size that takes several board meetings; the comm's node answers in got. */
static void wrapped_answers(MPI_Comm comm, int *got) {
    hcomm_comm_t *c = NULL;
    T_OK(hcomm_comm_wrap_mpi(comm, &c));
    if (!c)
        return;
    node_answers(c, got);
    got[0] = got[0] || c->size == 1; /* a comm of one has no board */
    enum { N = 100003 };
    int32_t *v = malloc(N * sizeof *v);
    for (int k = 0; v && k < N; k++)
        v[k] = c->rank + k;
    T_OK(hcomm_all_reduce(c, v, v, N, HCOMM_I32, HCOMM_SUM));
    int wrong = 0;
    for (int k = 0; v && k < N; k++)
        wrong += v[k] != c->size * (c->size - 1) / 2 + c->size * k;
    T_EQ_INT(wrong, 0);
    free(v);
    T_OK(hcomm_comm_destroy(c));
}

/* Before any launch in this process: a wrapped comm whose members share this host (mpirun on
 * one machine) finds its node as a launched world then does (the same board and one-copy
 * answers), on the world and on a split-off half wrapped alone. */
static void wrapped_node(void) {
    MPI_Comm half = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, mpi_rank % 2, mpi_rank, &half);
    int world[2] = {-1, -1}, halves[2] = {-1, -1}, launched[2] = {-1, -1};
    wrapped_answers(MPI_COMM_WORLD, world);
    wrapped_answers(half, halves);
    MPI_Comm_free(&half);
    T_OK(hcomm_launch("mpi", 0, node_answers, launched));
    launched[0] = launched[0] || mpi_size == 1;
    for (int i = 0; i < 2; i++) {
        T_CHECK(world[i] == launched[i] && halves[i] == launched[i],
                "%s: wrapped world %d, wrapped half %d, launched world %d",
                i ? "one-copy reads" : "board", world[i], halves[i], launched[i]);
    }
}

static hcomm_result_t sum_ranks(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int32_t mine = w->rank, sum = -1;
    HCOMM__TRY(hcomm_all_reduce(w, &mine, &sum, 1, HCOMM_I32, HCOMM_SUM));
    T_EQ_INT(sum, w->size * (w->size - 1) / 2);
    return HCOMM_OK;
}

/* Rank 1 fails at once; rank 0 waits for a message rank 1 never sends. */
static hcomm_result_t fail_rank1(hcomm_comm_t *w, void *arg) {
    double *waited = arg;
    if (w->rank == 1)
        return hcomm__err(HCOMM_ERR_IO, "fail_rank1", "rank 1 fails on purpose");
    if (w->rank != 0)
        return HCOMM_OK;
    int x = 0;
    double t0 = hcomm__now();
    hcomm_result_t r = hcomm__recv(w, HCOMM__CH_USER, 0, 1, &x, sizeof x, HCOMM__RECV_EXACT, NULL);
    *waited = hcomm__now() - t0;
    T_CHECK(r == HCOMM_ERR_ABORTED, "recv from the failed rank returned %s (%s)",
            hcomm_result_name(r), hcomm_last_error());
    return r;
}

/* Rank 0 waits for a message nobody sends: HCOMM_TIMEOUT ends the wait. */
static hcomm_result_t recv_nothing(hcomm_comm_t *w, void *arg) {
    (void)arg;
    if (w->rank != 0)
        return HCOMM_OK;
    int x = 0;
    hcomm_result_t r =
        hcomm__recv(w, HCOMM__CH_USER, 0, w->size - 1, &x, sizeof x, HCOMM__RECV_EXACT, NULL);
    T_CHECK(r == HCOMM_ERR_TIMEOUT, "recv nobody sends returned %s (%s)", hcomm_result_name(r),
            hcomm_last_error());
    T_CHECK(strstr(hcomm_last_error(), "HCOMM_TIMEOUT") != NULL, "got '%s'", hcomm_last_error());
    return r;
}

static void timeout_ends_wait(void) {
    const char *old = getenv("HCOMM_TIMEOUT");
    char saved[32] = "";
    if (old)
        snprintf(saved, sizeof saved, "%s", old);
    setenv("HCOMM_TIMEOUT", "1", 1);
    double t0 = hcomm__now();
    hcomm_result_t r = hcomm_launch("mpi", 0, recv_nothing, NULL);
    double took = hcomm__now() - t0;
    hcomm_result_t want = mpi_rank == 0 ? HCOMM_ERR_TIMEOUT : HCOMM_ERR_ABORTED;
    T_CHECK(r == want, "rank %d: launch returned %s, expected %s", mpi_rank, hcomm_result_name(r),
            hcomm_result_name(want));
    T_CHECK(took < 30.0, "a 1 s timeout took %.1f s", took);
    if (old)
        setenv("HCOMM_TIMEOUT", saved, 1);
    else
        unsetenv("HCOMM_TIMEOUT");
}

/* What one MPI call cannot carry fails cleanly before any buffer is touched (the buffers
 * here are tiny), on every rank alike, so no rank is left waiting. */
static hcomm_result_t limits(hcomm_comm_t *w, void *arg) {
    (void)arg;
    if (w->size > 64)
        return HCOMM_OK;
    char b[8] = {0};
    size_t big = (size_t)INT_MAX + 1, zeros[64] = {0}, bigs[64];
    for (int i = 0; i < 64; i++)
        bigs[i] = i == w->size - 1 ? big : 0;
    T_ERR(hcomm__send(w, HCOMM__CH_USER, 0, 0, b, big, NULL), HCOMM_ERR_UNSUPPORTED);
    T_CHECK(strstr(hcomm_last_error(), "INT_MAX") != NULL, "got '%s'", hcomm_last_error());
    T_ERR(w->tr->native->all_reduce(w, b, b, big, HCOMM_U8, HCOMM_SUM), HCOMM_ERR_UNSUPPORTED);
    T_ERR(w->tr->native->reduce_scatter(w, b, b, big, HCOMM_U8, HCOMM_MAX), HCOMM_ERR_UNSUPPORTED);
    T_ERR(w->tr->native->all_gather(w, b, b, big), HCOMM_ERR_UNSUPPORTED);
    T_ERR(w->tr->native->broadcast(w, b, big, 0), HCOMM_ERR_UNSUPPORTED);
    T_ERR(w->tr->native->all_to_allv(w, b, bigs, zeros, b, zeros, zeros, false),
          HCOMM_ERR_UNSUPPORTED);
    T_CHECK(strstr(hcomm_last_error(), "sendcounts[") != NULL, "got '%s'", hcomm_last_error());
    /* A displacement above INT_MAX is refused for a nonempty block only (an empty block's is
     * never used). */
    size_t last_one[64] = {0};
    last_one[w->size - 1] = 1;
    T_ERR(w->tr->native->all_to_allv(w, b, zeros, zeros, b, last_one, bigs, false),
          HCOMM_ERR_UNSUPPORTED);
    T_CHECK(strstr(hcomm_last_error(), "recvdispls[") != NULL, "got '%s'", hcomm_last_error());
    T_ERR(hcomm__send(w, HCOMM__CH_USER, 0, w->size, b, 1, NULL), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm__send(w, HCOMM__CH_USER, 0, -1, b, 1, NULL), HCOMM_ERR_INVALID_ARG);
    T_ERR(w->tr->native->all_reduce(w, b, b, 1, HCOMM_F32, HCOMM_AVG), HCOMM_ERR_INVALID_ARG);
    /* The world is still usable after all of that. */
    return sum_ranks(w, NULL);
}

static void launches(void) {
    T_OK(hcomm_launch("mpi", 0, sum_ranks, NULL));
    T_OK(hcomm_launch("mpi", mpi_size, sum_ranks, NULL));
    T_OK(hcomm_launch("mpi", 0, limits, NULL));
    T_ERR(hcomm_launch("mpi", mpi_size + 1, sum_ranks, NULL), HCOMM_ERR_INVALID_ARG);
    char a[16], b[16];
    snprintf(a, sizeof a, "%d", mpi_size + 1);
    snprintf(b, sizeof b, "%d", mpi_size);
    T_CHECK(strstr(hcomm_last_error(), a) && strstr(hcomm_last_error(), b),
            "message should name %s and %s: '%s'", a, b, hcomm_last_error());
    if (mpi_size < 2)
        return;
    double waited = -1.0;
    hcomm_result_t r = hcomm_launch("mpi", 0, fail_rank1, &waited);
    hcomm_result_t want = mpi_rank == 1 ? HCOMM_ERR_IO : HCOMM_ERR_ABORTED;
    T_CHECK(r == want, "rank %d: launch with a failing rank returned %s, expected %s", mpi_rank,
            hcomm_result_name(r), hcomm_result_name(want));
    if (mpi_rank == 0)
        T_CHECK(waited >= 0.0 && waited < 60.0, "rank 0 waited %.1f s for the failed rank", waited);
    /* The next world starts clean. */
    T_OK(hcomm_launch("mpi", 0, sum_ranks, NULL));
    timeout_ends_wait();
    T_OK(hcomm_launch("mpi", 0, sum_ranks, NULL));
}

int main(void) {
    hcomm_comm_t *c = (hcomm_comm_t *)&c;
    T_ERR(hcomm_comm_wrap_mpi(MPI_COMM_WORLD, &c), HCOMM_ERR_STATE);
    T_CHECK(c == NULL, "failed wrap left *out set");
    int provided = 0;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
    T_ERR(hcomm_comm_wrap_mpi(MPI_COMM_WORLD, NULL), HCOMM_ERR_NULL);
    T_ERR(hcomm_comm_wrap_mpi(MPI_COMM_NULL, &c), HCOMM_ERR_INVALID_ARG);
    const char *env = getenv("HCOMM_TIMEOUT");
    char saved[64] = "";
    snprintf(saved, sizeof saved, "%s", env ? env : "");
    setenv("HCOMM_TIMEOUT", "abc", 1); /* every rank alike: a malformed variable, as at launch */
    T_ERR(hcomm_comm_wrap_mpi(MPI_COMM_WORLD, &c), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), "hcomm_comm_wrap_mpi: HCOMM_TIMEOUT") != NULL,
            "malformed HCOMM_TIMEOUT: '%s'", hcomm_last_error());
    if (env)
        setenv("HCOMM_TIMEOUT", saved, 1);
    else
        unsetenv("HCOMM_TIMEOUT");
    wrapped_node(); /* first: no launch has made the node table yet */
    wrapped_world();
    mpi_errors_return();
    wrapped_split();
    launches();
    MPI_Finalize();
    T_ERR(hcomm_comm_wrap_mpi(MPI_COMM_WORLD, &c), HCOMM_ERR_STATE);
    T_ERR(hcomm_launch("mpi", 0, sum_ranks, NULL), HCOMM_ERR_STATE);
    return t_finish("test_mpi_wrap");
}

#else /* hcomm built without MPI: the mpi backend must say so. */

static hcomm_result_t never(hcomm_comm_t *w, void *arg) {
    (void)w, (void)arg;
    return HCOMM_ERR_INTERNAL;
}

int main(void) {
    T_ERR(hcomm_launch("mpi", 0, never, NULL), HCOMM_ERR_UNSUPPORTED);
    return t_finish("test_mpi_wrap");
}
#endif
