/* The mpi backend: each process of an mpirun/srun job is one rank; every hcomm communicator
 * owns a duplicate MPI communicator, so hcomm's traffic never matches the application's. This
 * file holds the MPI session, communicator creation and split, the launch, and the transport's
 * table, which names the parts below it (mpi_base.h lists them).
 *
 * No MPI error is fatal: hcomm's communicators use MPI_ERRORS_RETURN, and hcomm also sets
 * MPI_ERRORS_RETURN on MPI_COMM_WORLD and MPI_COMM_SELF whenever it initializes MPI or first
 * uses it (every hcomm_launch and hcomm_comm_wrap_mpi), because Open MPI reports errors of
 * nonblocking collectives (raised in MPI_Test) on MPI_COMM_WORLD. An application that wants
 * MPI_ERRORS_ARE_FATAL for its own calls must set it again on those two. A failed MPI call
 * becomes HCOMM_ERR_MISMATCH (MPI_ERR_TRUNCATE) or HCOMM_ERR_BACKEND with MPI's text.
 *
 * Ranks that disagree on a collective fail together with HCOMM_ERR_MISMATCH, as on the local
 * backend, instead of feeding MPI mismatched calls (which truncate, corrupt or hang). The
 * transport itself does not compare calls: the algorithms layer agrees on each call's
 * signature before it calls a native collective (in a meeting on the board where the comm has
 * one, else over the lane; every call, the first of each signature, or never, as HCOMM_CHECK
 * says), and all_to_allv exchanges its per-peer byte counts before moving any data
 * (mpi_coll.c). Every wait polls, so a missing peer times out and a failed one aborts the
 * wait (mpi_base.c). */
#include "hcomm/mpi.h"

#include "transport/mpi_base.h"

#include "core/env.h"
#include "core/topo_spec.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const hcomm__transport_t mpi_tr;

/* --- MPI session --- */

static void finalize_at_exit(void) {
    int done = 0;
    MPI_Finalized(&done);
    if (done)
        return;
    /* After a lost process MPI_Finalize may wait for it in its closing fence (Open MPI 4.1,
     * now and then): a survivor ends without it, as mpirun --enable-recovery allows. */
    if (hcomm__mpi_any_lost()) {
        hcomm__shm_unlink_all();
        return;
    }
    if (hcomm__mpi_poisoned) {
        fprintf(stderr, "hcomm: an MPI operation was abandoned after a timeout or abort; "
                        "aborting the job instead of a possibly hanging MPI_Finalize\n");
        hcomm__shm_unlink_all(); /* MPI_Abort kills the process: no destructors run */
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
}

/* Errors that Open MPI raises for hcomm's requests go to MPI_COMM_WORLD (nonblocking
 * collectives) or MPI_COMM_SELF; with the default MPI_ERRORS_ARE_FATAL a mismatch would kill
 * the job instead of returning an error (see the top of this file). */
static hcomm_result_t errors_return(const char *fn) {
    MPI_TRY(fn, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_TRY(fn, MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));
    return HCOMM_OK;
}

/* MPI is usable: initializes it when may_init (and finalizes it at exit), else requires it. */
static hcomm_result_t mpi_ready(const char *fn, bool may_init) {
    static bool exit_registered;
    int flag = 0;
    MPI_Finalized(&flag);
    if (flag)
        return hcomm__err(HCOMM_ERR_STATE, fn, "MPI is already finalized");
    MPI_Initialized(&flag);
    if (!flag && !may_init)
        return hcomm__err(HCOMM_ERR_STATE, fn, "MPI is not initialized: call MPI_Init first");
    if (!flag) {
        /* MULTIPLE keeps hcomm's promise that distinct comms may be used from distinct
         * threads; with less provided, one thread at a time still works. */
        int provided = 0;
        MPI_TRY(fn, MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided));
        if (!exit_registered && atexit(finalize_at_exit) == 0)
            exit_registered = true;
    }
    HCOMM__TRY(errors_return(fn));
    return hcomm__mpi_objects_create(fn);
}

/* --- communicators --- */

