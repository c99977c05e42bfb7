/* Views of peer processes' hcomm_mem_alloc buffers on this node. A process that maps its
 * peer's shared-memory object loads (and twoshot's all_reduce stores) the peer's data with
 * plain loads and stores at memory speed, where cross-memory attach (process_vm_readv) pins
 * and copies page by page at less than half of it (docs/tuning.md: mpi.shm-views). Mapping an
 * object costs a few system calls and its page faults, so each mapping is kept for the calls
 * that follow (a training loop reuses its buffers), keyed by (process, object id); ids are
 * never reused within a process, so a key never meets another object.
 *
 * A kept mapping would also keep a freed object's memory alive in /dev/shm. The open
 * descriptor tells when the owner unlinked it (st_nlink 0, which hcomm_mem_free does), and a
 * sweep unmaps those: on every new mapping, and at most once a second otherwise. A view in use
 * is never swept: its owner is inside the same collective and cannot have freed it. */
#include "transport/transport.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* More live objects than this are read with cross-memory attach instead. */
#define VIEW_SLOTS 64

typedef struct view {
    int pid;
    uint32_t id;
    int fd;
    const char *base;
    size_t bytes;
} view_t;

static pthread_mutex_t view_mu = PTHREAD_MUTEX_INITIALIZER;
static view_t views[VIEW_SLOTS];
static int nviews;
static time_t last_sweep;

static void unmap_view(int i) {
    munmap((void *)views[i].base, views[i].bytes);
    close(views[i].fd);
    views[i] = views[--nviews];
}

static void sweep_unlinked(void) {
    for (int i = nviews - 1; i >= 0; i--) {
        struct stat st;
        if (fstat(views[i].fd, &st) != 0 || st.st_nlink == 0)
            unmap_view(i);
    }
    last_sweep = time(NULL);
}

static int find_view(int pid, uint32_t id) {
    for (int i = 0; i < nviews; i++)
        if (views[i].pid == pid && views[i].id == id)
            return i;
    return -1;
}

/* Maps the whole object (later calls may use other parts of it); -1 when it cannot. */
static int map_view(int pid, uint32_t id) {
    if (nviews == VIEW_SLOTS)
        return -1;
    char name[HCOMM__SHM_NAME_MAX];
    hcomm__shm_name(name, pid, id);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return -1;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size > 0)
        p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return -1;
    }
    views[nviews] = (view_t){pid, id, fd, p, (size_t)st.st_size};
    return nviews++;
}

const void *hcomm__shm_view(int pid, uint32_t id, uint64_t off, size_t bytes) {
    if (id == 0)
        return NULL;
    pthread_mutex_lock(&view_mu);
    int i = find_view(pid, id);
    if (i < 0 || time(NULL) != last_sweep) { /* before a new mapping, else once a second */
        sweep_unlinked();
        i = find_view(pid, id); /* the sweep moves views, never one a live call uses */
    }
    if (i < 0)
        i = map_view(pid, id);
    const char *at = NULL;
    if (i >= 0 && off <= views[i].bytes && bytes <= views[i].bytes - off)
        at = views[i].base + off;
    pthread_mutex_unlock(&view_mu);
    return at;
}

void hcomm__shm_views_drop(void) {
    pthread_mutex_lock(&view_mu);
    while (nviews > 0)
        unmap_view(nviews - 1);
    pthread_mutex_unlock(&view_mu);
}
