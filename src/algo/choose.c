/* The choice of an algorithm for one call (choose.h). */
#include "algo/choose.h"

#include "algo/agree.h"
#include "algo/algos.h"
#include "algo/call.h"
#include "algo/cost.h"
#include "algo/select_table.h"
#include "core/env.h"
#include "core/log.h"
#include "topo/topo.h"

#include <math.h>
#include <stdio.h>

bool hcomm__on_one_node(hcomm_comm_t *c) {
    hcomm__topo_t *t;
    return hcomm__topo_one_node(c) || (hcomm__topo_get(c, &t) == HCOMM_OK && t->one_node);
}

bool hcomm__shm_runs(hcomm_comm_t *c) {
    return hcomm__on_board(c) && hcomm__shm_fits(c);
}

static bool is_reduction(int coll) {
    return coll == HCOMM__COLL_ALLREDUCE || coll == HCOMM__COLL_REDUCESCATTER ||
           coll == HCOMM__COLL_REDUCE || coll == HCOMM__COLL_REDUCESCATTERV;
}

/* --- the choices kept per collective --- */

/* The one-node choice made last, where one answers this call: kept per collective for
 * HCOMM__CHOICE_WAYS (size, override) pairs, so that other calls in between keep them (a
 * training step's large and small all_reduce; hcomm-bench's rows, which set and clear an
 * override around every call). An override enters through the set it allows for that
 * collective. Debug logging skips the cache, so that every choice is logged (docs/tuning.md:
 * choose.cache). */
static bool kept_choice(const hcomm__call_t *k, bool one_node, int coll, size_t bytes, int *algo) {
    const algo_state_t *a = k->a;
    if (!one_node || hcomm__log_on(HCOMM__LOG_DEBUG, HCOMM__SUB_ALGO))
        return false;
    for (int w = 0; w < HCOMM__CHOICE_WAYS; w++) {
        const hcomm__kept_choice_t *e = &a->kept[coll][w];
        if (e->valid && e->bytes == bytes && e->deterministic == k->c->deterministic &&
            e->forced == a->has_over && (!e->forced || e->allowed == a->over.allowed[coll])) {
            *algo = e->algo;
            return true;
        }
    }
    return false;
}

static void keep_choice(hcomm__call_t *k, int coll, size_t bytes, int algo) {
    algo_state_t *a = k->a;
    int w = a->kept_next[coll];
    a->kept_next[coll] = (uint8_t)((w + 1) % HCOMM__CHOICE_WAYS);
    a->kept[coll][w] = (hcomm__kept_choice_t){.valid = true,
                                              .deterministic = k->c->deterministic,
                                              .forced = a->has_over,
                                              .allowed = a->has_over ? a->over.allowed[coll] : 0,
                                              .algo = algo,
                                              .bytes = bytes};
}

/* The rooted and v-calls' native algorithm where the transport has none: what its default
 * would be there (local: tree for reduce, direct for gather and scatter). */
static int without_native(const hcomm_comm_t *c, int coll, int algo, hcomm__why_t *why) {
    const hcomm__native_ops_t *n = c->tr->native;
    bool missing = (coll == HCOMM__COLL_REDUCE && !n->reduce) ||
                   (coll == HCOMM__COLL_GATHER && !n->gather) ||
                   (coll == HCOMM__COLL_SCATTER && !n->scatter) ||
                   (coll == HCOMM__COLL_ALLGATHERV && !n->all_gatherv) ||
                   (coll == HCOMM__COLL_REDUCESCATTERV && !n->reduce_scatterv);
    if (algo != HCOMM__ALGO_NATIVE || !missing)
        return algo;
    *why = HCOMM__WHY_NO_NATIVE;
    return coll == HCOMM__COLL_REDUCE ? HCOMM__ALGO_TREE
           : coll == HCOMM__COLL_ALLGATHERV || coll == HCOMM__COLL_REDUCESCATTERV
               ? HCOMM__ALGO_RING
               : HCOMM__ALGO_DIRECT;
}

/* --- the choice --- */

static unsigned offers(hcomm_comm_t *c) {
    unsigned has = 0;
    if (hcomm__posted_transport(c))
        has |= HCOMM__HAS_POSTED;
    if (hcomm__peer_reads(c))
        has |= HCOMM__HAS_READS;
    if (hcomm__on_board(c))
        has |= HCOMM__HAS_BOARD | (hcomm__shm_fits(c) ? HCOMM__HAS_SHM : 0);
    if (hcomm__check_mode() == HCOMM__CHECK_OFF)
        has |= HCOMM__HAS_OFF;
    return has;
}

/* Algorithms that reduce every element's inputs in rank order already, which deterministic
 * mode runs as they are: the shared-memory native collectives, twoshot, shm, and direct
 * reduce_scatter and reduce. */