/* world_ranks[i] = the MPI_COMM_WORLD rank of member i. */
static hcomm_result_t fill_world_ranks(const char *fn, hcomm_comm_t *c) {
    int *idx = malloc(sizeof(int) * (size_t)c->size);
    if (!idx)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %d ranks", c->size);
    for (int i = 0; i < c->size; i++)
        idx[i] = i;
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    int rc = MPI_Comm_group(mcomm(c), &mine);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_group(MPI_COMM_WORLD, &world);
    if (rc == MPI_SUCCESS)
        rc = MPI_Group_translate_ranks(mine, c->size, idx, world, c->world_ranks);
    if (mine != MPI_GROUP_NULL)
        MPI_Group_free(&mine);
    if (world != MPI_GROUP_NULL)
        MPI_Group_free(&world);
    free(idx);
    return rc == MPI_SUCCESS ? HCOMM_OK : hcomm__mpi_fail(fn, "MPI_Group_translate_ranks", rc);
}

/* Wraps mc (owned from here on: freed on failure) into a new hcomm comm; parent (may be NULL)
 * passes on its settings; cma: its members' cross-memory verdict. */
static hcomm_result_t adopt(const char *fn, MPI_Comm mc, const hcomm_comm_t *parent, bool cma,
                            hcomm_comm_t **out) {
    int rank = 0, size = 0;
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mc, &rank);
    MPI_Comm_size(mc, &size);
    mpi_impl_t *impl = calloc(1, sizeof *impl);
    hcomm_comm_t *c = impl ? hcomm__comm_alloc(&mpi_tr, impl, rank, size, parent) : NULL;
    if (!c) {
        free(impl);
        MPI_Comm_free(&mc);
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for a communicator of %d ranks",
                          size);
    }
    impl->comm = mc;
    impl->broken = HCOMM_OK;
    impl->cma = cma;
    c->call_fn = fn; /* what its setup's waits name */
    hcomm_result_t r = fill_world_ranks(fn, c);
    if (r == HCOMM_OK)
        r = hcomm__mpi_frames_init(fn, c);
    if (r == HCOMM_OK)
        r = hcomm__mpi_board_init(fn, c);
    if (r != HCOMM_OK) {
        hcomm__comm_free(c);
        return r;
    }
    impl->adopted = true; /* hcomm frames may travel on it from here on */
    *out = c;
    return HCOMM_OK;
}

/* MPI_Comm_idup, polled: ranks that cannot reach each other time out instead of hanging. */
static hcomm_result_t dup_comm(const char *fn, MPI_Comm parent, bool cma, hcomm_comm_t **out) {
    MPI_Comm mc = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_TRY(fn, MPI_Comm_idup(parent, &mc, &req));
    HCOMM__TRY(hcomm__mpi_wait_setup(fn, "MPI_Comm_idup", &req));
    return adopt(fn, mc, NULL, cma, out);
}

/* The ranks of live wrapped comms, counted as a launch counts its own (core/wait.c): one rank
 * in this process, and the most members on this host that any of them has. */
static pthread_mutex_t wrap_mu = PTHREAD_MUTEX_INITIALIZER;
static int wraps_live, wrap_here;

static void wrap_count(int here) {
    pthread_mutex_lock(&wrap_mu);
    if (wraps_live++ == 0)
        hcomm__ranks_here(1, wrap_here = here);
    else if (here > wrap_here)
        hcomm__ranks_here(0, here - wrap_here), wrap_here = here;
    pthread_mutex_unlock(&wrap_mu);
}

static void wrap_uncount(void) {
    pthread_mutex_lock(&wrap_mu);
    if (--wraps_live == 0)
        hcomm__ranks_here(-1, -wrap_here), wrap_here = 0;
    pthread_mutex_unlock(&wrap_mu);
}

/* A wrapped comm learns its members' hosts (the board, one-copy reads) and counts its rank, so
 * its waits spin where every member on a host has a core, as a launched comm's do. */
static hcomm_result_t wrap_comm(const char *fn, MPI_Comm comm, hcomm_comm_t **out) {
    bool cma = false;
    int here = 0;
    HCOMM__TRY(hcomm__mpi_nodes_learn(fn, comm, &cma, &here));
    HCOMM__TRY(dup_comm(fn, comm, cma, out));
    if (hcomm__mpi_abort_comm == MPI_COMM_NULL) { /* inside a launch its rank is counted */
        impl_of(*out)->wrapped = true;
        wrap_count(here);
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_wrap_mpi(MPI_Comm comm, hcomm_comm_t **out) {
    HCOMM__CHECK_NULL(out);
    *out = NULL;
    HCOMM__TRY(hcomm__env_validate(__func__)); /* as hcomm_launch: no silent defaults */
    HCOMM__TRY(mpi_ready(__func__, false));
    if (comm == MPI_COMM_NULL)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "comm is MPI_COMM_NULL");
    int inter = 0;
    MPI_TRY(__func__, MPI_Comm_test_inter(comm, &inter));
    if (inter)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__,
                          "comm is an intercommunicator; hcomm needs an intracommunicator");
    return wrap_comm(__func__, comm, out);
}

