/* The mpi transport's view of the node (mpi_base.h): which ranks share a host (the launch's
 * table), one-copy access to their memory (Linux cross-memory attach, and mappings of their
 * hcomm_mem_alloc objects), and the board of a communicator whose members share one node. */
/* process_vm_readv (Linux cross-memory attach) is a GNU extension. */
#define _GNU_SOURCE

#include "transport/mpi_base.h"

#include "core/topo_spec.h"

#include "core/env.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

/* --- the launch's table --- */

/* Per world rank: a hash of its host name, its process id, and the address of its
 * cross-memory probe word (0: process_vm_readv does not work in it). */
typedef struct node_info {
    uint64_t host;
    uint64_t pid;
    uint64_t cma;
} node_info_t;

static node_info_t *world_node;
/* Per world rank: its process on this host was found gone (hcomm__mpi_lost); it was seen
 * alive when the table was made (a process of another pid namespace never is: never lost). */
static atomic_uchar *world_lost, *world_seen;
/* Every rank of the world can read every peer on its host (agreed at launch). */
static bool world_cma;
static int world_node_size;

bool hcomm__mpi_nodes_reset(int size) {
    free(world_node);
    free((void *)world_lost);
    free((void *)world_seen);
    world_node_size = 0;
    world_node = calloc((size_t)size, sizeof *world_node); /* pid 0: a row not known yet */
    world_lost = calloc((size_t)size, sizeof *world_lost);
    world_seen = calloc((size_t)size, sizeof *world_seen);
    return world_node != NULL && world_lost != NULL && world_seen != NULL;
}

static void mark_seen(void);

void hcomm__mpi_nodes_set(const uint64_t *all, size_t stride, int size) {
    for (int r = 0; r < size; r++)
        world_node[r] = (node_info_t){all[(size_t)r * stride], all[(size_t)r * stride + 1],
                                      all[(size_t)r * stride + 2]};
    world_node_size = size;
    mark_seen();
}

int hcomm__mpi_processes_here(int rank) {
    int n = 0;
    for (int r = 0; r < world_node_size; r++)
        n += world_node[r].host == world_node[rank].host;
    return n;
}

uint64_t hcomm__mpi_node_of(hcomm_comm_t *c, int rank) {
    int w = c->world_ranks[rank];
    return world_node && w < world_node_size ? world_node[w].host : 0; /* unknown: one node */
}

bool hcomm__mpi_shares_memory(hcomm_comm_t *c, int peer) {
    int a = c->world_ranks[c->rank], b = c->world_ranks[peer];
    if (!world_node || a >= world_node_size || b >= world_node_size || !world_node[a].pid ||
        !world_node[b].pid)
        return a == b;
    return world_node[a].host == world_node[b].host;
}

/* --- cross-memory attach --- */

/* Every member on this node with cross-memory attach: each rank computes the same answer
 * from the launch's table. */
bool hcomm__mpi_peer_read_ok(hcomm_comm_t *c) {
    for (int r = 0; r < c->size; r++) {
        int w = c->world_ranks[r];
        if (!impl_of(c)->cma || !world_node || w >= world_node_size ||
            !hcomm__mpi_shares_memory(c, r))
            return false;
    }
    return true;
}

/* Peer's process was found gone: lost for good, if it was seen alive at launch (world_seen). */
static bool mark_gone(hcomm_comm_t *c, int peer) {
    int w = c->world_ranks[peer];
    if (!world_lost || !world_seen || w < 0 || w >= world_node_size || !atomic_load(&world_seen[w]))
        return false;
    atomic_store(&world_lost[w], 1);
    return true;
}

/* One copy between this process and the peer's (Linux cross-memory attach), out of it or
 * into it (write), repeated until every byte moved. */
