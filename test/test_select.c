/* The selection tables (src/algo/select_table.h), row by row: each line below names one row and
 * a size either side of its boundary, with the algorithm expected on each side, written here by
 * hand (not read from the table). A changed threshold changes one row of the table and one line
 * here. Every row of the table must have its line, and every line its row. Then the timed bands
 * near shm's switches and what runs where an algorithm cannot. No communicator: selection reads
 * none (choose.c fills an hcomm__sel_t). */
#include "algo/select_table.h"
#include "harness.h"

#include <stdint.h>

/* The communicators the lines run on, as the flags selection sees. */
#define MPI 0u                                                       /* mpi across hosts, checked */
#define READS HCOMM__HAS_READS                                       /* mpi on one host, no board */
#define READS_OFF (READS | HCOMM__HAS_OFF)                           /* and HCOMM_CHECK=off */
#define LOCAL (HCOMM__HAS_POSTED | HCOMM__HAS_READS)                 /* the local backend */
#define BOARD (HCOMM__HAS_READS | HCOMM__HAS_BOARD | HCOMM__HAS_SHM) /* mpi on one host */
#define BOARD_OFF (BOARD | HCOMM__HAS_OFF)
#define K(n) ((size_t)(n) << 10)
#define M(n) ((size_t)(n) << 20)
#define NONE (-1) /* the row holds at every size: its other side is another communicator */

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
    NATIVE = HCOMM__ALGO_NATIVE,
    RD = HCOMM__ALGO_RD,
    RHD = HCOMM__ALGO_RHD,
    TREE = HCOMM__ALGO_TREE,
    DIRECT = HCOMM__ALGO_DIRECT,
    TWOSHOT = HCOMM__ALGO_TWOSHOT,
    BRUCK = HCOMM__ALGO_BRUCK,
    PAIRWISE = HCOMM__ALGO_PAIRWISE,
    SHM = HCOMM__ALGO_SHM,
    RING = HCOMM__ALGO_RING,
};

/* Row id: at `in` bytes on (has_in, p) the row decides `algo`; at `out` bytes on (has_out, p)
 * another row decides `other`. */
typedef struct line {
    const char *id;
    int coll, p;
    unsigned has_in;
    size_t in;
    int algo;
    unsigned has_out;
    size_t out;
    int other;
} line_t;