/* The algorithms layer has seen every rank arrive (a signature agreement over p2p) before it
 * calls this, so the blocking MPI_Comm_split cannot hang. */
static hcomm_result_t mpi_split(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out) {
    HCOMM__TRY(check_usable(c->call_fn, c));
    MPI_Comm mc = MPI_COMM_NULL;
    MPI_TRY(c->call_fn, MPI_Comm_split(mcomm(c), color < 0 ? MPI_UNDEFINED : color, key, &mc));
    *out = NULL;
    if (mc == MPI_COMM_NULL)
        return HCOMM_OK;
    return adopt(c->call_fn, mc, c, impl_of(c)->cma, out);
}

/* MPI_Comm_idup, polled on c: a member lost before it joined ends the wait. */
static hcomm_result_t mpi_dup(hcomm_comm_t *c, hcomm_comm_t **out) {
    HCOMM__TRY(check_usable(c->call_fn, c));
    MPI_Comm mc = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_TRY(c->call_fn, MPI_Comm_idup(mcomm(c), &mc, &req));
    HCOMM__TRY(hcomm__mpi_wait_request(c, c->call_fn, "MPI_Comm_idup", &req));
    return adopt(c->call_fn, mc, c, impl_of(c)->cma, out);
}

/* How long destroy waits for its peers' goodbyes (hcomm__mpi_frames_drain). After an abort or
 * a failed operation a peer may never come (abort is how a watchdog gives up on a hung one):
 * a short wait, then the MPI comm is left allocated rather than its id reused. */
static double drain_limit(hcomm_comm_t *c) {
    bool failed = atomic_load(&c->aborted) || impl_of(c)->broken != HCOMM_OK;
    return failed && c->timeout_s > 2.0 ? 2.0 : c->timeout_s;
}

static void mpi_destroy(hcomm_comm_t *c) {
    mpi_impl_t *impl = c->impl;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (impl)
        hcomm__mpi_board_free(c);
    if (impl && impl->wrapped)
        wrap_uncount();
    if (impl && !finalized) {
        bool drained = !impl->adopted || hcomm__mpi_frames_drain(c, drain_limit(c));
        hcomm__mpi_frames_free(impl);
        if (impl->comm != MPI_COMM_NULL && drained)
            MPI_Comm_free(&impl->comm);
    }
    free(impl);
    c->impl = NULL;
}

static hcomm_result_t mpi_usable(hcomm_comm_t *c) {
    return check_usable(c->call_fn, c);
}

static bool mpi_world_aborted(hcomm_comm_t *c) {
    (void)c;
    return hcomm__mpi_peer_aborted();
}

/* The shrunk communicator's MPI_Comm_create_group tag: the comm and the round that made it,
 * so that shrinks of different communicators (all made from MPI_COMM_WORLD) do not match. */
static uint64_t mpi_subset_token(hcomm_comm_t *c, int n, uint64_t round) {
    (void)n;
    return (hcomm__comm_id(c) ^ (round * 0x9E3779B97F4A7C15ull)) % 32749u;
}

/* The group of members[0..n) of c, and the communicator to make it from: MPI_COMM_WORLD where
 * every member is in it. Open MPI 4.1 lets only the pending communicator creation whose
 * parent has the lowest id go on (comm_cid.c), and a creation that a lost member left
 * unfinished (the worker's MPI_Comm_idup) never ends: MPI_COMM_WORLD's id, 0, is below it. */
