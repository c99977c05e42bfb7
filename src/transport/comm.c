/* Communicators: the object every transport fills, its settings and public queries, abort,
 * destroy; and the memory hcomm_mem_alloc hands out (shared-memory objects a peer process on
 * the node can map). hcomm_launch, which picks the backend that runs the ranks, is launch.c. */
/* MAP_ANONYMOUS is a BSD/Linux extension, outside strict POSIX. */
#define _DEFAULT_SOURCE
#include "transport/transport.h"

#include "core/env.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

hcomm_result_t hcomm__comm_settings(const char *fn, double *timeout_s, size_t *eager,
                                    size_t *unexpected) {
    HCOMM__TRY(hcomm__env_validate(fn));
    HCOMM__TRY(hcomm__env_timeout(fn, timeout_s));
    HCOMM__TRY(hcomm__env_eager_limit(fn, eager));
    return hcomm__env_bytes(fn, "HCOMM_UNEXPECTED_BYTES", (size_t)256 << 20, 0, SIZE_MAX / 2,
                            unexpected);
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    return h * 0xbf58476d1ce4e5b9ull;
}

uint64_t hcomm__comm_id(const hcomm_comm_t *c) {
    uint64_t h = mix(c->lineage, (uint64_t)c->size);
    for (int r = 0; r < c->size; r++)
        h = mix(h, (uint64_t)(uint32_t)c->world_ranks[r]);
    return h;
}

hcomm_comm_t *hcomm__comm_alloc(const hcomm__transport_t *tr, void *impl, int rank, int size,
                                const hcomm_comm_t *parent) {
    hcomm_comm_t *c = hcomm__calloc_lines(1, sizeof *c);
    int *wr = malloc(sizeof(int) * (size_t)(size > 0 ? size : 1));
    if (!c || !wr) {
        free(c);
        free(wr);
        return NULL;
    }
    *c = (hcomm_comm_t){
        .tr = tr, .impl = impl, .rank = rank, .size = size, .world_ranks = wr, .call_fn = "hcomm"};
    c->wait_peer = -1;
    /* A split runs as a call of its parent, so every member sees the same sequence number. */
    c->lineage = parent ? mix(hcomm__comm_id(parent), parent->call_seq) : 0x68636f6d6dull;
    atomic_init(&c->aborted, 0);
    atomic_init(&c->abort_with, NULL);
    if (parent) {
        c->timeout_s = parent->timeout_s;
        c->eager_limit = parent->eager_limit;
        c->unexpected_cap = parent->unexpected_cap;
        c->deterministic = parent->deterministic;
    } else if (hcomm__comm_settings("hcomm", &c->timeout_s, &c->eager_limit, &c->unexpected_cap) !=
               HCOMM_OK) {
        c->timeout_s = 300.0; /* launch validated the environment before any comm exists */
        c->eager_limit = 8192;
        c->unexpected_cap = (size_t)256 << 20;
    }
    if (!parent && hcomm__env_deterministic("hcomm", &c->deterministic) != HCOMM_OK)
        c->deterministic = false; /* launch validated the environment already */
    return c;
}

void hcomm__comm_free(hcomm_comm_t *c) {
    if (!c)
        return;
    c->idle = NULL; /* the p2p state goes below; the transport's last waits must not remake it */
    for (int l = HCOMM__LAYER_COUNT - 1; l >= 0; l--)
        if (c->layer[l] && c->layer_free[l])
            c->layer_free[l](c->layer[l]);
    if (c->tr && c->tr->destroy)
        c->tr->destroy(c);
    free(c->world_ranks);
    free(c);
}

