/* The selection tables (select_table.h): the rows are data in select_table.def, read here
 * first match; the measurements behind each row are in docs/tuning.md under its id, and a
 * changed threshold changes one row there and one line of test/test_select.c. */
#include "algo/select_table.h"

#define K(n) ((size_t)(n) << 10)
#define M(n) ((size_t)(n) << 20)
#define ALL SIZE_MAX

/* Where a row holds, as (need, deny) pairs of HCOMM__HAS_* flags. */
#define ANYWHERE 0, 0                                     /* either backend */
#define LOCAL HCOMM__HAS_POSTED, 0                        /* posted checks: local */
#define MPI 0, HCOMM__HAS_POSTED                          /* no posted checks: mpi */
#define MPI_CHECKED 0, HCOMM__HAS_POSTED | HCOMM__HAS_OFF /* mpi, HCOMM_CHECK on */
#define MPI_OFF HCOMM__HAS_OFF, HCOMM__HAS_POSTED         /* mpi, HCOMM_CHECK=off */
#define MPI_READS HCOMM__HAS_READS, HCOMM__HAS_POSTED     /* mpi, peers readable */
#define LOCAL_READS HCOMM__HAS_POSTED | HCOMM__HAS_READS, 0
#define BOARD HCOMM__HAS_SHM, 0 /* mpi, shm runs on the board */
#define BOARD_CHECKED HCOMM__HAS_SHM, HCOMM__HAS_OFF
#define BOARD_OFF HCOMM__HAS_SHM | HCOMM__HAS_OFF, 0
#define BOARD_READS HCOMM__HAS_BOARD | HCOMM__HAS_READS, 0 /* a board, peers readable */

enum {
    AR = HCOMM__COLL_ALLREDUCE,
    AG = HCOMM__COLL_ALLGATHER,
    RS = HCOMM__COLL_REDUCESCATTER,
    BC = HCOMM__COLL_BROADCAST,
    RE = HCOMM__COLL_REDUCE,
    GA = HCOMM__COLL_GATHER,
    SC = HCOMM__COLL_SCATTER,
    AGV = HCOMM__COLL_ALLGATHERV,
    RSV = HCOMM__COLL_REDUCESCATTERV,
    A2A = HCOMM__COLL_ALLTOALLV,
};

enum {
    NATIVE = HCOMM__ALGO_NATIVE,
    RD = HCOMM__ALGO_RD,
    RHD = HCOMM__ALGO_RHD,
    TREE = HCOMM__ALGO_TREE,
    DIRECT = HCOMM__ALGO_DIRECT,
    TWOSHOT = HCOMM__ALGO_TWOSHOT,
    BRUCK = HCOMM__ALGO_BRUCK,
    PAIRWISE = HCOMM__ALGO_PAIRWISE,
    SHM = HCOMM__ALGO_SHM,
};

#define TWO HCOMM__P2
#define NOT2 HCOMM__P_NOT2
#define ANY HCOMM__P_ANY
#define UPTO2 HCOMM__P_UPTO2
#define UPTO4 HCOMM__P_UPTO4
#define FROM3 HCOMM__P_FROM3
#define FROM5 HCOMM__P_FROM5
#define P8 HCOMM__P8_
#define P1_3_4 (HCOMM__P1 | HCOMM__P3_4)
#define RD_MAX HCOMM__RD_ALL_REDUCE_MAX
#define TIMED true
#define FIXED false

/* The two tables, from select_table.def: each pass keeps one kind of row. */
/* where expands to its (need, deny) pair, so a row is nine initializers. */
#define ROW(...) {__VA_ARGS__},

#define DEFAULT(id, coll, where, ranks, from, to, algo)                                            \
    ROW(id, coll, where, ranks, from, to, algo, false)
#define UPGRADE(...)
const hcomm__rule_t hcomm__defaults[] = {
#include "algo/select_table.def"
};
const int hcomm__ndefaults = (int)(sizeof hcomm__defaults / sizeof hcomm__defaults[0]);
#undef DEFAULT
#undef UPGRADE

#define DEFAULT(...)
#define UPGRADE(id, coll, where, ranks, from, to, algo, timed)                                     \
    ROW(id, coll, where, ranks, from, to, algo, timed)
const hcomm__rule_t hcomm__upgrades[] = {
#include "algo/select_table.def"
};
const int hcomm__nupgrades = (int)(sizeof hcomm__upgrades / sizeof hcomm__upgrades[0]);
#undef DEFAULT
#undef UPGRADE

