/* Lost members and the agreements that survive them (transport.h): the verdict every wait asks
 * for, and ULFM's agree and shrink over the transport's slots (transport.ft_slot).
 *
 * A round: each live member posts its value in its own slot, then reads every other member's
 * post of that round, or finds the member lost (transport.lost) with no post of it. A lost
 * member never posts again and its slot stays readable, so once it is found lost its slot is
 * final: every survivor reads the same posts and reaches the same result, with no second round
 * (the shared-memory form of consensus with a perfect failure detector). */
#include "transport/transport.h"

#include <stdlib.h>

int hcomm__lost_member(hcomm_comm_t *c) {
    if (!c->tr->lost)
        return -1;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && c->tr->lost(c, r))
            return r;
    return -1;
}

int hcomm__lost_member_now(hcomm_comm_t *c) {
    if (c->tr->lost_scan)
        c->tr->lost_scan(c);
    return hcomm__lost_member(c);
}

hcomm_result_t hcomm__lost_verdict(hcomm_comm_t *c, int rank) {
    int r = rank < 0 ? hcomm__lost_member(c) : (c->tr->lost && c->tr->lost(c, rank) ? rank : -1);
    return r < 0 ? HCOMM_OK : hcomm__lost_error(c, r);
}

hcomm_result_t hcomm__lost_error(hcomm_comm_t *c, int r) {
    c->wait_peer = r; /* the flight recorder's dump names it */
    return hcomm__err(HCOMM_ERR_PEER_LOST, c->call_fn,
                      "rank %d of this group (world rank %d) was lost (it stopped for good) "
                      "while this rank waited in seq %u; revoke, agree and shrink to go on "
                      "without it",
                      r, c->world_ranks[r], (unsigned)c->call_seq);
}

hcomm_result_t hcomm__own_abort_error(hcomm_comm_t *c) {
    if (atomic_load(&c->aborted) == HCOMM__REVOKE_CALLED)
        return hcomm__err(HCOMM_ERR_REVOKED, c->call_fn,
                          "the communicator was revoked (hcomm_comm_revoke, on this rank or a "
                          "peer); only hcomm_comm_agree, hcomm_comm_shrink and "
                          "hcomm_comm_destroy work on it now");
    return hcomm__err(HCOMM_ERR_ABORTED, c->call_fn,
                      "hcomm_comm_abort() was called on this communicator");
}

/* --- rounds --- */

static hcomm__ft_slot_t *slot(hcomm_comm_t *c, int r) {
    return c->tr->ft_slot(c, r);
}

/* Waits until member r posted round k (true) or is found lost without that post (false). */
static hcomm_result_t await_post(hcomm_comm_t *c, const char *fn, int r, uint64_t k, bool *posted) {
    const hcomm__ft_slot_t *s = slot(c, r);
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    for (;;) {
        if (atomic_load_explicit(&s->round, memory_order_acquire) >= k) {
            *posted = true;
            return HCOMM_OK;
        }
        double waited = hcomm__backoff(&b);
        if ((b.iter & 63) != 0)
            continue;
        if (c->tr->lost && c->tr->lost(c, r)) { /* final now: read it once more */
            *posted = atomic_load_explicit(&s->round, memory_order_acquire) >= k;
            return HCOMM_OK;
        }
        if (waited > c->timeout_s)
            return hcomm__err(HCOMM_ERR_TIMEOUT, fn,
                              "waited %g s for rank %d (world rank %d), which is alive, to join "
                              "round %llu (HCOMM_TIMEOUT); every live member must make the same "
                              "calls",
                              c->timeout_s, r, c->world_ranks[r], (unsigned long long)k);
    }
}

/* One round: posts (value, aux); posted[r] tells whose post of it came, values[r] and auxes[r]
 * hold them (this rank's own included). */
static hcomm_result_t ft_round(hcomm_comm_t *c, const char *fn, uint64_t value, uint64_t aux,
                               bool *posted, uint64_t *values, uint64_t *auxes) {
    uint64_t k = ++c->ft_round;
    hcomm__ft_slot_t *mine = slot(c, c->rank);
    mine->value[k & 1] = value;
    mine->aux[k & 1] = aux;
    atomic_store_explicit(&mine->round, k, memory_order_release);
    for (int r = 0; r < c->size; r++) {
        posted[r] = r == c->rank;
        if (r != c->rank)
            HCOMM__TRY(await_post(c, fn, r, k, &posted[r]));
        const hcomm__ft_slot_t *s = slot(c, r);
        values[r] = posted[r] ? s->value[k & 1] : 0;
        auxes[r] = posted[r] ? s->aux[k & 1] : 0;
    }
    return HCOMM_OK;
}

