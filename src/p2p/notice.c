/* Collective bookkeeping on the point-to-point layer (p2p.h). A rank whose own checks failed in
 * a call tells every peer (one eager control message each); their waits on that call end with
 * the notice (progress.c keeps it as it arrives). A rank that finds hcomm_comm_abort() called
 * tells its peers once; that notice ends every wait of theirs on the comm from then on.
 * hcomm__coll_done drops what is left of finished calls: their notices and late messages. */
#include "p2p/notice.h"
#include "p2p/progress.h"

#include "core/env.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

hcomm_result_t hcomm__notify_error(hcomm_comm_t *c, uint32_t seq, hcomm_result_t why,
                                   const char *text) {
    p2p_t *p = p2p_of(c);
    size_t n = strlen(text);
    if (n > 255)
        n = 255;
    HCOMM__LOG(HCOMM__LOG_DEBUG, HCOMM__SUB_P2P, "rank %d tells its peers seq %u failed: %s",
               c->rank, (unsigned)seq, text);
    hcomm_result_t first = HCOMM_OK;
    for (int peer = 0; p && peer < c->size; peer++) {
        if (peer == c->rank)
            continue;
        hcomm__req_t *r;
        HCOMM__TRY(hcomm__p2p_req_new(c, &r));
        /* The text lives in the request: the transport may read it after this returns. */
        r->env = (hcomm__env_t){.kind = HCOMM__ENV_ERROR,
                                .channel = HCOMM__CH_CTRL,
                                .tag = (int32_t)seq,
                                .result = (int32_t)why,
                                .bytes = n};
        memcpy(r->msg, text, n);
        r->peer = peer;
        r->channel = HCOMM__CH_CTRL;
        r->state = REQ_POSTED;
        /* Eager whatever the limit: a notice must never wait for its receiver. */
        hcomm_result_t res = c->tr->send_frame(c, peer, &r->env, r->msg, n, false, &r->tr);
        if (res != HCOMM_OK) { /* the other peers are still told */
            req_release(r);
            first = first == HCOMM_OK ? res : first;
            continue;
        }
        r->next = p->detached;
        p->detached = r;
    }
    return first;
}

bool hcomm__peer_error(hcomm_comm_t *c, uint32_t seq, int *src, hcomm_result_t *why, char *text,
                       size_t cap) {
    p2p_t *p = p2p_of(c);
    if (p && p->aborted_by) {
        *src = p->aborted_by - 1;
        *why = HCOMM_ERR_ABORTED;
        snprintf(text, cap, "rank %d called hcomm_comm_abort() on this communicator", *src);
        return true;
    }
    for (int i = 0; p && i < p->nerrs; i++)
        if (p->errs[i].seq == seq) {
            *src = p->errs[i].src;
            *why = p->errs[i].why;
            snprintf(text, cap, "%s", p->errs[i].text);
            return true;
        }
    return false;
}

void hcomm__abort_tell(hcomm_comm_t *c) {
    p2p_t *p = p2p_of(c);
    if (!p || p->abort_told)
        return;
    /* Any seq: the notice holds for every call the peers are in or make later. A failed send
     * (a lost peer) must not replace the caller's error message. */
    char keep[512];
    snprintf(keep, sizeof keep, "%s", hcomm_last_error());
    if (atomic_load(&c->aborted) == HCOMM__REVOKE_CALLED)
        hcomm__notify_error(c, c->call_seq, HCOMM_ERR_REVOKED, "hcomm_comm_revoke()");
    else
        hcomm__notify_error(c, c->call_seq, HCOMM_ERR_ABORTED, "hcomm_comm_abort()");
    hcomm__err_text(HCOMM_OK, keep);
    if (c->tr->abort_group)
        c->tr->abort_group(c);
    p->abort_told = true;
}

hcomm_result_t hcomm__comm_aborted(hcomm_comm_t *c) {
    hcomm__abort_tell(c);
    return hcomm__own_abort_error(c);
}

hcomm_result_t hcomm__p2p_peer_verdict(hcomm_comm_t *c, uint32_t seq) {
    int src;
    hcomm_result_t why;
    char text[256];
    if (!hcomm__peer_error(c, seq, &src, &why, text, sizeof text))
        return HCOMM_OK;
    bool passed_on = why == HCOMM_ERR_MISMATCH || why == HCOMM_ERR_PEER_LOST;
    return hcomm__err(passed_on ? why : HCOMM_ERR_PEER, c->call_fn, "%s", text);
}

hcomm_result_t hcomm__coll_wait_verdict(hcomm_comm_t *c, uint32_t seq, const char *what,
                                        double waited) {
    if (hcomm__aborted(c))
        return hcomm__comm_aborted(c); /* before a peer's notice: this rank's own doing */
    HCOMM__TRY(hcomm__progress(c));    /* notices arrive as frames */
    HCOMM__TRY(hcomm__p2p_peer_verdict(c, seq));
    HCOMM__TRY(hcomm__lost_verdict(c, -1));
    if (c->tr->world_aborted(c))
        return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                          "another rank failed while this rank waited for %s", what);
    if (waited > c->timeout_s)
        return hcomm__err(HCOMM_ERR_TIMEOUT, c->call_fn,
                          "waited %g s for %s (seq %u, HCOMM_TIMEOUT%s)", c->timeout_s, what,
                          (unsigned)c->call_seq, hcomm__check_hint(c->tr->posted_only != NULL));
    return HCOMM_OK;
}

/* Drops what is left of finished calls: their unexpected messages and notices. */
void hcomm__coll_done(hcomm_comm_t *c, uint32_t seq) {
    p2p_t *p = p2p_of(c);
    if (!p)
        return;
    p->coll_started = true;
    p->coll_done = seq;
    int k = 0;
    for (int i = 0; i < p->nerrs; i++)
        if (seq_before(seq, p->errs[i].seq))
            p->errs[k++] = p->errs[i];
    p->nerrs = k;
    uxm_t *prev = NULL;
    for (uxm_t *u = p->ux_head; u;) {
        uxm_t *next = u->next;
        if (!stale(p, &u->env) || (u->pulled && !u->arrived)) {
            prev = u;
            u = next;
            continue;
        }
        ux_unlink(p, prev, u);
        if (u->rndv && !u->pulled)
            hcomm__p2p_drain_rndv(c, u->src, &u->env, &u->rv);
        p->ux_bytes -= u->charged;
        free(u->data);
        free(u);
        u = next;
    }
    if (p->full && p->ux_bytes < c->unexpected_cap)
        p->full = false;
}
