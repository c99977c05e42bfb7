/* The entry path of all_to_allv (coll.h): its choice depends on the largest block of any pair,
 * which no rank knows alone, so the agreement that runs first carries the sizes (a2a_agree), or
 * two ranks on a lane agree in the message that carries small blocks (a2a_pair); then the
 * algorithms of a2a.h or the transport's native call. */
#include "algo/alltoallv.h"

#include "algo/a2a.h"
#include "algo/agree.h"
#include "algo/call.h"
#include "algo/choose.h"
#include "core/env.h"
#include "core/log.h"

#include <stdlib.h>

static hcomm_result_t nomem(const hcomm__call_t *k) {
    return hcomm__err(HCOMM_ERR_NOMEM, k->c->call_fn, "out of memory");
}

static hcomm_result_t a2a_run(const hcomm__xfer_t *x, int algo, const hcomm__a2a_t *v) {
    switch (algo & ~HCOMM__ALGO_DET) {
    case HCOMM__ALGO_BRUCK:
        return hcomm__a2a_bruck(x, v);
    case HCOMM__ALGO_DIRECT:
        return hcomm__a2a_direct(x, v);
    case HCOMM__ALGO_HIER:
        return hcomm__a2a_hier(x, v);
    default:
        return hcomm__a2a_pairwise(x, v);
    }
}

static int a2a_set(hcomm__call_t *k, int algo, const char *why, size_t bytes) {
    hcomm__call_chosen(k, algo, algo);
    if (algo <
        HCOMM__ALGO_COUNT) /* else hcomm__choose() logs the choice once the sizes are agreed */
        HCOMM__LOG(HCOMM__LOG_DEBUG, HCOMM__SUB_ALGO,
                   "%s seq %u: alltoallv with blocks up to %zu bytes on %d ranks: %s (%s)",
                   k->c->call_fn, (unsigned)k->seq, bytes, k->c->size, hcomm__algo_name(algo), why);
    return algo;
}

/* Two ranks with a lane and no board: the agreement and the data go in one lane message
 * each way (a2a_pair). */
static bool pair_on_lane(hcomm_comm_t *c) {
    return c->size == 2 && hcomm__lane_payload(c) > 0 && !hcomm__on_board(c);
}

/* The algorithm when the choice cannot depend on the block sizes, else -1: native where the
 * defaults pick it at every size (shared-memory transports on one node), the only one allowed,
 * shm on a board (its meeting agrees on everything, checked or not), or native where no
 * agreement runs to share the sizes (HCOMM_CHECK=off; but two ranks on a lane agree in the
 * message that carries small blocks, a2a_pair, which also spares the native call its count
 * check). */
static int a2a_fixed(hcomm__call_t *k) {
    uint32_t allowed = hcomm__algo_mask(k->a->has_over ? &k->a->over : NULL, HCOMM__COLL_ALLTOALLV);
    bool pair = pair_on_lane(k->c);
    bool native = allowed & (1u << HCOMM__ALGO_NATIVE);
    if (native && hcomm__posted_transport(k->c) && hcomm__on_one_node(k->c))
        return HCOMM__ALGO_NATIVE; /* first: this is every call on the local backend */
    if ((allowed & (allowed - 1)) == 0) {
        int a = 0;
        while (!(allowed & (1u << a)))
            a++;
        return a;
    }
    if ((allowed & (1u << HCOMM__ALGO_SHM)) && hcomm__shm_runs(k->c))
        return HCOMM__ALGO_SHM; /* its meeting agrees on everything: checked or not */
    if (native && hcomm__check_mode() == HCOMM__CHECK_OFF && !pair)
        return HCOMM__ALGO_NATIVE;
    return -1;
}

/* What runs where the chosen all_to_allv algorithm cannot: the native call where allowed,
 * else pairwise. */
static int a2a_fallback(const hcomm__call_t *k) {
    const hcomm__algo_set_t *over = k->a->has_over ? &k->a->over : NULL;
    return hcomm__algo_allowed(over, HCOMM__COLL_ALLTOALLV, HCOMM__ALGO_NATIVE)
               ? HCOMM__ALGO_NATIVE
               : HCOMM__ALGO_PAIRWISE;
}

/* direct needs cross-memory reads on every rank and shm a board (the same answers on all of
 * them); without, the native call runs where allowed, else pairwise. */
