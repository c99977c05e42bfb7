/* The vocabulary of selection: hcomm's algorithms and collectives, what each collective can
 * run, and the sets that HCOMM_ALGO (read once per process, validated at hcomm_launch) or a
 * communicator's own setting (hcomm_comm_set_algo, which wins) allow; the defaults themselves
 * are rows of select_table.h. Syntax, as NCCL_ALGO: entries separated by ';', each
 * "[collective:][^]name[,name...]": the names allowed for that collective (every collective
 * when none is named), or with '^' the names excluded. Example: "allreduce:ring;allgather:^ring".
 * The chosen algorithm is part of the call's signature, so ranks that chose differently fail
 * with HCOMM_ERR_MISMATCH instead of waiting on each other. */
#ifndef HCOMM_C_ALGO_SELECT_H_
#define HCOMM_C_ALGO_SELECT_H_

#include "core/internal.h"

typedef enum {
    HCOMM__ALGO_NATIVE = 0,
    HCOMM__ALGO_RD,
    HCOMM__ALGO_RING,
    HCOMM__ALGO_RHD,
    HCOMM__ALGO_NAIVE,
    HCOMM__ALGO_TREE,
    HCOMM__ALGO_DIRECT,
    HCOMM__ALGO_HIER,
    HCOMM__ALGO_TWOSHOT,
    HCOMM__ALGO_BRUCK,             /* all_gather(v) for any group size (Bruck et al. 1997) */
    HCOMM__ALGO_CHAIN,             /* pipelined chain broadcast */
    HCOMM__ALGO_SCATTER_ALLGATHER, /* broadcast as scatter + all_gather (van de Geijn) */
    HCOMM__ALGO_PAIRWISE,          /* all_to_allv: step s to rank + s, from rank - s */
    HCOMM__ALGO_SHM,               /* one node: through the board (shm.c) */
    HCOMM__ALGO_COUNT
} hcomm__algo_t;

/* Or'ed into a reduction's algorithm (and so its signature) in deterministic mode
 * (hcomm_comm_set_deterministic, HCOMM_DETERMINISTIC): the algorithm then runs its
 * deterministic form (determ.c), which gives the bits of the serial reduction in rank order. */
#define HCOMM__ALGO_DET 0x100

typedef enum {
    HCOMM__COLL_ALLREDUCE = 0,
    HCOMM__COLL_ALLGATHER,
    HCOMM__COLL_REDUCESCATTER,
    HCOMM__COLL_BROADCAST,
    HCOMM__COLL_REDUCE,
    HCOMM__COLL_GATHER,
    HCOMM__COLL_SCATTER,
    HCOMM__COLL_ALLGATHERV,
    HCOMM__COLL_REDUCESCATTERV,
    HCOMM__COLL_ALLTOALLV, /* also spelled "alltoall" in HCOMM_ALGO */
    HCOMM__COLL_COUNT
} hcomm__coll_t;

/* Per collective, a bit per hcomm__algo_t that may run. */
typedef struct hcomm__algo_set {
    uint32_t allowed[HCOMM__COLL_COUNT];
} hcomm__algo_set_t;

/* The algorithm's name; with HCOMM__ALGO_DET, "<name>+deterministic". */
const char *hcomm__algo_name(int algo);
const char *hcomm__coll_name(int coll);
/* The collective HCOMM_ALGO calls name ("allreduce", "alltoall" or "alltoallv", ...); -1: none. */
int hcomm__coll_find(const char *name);
/* Parses spec (named var in messages) into *out; an unknown name is HCOMM_ERR_INVALID_ARG
 * listing the valid ones. */
hcomm_result_t hcomm__algo_parse(const char *fn, const char *var, const char *spec,
                                 hcomm__algo_set_t *out);
/* HCOMM_ALGO, parsed once (NULL when unset or invalid); validate reports a bad value. */
const hcomm__algo_set_t *hcomm__algo_env(void);
hcomm_result_t hcomm__algo_env_validate(const char *fn);
/* The algorithms that may run coll, a bit per hcomm__algo_t: valid for it, and allowed by
 * over (else HCOMM_ALGO). */
uint32_t hcomm__algo_mask(const hcomm__algo_set_t *over, int coll);
/* True when algo may run coll: valid for it, and allowed by over (else HCOMM_ALGO). */
bool hcomm__algo_allowed(const hcomm__algo_set_t *over, int coll, int algo);
/* The first algorithm of allowed (a bit per hcomm__algo_t) in the order that stands in for an
 * excluded default (ring first, native last); -1 for none. */
int hcomm__algo_preferred(uint32_t allowed);

#endif /* HCOMM_C_ALGO_SELECT_H_ */