/* clang-format off */
static const line_t defaults[] = {
    /* id                      coll  p  inside              algo      outside              algo */
    {"ar.pair.rd",              AR,  2, MPI,   K(8) - 1,    RD,       MPI,   K(8),         NATIVE},
    {"ar.rd",                   AR,  3, MPI,   4096,        RD,       MPI,   4097,         NATIVE},
    {"ar.native",               AR,  3, MPI,   4097,        NATIVE,   MPI,   4096,         RD},
    {"ag.pair.rd",              AG,  2, READS,   K(8) - 1,    RD,       READS,   K(8),         DIRECT},
    {"ag.pair.direct",          AG,  2, READS,   K(8),        DIRECT,   READS,   K(8) - 1,     RD},
    {"ag.rd",                   AG,  4, READS,   2048,        RD,       READS,   2049,         NATIVE},
    {"ag.direct",               AG,  4, READS,   K(16),       DIRECT,   READS,   K(16) - 1,    NATIVE},
    {"ag.direct.off",           AG,  4, READS_OFF, K(128),    DIRECT,   READS_OFF, K(128) - 1, NATIVE},
    {"ag.native",               AG,  4, READS,   2049,        NATIVE,   READS,   2048,         RD},
    {"rs.pair.rhd",             RS,  2, READS,   K(8) - 1,    RHD,      READS,   K(8),         DIRECT},
    {"rs.pair.direct",          RS,  2, READS,   K(8),        DIRECT,   READS,   K(8) - 1,     RHD},
    {"rs.rd",                   RS,  3, READS,   2048,        RD,       READS,   2049,         NATIVE},
    {"rs.direct",               RS,  3, READS,   K(8),        DIRECT,   READS,   K(8) - 1,     NATIVE},
    {"rs.native",               RS,  3, READS,   2049,        NATIVE,   READS,   2048,         RD},
    {"bc.pair.tree",            BC,  2, READS,   K(8) - 1,    TREE,     READS,   K(8),         DIRECT},
    {"bc.pair.direct",          BC,  2, READS,   K(8),        DIRECT,   READS,   K(8) - 1,     TREE},
    {"bc.rd",                   BC,  4, READS,   1024,        RD,       READS,   1025,         NATIVE},
    {"bc.direct",               BC,  4, READS,   K(512),      DIRECT,   READS,   K(512) - 1,   NATIVE},
    {"bc.direct.off",           BC,  4, READS_OFF, K(128),    DIRECT,   READS_OFF, K(128) - 1, NATIVE},
    {"bc.native",               BC,  4, READS,   1025,        NATIVE,   READS,   1024,         RD},
    {"reduce.direct",           RE,  4, READS,   4096,        DIRECT,   READS,   4095,         TREE},
    {"reduce.local.pair.direct",RE,  2, LOCAL, 4096,        DIRECT,   LOCAL, 4095,         TREE},
    {"reduce.local.direct",     RE,  4, LOCAL, K(64),       DIRECT,   LOCAL, K(64) - 1,    TREE},
    {"reduce.local.many.direct",RE,  8, LOCAL, K(256),      DIRECT,   LOCAL, K(256) - 1,   TREE},
    {"reduce.tree",             RE,  4, READS,   4095,        TREE,     READS,   4096,         DIRECT},
    {"gather.native",           GA,  4, MPI,   M(1),        NATIVE,   LOCAL, M(1),         DIRECT},
    {"gather.local.direct",     GA,  4, LOCAL, M(1),        DIRECT,   MPI,   M(1),         NATIVE},
    {"scatter.native",          SC,  4, MPI,   8,           NATIVE,   LOCAL, 8,            DIRECT},
    {"scatter.local.direct",    SC,  4, LOCAL, 8,           DIRECT,   MPI,   8,            NATIVE},
    {"agv.native",              AGV, 4, MPI,   M(1),        NATIVE,   MPI,   0,            NONE},
    {"rsv.native",              RSV, 4, LOCAL, M(1),        NATIVE,   MPI,   0,            NONE},
    {"a2a.local.native",        A2A, 8, LOCAL, 8,           NATIVE,   MPI,   8,            BRUCK},
    {"a2a.bruck",               A2A, 8, MPI,   512,         BRUCK,    MPI,   513,          PAIRWISE},
    {"a2a.pair.pairwise",       A2A, 2, MPI,   2048,        PAIRWISE, MPI,   2049,         DIRECT},
    {"a2a.pairwise",            A2A, 4, MPI,   K(8),        PAIRWISE, MPI,   K(8) + 1,     NATIVE},
    {"a2a.pair.direct",         A2A, 2, MPI,   2049,        DIRECT,   MPI,   2048,         PAIRWISE},
    {"a2a.native",              A2A, 4, MPI,   K(8) + 1,    NATIVE,   MPI,   K(8),         PAIRWISE},
};

