/* all_to_allv with every algorithm (native, pairwise, bruck, direct, hier, shm, and the default)
 * against a serial reference: every received byte is the function of (sender, receiver,
 * offset) the sender wrote, and every byte outside the receive blocks keeps its sentinel.
 * Counts per pair: all zero, small primes, some zero, skewed (every rank sends everything to
 * one rank), odd sizes at odd offsets, and blocks above 64 KiB (rendezvous). hier runs on a
 * declared two-node topology. A count mismatch fails on both ranks of the pair, naming both
 * values and ranks, without writing that block; the next call works. Partial overlap and
 * in place are rejected. World sizes 1..9 (local) or the mpirun job (HCOMM_TEST_MPI). */
#include "algo/cost.h"
#include "algo/select.h"
#include "harness.h"

#include <math.h>

#include <stdint.h>

enum { PAT_ZERO, PAT_PRIME, PAT_SOME_ZERO, PAT_SKEWED, PAT_ODD, PAT_LARGE, PATTERNS };
static const char *const pattern_names[PATTERNS] = {"zero",   "prime", "some-zero",
                                                    "skewed", "odd",   "large"};
static const char *const algos[] = {NULL, "native", "pairwise", "bruck", "direct", "hier", "shm"};
enum { NALGOS = sizeof algos / sizeof algos[0] };

static const size_t primes[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41};

/* Bytes rank s sends to rank d. */
static size_t count_of(int pat, int s, int d, int p) {
    switch (pat) {
    case PAT_PRIME:
        return primes[(size_t)(3 * s + d) % (sizeof primes / sizeof primes[0])];
    case PAT_SOME_ZERO:
        return (s + d) % 3 == 0 ? 0 : (size_t)(s * 7 + d + 1);
    case PAT_SKEWED:
        return d == p - 1 ? 1000 + (size_t)s : 0;
    case PAT_ODD:
        return (size_t)(2 * ((s + 2 * d) % 5) + 1);
    case PAT_LARGE:
        return (64u << 10) + 1 + (size_t)(97 * s + 13 * d);
    default:
        return 0;
    }
}

static unsigned char byte_of(int s, int d, size_t i) {
    return (unsigned char)(s * 131 + d * 31 + (int)(i * 7) + 1);
}

/* One rank's layout: send blocks in reverse peer order with 3-byte gaps, receive blocks in
 * peer order with 1-byte gaps (odd offsets), both preceded by a gap. */
typedef struct layout {
    size_t sc[16], sd[16], rc[16], rd[16], sbytes, rbytes;
} layout_t;

static void make_layout(layout_t *l, int pat, int me, int p) {
    size_t off = 3;
    for (int d = p - 1; d >= 0; d--) {
        l->sc[d] = count_of(pat, me, d, p);
        l->sd[d] = off;
        off += l->sc[d] + 3;
    }
    l->sbytes = off;
    off = 1;
    for (int s = 0; s < p; s++) {
        l->rc[s] = count_of(pat, s, me, p);
        l->rd[s] = off;
        off += l->rc[s] + 1;
    }
    l->rbytes = off;
}

typedef struct tcase {
    hcomm_comm_t *w;
    const char *algo;
    int pat;
} tcase_t;

static void fill_send(unsigned char *send, const layout_t *l, int me, int p) {
    memset(send, 0x5a, l->sbytes);
    for (int d = 0; d < p; d++)
        for (size_t i = 0; i < l->sc[d]; i++)
            send[l->sd[d] + i] = byte_of(me, d, i);
}

/* Every block from s holds s's bytes for this rank; the gaps keep 0xee. skip: a sender whose
 * block must not have been written (a mismatch), -1 for none. */