static int a2a_runnable(hcomm__call_t *k, int algo, size_t bytes) {
    const char *why = algo == HCOMM__ALGO_SHM && !hcomm__shm_runs(k->c)
                          ? "shm needs a board: every rank of the mpi backend on one node"
                      : algo == HCOMM__ALGO_DIRECT && !hcomm__peer_reads(k->c)
                          ? "direct needs cross-memory reads"
                          : NULL;
    return why ? a2a_set(k, a2a_fallback(k), why, bytes) : algo;
}

/* A rank with a block whose count or displacement exceeds INT_MAX (every rank knows it from
 * the agreement) rules out the mpi transport's native call, whose arguments are ints: pairwise
 * runs instead, or, where only native is allowed, every rank fails alike. */
static hcomm_result_t a2a_narrow(hcomm__call_t *k, bool wide_any, int *algo, size_t most) {
    if (!wide_any || *algo != HCOMM__ALGO_NATIVE || hcomm__posted_transport(k->c))
        return HCOMM_OK;
    const hcomm__algo_set_t *over = k->a->has_over ? &k->a->over : NULL;
    if (!hcomm__algo_allowed(over, HCOMM__COLL_ALLTOALLV, HCOMM__ALGO_PAIRWISE))
        return hcomm__err(HCOMM_ERR_UNSUPPORTED, k->c->call_fn,
                          "a rank's count or displacement exceeds INT_MAX, the most an MPI call "
                          "takes, and only the native algorithm is allowed (allow pairwise)");
    *algo = a2a_set(k, HCOMM__ALGO_PAIRWISE, "counts beyond MPI's int", most);
    return HCOMM_OK;
}

/* After the agreement found a mismatch: every rank tells each peer what it sends it, and
 * two reductions find the lowest (receiver, sender) pair that differs, so every rank names
 * the same pair, as the transports' own check does. Runs only on this error path. */
static hcomm_result_t a2a_diagnose(hcomm__call_t *k, const hcomm__a2a_t *v) {
    int p = k->c->size, me = k->c->rank;
    hcomm__xfer_t x = hcomm__call_xfer(k);
    int64_t key = INT64_MAX, lowest = 0, vals[2] = {0, 0}, got[2];
    for (int s = 1; s < p; s++) {
        int to = (me + s) % p, from = (me - s + p) % p;
        uint64_t out = v->scounts[to], in = 0;
        HCOMM__TRY(hcomm__x_sendrecv(&x, to, &out, sizeof out, from, &in, sizeof in));
        if (in != v->rcounts[from] && (int64_t)me * p + from < key)
            key = (int64_t)me * p + from, vals[0] = (int64_t)in,
            vals[1] = (int64_t)v->rcounts[from];
    }
    if (v->scounts[me] != v->rcounts[me] && (int64_t)me * p + me < key)
        key = (int64_t)me * p + me, vals[0] = (int64_t)v->scounts[me],
        vals[1] = (int64_t)v->rcounts[me];
    HCOMM__TRY(hcomm__ar_rd(&x, &key, &lowest, 1, HCOMM_I64, HCOMM_MIN));
    if (lowest != key)
        vals[0] = vals[1] = 0;
    HCOMM__TRY(hcomm__ar_rd(&x, vals, got, 2, HCOMM_I64, HCOMM_MAX));
    int receiver = (int)(lowest / p), sender = (int)(lowest % p);
    return hcomm__err(HCOMM_ERR_MISMATCH, k->c->call_fn,
                      "sendcounts[%d]=%lld on rank %d but recvcounts[%d]=%lld on rank %d; no data "
                      "was moved",
                      receiver, (long long)got[0], sender, sender, (long long)got[1], receiver);
}

/* all_to_allv's choice depends on the largest block of any pair, which no rank knows alone,
 * and its counts must agree pair by pair: the signature agreement every non-native call runs
 * first carries both (a recursive doubling of hcomm__a2a_terms' sums instead of an empty one), so
 * every rank chooses from the same size, and a mismatch fails on every rank before any data
 * moves, without an extra exchange. On a shared-memory transport the posted meeting comes
 * first (where a rank that failed its own checks shows). *algo: the fixed algorithm, or -1
 * to choose one here. */