/* The upgrades, through the whole choice (hcomm__select): the default underneath included. */
static const line_t upgrades[] = {
    {"ar.shm.pair",             AR,  2, BOARD, K(8),        SHM,      BOARD, K(8) + 1,     TWOSHOT},
    {"ar.shm.pair.off",         AR,  2, BOARD_OFF, K(4),    SHM,      BOARD_OFF, K(4) + 1, TWOSHOT},
    {"ar.shm",                  AR,  4, BOARD, K(32),       SHM,      BOARD, K(32) + 1,    TWOSHOT},
    {"bc.shm.pair",             BC,  2, BOARD, K(4),        SHM,      BOARD, K(4) + 1,     DIRECT},
    {"bc.shm",                  BC,  4, BOARD, K(64),       SHM,      BOARD, K(64) + 1,    DIRECT},
    {"ag.shm.pair",             AG,  2, BOARD, K(32),       SHM,      BOARD, K(32) + 1,    DIRECT},
    {"ag.shm.pair.off",         AG,  2, BOARD_OFF, K(16),   SHM,      BOARD_OFF, K(16) + 1, DIRECT},
    {"ag.shm",                  AG,  4, BOARD, K(256),      SHM,      BOARD, K(256) + 1,   DIRECT},
    {"rs.shm.pair",             RS,  2, BOARD, K(16),       SHM,      BOARD, K(16) + 1,    DIRECT},
    {"rs.shm",                  RS,  4, BOARD, K(128),      SHM,      BOARD, K(128) + 1,   DIRECT},
    {"rsv.shm.pair",            RSV, 2, BOARD, K(16),       SHM,      BOARD, K(16) + 1,    DIRECT},
    {"rsv.shm",                 RSV, 4, BOARD, K(64),       SHM,      BOARD, K(64) + 1,    DIRECT},
    {"reduce.shm.pair",         RE,  2, BOARD, K(4),        SHM,      BOARD, K(4) + 1,     DIRECT},
    {"reduce.shm",              RE,  4, BOARD, K(64),       SHM,      BOARD, K(64) + 1,    DIRECT},
    {"gather.shm.pair",         GA,  2, BOARD, K(1),        SHM,      BOARD, K(1) + 1,     DIRECT},
    {"gather.shm",              GA,  4, BOARD, K(32),       SHM,      BOARD, K(32) + 1,    DIRECT},
    {"scatter.shm.pair",        SC,  2, BOARD, K(1),        SHM,      BOARD, K(1) + 1,     DIRECT},
    {"scatter.shm",             SC,  4, BOARD, K(64),       SHM,      BOARD, K(64) + 1,    DIRECT},
    {"agv.shm.pair",            AGV, 2, BOARD, K(8),        SHM,      BOARD, K(8) + 1,     DIRECT},
    {"agv.shm.pair.off",        AGV, 2, BOARD_OFF, K(4),    SHM,      BOARD_OFF, K(4) + 1, DIRECT},
    {"agv.shm",                 AGV, 4, BOARD, K(128),      SHM,      BOARD, K(128) + 1,   DIRECT},
    {"bc.board.direct",         BC,  4, BOARD, K(64) + 1,   DIRECT,   READS, K(64) + 1,    NATIVE},
    {"gather.board.direct",     GA,  4, BOARD, M(1),        DIRECT,   READS, M(1),         NATIVE},
    {"scatter.board.direct",    SC,  4, BOARD, M(1),        DIRECT,   READS, M(1),         NATIVE},
    {"agv.board.direct",        AGV, 4, BOARD, M(1),        DIRECT,   READS, M(1),         NATIVE},
    {"rsv.board.direct",        RSV, 4, BOARD, M(1),        DIRECT,   READS, M(1),         NATIVE},
    {"ar.twoshot.pair",         AR,  2, READS, K(4),        TWOSHOT,  READS, K(4) - 1,     RD},
    {"ar.twoshot",              AR,  4, READS, K(16),       TWOSHOT,  READS, K(16) - 1,    NATIVE},
    {"ar.local.twoshot",        AR,  4, LOCAL, M(2),        TWOSHOT,  LOCAL, M(2) - 1,     NATIVE},
    {"ar.local.twoshot.many",   AR,  8, LOCAL, M(4),        TWOSHOT,  LOCAL, M(4) - 1,     NATIVE},
};

/* Near a timed row's bound (a factor 2 either side) the answer is timed against a rival;
 * -1: none. */
static const struct {
    int coll, p;
    unsigned has;
    size_t bytes;
    int algo, rival;
} timed[] = {
    {AR, 2, BOARD, K(4) - 1,  SHM,     -1},
    {AR, 2, BOARD, K(4),      SHM,     TWOSHOT},
    {AR, 2, BOARD, K(16),     TWOSHOT, SHM},
    {AR, 2, BOARD, K(16) + 1, TWOSHOT, -1},
    {RE, 4, BOARD, K(32),     SHM,     DIRECT},
    {RE, 4, BOARD, K(128),    DIRECT,  SHM},
    {GA, 2, BOARD, 511,       SHM,     -1},
    {GA, 2, BOARD, 512,       SHM,     DIRECT},
    {AR, 2, READS, K(8),      TWOSHOT, -1}, /* no board: nothing to time */
};
/* clang-format on */

static int choose(int coll, int p, unsigned has, size_t bytes, const hcomm__algo_set_t *over,
                  int *rival) {
    hcomm__sel_t s = {coll, bytes, p, has, over};
    hcomm__why_t why = HCOMM__WHY_DEFAULT;
    return hcomm__select(&s, -1, &why, rival);
}

/* The row that decides at bytes on (has, p), or NULL. */
static const hcomm__rule_t *row_at(int coll, int p, unsigned has, size_t bytes, bool upgrade) {
    hcomm__sel_t s = {coll, bytes, p, has, NULL};
    return hcomm__select_rule(&s, upgrade);
}

