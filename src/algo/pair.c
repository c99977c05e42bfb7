/* Two ranks on the transport's lane (mpi): all_gather, reduce_scatter and broadcast as one
 * exchange of lane messages per piece, each message carrying the call's signature. Both ranks
 * send in every step (a broadcast's receiver sends the signature alone), so each compares the
 * other's signature before it writes anything: the agreement and the data travel in one message
 * each way, where an agreement and then the algorithm took two round trips, and Open MPI's
 * nonblocking collectives (the native path's, which stays abortable) about twice a blocking
 * call's time at small sizes. The same scheme as rd all_reduce on the lane (rd.c). */
#include "algo/algos.h"

#include "core/internal.h"

#include <string.h>

typedef struct pair {
    const hcomm__xfer_t *x;
    int me, peer;
    size_t piece; /* payload bytes per step */
    _Alignas(16) unsigned char in[HCOMM__LANE_MAX];
} pair_t;

static void pair_init(pair_t *s, const hcomm__xfer_t *x, size_t unit) {
    s->x = x;
    s->me = x->c->rank;
    s->peer = 1 - s->me;
    s->piece = hcomm__lane_payload(x->c) / unit * unit;
}

/* Payload of the message received last. */
static unsigned char *got(pair_t *s) {
    return s->in + HCOMM__LANE_HDR;
}

enum { SEND = 1, RECV = 2, BOTH = 3 };

/* Sends n_out bytes of src to the peer and receives its n_in bytes into got(s), checked; `ways`
 * says which halves run. */
static hcomm_result_t step_as(pair_t *s, int ways, const void *src, size_t n_out, size_t n_in) {
    return hcomm__x_lane(s->x, ways & SEND ? s->peer : -1, src, n_out, ways & RECV ? s->peer : -1,
                         s->in, n_in);
}

static hcomm_result_t step(pair_t *s, const void *src, size_t n_out, size_t n_in) {
    return step_as(s, BOTH, src, n_out, n_in);
}

static size_t piece_of(const pair_t *s, size_t total, size_t done) {
    return total - done < s->piece ? total - done : s->piece;
}

hcomm_result_t hcomm__pair_all_gather(const hcomm__xfer_t *x, const void *send, void *recv,
                                      size_t bytes) {
    pair_t s;
    pair_init(&s, x, 1);
    char *theirs = (char *)recv + (size_t)s.peer * bytes,
         *mine = (char *)recv + (size_t)s.me * bytes;
    size_t done = 0;
    do {
        size_t n = piece_of(&s, bytes, done);
        HCOMM__TRY(step(&s, (const char *)send + done, n, n));
        if (n) /* recv may be NULL with 0 bytes */
            memcpy(theirs + done, got(&s), n);
        done += n;
    } while (done < bytes);
    if (mine != send && bytes)
        memcpy(mine, send, bytes);
    return HCOMM_OK;
}

/* Each rank sends the peer's block and reduces the one it gets into its own, always as rank
 * 0's operand op rank 1's: the serial reduction's bits on both ranks. In place (send == recv)
 * rank 1's result overwrites block 0 a piece at a time, each piece after it was sent. */
hcomm_result_t hcomm__pair_reduce_scatter(const hcomm__xfer_t *x, const void *send, void *recv,
                                          size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    pair_t s;
    size_t es = hcomm__dtype_size(dt), done = 0;
    pair_init(&s, x, es);
    const char *mine = (const char *)send + (size_t)s.me * count * es,
               *theirs = (const char *)send + (size_t)s.peer * count * es;
    do {
        size_t n = piece_of(&s, count * es, done * es) / es, nb = n * es;
        HCOMM__TRY(step(&s, theirs + done * es, nb, nb));
        char *r = (char *)recv + done * es;
        const char *m = mine + done * es;
        if (s.me == 0) {
            if (r != m && nb)
                memmove(r, m, nb);
            hcomm__reduce(r, got(&s), n, dt, op);
        } else {
            hcomm__reduce(got(&s), m, n, dt, op);
            if (nb)
                memcpy(r, got(&s), nb);
        }
        done += n;
    } while (done < count);
    return HCOMM_OK;
}

/* The receiver answers each piece with its signature alone, so a root whose peer called
 * something else fails too; without `answer` (HCOMM_CHECK=off) the root only sends. */
hcomm_result_t hcomm__pair_broadcast(const hcomm__xfer_t *x, void *buf, size_t bytes, int root,
                                     bool answer) {
    pair_t s;
    pair_init(&s, x, 1);
    bool sender = s.me == root;
    int ways = answer ? BOTH : sender ? SEND : RECV;
    size_t done = 0;
    do {
        size_t n = piece_of(&s, bytes, done);
        HCOMM__TRY(step_as(&s, ways, (char *)buf + done, sender ? n : 0, sender ? 0 : n));
        if (!sender && n)
            memcpy((char *)buf + done, got(&s), n);
        done += n;
    } while (done < bytes);
    return HCOMM_OK;
}