static int subset_group(hcomm_comm_t *c, const int *members, int n, MPI_Comm *parent,
                        MPI_Group *out) {
    MPI_Group all = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    int *wr = malloc(sizeof *wr * (size_t)(n > 0 ? n : 1)), rc = wr ? MPI_SUCCESS : MPI_ERR_NO_MEM;
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_group(mcomm(c), &all);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_group(MPI_COMM_WORLD, &world);
    if (rc == MPI_SUCCESS)
        rc = MPI_Group_translate_ranks(all, n, members, world, wr);
    bool in_world = rc == MPI_SUCCESS;
    for (int i = 0; in_world && i < n; i++)
        in_world = wr[i] != MPI_UNDEFINED;
    *parent = in_world ? MPI_COMM_WORLD : mcomm(c);
    if (rc == MPI_SUCCESS)
        rc = in_world ? MPI_Group_incl(world, n, wr, out) : MPI_Group_incl(all, n, members, out);
    if (all != MPI_GROUP_NULL)
        MPI_Group_free(&all);
    if (world != MPI_GROUP_NULL)
        MPI_Group_free(&world);
    free(wr);
    return rc;
}

/* MPI_Comm_create_group involves only the group's members (MPI 3.0), so the survivors make it
 * without the lost ranks. It blocks: the agreement before it saw every member alive. */
static hcomm_result_t mpi_subset(hcomm_comm_t *c, const int *members, int n, uint64_t token,
                                 hcomm_comm_t **out) {
    MPI_Group some = MPI_GROUP_NULL;
    MPI_Comm mc = MPI_COMM_NULL, parent = MPI_COMM_NULL;
    int rc = subset_group(c, members, n, &parent, &some);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_create_group(parent, some, (int)token, &mc);
    if (some != MPI_GROUP_NULL)
        MPI_Group_free(&some);
    if (rc != MPI_SUCCESS)
        return hcomm__mpi_fail(c->call_fn, "MPI_Comm_create_group", rc);
    return adopt(c->call_fn, mc, c, impl_of(c)->cma, out);
}

static hcomm_result_t mpi_stop(hcomm_comm_t *c) {
    (void)c;
    fflush(NULL);
    raise(SIGKILL);
    return HCOMM_ERR_INTERNAL; /* not reached */
}

static bool mpi_threads_ok(void) {
    int level = MPI_THREAD_SINGLE;
    return MPI_Query_thread(&level) == MPI_SUCCESS && level == MPI_THREAD_MULTIPLE;
}

/* clang-format off */
static const hcomm__transport_t mpi_tr = {
    .name = "mpi",
    /* frames and the lane (mpi_frames.c) */
    .send_frame = hcomm__mpi_send_frame, .test_tx = hcomm__mpi_test_tx,
    .test_rx = hcomm__mpi_test_tx, .poll = hcomm__mpi_poll, .pull = hcomm__mpi_pull,
    .cancel = hcomm__mpi_cancel, .lane_post = hcomm__mpi_lane_post,
    .lane_test = hcomm__mpi_lane_test,
    /* where the ranks are, peers' memory and the board (mpi_peer.c) */
    .world_aborted = mpi_world_aborted, .shares_memory = hcomm__mpi_shares_memory,
    .node_of = hcomm__mpi_node_of, .mem_kind = hcomm__mpi_mem_kind,
    .peer_read_ok = hcomm__mpi_peer_read_ok, .peer_read = hcomm__mpi_peer_read,
    .peer_write = hcomm__mpi_peer_write, .views_writable = true,
    .buf_export = hcomm__mpi_buf_export, .buf_view = hcomm__mpi_buf_view,
    .board = hcomm__mpi_board,
    /* native collectives (mpi_coll.c), communicators (this file) */
    .native = &hcomm__mpi_native, .threads_ok = mpi_threads_ok, .usable = mpi_usable,
    .split = mpi_split, .dup = mpi_dup, .destroy = mpi_destroy,
    /* lost ranks (mpi_peer.c, this file) */
    .lost = hcomm__mpi_lost, .lost_scan = hcomm__mpi_lost_scan,
    .ft_slot = hcomm__mpi_ft_slot, .subset_token = mpi_subset_token,
    .subset = mpi_subset, .stop = mpi_stop,
};
/* clang-format on */

/* --- launch --- */

/* Tells every other process that this rank's function failed, so peers polling on it return
 * HCOMM_ERR_ABORTED. *reqs gets the pending sends (NULL if none could be posted). */
static int notify_abort(MPI_Comm ctrl, int rank, int size, MPI_Request **reqs) {
    static const int one = 1;
    *reqs = malloc(sizeof(MPI_Request) * (size_t)size);
    if (!*reqs)
        return 0;
    for (int p = 0; p < size; p++) {
        (*reqs)[p] = MPI_REQUEST_NULL;
        if (p != rank)
            MPI_Isend(&one, 1, MPI_INT, p, ABORT_TAG, ctrl, &(*reqs)[p]);
    }
    return 1;
}

