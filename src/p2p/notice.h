/* Collective bookkeeping's verdicts for the point-to-point layer's own waits (notice.c; the
 * layer's interface, hcomm__notify_error and the rest, is in p2p.h). */
#ifndef HCOMM_C_P2P_NOTICE_H_
#define HCOMM_C_P2P_NOTICE_H_

#include "p2p/p2p.h"

/* A peer's failure notice for call seq as this rank's result (HCOMM_OK: none came). */
hcomm_result_t hcomm__p2p_peer_verdict(hcomm_comm_t *c, uint32_t seq);

#endif /* HCOMM_C_P2P_NOTICE_H_ */