static hcomm_result_t cross_copy(hcomm_comm_t *c, int peer, void *mine, void *far_at, size_t bytes,
                                 bool write) {
    pid_t pid = (pid_t)world_node[c->world_ranks[peer]].pid;
    size_t done = 0;
    while (done < bytes) {
        struct iovec local = {(char *)mine + done, bytes - done};
        struct iovec far = {(char *)far_at + done, bytes - done};
        ssize_t n = write ? process_vm_writev(pid, &local, 1, &far, 1, 0)
                          : process_vm_readv(pid, &local, 1, &far, 1, 0);
        if (n < 0 && errno == ESRCH && mark_gone(c, peer)) /* gone, or on its way out */
            return hcomm__lost_error(c, peer);
        if (n <= 0)
            return hcomm__err(HCOMM_ERR_BACKEND, c->call_fn,
                              "%s of %zu bytes %s rank %d failed: %s",
                              write ? "process_vm_writev" : "process_vm_readv", bytes - done,
                              write ? "to" : "from", peer,
                              n < 0   ? strerror(errno)
                              : write ? "nothing written"
                                      : "nothing read");
        done += (size_t)n;
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm__mpi_peer_read(hcomm_comm_t *c, int peer, const void *remote, void *dst,
                                    size_t bytes) {
    return cross_copy(c, peer, dst, (void *)(uintptr_t)remote, bytes, false);
}

hcomm_result_t hcomm__mpi_peer_write(hcomm_comm_t *c, int peer, void *remote, const void *src,
                                     size_t bytes) {
    return cross_copy(c, peer, (void *)(uintptr_t)src, remote, bytes, true);
}

/* A word every rank publishes (its address travels in the launch's gather) so that peers on
 * its host can try a cross-memory read of it. */
static const volatile uint64_t cma_probe = 0x5eedc0ffee5eedull;
/* True when the word at addr in process pid reads as cma_probe's value. */
static bool probe_reads(uint64_t pid, uint64_t addr) {
    uint64_t dst = 0;
    struct iovec local = {&dst, sizeof dst}, far = {(void *)(uintptr_t)addr, sizeof dst};
    return addr && process_vm_readv((pid_t)pid, &local, 1, &far, 1, 0) == (ssize_t)sizeof dst &&
           dst == cma_probe;
}

/* Where this process writes its own memory through process_vm_writev (peer_write: direct
 * reduce writes its blocks into the root's output with it). */
static volatile uint64_t cma_written;

static bool self_writes(void) {
    uint64_t v = cma_probe;
    struct iovec local = {&v, sizeof v}, far = {(void *)(uintptr_t)&cma_written, sizeof v};
    return process_vm_writev(getpid(), &local, 1, &far, 1, 0) == (ssize_t)sizeof v &&
           cma_written == cma_probe;
}

/* The address of cma_probe when this process may read and write its own memory through
 * process_vm_readv and process_vm_writev (a seccomp profile may forbid either), else 0. */
uint64_t hcomm__mpi_cma_self(void) {
    uint64_t addr = (uint64_t)(uintptr_t)&cma_probe;
    return probe_reads((uint64_t)getpid(), addr) && self_writes() ? addr : 0;
}

/* True when this rank can read the probe of every peer on its host (rows not known yet are
 * not peers): a ptrace policy (Yama's ptrace_scope=1, the Ubuntu default) may allow reading
 * oneself but not a sibling process. */
static bool cma_reaches_peers(const node_info_t *nodes, int size, int me) {
    for (int r = 0; r < size; r++) {
        if (r == me || !nodes[r].pid || nodes[r].host != nodes[me].host)
            continue;
        if (!probe_reads(nodes[r].pid, nodes[r].cma))
            return false;
    }
    return nodes[me].cma != 0;
}

/* world_cma: every rank's verdict, so all of them decide alike (polled, as the gather). */
hcomm_result_t hcomm__mpi_cma_agree(int size, int me) {
    int ok = cma_reaches_peers(world_node, size, me), all = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_TRY("hcomm_launch", MPI_Iallreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &req));
    HCOMM__TRY(
        hcomm__mpi_wait_setup("hcomm_launch", "MPI_Iallreduce of the cross-memory probes", &req));
    world_cma = all != 0;
    return HCOMM_OK;
}

bool hcomm__mpi_world_cma(void) {
    return world_cma;
}

/* --- the table outside a launch --- */

enum { ROW_WORDS = 4 }; /* world rank, host, pid, probe */

static hcomm_result_t poll_setup(const char *fn, const char *what, int rc, MPI_Request *req) {
    return rc == MPI_SUCCESS ? hcomm__mpi_wait_setup(fn, what, req) : hcomm__mpi_fail(fn, what, rc);
}

/* This process's row, and every member's gathered over comm into all[size * ROW_WORDS]. */
static hcomm_result_t gather_rows(const char *fn, MPI_Comm comm, uint64_t *all) {
    char host[256] = "";
    int me = 0;
    gethostname(host, sizeof host - 1);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    uint64_t mine[ROW_WORDS] = {(uint64_t)me, hcomm__fnv(host, strlen(host), HCOMM__FNV_SEED),
                                (uint64_t)getpid(), hcomm__mpi_cma_self()};
    MPI_Request req = MPI_REQUEST_NULL;
    int rc =
        MPI_Iallgather(mine, ROW_WORDS, MPI_UINT64_T, all, ROW_WORDS, MPI_UINT64_T, comm, &req);
    return poll_setup(fn, "MPI_Iallgather of the host names", rc, &req);
}

/* The table has a row per world rank: made here when no launch made it. */
static bool table_ready(void) {
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world_node && world_node_size == world)
        return true;
    if (!hcomm__mpi_nodes_reset(world))
        return false;
    world_node_size = world;
    return true;
}

