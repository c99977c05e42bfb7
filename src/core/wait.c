/* How hcomm waits for a peer: spin while the peer has a core of its own, else yield it. */
#define _GNU_SOURCE /* sched_getaffinity */
#include "core/internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Ranks of live worlds in this process and on this node, as the transports count them. */
static atomic_int ranks_in_process, ranks_on_node;

void *hcomm__calloc_lines(size_t n, size_t size) {
    if (size && n > (SIZE_MAX - 63) / size)
        return NULL;
    size_t bytes = n * size > 0 ? (n * size + 63) / 64 * 64 : 64;
    void *p = aligned_alloc(64, bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}

double hcomm__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void hcomm__ranks_here(int in_process, int on_node) {
    atomic_fetch_add_explicit(&ranks_in_process, in_process, memory_order_relaxed);
    atomic_fetch_add_explicit(&ranks_on_node, on_node, memory_order_relaxed);
}

static int process_cores = 1, node_cores = 1;
static pthread_once_t cores_once = PTHREAD_ONCE_INIT;

/* The cores the first waiting thread may run on (its affinity mask: mpirun binds a process to
 * one) and the node's online cores. */
static void count_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    node_cores = n > 0 ? (int)n : 1;
    process_cores = node_cores;
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        process_cores = CPU_COUNT(&set);
#endif
}

/* Every rank has a core of its own: the transports counted some, its process's ranks fit the
 * process's cores, and the node's ranks the node's. A comm no launch counted (one wrapping an
 * application's MPI communicator) yields as before. */
static bool cores_to_spare(void) {
    pthread_once(&cores_once, count_cores);
    int in_process = atomic_load_explicit(&ranks_in_process, memory_order_relaxed);
    return in_process > 0 && in_process <= process_cores &&
           atomic_load_explicit(&ranks_on_node, memory_order_relaxed) <= node_cores;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

void hcomm__backoff_init(hcomm__backoff_t *b) {
    *b = (hcomm__backoff_t){0};
}

/* Where every rank has a core, a waiter spins for SPIN_S before it yields: a peer's post lands
 * within a microsecond or two, and a sched_yield costs about as much, so yielding early made
 * the waiter notice late (docs/tuning.md: wait.spin). Where ranks outnumber cores the peer
 * needs this core, so the waiter yields at once. A nap after 2 ms keeps idle waiters off the
 * cores. */
#define SPIN_S 50e-6

double hcomm__backoff(hcomm__backoff_t *b) {
    unsigned long i = b->iter++;
    if (i < 64)
        return 0.0;
    if (b->start == 0.0) {
        b->start = hcomm__now();
        b->spinning = cores_to_spare();
    }
    if ((i & 63) == 0) {
        b->waited = hcomm__now() - b->start;
        b->napping = b->waited > 2e-3;
        b->spinning = b->spinning && b->waited < SPIN_S;
    }
    if (b->napping) {
        struct timespec ts = {0, 20 * 1000};
        nanosleep(&ts, NULL);
    } else if (b->spinning) {
        cpu_relax();
    } else {
        sched_yield();
    }
    return b->waited;
}