static const char *const why_texts[] = {
    [HCOMM__WHY_DEFAULT] = "default",
    [HCOMM__WHY_COST] = "cost model",
    [HCOMM__WHY_ENV] = "HCOMM_ALGO",
    [HCOMM__WHY_SET_ALGO] = "hcomm_comm_set_algo",
    [HCOMM__WHY_UPGRADE_SHM] = "default: small, on a board",
    [HCOMM__WHY_UPGRADE_BOARD] = "default: on a board, above shm's sizes",
    [HCOMM__WHY_TWOSHOT_NO_READS] = "twoshot needs every rank on one node with cross-memory reads",
    [HCOMM__WHY_DIRECT_NO_READS] = "direct needs every rank on one node with cross-memory reads",
    [HCOMM__WHY_NO_BOARD] = "shm needs a board: every rank of the mpi backend on one node",
    [HCOMM__WHY_NO_NATIVE] = "the transport has no native call for it",
};

const char *hcomm__why_text(hcomm__why_t why) {
    return why_texts[why];
}

static unsigned rank_class(int p) {
    return p <= 1   ? HCOMM__P1
           : p == 2 ? HCOMM__P2
           : p <= 4 ? HCOMM__P3_4
           : p <= 7 ? HCOMM__P5_7
                    : HCOMM__P8_;
}

/* True when row r applies to s, its size range aside. */
static bool row_fits(const hcomm__rule_t *r, const hcomm__sel_t *s) {
    return r->coll == s->coll && (s->has & r->need) == r->need && (s->has & r->deny) == 0 &&
           (r->ranks & rank_class(s->p)) != 0;
}

static bool row_holds(const hcomm__rule_t *r, const hcomm__sel_t *s) {
    return row_fits(r, s) && s->bytes >= r->lo && s->bytes <= r->hi;
}

const hcomm__rule_t *hcomm__select_rule(const hcomm__sel_t *s, bool upgrades) {
    const hcomm__rule_t *rows = upgrades ? hcomm__upgrades : hcomm__defaults;
    int n = upgrades ? hcomm__nupgrades : hcomm__ndefaults;
    for (int i = 0; i < n; i++)
        if (row_holds(&rows[i], s))
            return &rows[i];
    return NULL;
}

int hcomm__select_default(const hcomm__sel_t *s, hcomm__why_t *why) {
    const hcomm__rule_t *r = hcomm__select_rule(s, false);
    int algo = r ? r->algo : NATIVE;
    *why = HCOMM__WHY_DEFAULT;
    const hcomm__algo_set_t *set = s->over ? s->over : hcomm__algo_env();
    if (!set || (set->allowed[s->coll] & (1u << algo)))
        return algo;
    *why = s->over ? HCOMM__WHY_SET_ALGO : HCOMM__WHY_ENV;
    int pick = hcomm__algo_preferred(set->allowed[s->coll]);
    return pick >= 0 ? pick : algo;
}

/* The first upgrade row for s that is allowed (skipping the shm rows where skip_shm), *why
 * naming it (shm and direct on a board; twoshot rows leave *why as it was); else dflt, *why
 * untouched. */
static int select_upgrade(const hcomm__sel_t *s, int dflt, bool skip_shm, hcomm__why_t *why) {
    for (int i = 0; i < hcomm__nupgrades; i++) {
        const hcomm__rule_t *r = &hcomm__upgrades[i];
        if ((skip_shm && r->algo == SHM) || !row_holds(r, s) ||
            !hcomm__algo_allowed(s->over, s->coll, r->algo))
            continue;
        if (r->algo == SHM)
            *why = HCOMM__WHY_UPGRADE_SHM;
        else if (r->algo == DIRECT)
            *why = HCOMM__WHY_UPGRADE_BOARD;
        return r->algo;
    }
    return dflt;
}

/* The timed row whose band holds s->bytes, else NULL. */
static const hcomm__rule_t *select_timed(const hcomm__sel_t *s) {
    for (int i = 0; i < hcomm__nupgrades; i++) {
        const hcomm__rule_t *r = &hcomm__upgrades[i];
        if (r->timed && row_fits(r, s))
            return s->bytes >= r->hi / HCOMM__TUNED_BAND && s->bytes <= r->hi * HCOMM__TUNED_BAND
                       ? r
                       : NULL;
    }
    return NULL;
}