hcomm_result_t hcomm__mpi_nodes_learn(const char *fn, MPI_Comm comm, bool *cma, int *here) {
    int size = 0, me = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &me);
    uint64_t *all = malloc(sizeof *all * (size_t)size * ROW_WORDS);
    node_info_t *rows = malloc(sizeof *rows * (size_t)size);
    hcomm_result_t res =
        all && rows && table_ready()
            ? gather_rows(fn, comm, all)
            : hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %d node ids", size);
    *here = 0;
    for (int r = 0; res == HCOMM_OK && r < size; r++) {
        const uint64_t *row = all + (size_t)r * ROW_WORDS;
        rows[r] = (node_info_t){row[1], row[2], row[3]};
        if (row[0] < (uint64_t)world_node_size)
            world_node[row[0]] = rows[r];
        *here += row[1] == all[(size_t)me * ROW_WORDS + 1];
    }
    int ok = res == HCOMM_OK && cma_reaches_peers(rows, size, me);
    free(all);
    free(rows);
    mark_seen();
    if (res == HCOMM_OK) {
        MPI_Request req = MPI_REQUEST_NULL;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm, &req);
        res = poll_setup(fn, "MPI_Iallreduce of the cross-memory probes", rc, &req);
    }
    *cma = ok != 0;
    return res;
}

/* --- views of hcomm_mem_alloc objects --- */

void hcomm__mpi_buf_export(hcomm_comm_t *c, const void *p, size_t bytes, hcomm__peer_buf_t *b) {
    (void)c;
    *b = (hcomm__peer_buf_t){.addr = (uint64_t)(uintptr_t)p};
    if (!hcomm__mem_shared(p, bytes, &b->obj, &b->off))
        b->obj = 0;
}

/* A mapping of the peer's hcomm_mem_alloc object, when the buffer lies in one. */
const void *hcomm__mpi_buf_view(hcomm_comm_t *c, int peer, const hcomm__peer_buf_t *b,
                                size_t bytes) {
    if (b->obj == 0 || peer == c->rank || !world_node || !hcomm__mpi_shares_memory(c, peer))
        return NULL;
    return hcomm__shm_view((int)world_node[c->world_ranks[peer]].pid, b->obj, b->off, bytes);
}

hcomm__mem_kind_t hcomm__mpi_mem_kind(hcomm_comm_t *c, const void *p) {
    (void)c;
    uint32_t obj;
    uint64_t off;
    return hcomm__mem_shared(p, 1, &obj, &off) ? HCOMM__MEM_SHARED : HCOMM__MEM_HOST;
}

/* --- the board (transport.board) --- */

/* A member's board region: the board, then its frame rings. */
static size_t region_bytes(const hcomm_comm_t *c) {
    return HCOMM__BOARD_BYTES + hcomm__mpi_ring_bytes(c->size);
}

/* Maps peer's board object read-only; NULL when it cannot. */
static void *map_board(hcomm_comm_t *c, int peer, uint32_t id) {
    char name[HCOMM__SHM_NAME_MAX];
    hcomm__shm_name(name, (int)world_node[c->world_ranks[peer]].pid, id);
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0)
        return NULL;
    void *p = mmap(NULL, region_bytes(c), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

void hcomm__mpi_board_free(hcomm_comm_t *c) {
    mpi_impl_t *m = c->impl;
    hcomm__mpi_ring_free(m);
    if (!m->board)
        return;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && m->board[r])
            munmap(m->board[r], region_bytes(c));
    hcomm_mem_free(m->board[c->rank]);
    free(m->board);
    m->board = NULL;
}

/* Every rank's answer to "can all members use the board", as a MIN over the comm. */
static hcomm_result_t board_agree(const char *fn, hcomm_comm_t *c, int *ok) {
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, ok, 1, MPI_INT, MPI_MIN, mcomm(c), &req);
    return rc == MPI_SUCCESS
               ? hcomm__mpi_wait_making(c, fn, "MPI_Iallreduce of the board's state", &req)
               : hcomm__mpi_fail(fn, "MPI_Iallreduce", rc);
}

/* A comm whose members share one node gets a board: each rank makes its region in /dev/shm,
 * the ids travel in one all_gather, and each rank maps its peers'. Where any rank cannot, no
 * rank has one (the algorithms then exchange messages instead). */
