/* Collective bookkeeping's verdicts for the point-to-point layer's own waits (notice.c; the
 * layer's interface, hcomm__notify_error and the rest, is in p2p.h). */
#ifndef HCOMM_C_P2P_NOTICE_H_
#define HCOMM_C_P2P_NOTICE_H_

#include "p2p/p2p.h"

/* A peer's failure notice for call seq as this rank's result (HCOMM_OK: none came). */
hcomm_result_t hcomm__p2p_peer_verdict(hcomm_comm_t *c, uint32_t seq);

/* This rank aborted c (ABORTED, its peers told), or the peer or channel is out of range. */
static inline hcomm_result_t check_peer(hcomm_comm_t *c, int peer, int channel) {
    if (hcomm__aborted(c))
        return hcomm__comm_aborted(c);
    if (peer < 0 || peer >= c->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, c->call_fn, "peer=%d outside 0..%d", peer,
                          c->size - 1);
    if (channel < 0 || channel >= HCOMM__CH_COUNT)
        return hcomm__err(HCOMM_ERR_INTERNAL, c->call_fn, "channel=%d is not a channel", channel);
    return HCOMM_OK;
}

#endif /* HCOMM_C_P2P_NOTICE_H_ */
