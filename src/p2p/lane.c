/* The lane (p2p.h, transport.lane_post): the small messages of latency-bound collectives, one
 * backend message each, without frames or matching; waits end as the collective's do
 * (hcomm__coll_wait_verdict). */
#include "p2p/p2p.h"

#include <stdio.h>
#include <string.h>

typedef struct lane_hdr {
    uint32_t seq, bytes;
    hcomm__sig_t sig;
} lane_hdr_t;

_Static_assert(sizeof(lane_hdr_t) <= HCOMM__LANE_HDR, "the lane header fits its room");

size_t hcomm__lane_payload(const hcomm_comm_t *c) {
    return c->tr->lane_post ? HCOMM__LANE_MAX - HCOMM__LANE_HDR : 0;
}

typedef struct lane_step {
    hcomm_comm_t *c;
    uint32_t seq;
    int to, from;
    bool sent, received;
    void *rbuf;
    size_t rcap;
    hcomm__treq_t tx, rx;
} lane_step_t;

static hcomm_result_t lane_post_recv(lane_step_t *s) {
    return s->c->tr->lane_post(s->c, s->from, s->seq, s->rbuf, HCOMM__LANE_HDR + s->rcap, false,
                               &s->rx);
}

/* Advances s: true once both halves are done (or *res failed). A message of an older call
 * with the same lane key (its receiver had failed) is dropped and the receive posted again. */
static bool lane_advance(lane_step_t *s, hcomm_result_t *res) {
    size_t got = 0;
    if (!s->sent && s->c->tr->lane_test(s->c, &s->tx, res, &got))
        s->sent = true;
    if (*res == HCOMM_OK && !s->received && s->c->tr->lane_test(s->c, &s->rx, res, &got)) {
        lane_hdr_t h;
        memcpy(&h, s->rbuf, sizeof h);
        s->received = *res != HCOMM_OK || (got >= sizeof h && h.seq == s->seq);
        if (!s->received)
            *res = lane_post_recv(s);
    }
    return *res != HCOMM_OK || (s->sent && s->received);
}

/* Why a lane wait must end now (HCOMM_OK: keep waiting). */
static hcomm_result_t lane_verdict(lane_step_t *s, double waited) {
    char what[96];
    s->c->wait_peer = s->received ? s->to : s->from; /* for the flight recorder's dump */
    snprintf(what, sizeof what, "a message from rank %d (collective channel, tag %u)",
             s->c->wait_peer, (unsigned)s->seq);
    return hcomm__coll_wait_verdict(s->c, s->seq, what, waited);
}

/* How long a lane send may take to complete after a peer's notice ended its step. */
#define LANE_DRAIN_S 0.5

/* Ends s after `why`. A send still in flight is one eager message: after a peer's notice
 * (the peer is alive and progresses in its next call) it completes within milliseconds, so
 * it is waited for (at most LANE_DRAIN_S, bounded by HCOMM_TIMEOUT: a backend that sends it
 * by rendezvous never completes it) instead of cancelled at once: a send MPI cannot cancel
 * leaves the communicator unusable, and the next call would fail on every rank. */
static void lane_give_up(lane_step_t *s, hcomm_result_t why) {
    if (!s->received)
        s->c->tr->cancel(s->c, &s->rx, false);
    if (!s->sent && (why == HCOMM_ERR_PEER || why == HCOMM_ERR_MISMATCH)) {
        hcomm__backoff_t b;
        hcomm__backoff_init(&b);
        hcomm_result_t res = HCOMM_OK;
        size_t got;
        double limit = s->c->timeout_s < LANE_DRAIN_S ? s->c->timeout_s : LANE_DRAIN_S;
        while (!s->sent && hcomm__backoff(&b) <= limit)
            s->sent = s->c->tr->lane_test(s->c, &s->tx, &res, &got) && res == HCOMM_OK;
    }
    if (!s->sent)
        s->c->tr->cancel(s->c, &s->tx, true);
}

hcomm_result_t hcomm__lane_step(hcomm_comm_t *c, uint32_t seq, const hcomm__sig_t *sig, int to,
                                void *sbuf, size_t sbytes, int from, void *rbuf, size_t rcap,
                                hcomm__sig_t *got_sig, size_t *got) {
    lane_step_t s; /* field by field: zeroing the two transport requests costs a tenth of it */
    s.c = c;
    s.seq = seq;
    s.to = to;
    s.from = from;
    s.sent = to < 0;
    s.received = true; /* no receive posted yet, none to cancel */
    s.rbuf = rbuf;
    s.rcap = rcap;
    /* The send goes first: the peer waits for it. The receive posted right after it usually
     * precedes the peer's message; when it does not, MPI holds the message as unexpected and
     * matches it in order (messages of one peer and key stay in order either way). */
    if (to >= 0) {
        lane_hdr_t h = {seq, (uint32_t)sbytes, *sig};
        memcpy(sbuf, &h, sizeof h);
        hcomm_result_t res =
            c->tr->lane_post(c, to, seq, sbuf, HCOMM__LANE_HDR + sbytes, true, &s.tx);
        if (res != HCOMM_OK) {
            lane_give_up(&s, res);
            return res;
        }
    }
    if (from >= 0) {
        hcomm_result_t res = lane_post_recv(&s);
        if (res != HCOMM_OK) {
            lane_give_up(&s, res);
            return res;
        }
        s.received = false;
    }
    hcomm_result_t res = HCOMM_OK;
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    while (!lane_advance(&s, &res)) {
        double waited = hcomm__backoff(&b);
        if ((b.iter & 63) == 0 && (res = lane_verdict(&s, waited)) != HCOMM_OK) {
            lane_give_up(&s, res);
            return res;
        }
    }
    if (res != HCOMM_OK) {
        lane_give_up(&s, res);
        return res;
    }
    if (from >= 0) {
        lane_hdr_t h;
        memcpy(&h, rbuf, sizeof h);
        *got_sig = h.sig;
        *got = h.bytes;
    }
    return HCOMM_OK;
}