hcomm_result_t hcomm__mpi_board_init(const char *fn, hcomm_comm_t *c) {
    mpi_impl_t *m = c->impl;
    bool one_node = c->size > 1 && world_node;
    for (int r = 0; r < c->size && one_node; r++)
        one_node = c->world_ranks[r] < world_node_size && hcomm__mpi_shares_memory(c, r);
    if (!one_node)
        return HCOMM_OK; /* every member reads the same launch table */
    uint32_t *ids = calloc((size_t)c->size, sizeof *ids);
    m->board = calloc((size_t)c->size, sizeof *m->board);
    if (!ids || !m->board) {
        free(ids);
        free(m->board);
        m->board = NULL;
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for a board of %d ranks", c->size);
    }
    uint64_t off = 0;
    /* HCOMM_NO_BOARD=1 on any rank turns it off for the comm (to compare: architecture.md) */
    const char *no = getenv("HCOMM_NO_BOARD");
    if (!(no && no[0] == '1') && hcomm_mem_alloc(region_bytes(c), &m->board[c->rank]) == HCOMM_OK)
        hcomm__mem_shared(m->board[c->rank], region_bytes(c), &ids[c->rank], &off);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc =
        MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, ids, 1, MPI_UINT32_T, mcomm(c), &req);
    hcomm_result_t res =
        rc == MPI_SUCCESS
            ? hcomm__mpi_wait_making(c, fn, "MPI_Iallgather of the board's objects", &req)
            : hcomm__mpi_fail(fn, "MPI_Iallgather", rc);
    int ok = ids[c->rank] != 0;
    for (int r = 0; res == HCOMM_OK && ok && r < c->size; r++)
        if (r != c->rank)
            ok = ids[r] != 0 && (m->board[r] = map_board(c, r, ids[r])) != NULL;
    free(ids);
    if (res == HCOMM_OK)
        res = board_agree(fn, c, &ok);
    if (res == HCOMM_OK && ok)
        res = hcomm__mpi_ring_init(fn, c, m->rbuf_bytes);
    if (res != HCOMM_OK || !ok)
        hcomm__mpi_board_free(c);
    return res;
}

void *hcomm__mpi_board(hcomm_comm_t *c, int rank) {
    mpi_impl_t *m = c->impl;
    return m->board ? m->board[rank] : NULL;
}

hcomm__ft_slot_t *hcomm__mpi_ft_slot(hcomm_comm_t *c, int rank) {
    char *b = hcomm__mpi_board(c, rank);
    return b ? (hcomm__ft_slot_t *)(void *)(b + HCOMM__BOARD_FT_AT) : NULL;
}

/* --- lost processes --- */

/* The process is gone, or a zombie its parent has not reaped yet (it runs no more). */
static bool pid_gone(uint64_t pid) {
    if (kill((pid_t)pid, 0) != 0)
        return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%llu/stat", (unsigned long long)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *end = strrchr(buf, ')'); /* the state follows the command's name */
    return end && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X');
}

/* The host id of this process's row (0: none yet). */
static uint64_t my_host(void) {
    uint64_t me = (uint64_t)getpid();
    for (int r = 0; r < world_node_size; r++)
        if (world_node[r].pid == me)
            return world_node[r].host;
    return 0;
}

/* The peers on this host whose process this one can see now: only they are watched. */
static void mark_seen(void) {
    uint64_t me = (uint64_t)getpid(), host = my_host();
    for (int r = 0; host && r < world_node_size; r++)
        if (world_node[r].pid && world_node[r].pid != me && world_node[r].host == host &&
            (kill((pid_t)world_node[r].pid, 0) == 0 || errno == EPERM))
            atomic_store(&world_seen[r], 1);
}

/* Looks at the watched processes, at most every HCOMM_FAILURE_DETECT / 10 seconds over all
 * threads (a thread that finds another looking uses the last answers), or now when forced. */
static void scan_host(bool force) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static double last = -1e300, every = -1.0;
    if (force ? pthread_mutex_lock(&mu) != 0 : pthread_mutex_trylock(&mu) != 0)
        return;
    if (every < 0.0)
        every = hcomm__env_failure_detect() / 10.0;
    double now = hcomm__now();
    if (every > 0.0 && (force || now - last >= every)) {
        last = now;
        for (int r = 0; r < world_node_size; r++)
            if (atomic_load(&world_seen[r]) && !atomic_load(&world_lost[r]) &&
                pid_gone(world_node[r].pid))
                atomic_store(&world_lost[r], 1);
    }
    pthread_mutex_unlock(&mu);
}

bool hcomm__mpi_lost(hcomm_comm_t *c, int rank) {
    int w = c->world_ranks[rank];
    if (!world_node || !world_lost || w < 0 || w >= world_node_size)
        return false;
    scan_host(false);
    return atomic_load(&world_lost[w]) != 0;
}

void hcomm__mpi_lost_scan(hcomm_comm_t *c) {
    (void)c;
    if (world_node && world_lost)
        scan_host(true);
}

bool hcomm__mpi_any_lost(void) {
    for (int r = 0; world_lost && r < world_node_size; r++)
        if (atomic_load(&world_lost[r]))
            return true;
    return false;
}