hcomm_result_t hcomm_comm_rank(const hcomm_comm_t *comm, int *rank) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(rank);
    *rank = comm->rank;
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_size(const hcomm_comm_t *comm, int *size) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(size);
    *size = comm->size;
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_members(const hcomm_comm_t *comm, int *ranks, int cap) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(ranks);
    if (cap < comm->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "cap=%d is less than the group size %d",
                          cap, comm->size);
    memcpy(ranks, comm->world_ranks, sizeof(int) * (size_t)comm->size);
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_backend(const hcomm_comm_t *comm, const char **name) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(name);
    *name = comm->tr->name;
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_destroy(hcomm_comm_t *comm) {
    if (!comm)
        return HCOMM_OK;
    if (comm->is_world)
        return hcomm__err(HCOMM_ERR_STATE, __func__,
                          "comm is the world communicator of a rank function; it is freed when "
                          "the rank function returns");
    hcomm__comm_free(comm);
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_abort(hcomm_comm_t *comm) {
    HCOMM__CHECK_NULL(comm);
    for (hcomm_comm_t *c = comm; c; c = atomic_load(&c->abort_with))
        atomic_store(&c->aborted, 1);
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_set_timeout(hcomm_comm_t *comm, double seconds) {
    HCOMM__CHECK_NULL(comm);
    if (!(seconds > 0.0) || seconds > 1e9)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "seconds=%g is not in (0, 1e9]",
                          seconds);
    comm->timeout_s = seconds;
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_set_deterministic(hcomm_comm_t *comm, int on) {
    HCOMM__CHECK_NULL(comm);
    if (on != 0 && on != 1)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "on=%d is neither 0 nor 1", on);
    comm->deterministic = on == 1;
    return HCOMM_OK;
}

/* Communication buffers live in POSIX shared-memory objects (/dev/shm), so a peer process on
 * the same node can map a buffer by name and move data once (the one-node fast path of the
 * algorithms layer); within one process (local backend) any buffer is shared already. The
 * registry maps each buffer to its object; any other buffer still works with every call.
 *
 * A named object outlives its process unless unlinked: hcomm_mem_free unlinks it, the library's
 * destructor unlinks what is left at a normal exit (and the mpi backend before it aborts the
 * job), and the first allocation of a process unlinks the objects of processes of its pid
 * namespace that died without either (a crash, a signal). The name carries that namespace, so
 * a process never judges another namespace's pids. */
typedef struct shm_buf {
    struct shm_buf *next;
    void *base;
    size_t bytes;
    uint32_t id; /* its object is named by hcomm__shm_name(this process, id); 0: private */
} shm_buf_t;

static pthread_mutex_t shm_mu = PTHREAD_MUTEX_INITIALIZER;
static shm_buf_t *shm_bufs;
static atomic_uint shm_counter;
static pthread_once_t shm_once = PTHREAD_ONCE_INIT;
static unsigned long shm_pidns; /* this process's pid namespace (its inode), 0 if unknown */

static void format_name(char *name, unsigned long ns, int pid, uint32_t id) {
    snprintf(name, HCOMM__SHM_NAME_MAX, "/hcomm-%lu-%d-%u", ns, pid, (unsigned)id);
}

/* Unlinks the objects left in /dev/shm by dead processes of this pid namespace. */
static void sweep_dead_owners(void) {
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        unsigned long ns = 0;
        int pid = 0, end = 0;
        unsigned id = 0;
        if (sscanf(e->d_name, "hcomm-%lu-%d-%u%n", &ns, &pid, &id, &end) != 3 ||
            e->d_name[end] != '\0' || ns != shm_pidns || pid <= 0)
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) /* alive, or not ours to judge */
            continue;
        char name[HCOMM__SHM_NAME_MAX];
        format_name(name, ns, pid, id); /* not hcomm__shm_name: it waits for this setup */
        shm_unlink(name);
    }
    closedir(d);
}

static void shm_setup(void) {
    struct stat st;
    shm_pidns = stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long)st.st_ino : 0;
    sweep_dead_owners();
}

void hcomm__shm_unlink_all(void) {
    char name[HCOMM__SHM_NAME_MAX];
    pthread_mutex_lock(&shm_mu);
    for (shm_buf_t *b = shm_bufs; b; b = b->next)
        if (b->id) {
            hcomm__shm_name(name, getpid(), b->id);
            shm_unlink(name);
        }
    pthread_mutex_unlock(&shm_mu);
}

/* At exit (or when the library is unloaded) the objects still allocated go: their mappings,
 * this process's and its peers', stay valid until they are unmapped. */