static void check_line(const line_t *l, bool upgrade) {
    int rival;
    const hcomm__rule_t *r = row_at(l->coll, l->p, l->has_in, l->in, upgrade);
    T_CHECK(r && strcmp(r->id, l->id) == 0, "%s: at %zu bytes on %d ranks the row is %s", l->id,
            l->in, l->p, r ? r->id : "none");
    int got = choose(l->coll, l->p, l->has_in, l->in, NULL, &rival);
    T_CHECK(got == l->algo, "%s: %zu bytes on %d ranks chose %s, expected %s", l->id, l->in, l->p,
            hcomm__algo_name(got), hcomm__algo_name(l->algo));
    if (l->other == NONE) { /* every size: both ends of the range */
        got = choose(l->coll, l->p, l->has_in, SIZE_MAX, NULL, &rival);
        T_CHECK(got == l->algo, "%s: SIZE_MAX bytes chose %s", l->id, hcomm__algo_name(got));
        return;
    }
    r = row_at(l->coll, l->p, l->has_out, l->out, upgrade);
    T_CHECK(!r || strcmp(r->id, l->id) != 0, "%s: still the row at %zu bytes", l->id, l->out);
    got = choose(l->coll, l->p, l->has_out, l->out, NULL, &rival);
    T_CHECK(got == l->other, "%s: %zu bytes on %d ranks chose %s, expected %s", l->id, l->out, l->p,
            hcomm__algo_name(got), hcomm__algo_name(l->other));
}

static bool listed(const char *id, const line_t *lines, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(lines[i].id, id) == 0)
            return true;
    return false;
}

/* Every row has its line here, and every line its row. */
static void check_complete(const hcomm__rule_t *rows, int nrows, const line_t *lines, size_t n) {
    for (int i = 0; i < nrows; i++)
        T_CHECK(listed(rows[i].id, lines, n), "row %s has no line in test_select.c", rows[i].id);
    for (size_t i = 0; i < n; i++) {
        bool found = false;
        for (int j = 0; j < nrows; j++)
            found = found || strcmp(rows[j].id, lines[i].id) == 0;
        T_CHECK(found, "line %s names no row of the table", lines[i].id);
    }
}

static void check_timed(void) {
    for (size_t i = 0; i < sizeof timed / sizeof timed[0]; i++) {
        int rival,
            got = choose(timed[i].coll, timed[i].p, timed[i].has, timed[i].bytes, NULL, &rival);
        T_CHECK(got == timed[i].algo && rival == timed[i].rival,
                "%s of %zu bytes on %d ranks: %s timed against %s, expected %s against %s",
                hcomm__coll_name(timed[i].coll), timed[i].bytes, timed[i].p, hcomm__algo_name(got),
                rival < 0 ? "none" : hcomm__algo_name(rival), hcomm__algo_name(timed[i].algo),
                timed[i].rival < 0 ? "none" : hcomm__algo_name(timed[i].rival));
    }
}

/* What runs where the default cannot (no peer reads, no board), and under an override that
 * excludes the default (no upgrade then). */
static void check_fallbacks(void) {
    int rival;
    T_EQ_INT(choose(RS, 2, MPI, K(8), NULL, &rival), RHD);    /* direct, no reads */
    T_EQ_INT(choose(BC, 2, MPI, K(8), NULL, &rival), NATIVE); /* direct, no reads */
    T_EQ_INT(choose(RE, 4, MPI, K(8), NULL, &rival), TREE);   /* direct, no reads */
    T_EQ_INT(choose(AG, 4, MPI, K(16), NULL, &rival), NATIVE);
    hcomm__algo_set_t set;
    T_OK(hcomm__algo_parse("test", "spec", "allreduce:shm", &set));
    T_EQ_INT(choose(AR, 4, MPI, 4096, &set, &rival), RD); /* shm without a board */
    T_EQ_INT(choose(AR, 4, MPI, 4097, &set, &rival), RING);
    T_EQ_INT(choose(AR, 4, LOCAL, 8, &set, &rival), NATIVE);
    T_OK(hcomm__algo_parse("test", "spec", "allreduce:^rd", &set));
    T_EQ_INT(choose(AR, 2, BOARD, 8, &set, &rival), RING); /* not the shm upgrade */
    T_OK(hcomm__algo_parse("test", "spec", "allreduce:^shm", &set));
    T_EQ_INT(choose(AR, 2, BOARD, 8, &set, &rival), RD);
    T_EQ_INT(rival, -1);
    T_EQ_INT(choose(AR, 2, BOARD, K(8), &set, &rival), TWOSHOT);
}

int main(void) {
    unsetenv("HCOMM_ALGO"); /* the defaults are what this tests */
    size_t nd = sizeof defaults / sizeof defaults[0], nu = sizeof upgrades / sizeof upgrades[0];
    check_complete(hcomm__defaults, hcomm__ndefaults, defaults, nd);
    check_complete(hcomm__upgrades, hcomm__nupgrades, upgrades, nu);
    for (size_t i = 0; i < nd; i++)
        check_line(&defaults[i], false);
    for (size_t i = 0; i < nu; i++)
        check_line(&upgrades[i], true);
    check_timed();
    check_fallbacks();
    return t_finish("test_select");
}