static void check_recv(const tcase_t *t, const unsigned char *recv, const layout_t *l, int me,
                       int p, int skip) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < l->rbytes; i++) {
        unsigned char want = 0xee;
        for (int s = 0; s < p; s++)
            if (s != skip && i >= l->rd[s] && i < l->rd[s] + l->rc[s])
                want = byte_of(s, me, i - l->rd[s]);
        if (recv[i] != want && bad++ == 0)
            first = i;
    }
    T_CHECK(bad == 0,
            "all_to_allv algo %s pattern %s world %d rank %d: %zu wrong bytes, first at %zu "
            "(got %u)",
            t->algo ? t->algo : "auto", pattern_names[t->pat], p, me, bad, first,
            bad ? recv[first] : 0);
}

/* hier needs nodes: two uneven ones declared (one node when p == 1). */
static hcomm_result_t set_algo(hcomm_comm_t *w, const char *algo, int p) {
    char spec[64];
    if (algo && strcmp(algo, "hier") == 0 && p > 1) {
        snprintf(spec, sizeof spec, "nodes=%d,%d", (p + 1) / 2, p / 2);
        T_TRY(hcomm_comm_set_topo(w, spec));
    } else {
        T_TRY(hcomm_comm_set_topo(w, NULL));
    }
    if (!algo)
        return hcomm_comm_set_algo(w, NULL);
    snprintf(spec, sizeof spec, "alltoallv:%s", algo);
    return hcomm_comm_set_algo(w, spec);
}

static hcomm_result_t one_case(const tcase_t *t) {
    int me = t_rank(t->w), p = t_size(t->w);
    layout_t l;
    make_layout(&l, t->pat, me, p);
    unsigned char *send = malloc(l.sbytes), *recv = malloc(l.rbytes);
    if (!send || !recv) {
        free(send);
        free(recv);
        return HCOMM_ERR_NOMEM;
    }
    fill_send(send, &l, me, p);
    memset(recv, 0xee, l.rbytes);
    hcomm_result_t r = hcomm_all_to_allv(t->w, send, l.sc, l.sd, recv, l.rc, l.rd);
    T_CHECK(r == HCOMM_OK, "all_to_allv algo %s pattern %s world %d rank %d: %s (%s)",
            t->algo ? t->algo : "auto", pattern_names[t->pat], p, me, hcomm_result_name(r),
            hcomm_last_error());
    if (r == HCOMM_OK)
        check_recv(t, recv, &l, me, p, -1);
    free(send);
    free(recv);
    return r;
}

/* Rank 0 sends rank 1 one byte more than rank 1 expects: both fail naming both values and
 * ranks, rank 1's block from 0 stays untouched; the other ranks either complete (hcomm's
 * algorithms: their data is right) or fail too (native: nothing moves). */
static void mismatch_case(const tcase_t *t) {
    int me = t_rank(t->w), p = t_size(t->w);
    layout_t l;
    make_layout(&l, PAT_PRIME, me, p);
    size_t want = count_of(PAT_PRIME, 0, 1, p), sent = want + 1;
    if (me == 0)
        l.sc[1] = sent;
    unsigned char *send = malloc(l.sbytes + 1), *recv = malloc(l.rbytes);
    fill_send(send, &l, me, p);
    memset(recv, 0xee, l.rbytes);
    hcomm_result_t r = hcomm_all_to_allv(t->w, send, l.sc, l.sd, recv, l.rc, l.rd);
    const char *name = t->algo ? t->algo : "auto";
    if (me <= 1) {
        char text[160];
        snprintf(text, sizeof text, "sendcounts[1]=%zu on rank 0 but recvcounts[0]=%zu on rank 1",
                 sent, want);
        T_CHECK(r == HCOMM_ERR_MISMATCH && strstr(hcomm_last_error(), text) &&
                    strstr(hcomm_last_error(), "hcomm_all_to_allv"),
                "mismatch with algo %s world %d rank %d: got %s (%s), expected MISMATCH with "
                "'%s'",
                name, p, me, hcomm_result_name(r), hcomm_last_error(), text);
        if (me == 1)
            for (size_t i = 0; i < l.rc[0]; i++)
                T_CHECK(recv[l.rd[0] + i] == 0xee || recv[l.rd[0] + i] == byte_of(0, 1, i),
                        "mismatch with algo %s: rank 1's block from rank 0 was overwritten", name);
    } else {
        T_CHECK(r == HCOMM_OK || r == HCOMM_ERR_MISMATCH || r == HCOMM_ERR_PEER,
                "mismatch with algo %s world %d rank %d: got %s (%s)", name, p, me,
                hcomm_result_name(r), hcomm_last_error());
        if (r == HCOMM_OK)
            check_recv(t, recv, &l, me, p, -1);
    }
    free(send);
    free(recv);
}

