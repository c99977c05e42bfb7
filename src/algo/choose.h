/* The choice of an algorithm for one call (choose.c): the cost model where the topology is
 * known (several nodes, or a declared mesh or ring), else the selection tables
 * (select_table.h), narrowed by HCOMM_ALGO or hcomm_comm_set_algo; then what runs where the
 * choice cannot (an algorithm this communicator or transport lacks), the timed switches near a
 * row's bound (tune.h), and deterministic mode. Every rank decides alike from what every rank
 * knows alike. One-node communicators keep their last choices per collective (a loop of calls
 * of one size pays the selection once). */
#ifndef HCOMM_C_ALGO_CHOOSE_H_
#define HCOMM_C_ALGO_CHOOSE_H_

#include "algo/state.h"
#include "algo/xfer.h"

/* The algorithm call k runs for coll (hcomm__coll_t) sized by bytes, recorded in its signature
 * (hcomm__call_chosen); with HCOMM__ALGO_DET where deterministic mode changes how it runs. */
int hcomm__choose(hcomm__call_t *k, int coll, size_t bytes);

/* Every rank of c on one node with no declared mesh or ring (the topology layer's answer). */
bool hcomm__on_one_node(hcomm_comm_t *c);
/* The communicator's board can run shm (hcomm__on_board, and the group fits it). */
bool hcomm__shm_runs(hcomm_comm_t *c);

/* Narrows this rank's algorithm choice on c (HCOMM_ALGO syntax; NULL or "" undoes it). */
hcomm_result_t hcomm__coll_set_algo(hcomm_comm_t *c, const char *spec);

/* True when algo, running coll (as HCOMM_ALGO names it) on c, moves data outside the links of a
 * simulated multi-node machine (HCOMM_TOPO nodes= on the local backend): the algorithms the
 * cost model gives no estimate there (cost.c: the shared-memory native collectives, twoshot,
 * direct reads). Auto never picks them, and their times say nothing of the simulated machine
 * (hcomm-bench leaves them out of regret). */
bool hcomm__coll_bypasses_links(hcomm_comm_t *c, const char *coll, int algo);

#endif /* HCOMM_C_ALGO_CHOOSE_H_ */
