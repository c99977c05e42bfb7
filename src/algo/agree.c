/* How the ranks of a call agree on its signature (agree.h). */
#include "algo/agree.h"

#include "algo/algos.h"
#include "algo/sig.h"
#include "core/env.h"
#include "topo/topo.h"

#include <stdio.h>
#include <string.h>

bool hcomm__on_board(hcomm_comm_t *c) {
    hcomm__topo_t *t;
    return hcomm__board_on(c) &&
           (hcomm__topo_one_node(c) || (hcomm__topo_get(c, &t) == HCOMM_OK && t->nnodes < 2));
}

bool hcomm__on_lane(const hcomm_comm_t *c) {
    return !hcomm__posted_transport(c) && hcomm__lane_payload(c) > 0;
}

bool hcomm__on_pair_lane(const hcomm__call_t *k, int algo) {
    int want = k->sig.call == HCOMM__CALL_ALL_GATHER       ? HCOMM__ALGO_RD
               : k->sig.call == HCOMM__CALL_REDUCE_SCATTER ? HCOMM__ALGO_RHD
               : k->sig.call == HCOMM__CALL_BROADCAST      ? HCOMM__ALGO_TREE
                                                           : -1;
    return k->c->size == 2 && (algo & ~HCOMM__ALGO_DET) == want && hcomm__on_lane(k->c);
}

bool hcomm__ag_whole_on_lane(const hcomm__call_t *k, int algo) {
    return algo == HCOMM__ALGO_RD && hcomm__on_lane(k->c) &&
           hcomm__ag_rd_whole_fits(k->c, k->sig.count);
}

/* --- meetings on the board --- */

/* Meeting `step` of the call on the board (payload written at hcomm__board_space before),
 * checked on every rank; on HCOMM_OK the caller reads its peers' payloads, then leaves. */
static hcomm_result_t board_checked(hcomm__call_t *k, uint32_t step) {
    hcomm__posted_sig_t ps = hcomm__sig_post(&k->sig);
    HCOMM__TRY(hcomm__board_meet(k->c, k->seq, step, &ps, HCOMM__MEET_ALL));
    hcomm_result_t res = hcomm__sig_verdict(k, &ps, true);
    if (res != HCOMM_OK)
        hcomm__board_leave(k->c);
    return res;
}

hcomm_result_t hcomm__agree_board_sum(hcomm__call_t *k, const int64_t *mine, int64_t *all, int n) {
    hcomm_comm_t *c = k->c;
    void *space;
    HCOMM__TRY(hcomm__board_space(c, k->seq, sizeof *mine * (size_t)n, &space));
    memcpy(space, mine, sizeof *mine * (size_t)n);
    HCOMM__TRY(board_checked(k, 0));
    memset(all, 0, sizeof *all * (size_t)n);
    for (int r = 0; r < c->size; r++) {
        const void *theirs;
        hcomm__board_peer(c, r, NULL, &theirs);
        for (int i = 0; i < n; i++)
            all[i] = (int64_t)((uint64_t)all[i] + (uint64_t)((const int64_t *)theirs)[i]);
    }
    hcomm__board_leave(c);
    return HCOMM_OK;
}

/* --- the call's messaging context --- */

static hcomm_result_t xfer_check(const hcomm__xfer_t *x, int peer, const hcomm__env_t *env) {
    return hcomm__sig_check(x->call, peer, &env->sig);
}

/* A checked call's meetings wait for every rank and compare the signatures. An unchecked one
 * waits only where the shape needs it: a root whose payload the others read posts and goes on
 * (as MPI_Bcast's root does), and ranks that only feed a root leave at once (docs/tuning.md:
 * board.unchecked). */
static hcomm_result_t xfer_meet(const hcomm__xfer_t *x, uint32_t step, int from, int to) {
    hcomm__call_t *k = x->call;
    if ((from < 0 && to < 0) || hcomm__check_mode() != HCOMM__CHECK_OFF)
        return board_checked(k, step);
    int me = k->c->rank;
    int wait_for = (to >= 0 && to != me) ? HCOMM__MEET_NONE : from;
    hcomm__posted_sig_t ps = hcomm__sig_post(&k->sig);
    return hcomm__board_meet(k->c, k->seq, step, &ps, wait_for);
}

hcomm__xfer_t hcomm__call_xfer(hcomm__call_t *k) {
    return (hcomm__xfer_t){.c = k->c,
                           .tag = (int)k->seq,
                           .desc = {.sig = k->sig},
                           .scratch = &k->a->scratch,
                           .check = xfer_check,
                           .meet = xfer_meet,
                           .call = k};
}

/* --- agreements --- */

hcomm_result_t hcomm__agree_all(hcomm__call_t *k) {
    if (hcomm__on_board(k->c)) {
        HCOMM__TRY(board_checked(k, 0));
        hcomm__board_leave(k->c);
        return HCOMM_OK;
    }
    hcomm__xfer_t x = hcomm__call_xfer(k);
    return hcomm__ar_rd(&x, NULL, NULL, 0, HCOMM_U8, HCOMM_SUM);
}

