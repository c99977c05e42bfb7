/* Call bookkeeping and the flight recorder: each communicator's last calls, printed when one
 * times out (call.h). */
#include "algo/call.h"

#include "algo/dump.h"
#include "algo/sig.h"
#include "algo/xfer.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>

static void state_free(void *p) {
    algo_state_t *a = p;
    free(a->scratch.p);
    free(a->widened.p);
    free(a);
}

algo_state_t *hcomm__algo_state(hcomm_comm_t *c) {
    return hcomm__layer_state(&c->layer[HCOMM__LAYER_ALGO], &c->layer_free[HCOMM__LAYER_ALGO],
                              sizeof(algo_state_t), hcomm__calloc_lines, state_free);
}

/* --- the flight recorder --- */

static void flight_line(FILE *out, hcomm_comm_t *c, const hcomm__flight_t *f) {
    fprintf(out,
            "hcomm flight recorder: world rank %d, comm rank %d/%d: seq %u %s (%s %s=%llu algo=%s) "
            "%s",
            c->world_ranks[c->rank], c->rank, c->size, (unsigned)f->seq, f->fn,
            hcomm__call_name(f->sig.call), hcomm__call_count_name(f->sig.call),
            (unsigned long long)f->sig.count, hcomm__algo_name(f->sig.algo), f->state);
    if (f->timed_out)
        fprintf(out, " after %g s (HCOMM_TIMEOUT)", c->timeout_s);
    fprintf(out, "\n");
}

static void dump_flight(hcomm_comm_t *c) {
    algo_state_t *a = hcomm__algo_state(c);
    const char *path = getenv("HCOMM_TRACE_FILE");
    FILE *trace = path && path[0] ? fopen(path, "a") : NULL;
    unsigned first = a->nflight > HCOMM__FLIGHT ? a->nflight - HCOMM__FLIGHT : 0;
    for (unsigned i = first; i < a->nflight; i++) {
        flight_line(stderr, c, &a->flight[i % HCOMM__FLIGHT]);
        if (trace)
            flight_line(trace, c, &a->flight[i % HCOMM__FLIGHT]);
    }
    if (trace)
        fclose(trace);
}

/* --- naming the public call --- */

void hcomm__enter(hcomm_comm_t *c, const char *fn) {
    algo_state_t *a = hcomm__algo_state(c);
    if (a && a->depth++ == 0) {
        a->outer_fn = c->call_fn;
        c->call_fn = fn;
        c->wait_peer = -1;
    }
}

hcomm_result_t hcomm__leave(hcomm_comm_t *c, hcomm_result_t res) {
    algo_state_t *a = hcomm__algo_state(c);
    if (!a || --a->depth > 0)
        return res;
    if (res == HCOMM_ERR_TIMEOUT)
        dump_flight(c);
    if (hcomm__dump_wanted(res))
        hcomm__dump_comm(c, a, res);
    c->call_fn = a->outer_fn ? a->outer_fn : "hcomm";
    return res;
}

/* --- one call --- */

hcomm_result_t hcomm__call_begin(hcomm_comm_t *c, hcomm__call_t *k, hcomm__call_kind_t kind,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root, uint64_t count) {
    k->c = c;
    if (atomic_load_explicit(&c->aborted, memory_order_relaxed))
        return hcomm__comm_aborted(c); /* peers may wait in this call already */
    k->a = hcomm__algo_state(c);
    if (!k->a)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for collective state");
    k->sig = (hcomm__sig_t){.call = kind,
                            .dtype = dt,
                            .op = op,
                            .root = root,
                            .count = count,
                            .extra = kind == HCOMM__CALL_FAILED ? 0 : k->a->extra};
    k->seq = ++k->a->seq;
    c->call_seq = k->seq;
    c->wait_peer = -1;
    k->f = &k->a->flight[k->a->nflight++ % HCOMM__FLIGHT];
    *k->f = (hcomm__flight_t){.fn = c->call_fn, .seq = k->seq, .sig = k->sig, .state = "running"};
    return HCOMM_OK;
}

