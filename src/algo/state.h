/* What the algorithms layer keeps per communicator (algo_state_t, in the communicator's
 * HCOMM__LAYER_ALGO slot) and per call (hcomm__call_t), as the entry path's modules share them:
 * call.c (bookkeeping, flight recorder), sig.c (signatures and their wording), agree.c
 * (agreement), choose.c (the choice of an algorithm), run.c and coll.c (running). Types only. */
#ifndef HCOMM_C_ALGO_STATE_H_
#define HCOMM_C_ALGO_STATE_H_

#include "algo/select.h"
#include "algo/tune.h"

/* What a call is, as its signature names it (hcomm__sig_t.call). */
typedef enum {
    HCOMM__CALL_FAILED = 0, /* a rank whose own checks failed */
    HCOMM__CALL_ALL_REDUCE,
    HCOMM__CALL_REDUCE_SCATTER,
    HCOMM__CALL_ALL_GATHER,
    HCOMM__CALL_BROADCAST,
    HCOMM__CALL_ALL_TO_ALLV,
    HCOMM__CALL_BARRIER,
    HCOMM__CALL_SPLIT,
    HCOMM__CALL_REDUCE,
    HCOMM__CALL_GATHER,
    HCOMM__CALL_SCATTER,
    HCOMM__CALL_ALL_GATHERV,
    HCOMM__CALL_REDUCE_SCATTERV,
    HCOMM__CALL_WORKER_SPLIT, /* a first nonblocking call, which splits off its worker's comm */
    HCOMM__CALL_KINDS
} hcomm__call_kind_t;

enum { HCOMM__FLIGHT = 16, HCOMM__SEEN = 64, HCOMM__CHOICE_WAYS = 4 };

/* One call in the flight recorder. */
typedef struct hcomm__flight {
    const char *fn;
    uint32_t seq;
    hcomm__sig_t sig;
    const char *state; /* "running", "done", or a result name */
    bool timed_out;    /* its wait ended by HCOMM_TIMEOUT (no clock is read per call: latency) */
} hcomm__flight_t;

/* One choice of the one-node defaults and what it depended on that can change per call. */
typedef struct hcomm__kept_choice {
    bool valid, deterministic;
    bool forced; /* made under hcomm_comm_set_algo's override, which allowed `allowed` */
    uint32_t allowed;
    int algo;
    size_t bytes;
} hcomm__kept_choice_t;

typedef struct algo_state {
    uint32_t seq;
    int depth;
    const char *outer_fn;
    hcomm__flight_t flight[HCOMM__FLIGHT];
    unsigned nflight;
    uint64_t seen[HCOMM__SEEN]; /* HCOMM_CHECK=first: signatures already agreed on */
    int nseen;
    uint64_t extra;
    char extra_desc[200];
    hcomm__algo_set_t over; /* hcomm_comm_set_algo, when has_over */
    bool has_over;
    int last_algo;    /* 1 + the algorithm the last call chose; 0: none since last asked */
    bool last_probed; /* a call since last asked timed a candidate (tune.h) */
    /* the one-node choices made last (choose.c): HCOMM__CHOICE_WAYS per collective, the oldest
     * replaced first */
    hcomm__kept_choice_t kept[HCOMM__COLL_COUNT][HCOMM__CHOICE_WAYS];
    uint8_t kept_next[HCOMM__COLL_COUNT];
    uint64_t agreements; /* signature agreements run before native calls (hcomm__coll_counts) */
    bool nonblocking;    /* the comm issued nonblocking calls or is their worker's duplicate */
    hcomm__scratch_t scratch; /* the algorithms' scratch (hcomm__x_scratch) */
    hcomm__scratch_t widened; /* run.c's f32 copies of half-precision reductions */
    hcomm__tune_t tune;       /* choices timed near a switch (tune.h) */
} algo_state_t;

/* One collective call on its way through the entry path. */
typedef struct hcomm__call {
    hcomm_comm_t *c;
    algo_state_t *a;
    hcomm__sig_t sig;
    hcomm__flight_t *f;
    uint32_t seq;
    const size_t *vcounts; /* the v-calls' per-rank counts, for a mismatch message */
    hcomm__probe_t probe;  /* this call times a candidate (tune.h) */
} hcomm__call_t;

#endif /* HCOMM_C_ALGO_STATE_H_ */
