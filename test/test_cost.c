/* The cost model (src/algo/cost.c) on declared topologies:
 *   - every (collective, algorithm) pair valid for the collective gets a finite, non-negative
 *     estimate on "mesh", "ring" and a node shape ("nodes=2x4" on 8 ranks; 2x(p/2) or
 *     "p-1,1" on other sizes), for transports with and without shared-memory collectives, at
 *     sizes from 0 to 1 GiB; the only exceptions are twoshot and direct (all_gather,
 *     reduce_scatter, broadcast, all_to_allv) across nodes (they read peers' memory, which another
 * node cannot); and the selection returns one of them;
 *   - with a tuning file (HCOMM_TUNING_FILE, written here before hcomm reads it) whose
 *     inter-node bandwidth is 10x below the intra-node one, auto picks hier for all_reduce
 *     from 1 MiB up on nodes=2x4 (a transport without shared-memory collectives: on the local
 *     backend, whose native collectives are one copy in one process, native is cheaper);
 *   - on 2 ranks of one host with a calibrated intra class whose reduction outruns the link
 *     (mpi here), rd at 8 B and twoshot at 1 MiB;
 *   - the collectives the model now decides (broadcast, reduce, gather, scatter, the
 *     v-calls) still give the right values with auto's choice on every declared topology.
 * World sizes 1..8 on the local backend. */
#include "algo/cost.h"
#include "algo/select.h"
#include "core/topo_spec.h"
#include "harness.h"

#include <math.h>
#include <unistd.h>

static const size_t sizes[] = {
    0, 1, 8, 4096, 65536, (size_t)1 << 20, (size_t)64 << 20, (size_t)1 << 30};
#define NSIZES (sizeof sizes / sizeof *sizes)

static bool can_run(int coll, int algo, const char *topo) {
    bool nodes = strncmp(topo, "nodes=", 6) == 0; /* peer reads cannot cross nodes */
    return !(nodes && (algo == HCOMM__ALGO_TWOSHOT || algo == HCOMM__ALGO_SHM ||
                       (algo == HCOMM__ALGO_DIRECT &&
                        (coll == HCOMM__COLL_ALLTOALLV || coll == HCOMM__COLL_ALLGATHER ||
                         coll == HCOMM__COLL_ALLGATHERV || coll == HCOMM__COLL_REDUCESCATTER ||
                         coll == HCOMM__COLL_REDUCESCATTERV || coll == HCOMM__COLL_BROADCAST))));
}

static hcomm_result_t every_pair_finite(hcomm_comm_t *w, const char *topo) {
    hcomm__algo_set_t all;
    T_TRY(hcomm__algo_parse("test", "HCOMM_ALGO", "", &all));
    for (int coll = 0; coll < HCOMM__COLL_COUNT; coll++)
        for (int shm = 0; shm < 2; shm++)
            for (size_t i = 0; i < NSIZES; i++) {
                for (int a = 0; a < HCOMM__ALGO_COUNT; a++) {
                    if (!hcomm__algo_allowed(&all, coll, a) || !can_run(coll, a, topo))
                        continue;
                    double e = hcomm__cost_estimate(w, coll, a, sizes[i], shm);
                    T_CHECK(isfinite(e) && e >= 0.0,
                            "%s on %d ranks, %s of %zu bytes by %s (shm %d): estimate %g", topo,
                            t_size(w), hcomm__coll_name(coll), sizes[i], hcomm__algo_name(a), shm,
                            e);
                }
                double est = -1.0;
                int a = hcomm__cost_choose(w, NULL, coll, sizes[i], shm, &est);
                T_CHECK(a >= 0 && hcomm__algo_allowed(&all, coll, a) && isfinite(est),
                        "%s on %d ranks: %s of %zu bytes (shm %d) chose %d (%s), estimate %g", topo,
                        t_size(w), hcomm__coll_name(coll), sizes[i], shm, a,
                        a >= 0 ? hcomm__algo_name(a) : "none", est);
            }
    return HCOMM_OK;
}

