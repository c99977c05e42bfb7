/* Selection as data (select_table.c): which algorithm runs a collective by default, as rows of
 * two tables read top to bottom, first match wins.
 *   - defaults: the measured default for (collective, transport class, ranks, check mode, size);
 *   - upgrades: where the communicator offers more (peers' memory it can read, a board), the
 *     faster algorithm that replaces that default, if the override allows it; taken only where
 *     the default itself was allowed and can run (choose.c).
 * Each row has a tuning id; docs/tuning.md keeps the measurements behind it under that id. A row
 * marked timed has a switch whose best side changes with the machine: near its upper bound
 * (a factor HCOMM__TUNED_BAND either side) the choice is timed on the first calls (tune.h).
 * Nothing here reads a communicator: choose.c fills an hcomm__sel_t, and test_select checks
 * each row's boundary on both sides. The one thing read besides it is HCOMM_ALGO, where
 * hcomm__sel_t carries no per-communicator override (test_select unsets it). */
#ifndef HCOMM_C_ALGO_SELECT_TABLE_H_
#define HCOMM_C_ALGO_SELECT_TABLE_H_

#include "algo/select.h"

/* What the communicator offers, and the check mode: hcomm__sel_t.has and a row's need / deny. */
enum {
    HCOMM__HAS_POSTED = 1 << 0, /* a shared-memory transport that checks calls in posted slots */
    HCOMM__HAS_READS = 1 << 1,  /* every rank can read every other's memory (one node) */
    HCOMM__HAS_BOARD = 1 << 2,  /* calls meet on a board (mpi, every rank on one host) */
    HCOMM__HAS_SHM = 1 << 3,    /* the board fits the group: shm can run */
    HCOMM__HAS_OFF = 1 << 4,    /* HCOMM_CHECK=off: no agreement before native calls */
};

/* Rank counts, as a row's mask. */
enum {
    HCOMM__P1 = 1 << 0,
    HCOMM__P2 = 1 << 1,
    HCOMM__P3_4 = 1 << 2,
    HCOMM__P5_7 = 1 << 3,
    HCOMM__P8_ = 1 << 4,
    HCOMM__P_ANY = 0x1f,
    HCOMM__P_NOT2 = HCOMM__P_ANY & ~HCOMM__P2,
    HCOMM__P_UPTO2 = HCOMM__P1 | HCOMM__P2,
    HCOMM__P_UPTO4 = HCOMM__P_UPTO2 | HCOMM__P3_4,
    HCOMM__P_FROM3 = HCOMM__P_ANY & ~HCOMM__P_UPTO2,
    HCOMM__P_FROM5 = HCOMM__P5_7 | HCOMM__P8_,
};

/* The largest all_reduce recursive doubling runs by default without posted checks (also what a
 * forced shm without a board falls back to): measured (docs/tuning.md: ar.rd), so it may move
 * apart from rd's piece (HCOMM__RD_PIECE_BYTES), which it equals today. */
#define HCOMM__RD_ALL_REDUCE_MAX 4096
#define HCOMM__TUNED_BAND 2

typedef struct hcomm__rule {
    const char *id;     /* tuning id (docs/tuning.md) */
    uint8_t coll;       /* hcomm__coll_t */
    uint8_t need, deny; /* HCOMM__HAS_* the call must have / must not have */
    uint8_t ranks;      /* HCOMM__P* mask */
    size_t lo, hi;      /* bytes, both included */
    uint8_t algo;       /* hcomm__algo_t */
    bool timed;         /* the switch at hi is timed (tune.h) */
} hcomm__rule_t;

/* One call as selection sees it. */
typedef struct hcomm__sel {
    int coll;                      /* hcomm__coll_t */
    size_t bytes;                  /* what the collective is sized by (choose.c) */
    int p;                         /* ranks */
    unsigned has;                  /* HCOMM__HAS_* */
    const hcomm__algo_set_t *over; /* hcomm_comm_set_algo's set; NULL: HCOMM_ALGO's, if any */
} hcomm__sel_t;

/* Why an algorithm was chosen (debug logs). */
typedef enum {
    HCOMM__WHY_DEFAULT,          /* the defaults table */
    HCOMM__WHY_COST,             /* the cost model (a known multi-node topology) */
    HCOMM__WHY_ENV,              /* HCOMM_ALGO excluded the default */
    HCOMM__WHY_SET_ALGO,         /* hcomm_comm_set_algo excluded the default */
    HCOMM__WHY_UPGRADE_SHM,      /* upgrades: small, on a board */
    HCOMM__WHY_UPGRADE_BOARD,    /* upgrades: on a board, above shm's sizes */
    HCOMM__WHY_TWOSHOT_NO_READS, /* twoshot needs cross-memory reads */
    HCOMM__WHY_DIRECT_NO_READS,  /* direct needs cross-memory reads */
    HCOMM__WHY_NO_BOARD,         /* shm needs a board */
    HCOMM__WHY_NO_NATIVE,        /* the transport has no native call for it */
} hcomm__why_t;
const char *hcomm__why_text(hcomm__why_t why);

/* The rows, for test_select and hcomm-bench. */
extern const hcomm__rule_t hcomm__defaults[];
extern const int hcomm__ndefaults;
extern const hcomm__rule_t hcomm__upgrades[];
extern const int hcomm__nupgrades;

/* The first row of the defaults (or the upgrades) that holds for s, its algorithm's permission
 * aside; NULL for none. */
const hcomm__rule_t *hcomm__select_rule(const hcomm__sel_t *s, bool upgrades);
/* The default for s (WHY_DEFAULT), or where the override excludes it, the first algorithm it
 * allows in preference order (WHY_SET_ALGO or WHY_ENV). */
int hcomm__select_default(const hcomm__sel_t *s, hcomm__why_t *why);

/* The whole choice for s after the cost model: algo is the model's answer (*why
 * HCOMM__WHY_COST), or -1 for the defaults table. What this communicator cannot run falls back
 * (twoshot and direct without peer reads, shm without a board); a default is upgraded where
 * allowed. *rival: near a timed switch, the algorithm to time against the answer (tune.h), else
 * -1. The transport's missing native calls are the caller's (choose.c). */
int hcomm__select(const hcomm__sel_t *s, int algo, hcomm__why_t *why, int *rival);
/* True when algo's answer for coll depends on more than the transport class (peer reads, the
 * board): what a cost-model answer needs looked up. */
bool hcomm__select_needs_offers(int coll, int algo);

#endif /* HCOMM_C_ALGO_SELECT_TABLE_H_ */