/* --- what runs where the choice cannot --- */

/* twoshot and direct need every rank's memory readable; a default direct falls back to what the
 * tables measured next (native; tree for reduce; rhd for 2 ranks' reduce_scatter), a forced
 * one to ring (tree for the rooted calls). */
static int without_reads(int coll, int p, bool dflt) {
    if (coll == HCOMM__COLL_REDUCE)
        return HCOMM__ALGO_TREE;
    if (coll == HCOMM__COLL_BROADCAST)
        return dflt ? HCOMM__ALGO_NATIVE : HCOMM__ALGO_TREE;
    if (!dflt)
        return HCOMM__ALGO_RING;
    return coll == HCOMM__COLL_REDUCESCATTER && p == 2 ? HCOMM__ALGO_RHD : HCOMM__ALGO_NATIVE;
}

/* shm needs a board: what the transport does best without one. */
static int without_board(const hcomm__sel_t *s) {
    bool posted = s->has & HCOMM__HAS_POSTED;
    if (s->coll == HCOMM__COLL_REDUCE)
        return HCOMM__ALGO_TREE;
    if (s->coll == HCOMM__COLL_GATHER || s->coll == HCOMM__COLL_SCATTER)
        return HCOMM__ALGO_DIRECT;
    if (posted)
        return HCOMM__ALGO_NATIVE;
    if (s->coll == HCOMM__COLL_ALLGATHERV || s->coll == HCOMM__COLL_REDUCESCATTERV)
        return HCOMM__ALGO_RING;
    if (s->coll == HCOMM__COLL_BROADCAST)
        return HCOMM__ALGO_TREE;
    return s->coll == HCOMM__COLL_ALLREDUCE && s->bytes <= HCOMM__RD_ALL_REDUCE_MAX
               ? HCOMM__ALGO_RD
               : HCOMM__ALGO_RING;
}

static bool reads_needed(int coll, int algo) {
    if (algo == HCOMM__ALGO_TWOSHOT)
        return true;
    return algo == HCOMM__ALGO_DIRECT &&
           (coll == HCOMM__COLL_ALLGATHER || coll == HCOMM__COLL_ALLGATHERV ||
            coll == HCOMM__COLL_REDUCESCATTER || coll == HCOMM__COLL_REDUCESCATTERV ||
            coll == HCOMM__COLL_BROADCAST || coll == HCOMM__COLL_REDUCE);
}

bool hcomm__select_needs_offers(int coll, int algo) {
    return reads_needed(coll, algo) || algo == HCOMM__ALGO_SHM;
}

static int runnable(const hcomm__sel_t *s, int algo, hcomm__why_t *why) {
    if (reads_needed(s->coll, algo) && !(s->has & HCOMM__HAS_READS)) {
        int other = algo == HCOMM__ALGO_TWOSHOT
                        ? HCOMM__ALGO_RING
                        : without_reads(s->coll, s->p, *why == HCOMM__WHY_DEFAULT);
        *why =
            algo == HCOMM__ALGO_TWOSHOT ? HCOMM__WHY_TWOSHOT_NO_READS : HCOMM__WHY_DIRECT_NO_READS;
        return other;
    }
    if (algo == HCOMM__ALGO_SHM && !(s->has & HCOMM__HAS_SHM)) {
        *why = HCOMM__WHY_NO_BOARD;
        return without_board(s);
    }
    return algo;
}

/* Near a timed row's bound, on a board where nothing forced either side, the choice is timed
 * against the algorithm on the other side of it: shm and what runs above it. */
static int timed_rival(const hcomm__sel_t *s, int pre, int algo) {
    if (!select_timed(s) || !hcomm__algo_allowed(s->over, s->coll, HCOMM__ALGO_SHM))
        return -1;
    hcomm__why_t unused;
    int above = select_upgrade(s, pre, true, &unused);
    return algo == HCOMM__ALGO_SHM ? above : HCOMM__ALGO_SHM;
}

int hcomm__select(const hcomm__sel_t *s, int algo, hcomm__why_t *why, int *rival) {
    *rival = -1;
    if (algo < 0)
        algo = hcomm__select_default(s, why);
    algo = runnable(s, algo, why);
    if (*why != HCOMM__WHY_DEFAULT)
        return algo;
    int pre = algo;
    algo = select_upgrade(s, pre, false, why);
    *rival = timed_rival(s, pre, algo);
    return algo;
}