/* Auto's choice on the declared topology gives the serial results (i32 sums are exact). */
static hcomm_result_t rooted_and_v_right(hcomm_comm_t *w, const char *topo) {
    int p = t_size(w), me = t_rank(w), root = p - 1;
    size_t n = 70001; /* elements per rank: odd, above the chain segment in bytes */
    int32_t *in = malloc(n * 4), *out = malloc(n * 4 * (size_t)p);
    size_t *counts = malloc(sizeof(size_t) * (size_t)p);
    T_CHECK(in && out && counts, "out of memory");
    if (!in || !out || !counts)
        return HCOMM_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        in[i] = (int32_t)(i % 1000) + me;
    int32_t sum_me = p * (p - 1) / 2;
    /* broadcast from the last rank */
    memcpy(out, in, n * 4);
    T_TRY(hcomm_broadcast(w, out, n * 4, root));
    T_CHECK(out[7] == 7 + root && out[n - 1] == (int32_t)((n - 1) % 1000) + root,
            "%s: broadcast gave %d, %d", topo, out[7], out[n - 1]);
    /* reduce to the last rank */
    T_TRY(hcomm_reduce(w, in, out, n, HCOMM_I32, HCOMM_SUM, root));
    if (me == root)
        T_CHECK(out[9] == 9 * p + sum_me && out[n - 1] == (int32_t)((n - 1) % 1000) * p + sum_me,
                "%s: reduce gave %d, %d", topo, out[9], out[n - 1]);
    /* gather, then scatter the gathered buffer back */
    T_TRY(hcomm_gather(w, in, out, n * 4, root));
    if (me == root)
        for (int r = 0; r < p; r++)
            T_CHECK(out[(size_t)r * n + 3] == 3 + r, "%s: gather block %d gave %d", topo, r,
                    out[(size_t)r * n + 3]);
    int32_t *back = malloc(n * 4);
    T_CHECK(back != NULL, "out of memory");
    if (back) {
        T_TRY(hcomm_scatter(w, out, back, n * 4, root));
        T_CHECK(back[3] == 3 + me, "%s: scatter gave %d", topo, back[3]);
        free(back);
    }
    /* all_gatherv of uneven blocks: rank r gives r + 1 elements */
    for (int r = 0; r < p; r++)
        counts[r] = (size_t)(r + 1) * 4;
    T_TRY(hcomm_all_gatherv(w, in, out, counts));
    for (int r = 0, off = 0; r < p; off += r + 1, r++)
        T_CHECK(out[off + r] == r + r, "%s: all_gatherv block %d gave %d", topo, r, out[off + r]);
    /* reduce_scatterv of the same blocks */
    for (int r = 0; r < p; r++)
        counts[r] = (size_t)(r + 1);
    size_t total = (size_t)p * (size_t)(p + 1) / 2, first = (size_t)me * (size_t)(me + 1) / 2;
    T_TRY(hcomm_reduce_scatterv(w, in, out, counts, HCOMM_I32, HCOMM_SUM));
    T_CHECK(total <= n && out[0] == (int32_t)(first % 1000) * p + sum_me,
            "%s: reduce_scatterv gave %d", topo, out[0]);
    free(counts);
    free(out);
    free(in);
    return HCOMM_OK;
}