__attribute__((destructor)) static void unlink_at_exit(void) {
    hcomm__shm_unlink_all();
}

/* A named shared object; NULL when /dev/shm cannot hold it. posix_fallocate reserves the pages
 * now: a sparse object on a full tmpfs would raise SIGBUS at first touch instead. */
static void *shm_map(size_t bytes, char *name) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return NULL;
    void *p = MAP_FAILED;
    if (posix_fallocate(fd, 0, (off_t)bytes) == 0)
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED)
        return p;
    shm_unlink(name);
    return NULL;
}

/* Falls back to private memory (no name: not shareable) when /dev/shm is small or missing;
 * shared=false asks for private memory at once. */
static hcomm_result_t shm_create(size_t bytes, shm_buf_t *b, bool shared) {
    char name[HCOMM__SHM_NAME_MAX];
    pthread_once(&shm_once, shm_setup);
    b->id = atomic_fetch_add(&shm_counter, 1) + 1; /* never 0, never reused by this process */
    hcomm__shm_name(name, getpid(), b->id);
    void *p = shared ? shm_map(bytes, name) : NULL;
    if (p == NULL) {
        b->id = 0;
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (p == MAP_FAILED)
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_mem_alloc", "cannot map bytes=%zu: %s", bytes,
                          strerror(errno));
    b->base = p;
    b->bytes = bytes;
    return HCOMM_OK;
}

static hcomm_result_t mem_alloc(size_t bytes, void **ptr, bool shared) {
    *ptr = NULL;
    shm_buf_t *b = calloc(1, sizeof *b);
    if (!b)
        return hcomm__err(HCOMM_ERR_NOMEM, "hcomm_mem_alloc", "out of memory for bytes=%zu", bytes);
    hcomm_result_t r = shm_create(bytes ? bytes : 1, b, shared);
    if (r != HCOMM_OK) {
        free(b);
        return r;
    }
    pthread_mutex_lock(&shm_mu);
    b->next = shm_bufs;
    shm_bufs = b;
    pthread_mutex_unlock(&shm_mu);
    *ptr = b->base;
    return HCOMM_OK;
}

hcomm_result_t hcomm_mem_alloc(size_t bytes, void **ptr) {
    HCOMM__CHECK_NULL(ptr);
    return mem_alloc(bytes, ptr, true);
}

hcomm_result_t hcomm__mem_alloc_private(size_t bytes, void **ptr) {
    return mem_alloc(bytes, ptr, false);
}

hcomm_result_t hcomm_mem_free(void *ptr) {
    if (!ptr)
        return HCOMM_OK;
    pthread_mutex_lock(&shm_mu);
    shm_buf_t **pb = &shm_bufs;
    while (*pb && (*pb)->base != ptr)
        pb = &(*pb)->next;
    shm_buf_t *b = *pb;
    if (b)
        *pb = b->next;
    pthread_mutex_unlock(&shm_mu);
    if (!b)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__,
                          "ptr=%p did not come from hcomm_mem_alloc (or was freed already)", ptr);
    munmap(b->base, b->bytes);
    if (b->id) {
        char name[HCOMM__SHM_NAME_MAX];
        hcomm__shm_name(name, getpid(), b->id);
        shm_unlink(name);
    }
    free(b);
    return HCOMM_OK;
}

void hcomm__shm_name(char *name, int pid, uint32_t id) {
    pthread_once(&shm_once, shm_setup); /* a peer's view names the object too */
    format_name(name, shm_pidns, pid, id);
}

bool hcomm__mem_shared(const void *p, size_t bytes, uint32_t *id, uint64_t *offset) {
    bool found = false;
    pthread_mutex_lock(&shm_mu);
    for (shm_buf_t *b = shm_bufs; b && !found; b = b->next) {
        uintptr_t base = (uintptr_t)b->base, q = (uintptr_t)p;
        if (b->id && q >= base && q - base <= b->bytes && bytes <= b->bytes - (q - base)) {
            found = true;
            *id = b->id;
            *offset = q - base;
        }
    }
    pthread_mutex_unlock(&shm_mu);
    return found;
}