/* Every process learns how many rank functions failed, so all return consistent results, and
 * the abort notices are drained so ctrl can be freed. This allreduce does not poll: a peer
 * whose own function never returns (blocked outside hcomm) keeps this process waiting too. */
static hcomm_result_t agree(MPI_Comm ctrl, hcomm_result_t mine, int rank, int size) {
    MPI_Request *notes = NULL;
    int local[2] = {mine != HCOMM_OK, 0}, total[2] = {0, 0};
    if (mine != HCOMM_OK)
        local[1] = notify_abort(ctrl, rank, size, &notes);
    int rc = MPI_Allreduce(local, total, 2, MPI_INT, MPI_SUM, ctrl);
    for (int i = 0; rc == MPI_SUCCESS && i < total[1] - local[1]; i++) {
        int dummy = 0;
        MPI_Recv(&dummy, 1, MPI_INT, MPI_ANY_SOURCE, ABORT_TAG, ctrl, MPI_STATUS_IGNORE);
    }
    if (notes)
        MPI_Waitall(size, notes, MPI_STATUSES_IGNORE);
    free(notes);
    if (mine != HCOMM_OK)
        return mine;
    if (rc != MPI_SUCCESS)
        return hcomm__mpi_fail("hcomm_launch", "MPI_Allreduce of the rank results", rc);
    if (total[0] > 0)
        return hcomm__err(HCOMM_ERR_ABORTED, "hcomm_launch",
                          "%d of %d ranks failed (this rank's function returned HCOMM_OK); "
                          "see their messages",
                          total[0], size);
    return HCOMM_OK;
}

/* Words per rank of the launch's gather: its row of the node table (hcomm__mpi_nodes_set),
 * then the digests of the algorithm-selection inputs (core/topo_spec.h). */
enum { NODE_WORDS = 3, GATHERED = NODE_WORDS + HCOMM__SEL_COUNT };

/* The first rank whose shared setting i (HCOMM_ALGO, HCOMM_TOPO, the tuning file, HCOMM_CHECK,
 * HCOMM_EAGER_LIMIT) differs from rank 0's: every rank runs the same check on the same table, so
 * all fail alike. */
static hcomm_result_t check_selection(const uint64_t *all, int size) {
    for (int i = 0; i < HCOMM__SEL_COUNT; i++)
        for (int r = 1; r < size; r++) {
            uint64_t theirs = all[(size_t)r * GATHERED + NODE_WORDS + (size_t)i];
            uint64_t first = all[NODE_WORDS + (size_t)i];
            if (theirs == first)
                continue;
            char what[96] = ""; /* the eager limit's digest is its bytes + 1 (0: malformed) */
            if (i == HCOMM__SEL_TUNING)
                snprintf(what, sizeof what, " (the files' contents)");
            else if (i == HCOMM__SEL_EAGER && first && theirs)
                snprintf(what, sizeof what, " (%llu bytes on rank 0 but %llu on rank %d)",
                         (unsigned long long)first - 1, (unsigned long long)theirs - 1, r);
            return hcomm__err(HCOMM_ERR_MISMATCH, "hcomm_launch",
                              "%s differs between rank 0 and rank %d%s; %s needs the same on "
                              "every rank (mpirun -x %s)",
                              hcomm__selection_var(i), r, what,
                              i == HCOMM__SEL_EAGER ? "the size of eager messages"
                                                    : "algorithm selection",
                              hcomm__selection_var(i));
        }
    return HCOMM_OK;
}

/* The node table's row of each world rank: its host (a hash of its name), pid and cross-memory
 * attach (polled: a rank that never arrives times out), so shares_memory can tell which peers
 * are on this node and peer_read can reach them (mpi_peer.c). The same gather carries the digests
 * of the algorithm-selection inputs, which every rank must share. */