/* Partial overlap of the send and receive ranges, and in place, fail on every rank. */
static void overlap_case(const tcase_t *t) {
    int p = t_size(t->w);
    size_t c[16], d[16];
    for (int q = 0; q < p; q++)
        c[q] = 4, d[q] = 4 * (size_t)q;
    unsigned char buf[128] = {0};
    hcomm_result_t r = hcomm_all_to_allv(t->w, buf, c, d, buf + 2, c, d);
    T_CHECK(r == HCOMM_ERR_INVALID_ARG || r == HCOMM_ERR_PEER,
            "partial overlap with algo %s: got %s", t->algo ? t->algo : "auto",
            hcomm_result_name(r));
    r = hcomm_all_to_allv(t->w, buf, c, d, buf, c, d);
    T_CHECK(r == HCOMM_ERR_INVALID_ARG || r == HCOMM_ERR_PEER, "in place with algo %s: got %s",
            t->algo ? t->algo : "auto", hcomm_result_name(r));
}

/* The last rank's own check fails (no send buffer): it gets HCOMM_ERR_NULL, its peers
 * HCOMM_ERR_PEER naming it, nobody hangs. Not where the mpi native path runs unchecked
 * (HCOMM_CHECK=off or first: MPI's collectives would pair this call with the next). */
static void failed_rank_case(const tcase_t *t) {
    int me = t_rank(t->w), p = t_size(t->w);
    const char *check = getenv("HCOMM_CHECK");
    if ((!t->algo || strcmp(t->algo, "native") == 0) && strcmp(t_backend(), "mpi") == 0 && check &&
        check[0] && strcmp(check, "always") != 0)
        return;
    layout_t l;
    make_layout(&l, PAT_PRIME, me, p);
    unsigned char *send = malloc(l.sbytes), *recv = malloc(l.rbytes);
    fill_send(send, &l, me, p);
    hcomm_result_t r =
        hcomm_all_to_allv(t->w, me == p - 1 ? NULL : send, l.sc, l.sd, recv, l.rc, l.rd);
    hcomm_result_t want = me == p - 1 ? HCOMM_ERR_NULL : HCOMM_ERR_PEER;
    T_CHECK(r == want, "a failed rank with algo %s world %d rank %d: got %s (%s), expected %s",
            t->algo ? t->algo : "auto", p, me, hcomm_result_name(r), hcomm_last_error(),
            hcomm_result_name(want));
    free(send);
    free(recv);
}

static hcomm_result_t run(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int p = t_size(w);
    if (p > 16)
        return HCOMM_OK;
    for (int a = 0; a < NALGOS; a++) {
        T_TRY(set_algo(w, algos[a], p));
        for (int pat = 0; pat < PATTERNS; pat++) {
            tcase_t t = {w, algos[a], pat};
            T_TRY(one_case(&t));
        }
        tcase_t t = {w, algos[a], PAT_PRIME};
        if (p > 1)
            mismatch_case(&t);
        T_TRY(one_case(&t)); /* usable after the mismatch */
        overlap_case(&t);
        T_TRY(one_case(&t));
        if (p > 1)
            failed_rank_case(&t);
        T_TRY(one_case(&t));
    }
    T_TRY(hcomm_comm_set_topo(w, NULL));
    return hcomm_comm_set_algo(w, NULL);
}

