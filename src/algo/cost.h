/* Cost-model algorithm selection (cost.c): per call, the allowed algorithm with the smallest
 * alpha-beta-gamma estimate for (collective, bytes, group size, topology). */
#ifndef HCOMM_C_ALGO_COST_H_
#define HCOMM_C_ALGO_COST_H_

#include "algo/select.h"

/* The algorithm for coll moving bytes on c among allowed (NULL: every valid one), with its
 * estimate in *est_s; -1 when no model applies (a communicator on one node keeps the measured
 * defaults of select_table.c unless "mesh" or "ring" was declared) or nothing allowed has a finite
 * estimate. Every collective of select.h has a model for each algorithm valid for it (for
 * all_to_allv, bytes is the largest block of a pair), except where the algorithm cannot run:
 * twoshot and direct beyond one node, and the shared-memory native collectives on a simulated
 * multi-node machine (their loads bypass the simulated links). shm: the transport has
 * shared-memory native collectives. Cheap after the first call per (collective, power-of-two
 * size band): the choice is
 * cached with the communicator's topology. The same inputs give the same choice on every rank. */
int hcomm__cost_choose(hcomm_comm_t *c, const hcomm__algo_set_t *allowed, int coll, size_t bytes,
                       bool shm, double *est_s);
/* The estimate in seconds of algo for coll moving bytes over c's topology (INFINITY when algo
 * has no model or cannot run there). */
double hcomm__cost_estimate(hcomm_comm_t *c, int coll, int algo, size_t bytes, bool shm);

#endif /* HCOMM_C_ALGO_COST_H_ */