void hcomm__call_chosen(hcomm__call_t *k, int sig_algo, int algo) {
    k->sig.algo = sig_algo;
    k->f->sig.algo = sig_algo;
    k->a->last_algo = algo + 1;
}

/* Blocking and nonblocking calls run on different communicators (the worker's duplicate):
 * ranks that mix the forms wait for each other in two places until the timeout. */
static hcomm_result_t timeout_hint(hcomm_result_t res) {
    char text[768];
    snprintf(text, sizeof text,
             "%s (a blocking call matches only a blocking call on the other ranks, and "
             "hcomm_iall_reduce etc. only the same nonblocking call)",
             hcomm_last_error());
    return hcomm__err_text(res, text);
}

/* Results a lost member causes on its peers: its own loss, and its echoes (a peer's notice,
 * a revoke, an abandoned operation, a timeout). */
static bool follows_loss(hcomm_result_t res) {
    return res == HCOMM_ERR_PEER_LOST || res == HCOMM_ERR_PEER || res == HCOMM_ERR_REVOKED ||
           res == HCOMM_ERR_ABORTED || res == HCOMM_ERR_TIMEOUT;
}

hcomm_result_t hcomm__call_end(hcomm__call_t *k, hcomm_result_t res) {
    k->a->last_probed |= k->probe.active;
    if (res == HCOMM_ERR_NOMEM) { /* peers may wait on this rank's messages: tell them */
        hcomm__xfer_t x = {.c = k->c, .tag = (int)k->seq};
        res = hcomm__x_tell_peers(&x, res);
    }
    if (k->probe.active && res == HCOMM_OK) {
        hcomm__posted_sig_t ps = hcomm__sig_post(&k->sig);
        res = hcomm__tune_record(&k->a->tune, k->c, k->seq, &ps, &k->probe);
    }
    if (res != HCOMM_OK && atomic_load_explicit(&k->c->aborted, memory_order_relaxed))
        hcomm__abort_tell(k->c); /* where a wait below p2p found the abort */
    if (follows_loss(res) && hcomm__lost_member_now(k->c) >= 0)
        res = hcomm__lost_verdict(k->c, -1); /* the cause, whichever wait saw its echo first */
    hcomm__coll_done(k->c, k->seq);
    k->f->state = res == HCOMM_OK ? "done" : hcomm_result_name(res);
    k->f->timed_out = res == HCOMM_ERR_TIMEOUT;
    if (res == HCOMM_ERR_TIMEOUT && k->a->nonblocking)
        res = timeout_hint(res);
    if (res != HCOMM_OK)
        HCOMM__LOG(HCOMM__LOG_INFO, HCOMM__SUB_ALGO, "%s", hcomm_last_error());
    return res;
}

/* --- what calls leave behind --- */

void hcomm__coll_set_extra(hcomm_comm_t *c, uint64_t digest, const char *desc) {
    algo_state_t *a = hcomm__algo_state(c);
    if (!a)
        return;
    a->extra = digest;
    snprintf(a->extra_desc, sizeof a->extra_desc, "%s", desc);
}

void hcomm__coll_clear_extra(hcomm_comm_t *c) {
    algo_state_t *a = hcomm__algo_state(c);
    if (a)
        a->extra = 0;
}

void hcomm__coll_counts(hcomm_comm_t *c, uint64_t *calls, uint64_t *agreements) {
    algo_state_t *a = hcomm__algo_state(c);
    *calls = a ? a->seq : 0;
    *agreements = a ? a->agreements : 0;
}

const char *hcomm__coll_take_algo(hcomm_comm_t *c) {
    algo_state_t *a = hcomm__algo_state(c);
    int last = a ? a->last_algo : 0;
    if (a)
        a->last_algo = 0;
    return last > 0 ? hcomm__algo_name(last - 1) : NULL;
}

bool hcomm__coll_take_probed(hcomm_comm_t *c) {
    algo_state_t *a = hcomm__algo_state(c);
    bool probed = a && a->last_probed;
    if (a)
        a->last_probed = false;
    return probed;
}