/* With the tuning file's inter-node class 10x slower than the intra one. */
static hcomm_result_t hier_by_tuning(hcomm_comm_t *w) {
    hcomm__link_t link[HCOMM__LINK_CLASSES];
    hcomm__link_default(link);
    T_CHECK(fabs(link[HCOMM__LINK_INTER].beta - 10.0 * link[HCOMM__LINK_INTRA].beta) <
                1e-3 * link[HCOMM__LINK_INTER].beta,
            "the tuning file was not read: intra beta %g, inter beta %g",
            link[HCOMM__LINK_INTRA].beta, link[HCOMM__LINK_INTER].beta);
    T_TRY(hcomm_comm_set_topo(w, "nodes=2x4"));
    for (size_t bytes = (size_t)1 << 20; bytes <= (size_t)256 << 20; bytes *= 2) {
        double est;
        int a = hcomm__cost_choose(w, NULL, HCOMM__COLL_ALLREDUCE, bytes, false, &est);
        T_CHECK(a == HCOMM__ALGO_HIER, "all_reduce of %zu bytes on nodes=2x4 chose %s", bytes,
                a >= 0 ? hcomm__algo_name(a) : "none");
        /* direct reduce reads peers' memory on one node only (its split estimate must not
         * undercut rhd across nodes, where it would run as a tree) */
        a = hcomm__cost_choose(w, NULL, HCOMM__COLL_REDUCE, bytes, false, &est);
        T_CHECK(a != HCOMM__ALGO_DIRECT, "reduce of %zu bytes on nodes=2x4 chose direct", bytes);
    }
    return hcomm_comm_set_topo(w, NULL);
}

/* Two processes on one host as calibrated here on mpi (intra 0.6 us, 5 GB/s; reduction
 * 8 GB/s): rd for a tiny all_reduce, twoshot (one copy per byte and phase, the fastest
 * measured there from 32 KiB) for a large one. */
static hcomm_result_t one_host_mpi(hcomm_comm_t *w) {
    T_TRY(hcomm_comm_set_topo(w, "mesh;intra=0.6us,5GB/s,8GB/s"));
    double est;
    int a = hcomm__cost_choose(w, NULL, HCOMM__COLL_ALLREDUCE, 8, false, &est);
    T_CHECK(a == HCOMM__ALGO_RD, "8-byte all_reduce chose %s",
            a >= 0 ? hcomm__algo_name(a) : "none");
    a = hcomm__cost_choose(w, NULL, HCOMM__COLL_ALLREDUCE, (size_t)1 << 20, false, &est);
    T_CHECK(a == HCOMM__ALGO_TWOSHOT, "1 MiB all_reduce chose %s",
            a >= 0 ? hcomm__algo_name(a) : "none");
    return hcomm_comm_set_topo(w, NULL);
}

static hcomm_result_t run(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int p = t_size(w);
    char nodes[64] = "";
    if (p == 8)
        snprintf(nodes, sizeof nodes, "nodes=2x4");
    else if (p >= 2 && p % 2 == 0)
        snprintf(nodes, sizeof nodes, "nodes=2x%d", p / 2);
    else if (p >= 3)
        snprintf(nodes, sizeof nodes, "nodes=%d,1", p - 1);
    const char *topos[] = {"mesh", "ring", nodes};
    for (int i = 0; i < 3; i++) {
        if (!topos[i][0])
            continue;
        T_TRY(hcomm_comm_set_topo(w, topos[i]));
        T_TRY(every_pair_finite(w, topos[i]));
        T_TRY(rooted_and_v_right(w, topos[i]));
    }
    T_TRY(hcomm_comm_set_topo(w, NULL));
    if (p == 2)
        T_TRY(one_host_mpi(w));
    return p == 8 ? hier_by_tuning(w) : HCOMM_OK;
}

int main(void) {
    /* Read once per process: set before hcomm reads it. intra 2 us, 10 GB/s; inter 20 us,
     * 1 GB/s. */
    char path[] = "/tmp/hcomm_cost_XXXXXX";
    int fd = mkstemp(path);
    T_CHECK(fd >= 0, "mkstemp failed");
    if (fd < 0)
        return t_finish("test_cost");
    const char text[] = "intra.alpha_us = 2\nintra.bw_GBps = 10\nintra.reduce_GBps = 4\n"
                        "inter.alpha_us = 20\ninter.bw_GBps = 1\ninter.reduce_GBps = 4\n";
    T_CHECK(write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1), "write failed");
    close(fd);
    setenv("HCOMM_TUNING_FILE", path, 1);
    t_for_each_world(run, NULL, 8);
    unlink(path);
    return t_finish("test_cost");
}