static hcomm_result_t gather_nodes(int size) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    uint64_t mine[GATHERED];
    mine[0] = hcomm__fnv(host, strlen(host), HCOMM__FNV_SEED);
    mine[1] = (uint64_t)getpid();
    mine[2] = hcomm__mpi_cma_self();
    hcomm__selection_digests(mine + NODE_WORDS);
    bool room = hcomm__mpi_nodes_reset(size);
    uint64_t *all = malloc(sizeof *all * (size_t)size * GATHERED);
    if (!room || !all) {
        free(all);
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_launch", "out of memory for %d node ids", size);
    }
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(mine, GATHERED, MPI_UINT64_T, all, GATHERED, MPI_UINT64_T,
                            MPI_COMM_WORLD, &req);
    hcomm_result_t res =
        rc == MPI_SUCCESS
            ? hcomm__mpi_wait_setup("hcomm_launch", "MPI_Iallgather of the host names", &req)
            : hcomm__mpi_fail("hcomm_launch", "MPI_Iallgather", rc);
    if (res == HCOMM_OK)
        res = check_selection(all, size);
    if (res == HCOMM_OK)
        hcomm__mpi_nodes_set(all, GATHERED, size);
    free(all);
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    return res == HCOMM_OK ? hcomm__mpi_cma_agree(size, me) : res;
}

/* agree() over the survivors where a rank of the world was lost: its MPI_Allreduce would wait
 * for the lost one forever. */
static hcomm_result_t agree_survivors(hcomm_comm_t *world, hcomm_result_t mine) {
    uint64_t ok = mine == HCOMM_OK;
    char keep[512];
    snprintf(keep, sizeof keep, "%s", hcomm_last_error());
    hcomm_result_t r = hcomm__ft_agree(world, "hcomm_launch", &ok, NULL);
    if (mine != HCOMM_OK) {
        hcomm__err_text(mine, keep);
        return mine;
    }
    if (r != HCOMM_OK)
        return r;
    return ok ? HCOMM_OK
              : hcomm__err(HCOMM_ERR_ABORTED, "hcomm_launch",
                           "a surviving rank failed (this rank's function returned HCOMM_OK); "
                           "see its message");
}

static hcomm_result_t run_world(hcomm_rank_fn_t fn, void *arg, int rank, int size) {
    hcomm_comm_t *world = NULL;
    MPI_Comm ctrl = MPI_COMM_NULL;
    HCOMM__TRY(gather_nodes(size));
    HCOMM__TRY(hcomm__topo_spec_env_fits("hcomm_launch", size)); /* the same text everywhere now */
    int here = hcomm__mpi_processes_here(rank);
    HCOMM__TRY(dup_comm("hcomm_launch", MPI_COMM_WORLD, hcomm__mpi_world_cma(), &world));
    world->is_world = true;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &ctrl);
    if (rc != MPI_SUCCESS) {
        hcomm__comm_free(world);
        return hcomm__mpi_fail("hcomm_launch", "MPI_Comm_dup", rc);
    }
    MPI_Comm_set_errhandler(ctrl, MPI_ERRORS_RETURN);
    hcomm__mpi_abort_comm = ctrl;
    hcomm__ranks_here(1, here);
    hcomm_result_t r = fn(world, arg);
    hcomm__ranks_here(-1, -here);
    hcomm__mpi_abort_comm = MPI_COMM_NULL;
    r = hcomm__lost_member(world) >= 0 ? agree_survivors(world, r) : agree(ctrl, r, rank, size);
    MPI_Comm_free(&ctrl);
    hcomm__comm_free(world);
    hcomm__shm_views_drop(); /* every peer has left: their objects may go now */
    return r;
}

hcomm_result_t hcomm__mpi_launch(int nranks, hcomm_rank_fn_t fn, void *arg) {
    int size = 0, rank = 0;
    if (hcomm__mpi_abort_comm != MPI_COMM_NULL)
        return hcomm__err(HCOMM_ERR_STATE, "hcomm_launch",
                          "backend=\"mpi\" is already running a world in this process; "
                          "launch worlds one after another, not from a rank function");
    HCOMM__TRY(mpi_ready("hcomm_launch", true));
    MPI_TRY("hcomm_launch", MPI_Comm_size(MPI_COMM_WORLD, &size));
    MPI_TRY("hcomm_launch", MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (nranks != 0 && nranks != size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, "hcomm_launch",
                          "nranks=%d but the MPI job has %d process%s (pass 0 to use the MPI "
                          "world size, or start the job with mpirun -np %d)",
                          nranks, size, size == 1 ? "" : "es", nranks);
    return run_world(fn, arg, rank, size);
}