/* The signature's digest, for HCOMM_CHECK=first. */
static uint64_t sig_digest(const hcomm__sig_t *s) {
    return ((uint64_t)s->call << 56) ^ ((uint64_t)s->dtype << 48) ^ ((uint64_t)s->op << 40) ^
           ((uint64_t)(uint32_t)s->root << 8) ^ (s->count * 0x9E3779B97F4A7C15ull) ^ s->extra ^
           ((uint64_t)(uint32_t)s->algo << 32);
}

hcomm_result_t hcomm__agree_as(hcomm__call_t *k, int mode) {
    if (mode == HCOMM__CHECK_OFF || k->c->size == 1)
        return HCOMM_OK;
    uint64_t h = sig_digest(&k->sig);
    algo_state_t *a = k->a;
    if (mode == HCOMM__CHECK_FIRST)
        for (int i = 0; i < a->nseen; i++)
            if (a->seen[i] == h)
                return HCOMM_OK;
    a->agreements++;
    HCOMM__TRY(hcomm__agree_all(k));
    if (mode == HCOMM__CHECK_FIRST)
        a->seen[a->nseen < HCOMM__SEEN ? a->nseen++ : HCOMM__SEEN - 1] = h;
    return HCOMM_OK;
}

/* The calls whose every message takes the lane and carries the signature, every rank sending
 * and receiving in every step, so that ranks that disagree meet and see it: no agreement first.
 * (All_reduce's rd, on any transport without posted checks.) */
static bool checks_in_messages(const hcomm__call_t *k, int algo) {
    bool lane = hcomm__on_lane(k->c); /* twoshot's and direct's messages take it too */
    switch (k->sig.call) {
    case HCOMM__CALL_ALL_REDUCE:
        return algo == HCOMM__ALGO_RD || (lane && algo == HCOMM__ALGO_TWOSHOT);
    case HCOMM__CALL_REDUCE_SCATTER:
        return (lane && (algo == HCOMM__ALGO_RD || algo == HCOMM__ALGO_DIRECT)) ||
               hcomm__on_pair_lane(k, algo);
    case HCOMM__CALL_BROADCAST:
        return (lane && algo == HCOMM__ALGO_RD) || hcomm__on_pair_lane(k, algo);
    case HCOMM__CALL_REDUCE: /* direct: addresses from every rank to every rank first */
        return lane && algo == HCOMM__ALGO_DIRECT;
    case HCOMM__CALL_ALL_GATHER:
        return hcomm__on_pair_lane(k, algo) || hcomm__ag_whole_on_lane(k, algo) ||
               (lane && algo == HCOMM__ALGO_DIRECT);
    default:
        return false;
    }
}

/* The envelopes alone would not tell a rank that only sends (a broadcast root, a gather leaf)
 * that its peers disagree, and a mismatch found midway would leave recvbuf half written: the
 * ranks agree first, unless every message checks (checks_in_messages) and no rank waits on a
 * board, where it would never see such a message. HCOMM_CHECK=first is always for hcomm's own
 * algorithms: under first only the ranks that saw a signature before would skip it, and their
 * peers would wait in the agreement until the timeout (off: every rank skips it alike). */
hcomm_result_t hcomm__agree_p2p(hcomm__call_t *k, int algo) {
    hcomm_comm_t *c = k->c;
    if (!hcomm__posted_transport(c)) {
        if (checks_in_messages(k, algo) && !hcomm__on_board(c))
            return HCOMM_OK;
        int mode = hcomm__check_mode();
        return hcomm__agree_as(
            k, algo == HCOMM__ALGO_NATIVE || mode == HCOMM__CHECK_OFF ? mode : HCOMM__CHECK_ALWAYS);
    }
    return hcomm__run_posted(k, hcomm__posted_barrier, NULL);
}

hcomm_result_t hcomm__posted_barrier(hcomm_comm_t *c, const void *arg) {
    (void)arg;
    HCOMM__TRY(c->tr->posted_only(c));
    return c->tr->posted_release(c);
}

hcomm_result_t hcomm__run_posted(hcomm__call_t *k, hcomm__posted_fn_t fn, const void *arg) {
    hcomm_comm_t *c = k->c;
    hcomm__posted_sig_t ps = hcomm__sig_post(&k->sig);
    c->posted = &ps;
    hcomm_result_t res = fn(c, arg);
    c->posted = NULL;
    if (res == HCOMM_ERR_MISMATCH && c->posted_held)
        res = hcomm__sig_posted_verdict(k, &ps);
    return res;
}

void hcomm__agree_failed(hcomm__call_t *k, hcomm_result_t res, const char *text) {
    hcomm_comm_t *c = k->c;
    hcomm__posted_sig_t ps = hcomm__sig_post(&k->sig);
    ps.failed = res;
    ps.failed_text = text;
    if (hcomm__posted_transport(c)) {
        c->posted = &ps;
        if (c->tr->posted_only(c) == HCOMM_ERR_MISMATCH && c->posted_held)
            c->tr->posted_release(c);
        c->posted = NULL;
        return;
    }
    if (c->size == 1)
        return;
    if (hcomm__on_board(c)) /* peers that meet there see it at once */
        hcomm__board_meet(c, k->seq, 0, &ps, HCOMM__MEET_NONE);
    char note[600];
    snprintf(note, sizeof note, "rank %d failed its own checks in this call, nothing moved: %s",
             c->rank, text);
    hcomm__notify_error(c, k->seq, HCOMM_ERR_PEER, note);
}