static bool rank_ordered(const hcomm__sel_t *s, int algo) {
    if (algo == HCOMM__ALGO_TWOSHOT || algo == HCOMM__ALGO_SHM)
        return true;
    if (algo == HCOMM__ALGO_NATIVE)
        return s->has & HCOMM__HAS_POSTED;
    return algo == HCOMM__ALGO_DIRECT &&
           (s->coll == HCOMM__COLL_REDUCESCATTER || s->coll == HCOMM__COLL_REDUCESCATTERV ||
            s->coll == HCOMM__COLL_REDUCE);
}

static void log_choice(const hcomm__call_t *k, const hcomm__sel_t *s, int algo, const char *why,
                       double est) {
    char est_text[48] = "no cost estimate: measured tables";
    if (est >= 0)
        snprintf(est_text, sizeof est_text, "estimate %.4g us", est * 1e6);
    hcomm__log(HCOMM__LOG_DEBUG, HCOMM__SUB_ALGO,
               "%s seq %u: %s of %zu bytes on %d ranks: %s (%s, %s)", k->c->call_fn,
               (unsigned)k->seq, hcomm__coll_name(s->coll), s->bytes, s->p, hcomm__algo_name(algo),
               why, est_text);
}

/* The algorithm before deterministic mode: the cost model's, else the tables' (select_table.h),
 * timed near a switch, native only where the transport has it. */
static int pick(hcomm__call_t *k, bool one_node, hcomm__sel_t *s, double *est,
                const char **why_text) {
    hcomm_comm_t *c = k->c;
    int algo = one_node ? -1
                        : hcomm__cost_choose(c, s->over ? s->over : hcomm__algo_env(), s->coll,
                                             s->bytes, hcomm__posted_transport(c), est);
    /* the model's answers need only what decides whether they can run: asked per call */
    bool all = algo < 0 || hcomm__select_needs_offers(s->coll, algo);
    s->has = all ? offers(c) : hcomm__posted_transport(c) ? HCOMM__HAS_POSTED : 0;
    hcomm__why_t why = algo < 0 ? HCOMM__WHY_DEFAULT : HCOMM__WHY_COST;
    int rival = -1;
    algo = hcomm__select(s, algo, &why, &rival);
    *why_text = hcomm__why_text(why);
    if (rival >= 0) /* near a timed switch: the faster of the two on this machine (tune.h) */
        algo = hcomm__tune_pick(&k->a->tune, s->coll, s->bytes, c->deterministic, algo, rival,
                                &k->probe, why_text);
    algo = without_native(c, s->coll, algo, &why);
    if (why == HCOMM__WHY_NO_NATIVE)
        *why_text = hcomm__why_text(why);
    return algo;
}

int hcomm__choose(hcomm__call_t *k, int coll, size_t bytes) {
    hcomm__sel_t s = {coll, bytes, k->c->size, 0, k->a->has_over ? &k->a->over : NULL};
    bool det = k->c->deterministic && is_reduction(coll);
    bool one_node = hcomm__topo_one_node(k->c);
    int algo;
    if (!kept_choice(k, one_node, coll, bytes, &algo)) {
        double est = -1.0;
        const char *why;
        algo = pick(k, one_node, &s, &est, &why);
        if (det && !rank_ordered(&s, algo))
            algo |= HCOMM__ALGO_DET;
        /* read again: the choice may have built the topology model */
        if (hcomm__topo_one_node(k->c) && !k->probe.active) /* not while a probe alternates */
            keep_choice(k, coll, bytes, algo);
        if (hcomm__log_on(HCOMM__LOG_DEBUG, HCOMM__SUB_ALGO))
            log_choice(k, &s, algo, why, est);
    }
    hcomm__call_chosen(k, algo | (det ? HCOMM__ALGO_DET : 0), algo);
    return algo;
}

hcomm_result_t hcomm__coll_set_algo(hcomm_comm_t *c, const char *spec) {
    algo_state_t *a = hcomm__algo_state(c);
    if (!a)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for collective state");
    if (!spec || !spec[0]) {
        a->has_over = false;
        return HCOMM_OK;
    }
    hcomm__algo_set_t set;
    HCOMM__TRY(hcomm__algo_parse(c->call_fn, "algorithm spec", spec, &set));
    a->over = set;
    a->has_over = true;
    return HCOMM_OK;
}

bool hcomm__coll_bypasses_links(hcomm_comm_t *c, const char *coll, int algo) {
    hcomm__topo_t *t;
    int k = hcomm__coll_find(coll);
    if (k < 0 || hcomm__topo_get(c, &t) != HCOMM_OK || !t->simulated || t->nnodes < 2)
        return false;
    /* on a simulated machine only those algorithms lack an estimate, whatever the size */
    return !isfinite(
        hcomm__cost_estimate(c, k, algo & ~HCOMM__ALGO_DET, 0, hcomm__posted_transport(c)));
}
