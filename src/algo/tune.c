/* Online choice near a switch (tune.h). */
#include "algo/tune.h"

#include "algo/select.h"
#include "core/log.h"

#include <stdlib.h>
#include <string.h>

/* A rival must win by this much to replace the measured default: the two halves of a probe
 * see the same noise, and a tie keeps the choice the tables were measured for. */
#define TUNE_MARGIN 0.05

/* The last step of a call's meetings: after every algorithm's own (each at most a few
 * thousand pieces of the board's room on the sizes probed). */
#define TUNE_STEP 0xFFFFFFu

static hcomm__tune_entry_t *find(hcomm__tune_t *t, const hcomm__tune_entry_t *key) {
    for (int i = 0; i < t->n; i++) {
        hcomm__tune_entry_t *e = &t->e[i];
        if (e->coll == key->coll && e->bytes == key->bytes &&
            e->deterministic == key->deterministic && e->cand[0] == key->cand[0] &&
            e->cand[1] == key->cand[1])
            return e;
    }
    return NULL;
}

int hcomm__tune_pick(hcomm__tune_t *t, int coll, size_t bytes, bool deterministic, int dflt,
                     int other, hcomm__probe_t *probe, const char **why) {
    hcomm__tune_entry_t key = {.coll = coll,
                               .bytes = bytes,
                               .deterministic = deterministic,
                               .cand = {dflt, other},
                               .decided = -1};
    hcomm__tune_entry_t *e = find(t, &key);
    if (!e && t->n == HCOMM__TUNE_SLOTS)
        return dflt;
    if (e && e->decided >= 0) {
        *why = "the faster of two, timed on this communicator's first calls of this size";
        return e->cand[e->decided];
    }
    unsigned calls = e ? e->calls : 0, run = calls / HCOMM__TUNE_RUN;
    *probe = (hcomm__probe_t){.active = true,
                              .e = e,
                              .key = key,
                              .idx = (int)(run % 2),
                              .timed = calls % HCOMM__TUNE_RUN != 0 && run >= HCOMM__TUNE_WARM_RUNS,
                              .t0 = hcomm__now()};
    *why = "timing two candidates on this communicator's first calls of this size";
    return key.cand[probe->idx];
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int64_t median(int64_t *v, unsigned n) {
    qsort(v, n, sizeof *v, cmp_i64);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The slowest rank's median of each, in one board meeting after the call's own: a call ends
 * when its last rank does (summed, a rooted call's leaves that leave at once made shm look far
 * cheaper than a direct reduce whose leaves wait for the root). No decision is taken early: a
 * candidate's first calls of a size are its slowest (docs/tuning.md: tune.probe). */
static hcomm_result_t decide(hcomm_comm_t *c, uint32_t seq, const hcomm__posted_sig_t *sig,
                             hcomm__tune_entry_t *e) {
    int64_t mine[2] = {median(e->ns[0], e->n[0]), median(e->ns[1], e->n[1])}, all[2] = {0, 0};
    void *space;
    HCOMM__TRY(hcomm__board_space(c, seq, sizeof mine, &space));
    memcpy(space, mine, sizeof mine);
    HCOMM__TRY(hcomm__board_meet(c, seq, TUNE_STEP, sig, HCOMM__MEET_ALL));
    for (int r = 0; r < c->size; r++) {
        const void *theirs;
        int64_t v[2];
        hcomm__board_peer(c, r, NULL, &theirs);
        memcpy(v, theirs, sizeof v);
        all[0] = v[0] > all[0] ? v[0] : all[0];
        all[1] = v[1] > all[1] ? v[1] : all[1];
    }
    hcomm__board_leave(c);
    double t0 = (double)all[0], t1 = (double)all[1];
    e->decided = t1 < (1.0 - TUNE_MARGIN) * t0 ? 1 : 0;
    HCOMM__LOG(HCOMM__LOG_DEBUG, HCOMM__SUB_ALGO,
               "%s of %zu bytes, timed: %s %.2f us, %s %.2f us (slowest rank's medians of %u "
               "and %u calls): %s",
               hcomm__coll_name(e->coll), e->bytes, hcomm__algo_name(e->cand[0]), t0 / 1e3,
               hcomm__algo_name(e->cand[1]), t1 / 1e3, e->n[0], e->n[1],
               hcomm__algo_name(e->cand[e->decided]));
    return HCOMM_OK;
}

hcomm_result_t hcomm__tune_record(hcomm__tune_t *t, hcomm_comm_t *c, uint32_t seq,
                                  const hcomm__posted_sig_t *sig, hcomm__probe_t *probe) {
    hcomm__tune_entry_t *e = probe->e;
    probe->active = false;
    if (!e) { /* the size's first call: a slot was free when it began */
        if (t->n == HCOMM__TUNE_SLOTS)
            return HCOMM_OK;
        e = &t->e[t->n++];
        *e = probe->key;
    }
    if (probe->timed && e->n[probe->idx] < HCOMM__TUNE_SAMPLES)
        e->ns[probe->idx][e->n[probe->idx]++] = (int64_t)((hcomm__now() - probe->t0) * 1e9);
    if (++e->calls < HCOMM__TUNE_CALLS)
        return HCOMM_OK;
    hcomm_result_t res = decide(c, seq, sig, e);
    if (res != HCOMM_OK)
        e->decided = 0; /* the group is failing: no second meeting on later calls */
    return res;
}
