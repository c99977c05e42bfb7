/* Completion on the point-to-point layer (p2p.h): test, wait and wait_all, probe, and why a wait
 * must end (a peer's failure notice, an abort, a full unexpected budget, HCOMM_TIMEOUT); a request
 * given up is cancelled, a rendezvous send withdrawn from its receiver. */
#include "p2p/progress.h"
#include "p2p/notice.h"

#include "core/env.h"

#include <stdio.h>
#include <stdlib.h>

hcomm_result_t hcomm__test(hcomm__req_t *r, bool *done) {
    HCOMM__TRY(hcomm__progress(r->c));
    *done = advance(r);
    return HCOMM_OK;
}

static void unpost(p2p_t *p, hcomm__req_t *r) {
    hcomm__req_t *prev = NULL;
    for (hcomm__req_t *q = p->posted_head; q; prev = q, q = q->next)
        if (q == r) {
            posted_unlink(p, prev, q);
            return;
        }
}

/* Tells the receiver to drop rendezvous message r if it has not pulled it yet (eager, so the
 * notice never waits; it comes after the message itself, frames of one source stay in order). */
static void withdraw(hcomm__req_t *r) {
    hcomm__req_t *n;
    if (hcomm__p2p_req_new(r->c, &n) != HCOMM_OK)
        return;
    n->env = r->env;
    n->env.kind = HCOMM__ENV_WITHDRAW;
    n->env.bytes = 0;
    n->peer = r->peer;
    n->channel = r->channel;
    n->state = REQ_POSTED;
    if (r->c->tr->send_frame(r->c, r->peer, &n->env, NULL, 0, false, &n->tr) != HCOMM_OK) {
        req_release(n);
        return;
    }
    p2p_t *p = p2p_of(r->c);
    n->next = p->detached;
    p->detached = n;
}

/* Gives up r after a timeout or abort; the transport never touches its buffer afterwards.
 * The transport may still write into a request it could not cancel (a rendezvous send whose
 * receiver copies later sets its done flag), so such a request is never reused. */
static void cancel(hcomm__req_t *r) {
    hcomm_comm_t *c = r->c;
    if (r->state == REQ_POSTED && r->is_recv) {
        unpost(p2p_of(c), r);
    } else if (r->state == REQ_POSTED && !r->is_recv && r->rndv) {
        withdraw(r);
        c->tr->cancel(c, &r->tr, true);
        r->abandoned = true; /* the receiver may still look at its flag */
    } else if ((r->state == REQ_POSTED || r->state == REQ_PULLING) &&
               !c->tr->cancel(c, &r->tr, !r->is_recv)) {
        r->abandoned = true;
    } else if (r->state == REQ_RESCUED) {
        r->rescued = NULL; /* its entry stays reachable from nowhere: leaked, never written */
    }
}

static const char *what_awaited(const hcomm__req_t *r, char *buf, size_t cap) {
    if (r->is_recv)
        snprintf(buf, cap, "a message from rank %d (%s channel, tag %d)", r->peer,
                 hcomm__p2p_channel_names[r->channel], r->tag);
    else
        snprintf(buf, cap, "rank %d to receive a %llu-byte message (%s channel, tag %d)", r->peer,
                 (unsigned long long)r->env.bytes, hcomm__p2p_channel_names[r->channel], r->tag);
    return buf;
}

/* Why a wait on r must end now (HCOMM_OK: keep waiting). */
static hcomm_result_t wait_verdict(hcomm__req_t *r, double waited) {
    hcomm_comm_t *c = r->c;
    p2p_t *p = p2p_of(c);
    char what[160];
    c->wait_peer = r->peer; /* for the flight recorder's dump */
    if (hcomm__aborted(c))
        return hcomm__comm_aborted(c);
    /* A send of a failed call still completes: its receiver drops the message as stale on
     * arrival (pulling a rendezvous payload into scratch), so only receives end early here. */
    if ((r->channel == HCOMM__CH_COLL && r->is_recv) || p->aborted_by) /* the comm is dead */
        HCOMM__TRY(hcomm__p2p_peer_verdict(c, (uint32_t)r->tag));
    /* A collective's receive fails when any member is lost; a point-to-point wait only on its
     * own peer (the rest of the group may go on). */
    HCOMM__TRY(hcomm__lost_verdict(c, r->channel == HCOMM__CH_COLL ? -1 : r->peer));
    if (c->tr->world_aborted(c))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "another rank failed while this rank waited for %s",
                          what_awaited(r, what, sizeof what));
    if (p->full && r->is_recv)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn,
                          "cannot keep a %zu-byte message from rank %d (%s channel, tag %d) that "
                          "no receive has matched: %zu bytes of unexpected messages are held, "
                          "HCOMM_UNEXPECTED_BYTES=%zu",
                          p->full_bytes, p->full_src, hcomm__p2p_channel_names[p->full_channel],
                          p->full_tag, p->ux_bytes, c->unexpected_cap);
    /* Both ranks wait in a send and the peer's message does not fit the budget: neither can
     * finish. A second's grace lets an unrelated peer's message be received first. */
    if (p->rescue_blocked && p->rescue > 0 && waited > 1.0)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn,
                          "cannot take a %zu-byte message from rank %d (%s channel, tag %d) into "
                          "the unexpected-message buffer while this rank waits for %s: %zu bytes "
                          "held, HCOMM_UNEXPECTED_BYTES=%zu",
                          p->rb_bytes, p->rb_src, hcomm__p2p_channel_names[p->rb_channel],
                          p->rb_tag, what_awaited(r, what, sizeof what), p->ux_bytes,
                          c->unexpected_cap);
    if (waited > c->timeout_s)
        return hcomm__err(HCOMM_ERR_TIMEOUT, c->call_fn,
                          "waited %g s for %s (seq %u, HCOMM_TIMEOUT%s)", c->timeout_s,
                          what_awaited(r, what, sizeof what), (unsigned)c->call_seq,
                          hcomm__check_hint(c->tr->posted_only != NULL));
    return HCOMM_OK;
}