static hcomm_result_t a2a_agree(hcomm__call_t *k, hcomm__a2a_t *v, int *algo) {
    int64_t mine[HCOMM__A2A_AGREE], all[HCOMM__A2A_AGREE];
    hcomm__a2a_terms(v, k->c->size, k->c->rank, mine);
    if (*algo < 0)
        a2a_set(k, HCOMM__ALGO_COUNT, "undecided until the sizes are agreed", 0);
    if (hcomm__posted_transport(k->c))
        HCOMM__TRY(hcomm__agree_p2p(k, *algo < 0 ? HCOMM__ALGO_COUNT : *algo));
    k->a->agreements++;
    hcomm__xfer_t x = hcomm__call_xfer(k);
    HCOMM__TRY(hcomm__on_board(k->c)
                   ? hcomm__agree_board_sum(k, mine, all, HCOMM__A2A_AGREE)
                   : hcomm__ar_rd(&x, mine, all, HCOMM__A2A_AGREE, HCOMM_I64, HCOMM_SUM));
    if (all[0] != 0)
        return a2a_diagnose(k, v);
    size_t most = hcomm__a2a_largest(all); /* every block is below 2 * most */
    if (*algo < 0)
        *algo = a2a_runnable(k, hcomm__choose(k, HCOMM__COLL_ALLTOALLV, most), most);
    HCOMM__TRY(a2a_narrow(k, all[HCOMM__A2A_WIDE] != 0, algo, most));
    v->lane = hcomm__lane_payload(k->c) > 0 && 2 * most <= HCOMM__A2A_LANE_BLOCK(k->c);
    return HCOMM_OK;
}

/* a2a_agree for two ranks on a lane (hcomm__a2a_pair): one message each way agrees and, for
 * blocks that fit, moves the data (*done), where the agreement and pairwise took two. */
static hcomm_result_t a2a_pair(hcomm__call_t *k, hcomm__a2a_t *v, int *algo, bool *done) {
    size_t most = 0;
    if (*algo < 0)
        a2a_set(k, HCOMM__ALGO_COUNT, "undecided until the sizes are agreed", 0);
    k->a->agreements++;
    hcomm__xfer_t x = hcomm__call_xfer(k);
    bool wide_any = false;
    HCOMM__TRY(hcomm__a2a_pair(&x, v, &most, &wide_any, done));
    if (*done)
        *algo = a2a_set(k, HCOMM__ALGO_PAIRWISE, "two ranks, both blocks in the agreement", most);
    else if (*algo < 0)
        *algo = a2a_runnable(k, hcomm__choose(k, HCOMM__COLL_ALLTOALLV, most), most);
    return *done ? HCOMM_OK : a2a_narrow(k, wide_any, algo, most);
}

static hcomm_result_t a2a_native(hcomm__call_t *k, const hcomm__a2a_t *v, bool counts_proved) {
    hcomm_comm_t *c = k->c;
    return c->tr->native->all_to_allv(c, v->send, v->scounts, v->sdispls, v->recv, v->rcounts,
                                      v->rdispls, counts_proved);
}

/* shm on the board; where its blocks cannot move well there, what it names runs, the counts
 * agreed in its meeting. */
static hcomm_result_t a2a_board(hcomm__call_t *k, hcomm__a2a_t *v) {
    hcomm__xfer_t x = hcomm__call_xfer(k);
    int fallback = -1;
    k->a->agreements++;
    HCOMM__TRY(hcomm__a2a_shm(&x, v, &fallback));
    if (fallback < 0)
        return HCOMM_OK;
    if (fallback == HCOMM__ALGO_NATIVE && a2a_fallback(k) == HCOMM__ALGO_NATIVE)
        return a2a_native(k, v, true);
    return hcomm__a2a_pairwise(&x, v); /* it checks the counts in its messages */
}

/* The native call with the signature posted (a shared-memory transport). */
typedef struct a2a_native_arg {
    hcomm__call_t *k;
    const hcomm__a2a_t *v;
    bool counts_proved;
} a2a_native_arg_t;

static hcomm_result_t a2a_posted(hcomm_comm_t *c, const void *arg) {
    (void)c;
    const a2a_native_arg_t *n = arg;
    return a2a_native(n->k, n->v, n->counts_proved);
}

/* The agreement the algorithm needs, with the counts (*counts_proved: proved on every rank). */
static hcomm_result_t a2a_agree_for(hcomm__call_t *k, hcomm__a2a_t *v, int *algo,
                                    bool *counts_proved, bool *done) {
    hcomm_comm_t *c = k->c;
    if (*algo == HCOMM__ALGO_NATIVE)
        return *counts_proved ? HCOMM_OK : hcomm__agree_as(k, hcomm__check_mode());
    if (*algo >= 0 && hcomm__check_mode() == HCOMM__CHECK_OFF)
        return hcomm__agree_p2p(k, *algo); /* the counts are checked with the data only */
    *counts_proved = true;
    if (pair_on_lane(c) && (*algo < 0 || *algo == HCOMM__ALGO_PAIRWISE))
        return a2a_pair(k, v, algo, done);
    return a2a_agree(k, v, algo);
}