static hcomm_result_t ft_ready(hcomm_comm_t *c, const char *fn) {
    if (c->tr->ft_slot && c->tr->ft_slot(c, c->rank))
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_UNSUPPORTED, fn,
                      "the %s backend finds lost ranks only among members on one host, and this "
                      "communicator spans several; recover by restarting the job from a "
                      "checkpoint (scripts/hcomm-restart.sh)",
                      c->tr->name);
}

/* Scratch for one round of c: posted, values, auxes. */
typedef struct round_buf {
    bool *posted;
    uint64_t *values, *auxes;
} round_buf_t;

static hcomm_result_t round_buf_new(hcomm_comm_t *c, const char *fn, round_buf_t *rb) {
    rb->posted = calloc((size_t)c->size, sizeof *rb->posted);
    rb->values = calloc(2 * (size_t)c->size, sizeof *rb->values);
    rb->auxes = rb->values ? rb->values + c->size : NULL;
    if (rb->posted && rb->values)
        return HCOMM_OK;
    free(rb->posted);
    free(rb->values);
    return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for an agreement of %d ranks", c->size);
}

static void round_buf_free(round_buf_t *rb) {
    free(rb->posted);
    free(rb->values);
}

hcomm_result_t hcomm__ft_agree(hcomm_comm_t *c, const char *fn, uint64_t *value, bool *lost) {
    HCOMM__TRY(ft_ready(c, fn));
    round_buf_t rb;
    HCOMM__TRY(round_buf_new(c, fn, &rb));
    hcomm_result_t res = ft_round(c, fn, *value, 0, rb.posted, rb.values, rb.auxes);
    uint64_t all = *value;
    for (int r = 0; res == HCOMM_OK && r < c->size; r++) {
        if (rb.posted[r])
            all &= rb.values[r];
        if (lost)
            lost[r] = !rb.posted[r];
    }
    if (res == HCOMM_OK)
        *value = all;
    round_buf_free(&rb);
    return res;
}

/* The second round of a shrink: the first live member publishes the transport's token for the
 * new communicator (local: its shared state), the others read it. A member lost since the
 * first round is dropped and the round repeated, so the new communicator starts with none
 * lost that the survivors could have seen. */
static hcomm_result_t publish_token(hcomm_comm_t *c, const char *fn, int *members, int *n,
                                    round_buf_t *rb, uint64_t *token) {
    for (;;) {
        uint64_t mine = 0;
        if (members[0] == c->rank && c->tr->subset_token)
            mine = c->tr->subset_token(c, *n, c->ft_round + 1);
        HCOMM__TRY(ft_round(c, fn, 1, mine, rb->posted, rb->values, rb->auxes));
        int kept = 0;
        for (int i = 0; i < *n; i++)
            if (rb->posted[members[i]])
                members[kept++] = members[i];
        if (kept == *n) {
            *token = rb->auxes[members[0]];
            return HCOMM_OK;
        }
        *n = kept;
    }
}

hcomm_result_t hcomm__ft_shrink(hcomm_comm_t *c, const char *fn, hcomm_comm_t **out) {
    *out = NULL;
    HCOMM__TRY(ft_ready(c, fn));
    round_buf_t rb;
    HCOMM__TRY(round_buf_new(c, fn, &rb));
    int *members = malloc(sizeof *members * (size_t)c->size), n = 0;
    hcomm_result_t res = members ? ft_round(c, fn, 1, 0, rb.posted, rb.values, rb.auxes)
                                 : hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory");
    for (int r = 0; res == HCOMM_OK && r < c->size; r++)
        if (rb.posted[r])
            members[n++] = r;
    uint64_t token = 0;
    if (res == HCOMM_OK)
        res = publish_token(c, fn, members, &n, &rb, &token);
    const char *keep = c->call_fn;
    c->call_fn = fn;
    if (res == HCOMM_OK)
        res = c->tr->subset(c, members, n, token, out);
    c->call_fn = keep;
    free(members);
    round_buf_free(&rb);
    return res;
}