/* HCOMM_ALGO names: both spellings of the collective, and a wrong algorithm. */
static hcomm_result_t names(hcomm_comm_t *w, void *arg) {
    (void)arg;
    T_OK(hcomm_comm_set_algo(w, "alltoall:bruck"));
    T_OK(hcomm_comm_set_algo(w, "alltoallv:^native"));
    T_ERR(hcomm_comm_set_algo(w, "alltoallv:ring"), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), "pairwise") != NULL,
            "the error names the valid algorithms: '%s'", hcomm_last_error());
    return hcomm_comm_set_algo(w, NULL);
}

/* The cost model on a declared 2-node machine whose inter-node link is 20x slower: hier for
 * tiny blocks (one inter-node message per rail and node pair), pairwise for large ones (hier's
 * and Bruck's probed bundles left out above the eager limit). */
static hcomm_result_t cost_choices(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int p = t_size(w);
    if (p < 4 || p % 2)
        return HCOMM_OK;
    char spec[96];
    snprintf(spec, sizeof spec, "nodes=2x%d;intra=1us,10GB/s;inter=20us,1GB/s", p / 2);
    T_TRY(hcomm_comm_set_topo(w, spec));
    hcomm__algo_set_t own;
    T_TRY(hcomm__algo_parse("test", "spec", "alltoallv:^native", &own));
    double est;
    int small = hcomm__cost_choose(w, &own, HCOMM__COLL_ALLTOALLV, 64, false, &est);
    int large = hcomm__cost_choose(w, &own, HCOMM__COLL_ALLTOALLV, 1 << 20, false, &est);
    T_CHECK(small == HCOMM__ALGO_HIER, "alltoallv of 64 B blocks on %s: chose %s, expected hier",
            spec, hcomm__algo_name(small));
    T_CHECK(large == HCOMM__ALGO_PAIRWISE,
            "alltoallv of 1 MiB blocks on %s: chose %s, expected pairwise", spec,
            hcomm__algo_name(large));
    T_CHECK(isinf(hcomm__cost_estimate(w, HCOMM__COLL_ALLTOALLV, HCOMM__ALGO_DIRECT, 64, false)),
            "direct must not be a candidate across nodes");
    return hcomm_comm_set_topo(w, NULL);
}

/* Empty blocks with displacements above INT_MAX (never used: valid, as the header says) on
 * every rank but the last, whose blocks to and from everyone are empty: every algorithm,
 * native included, must move the other blocks (the mpi transport took such a displacement for
 * one its int arguments could not carry and failed on those ranks alone, the last rank waiting
 * for the timeout). */
static hcomm_result_t wide_empty_blocks(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int me = t_rank(w), p = t_size(w), last = p - 1;
    size_t sc[16], sd[16], rc[16], rd[16];
    unsigned char send[16], recv[16];
    if (p > 16)
        return HCOMM_OK;
    for (int q = 0; q < p; q++) {
        bool empty = q == last || me == last;
        sc[q] = rc[q] = empty ? 0 : 1;
        sd[q] = rd[q] = empty && me != last ? (size_t)3 << 31 : (size_t)q;
        send[q] = (unsigned char)(me * 16 + q);
        recv[q] = 0xee;
    }
    for (int a = 0; a < 3; a++) {
        T_TRY(set_algo(w, algos[a], p));
        hcomm_result_t r = hcomm_all_to_allv(w, send, sc, sd, recv, rc, rd);
        T_CHECK(r == HCOMM_OK, "empty blocks at displacement 3<<31, algo %s, rank %d of %d: %s",
                algos[a] ? algos[a] : "auto", me, p, hcomm_last_error());
        for (int q = 0; r == HCOMM_OK && q < p; q++)
            T_CHECK(rc[q] == 0 || recv[q] == (unsigned char)(q * 16 + me),
                    "rank %d got %d from rank %d", me, recv[q], q);
    }
    return hcomm_comm_set_algo(w, NULL);
}

int main(void) {
    /* HCOMM_TEST_MPI */
    t_for_each_world(wide_empty_blocks, NULL, 5);
    t_for_each_world(names, NULL, 2);
    t_for_each_world(run, NULL, 9);
    t_for_each_world(cost_choices, NULL, 8);
    return t_finish("test_a2a");
}