/* counts_proved: the caller's own exchange already checked the call and the counts on every rank,
 * so the native path runs without the signature agreement and the transport's count check
 * (MoE's dispatch; it has no size every rank shares, so it stays native). */
static hcomm_result_t all_to_allv(hcomm_comm_t *c, hcomm__a2a_t *v, bool counts_proved) {
    hcomm__call_t k = {0};
    HCOMM__TRY(hcomm__call_begin(c, &k, HCOMM__CALL_ALL_TO_ALLV, HCOMM_U8, HCOMM_SUM, 0, 0));
    int algo = counts_proved ? HCOMM__ALGO_NATIVE : a2a_fixed(&k);
    if (algo >= 0 && !counts_proved)
        algo = a2a_runnable(&k, a2a_set(&k, algo, "fixed", 0), 0);
    a2a_native_arg_t n = {&k, v, false};
    if (hcomm__posted_transport(c) && algo == HCOMM__ALGO_NATIVE)
        return hcomm__call_end(&k, hcomm__run_posted(&k, a2a_posted, &n));
    if (algo == HCOMM__ALGO_SHM)
        return hcomm__call_end(&k, a2a_board(&k, v));
    bool done = false;
    hcomm_result_t res = a2a_agree_for(&k, v, &algo, &counts_proved, &done);
    if (res != HCOMM_OK || done)
        return hcomm__call_end(&k, res);
    n.counts_proved = true;
    if (algo == HCOMM__ALGO_NATIVE && hcomm__posted_transport(c))
        return hcomm__call_end(&k, hcomm__run_posted(&k, a2a_posted, &n));
    if (algo == HCOMM__ALGO_NATIVE)
        return hcomm__call_end(&k, a2a_native(&k, v, counts_proved));
    hcomm__xfer_t x = hcomm__call_xfer(&k);
    return hcomm__call_end(&k, a2a_run(&x, algo, v));
}

hcomm_result_t hcomm__coll_all_to_allv(hcomm_comm_t *c, const void *sendbuf,
                                       const size_t *sendcounts, const size_t *sdispls,
                                       void *recvbuf, const size_t *recvcounts,
                                       const size_t *rdispls, bool counts_proved) {
    hcomm__a2a_t v = {sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, false};
    return all_to_allv(c, &v, counts_proved);
}

/* Counts and displacements of equal blocks of bytes for p ranks: v[0..p) and v[p..2p), or NULL
 * without memory. */
static size_t *equal_blocks(size_t p, size_t bytes) {
    size_t *v = malloc(2 * p * sizeof *v);
    for (size_t i = 0; v && i < p; i++) {
        v[i] = bytes;
        v[p + i] = i * bytes;
    }
    return v;
}

typedef struct checked_arg {
    const void *send;
    void *recv;
    const size_t *v;
    size_t p;
} checked_arg_t;

static hcomm_result_t checked_posted(hcomm_comm_t *c, const void *arg) {
    const checked_arg_t *a = arg;
    return c->tr->native->all_to_allv(c, a->send, a->v, a->v + a->p, a->recv, a->v, a->v + a->p,
                                      false);
}

/* Over p2p, pairwise (a2a.c), the signature in every envelope; on a shared-memory transport,
 * the native exchange with the signature posted. */
hcomm_result_t hcomm__coll_all_to_all_checked(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                              size_t bytes) {
    hcomm__call_t k = {0};
    HCOMM__TRY(hcomm__call_begin(c, &k, HCOMM__CALL_ALL_TO_ALLV, HCOMM_U8, HCOMM_SUM, 0, bytes));
    bool posted = hcomm__posted_transport(c);
    hcomm_result_t res = !posted && hcomm__on_board(c) ? hcomm__agree_all(&k) : HCOMM_OK;
    size_t p = (size_t)c->size, *v = res == HCOMM_OK ? equal_blocks(p, bytes) : NULL;
    if (res == HCOMM_OK && !v)
        res = nomem(&k);
    checked_arg_t a = {sendbuf, recvbuf, v, p};
    hcomm__a2a_t blocks = {sendbuf, v, v ? v + p : NULL, recvbuf, v, v ? v + p : NULL, false};
    hcomm__xfer_t x = hcomm__call_xfer(&k);
    if (res == HCOMM_OK)
        res = posted ? hcomm__run_posted(&k, checked_posted, &a) : hcomm__a2a_pairwise(&x, &blocks);
    free(v);
    return hcomm__call_end(&k, res);
}