static hcomm_result_t report(hcomm__req_t *r) {
    if (r->res == HCOMM_OK)
        return HCOMM_OK;
    return hcomm__err(r->res, r->c->call_fn, "%s", r->msg[0] ? r->msg : hcomm_strerror(r->res));
}

/* How long a receive whose payload is already being pulled may take to finish once its call
 * failed elsewhere: its sender is alive, and a pull cancelled under way (MPI_Cancel of the
 * payload's receive) would leave that sender waiting out HCOMM_TIMEOUT. */
#define PULL_DRAIN_S 0.5

/* Whether r completed, given a little time (PULL_DRAIN_S, at most HCOMM_TIMEOUT) where its
 * payload is being pulled. */
static bool finish_pull(hcomm__req_t *r) {
    hcomm_comm_t *c = r->c;
    double limit = c->timeout_s < PULL_DRAIN_S ? c->timeout_s : PULL_DRAIN_S;
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    do {
        if (hcomm__progress(c) == HCOMM_OK && advance(r))
            return true;
    } while (r->is_recv && r->state == REQ_PULLING && hcomm__backoff(&b) <= limit);
    return false;
}

/* Blocks until r is done or must be given up. A blocking send pulls unexpected rendezvous
 * messages into the unexpected budget at once (so two ranks that send to each other, then
 * receive, complete); any other wait does so once it has lasted 2 ms, so code that assumes
 * buffered sends (a receive of tag 6 while the peer blocks sending tag 5) completes within the
 * budget, while traffic received in order keeps its single copy. */
static hcomm_result_t complete(hcomm__req_t *r) {
    hcomm_comm_t *c = r->c;
    p2p_t *p = p2p_of(c);
    bool blocking_send = !r->is_recv;
    if (blocking_send)
        p->rescue++;
    hcomm_result_t res = HCOMM_OK;
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    bool rescuing = blocking_send;
    for (;;) {
        res = hcomm__progress(c);
        if (res != HCOMM_OK || advance(r))
            break;
        double waited = hcomm__backoff(&b);
        if (!rescuing && b.napping) { /* the wait has lasted: rescue (above) */
            rescuing = true;
            p->rescue++;
        }
        if ((b.iter & 63) == 0 && (res = wait_verdict(r, waited)) != HCOMM_OK) {
            char keep[512];
            snprintf(keep, sizeof keep, "%s", hcomm_last_error());
            if (finish_pull(r)) { /* it completed meanwhile */
                res = HCOMM_OK;
                break;
            }
            cancel(r); /* may fail on its own (a send to a lost peer): keep the reason */
            hcomm__err_text(res, keep);
            break;
        }
    }
    if (rescuing)
        p->rescue--;
    return res;
}

hcomm_result_t hcomm__wait(hcomm__req_t *r, hcomm__env_t *env, void **data) {
    hcomm_result_t res = complete(r);
    if (res == HCOMM_OK)
        res = report(r);
    if (env)
        *env = r->env;
    if (data)
        *data = res == HCOMM_OK && r->mode == HCOMM__RECV_ALLOC ? r->buf : NULL;
    if (res != HCOMM_OK && r->mode == HCOMM__RECV_ALLOC && r->state == REQ_DONE)
        hcomm_mem_free(r->buf);
    if (!r->abandoned)
        req_release(r);
    return res;
}

hcomm_result_t hcomm__wait_all(hcomm__req_t **reqs, int n) {
    hcomm_result_t first = HCOMM_OK;
    char msg[512] = "";
    for (int i = 0; i < n; i++) {
        if (!reqs[i])
            continue;
        hcomm_result_t r = hcomm__wait(reqs[i], NULL, NULL);
        reqs[i] = NULL;
        if (r != HCOMM_OK && first == HCOMM_OK) {
            first = r;
            snprintf(msg, sizeof msg, "%s", hcomm_last_error());
        }
    }
    if (first != HCOMM_OK) /* later failures must not overwrite the first one's message */
        hcomm__err_text(first, msg);
    return first;
}

hcomm_result_t hcomm__probe(hcomm_comm_t *c, int channel, int tag, int peer, hcomm__env_t *env) {
    HCOMM__TRY(check_peer(c, peer, channel));
    hcomm__req_t probe = {.c = c, .is_recv = true, .peer = peer, .channel = channel, .tag = tag};
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    p2p_t *p = p2p_of(c);
    hcomm_result_t res = HCOMM_OK;
    bool rescuing = false, found = false;
    while (res == HCOMM_OK && !found) {
        res = hcomm__progress(c);
        for (uxm_t *u = p->ux_head; res == HCOMM_OK && u && !found; u = u->next)
            if (key_matches(peer, channel, tag, u->src, &u->env)) {
                *env = u->env;
                found = true;
            }
        if (found || res != HCOMM_OK)
            break;
        double waited = hcomm__backoff(&b);
        if (!rescuing && b.napping) { /* as in complete() */
            rescuing = true;
            p->rescue++;
        }
        if ((b.iter & 63) == 0)
            res = wait_verdict(&probe, waited);
    }
    if (rescuing)
        p->rescue--;
    return res;
}
