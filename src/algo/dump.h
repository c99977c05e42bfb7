/* The flight recorder as JSON for hcomm-doctor (dump.c): after a public call on a communicator
 * fails in a way that leaves peers out of step (a timeout, an abort, a peer's failure, a
 * mismatch), each rank writes HCOMM_DUMP_DIR/hcomm-rank<W>.json with every communicator it has
 * dumped so far in this process. */
#ifndef HCOMM_C_ALGO_DUMP_H_
#define HCOMM_C_ALGO_DUMP_H_

#include "algo/state.h"

/* Whether a call that ended with res is dumped. */
static inline bool hcomm__dump_wanted(hcomm_result_t res) {
    return res == HCOMM_ERR_TIMEOUT || res == HCOMM_ERR_ABORTED || res == HCOMM_ERR_PEER ||
           res == HCOMM_ERR_MISMATCH || res == HCOMM_ERR_PEER_LOST || res == HCOMM_ERR_REVOKED;
}

/* Keeps a copy of c's flight recorder (a and res: its state and the call's result) and rewrites
 * this rank's file, when HCOMM_DUMP_DIR is set; failures to write are logged, never returned. */
void hcomm__dump_comm(hcomm_comm_t *c, const algo_state_t *a, hcomm_result_t res);

#endif /* HCOMM_C_ALGO_DUMP_H_ */
