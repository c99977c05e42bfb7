/* Online choice between two algorithms near a measured switch (tune.c): on a host where the
 * same processes keep one of several placements for their whole life, the one-node algorithms
 * trade places with it, so any fixed switch loses in one of them (docs/tuning.md: tune.probe).
 * Near each switch a communicator therefore times both candidates on its first calls of a size
 * and keeps the faster, every rank alike. */
#ifndef HCOMM_C_ALGO_TUNE_H_
#define HCOMM_C_ALGO_TUNE_H_

#include "p2p/p2p.h"

/* Calls per run of one candidate (the first of each run is not timed: it finds the buffers
 * as the other candidate left them), and runs, alternating: the probe of one size takes
 * HCOMM__TUNE_CALLS calls. The first runs of each (HCOMM__TUNE_WARM_RUNS) are not timed at all:
 * a candidate's first calls of a size run well above its later ones. */
#define HCOMM__TUNE_RUN 3
#define HCOMM__TUNE_RUNS 6
#define HCOMM__TUNE_WARM_RUNS 2
#define HCOMM__TUNE_CALLS (HCOMM__TUNE_RUN * HCOMM__TUNE_RUNS)
#define HCOMM__TUNE_SAMPLES ((HCOMM__TUNE_RUN - 1) * (HCOMM__TUNE_RUNS - HCOMM__TUNE_WARM_RUNS) / 2)
#define HCOMM__TUNE_SLOTS 16

typedef struct hcomm__tune_entry {
    int coll;
    size_t bytes;
    bool deterministic;
    int cand[2];    /* [0]: the measured default */
    unsigned calls; /* probe calls that completed */
    int decided;    /* -1 while probing, else the index into cand */
    unsigned n[2];
    int64_t ns[2][HCOMM__TUNE_SAMPLES];
} hcomm__tune_entry_t;

/* A communicator's table; the first HCOMM__TUNE_SLOTS (collective, size) pairs get one. */
typedef struct hcomm__tune {
    hcomm__tune_entry_t e[HCOMM__TUNE_SLOTS];
    int n;
} hcomm__tune_t;

/* One call's part in a probe: the entry (NULL on the first call of a size: the entry is made
 * once that call succeeds, so that calls that failed, which may differ between ranks, leave
 * every rank's table alike), the candidate it runs, and when it began. */
typedef struct hcomm__probe {
    bool active;
    hcomm__tune_entry_t *e, key;
    int idx;
    bool timed;
    double t0;
} hcomm__probe_t;

/* The algorithm for a call of `bytes` of coll whose measured default is dflt and whose rival
 * is other: the decided one, or the candidate this call probes (then *probe is set and *why
 * says so). Every rank passes the same arguments in the same order of calls, so every rank
 * runs the same candidate. Local. */
int hcomm__tune_pick(hcomm__tune_t *t, int coll, size_t bytes, bool deterministic, int dflt,
                     int other, hcomm__probe_t *probe, const char **why);

/* After a probed call (probe->active) that succeeded on this rank (every rank of the group
 * then succeeded): records its time; after the last call of the probe the ranks meet on the
 * board (seq, with the call's signature sig) to compare the slowest rank's median of each, and
 * all keep the faster. A failed call is not counted, on any rank. */
hcomm_result_t hcomm__tune_record(hcomm__tune_t *t, hcomm_comm_t *c, uint32_t seq,
                                  const hcomm__posted_sig_t *sig, hcomm__probe_t *probe);

#endif /* HCOMM_C_ALGO_TUNE_H_ */
