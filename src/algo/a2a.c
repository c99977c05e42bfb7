/* all_to_allv algorithms over p2p (see a2a.h). */
#include "algo/a2a.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static void note(hcomm__a2a_bad_t *b, int receiver, int sender, size_t sent, size_t expected) {
    if (b->set && (b->receiver < receiver || (b->receiver == receiver && b->sender < sender)))
        return;
    *b = (hcomm__a2a_bad_t){true, receiver, sender, sent, expected};
}

/* A block from `from` arrived with sent bytes and what `from` expects back (their_expect):
 * both directions of the pair checked against this rank's counts. True when it may land. */
bool hcomm__a2a_check_pair(const hcomm__xfer_t *x, const hcomm__a2a_t *v, int from, uint64_t sent,
                           uint64_t their_expect, hcomm__a2a_bad_t *b) {
    int me = x->c->rank;
    if (their_expect != v->scounts[from])
        note(b, from, me, v->scounts[from], (size_t)their_expect);
    if (sent == v->rcounts[from])
        return true;
    note(b, me, from, (size_t)sent, v->rcounts[from]);
    return false;
}

/* what: what happened to the data ("that block was not moved", "no data was moved"). */
hcomm_result_t hcomm__a2a_verdict_as(const hcomm__xfer_t *x, const hcomm__a2a_bad_t *b,
                                     const char *what) {
    if (!b->set)
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_MISMATCH, x->c->call_fn,
                      "sendcounts[%d]=%zu on rank %d but recvcounts[%d]=%zu on rank %d; %s",
                      b->receiver, b->sent, b->sender, b->sender, b->expected, b->receiver, what);
}

hcomm_result_t hcomm__a2a_verdict(const hcomm__xfer_t *x, const hcomm__a2a_bad_t *b) {
    return hcomm__a2a_verdict_as(x, b, "that block was not moved");
}

void hcomm__a2a_self_copy(const hcomm__xfer_t *x, const hcomm__a2a_t *v, hcomm__a2a_bad_t *b) {
    int me = x->c->rank;
    if (hcomm__a2a_check_pair(x, v, me, v->scounts[me], v->rcounts[me], b) && v->rcounts[me])
        memcpy(hcomm__a2a_rblock(v, me), hcomm__a2a_sblock(v, me), v->rcounts[me]);
}

hcomm_result_t hcomm__a2a_nomem(const hcomm__xfer_t *x, size_t bytes) {
    return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes of scratch",
                      bytes);
}

/* Receives from `from` into buf (exactly cap bytes; any size when alloc: a malloc'd buffer
 * in *got, sized from a probe, since p2p's own would map fresh pages per message) and checks
 * the sender's signature. A size other than cap is no error here: env tells the caller,
 * which checks the counts (nothing landed). */
hcomm_result_t hcomm__a2a_recv_msg(const hcomm__xfer_t *x, int from, void *buf, size_t cap,
                                   bool alloc, hcomm__env_t *env, void **got) {
    memset(env, 0, sizeof *env);
    if (alloc) {
        HCOMM__TRY(hcomm__probe(x->c, HCOMM__CH_COLL, x->tag, from, env));
        cap = (size_t)env->bytes;
        buf = *got = malloc(cap + 1);
        if (!buf)
            return hcomm__a2a_nomem(x, cap);
    }
    hcomm__req_t *r = NULL;
    hcomm_result_t res =
        hcomm__irecv(x->c, HCOMM__CH_COLL, x->tag, from, buf, cap, HCOMM__RECV_EXACT, &r);
    if (res == HCOMM_OK)
        res = hcomm__wait(r, env, NULL);
    if (env->kind == HCOMM__ENV_DATA && (res == HCOMM_OK || res == HCOMM_ERR_MISMATCH)) {
        hcomm_result_t sig = x->check(x, from, env);
        if (sig != HCOMM_OK)
            res = sig;
        else if (res == HCOMM_ERR_MISMATCH && !alloc && env->bytes != cap)
            res = HCOMM_OK;
    }
    if (res != HCOMM_OK && alloc) { /* the caller keeps only what arrived */
        free(*got);
        *got = NULL;
    }
    return res;
}

/* Sends bytes to `to` with expect in the envelope, and receives from `from` as hcomm__a2a_recv_msg.
 */
hcomm_result_t hcomm__a2a_swap(const hcomm__xfer_t *x, int to, const void *sbuf, size_t sbytes,
                               uint64_t expect, int from, void *rbuf, size_t rcap, bool alloc,
                               hcomm__env_t *env, void **got) {
    hcomm__env_t desc = x->desc;
    desc.shape[0] = (int64_t)expect;
    hcomm__req_t *s = NULL;
    HCOMM__TRY(hcomm__isend(x->c, HCOMM__CH_COLL, x->tag, to, sbuf, sbytes, &desc, &s));
    hcomm_result_t res = hcomm__a2a_recv_msg(x, from, rbuf, rcap, alloc, env, got);
    hcomm_result_t sres = hcomm__wait(s, NULL, NULL);
    return res != HCOMM_OK ? res : sres;
}

/* --- pairwise, over the ranks of a group (all of them, or one node's) --- */

/* One pairwise step on the lane: the block to `to` after its (size, what this rank expects
 * back) pair, the block from `from` likewise; the sizes travel, so a mismatch is found on
 * both ranks of the pair, as on p2p. */
static hcomm_result_t lane_swap(const hcomm__xfer_t *x, const hcomm__a2a_t *v, int to, int from,
                                hcomm__a2a_bad_t *b) {
    _Alignas(16) unsigned char out[HCOMM__LANE_MAX], in[HCOMM__LANE_MAX];
    uint64_t head[2] = {v->scounts[to], v->rcounts[to]};
    memcpy(out + HCOMM__LANE_HDR, head, sizeof head);
    if (head[0])
        memcpy(out + HCOMM__LANE_HDR + sizeof head, hcomm__a2a_sblock(v, to), head[0]);
    hcomm__env_t env = {.kind = HCOMM__ENV_DATA};
    size_t got = 0;
    HCOMM__TRY(hcomm__lane_step(x->c, (uint32_t)x->tag, &x->desc.sig, to, out,
                                sizeof head + head[0], from, in, HCOMM__LANE_MAX - HCOMM__LANE_HDR,
                                &env.sig, &got));
    HCOMM__TRY(x->check(x, from, &env));
    memcpy(head, in + HCOMM__LANE_HDR, sizeof head);
    if (got < sizeof head || got != sizeof head + head[0])
        head[0] = got; /* a short message: no block of the size it claims */
    if (hcomm__a2a_check_pair(x, v, from, head[0], head[1], b) && head[0])
        memcpy(hcomm__a2a_rblock(v, from), in + HCOMM__LANE_HDR + sizeof head, head[0]);
    return HCOMM_OK;
}

hcomm_result_t hcomm__a2a_pairwise_over(const hcomm__xfer_t *x, const hcomm__a2a_t *v,
                                        const int *ranks, int n, int me, hcomm__a2a_bad_t *b) {
    for (int s = 1; s < n; s++) {
        int to = ranks[(me + s) % n], from = ranks[(me - s + n) % n];
        if (v->lane) {
            HCOMM__TRY(lane_swap(x, v, to, from, b));
            continue;
        }
        hcomm__env_t env;
        HCOMM__TRY(hcomm__a2a_swap(x, to, hcomm__a2a_sblock(v, to), v->scounts[to], v->rcounts[to],
                                   from, hcomm__a2a_rblock(v, from), v->rcounts[from], false, &env,
                                   NULL));
        hcomm__a2a_check_pair(x, v, from, env.bytes, (uint64_t)env.shape[0], b);
    }
    return HCOMM_OK;
}

static int *identity(int p) {
    int *r = malloc(sizeof(int) * (size_t)p);
    for (int i = 0; r && i < p; i++)
        r[i] = i;
    return r;
}

hcomm_result_t hcomm__a2a_pairwise(const hcomm__xfer_t *x, const hcomm__a2a_t *v) {
    hcomm__a2a_bad_t b = {0};
    int *all = identity(x->c->size);
    if (!all)
        return hcomm__a2a_nomem(x, sizeof(int) * (size_t)x->c->size);
    hcomm__a2a_self_copy(x, v, &b);
    hcomm_result_t res = hcomm__a2a_pairwise_over(x, v, all, x->c->size, x->c->rank, &b);
    free(all);
    return res != HCOMM_OK ? res : hcomm__a2a_verdict(x, &b);
}

/* --- bruck: scratch block j holds the block for rank me + j (then from rank me - j) --- */

typedef struct blk {
    const char *data;
    uint64_t len, expect; /* its bytes; what its sender expects back from its receiver */
} blk_t;

/* The blocks whose index has bit dist: a header of (len, expect) pairs, then their bytes. */
static char *bruck_pack(const blk_t *b, int p, int dist, size_t *bytes) {
    size_t n = 0, data = 0;
    for (int j = 1; j < p; j++)
        if (j & dist)
            n++, data += b[j].len;
    char *out = malloc(16 * n + data + 1), *d = out + 16 * n;
    uint64_t *hdr = (uint64_t *)out;
    for (int j = 1; out && j < p; j++)
        if (j & dist) {
            *hdr++ = b[j].len;
            *hdr++ = b[j].expect;
            if (b[j].len)
                memcpy(d, b[j].data, b[j].len);
            d += b[j].len;
        }
    *bytes = 16 * n + data;
    return out;
}

/* Points the blocks with bit dist at the received message's pieces. */
static hcomm_result_t bruck_unpack(const hcomm__xfer_t *x, blk_t *b, int p, int dist,
                                   const char *msg, size_t bytes, int from) {
    size_t n = 0, data = 0;
    for (int j = 1; j < p; j++)
        n += (j & dist) != 0;
    const uint64_t *hdr = (const uint64_t *)msg;
    for (size_t i = 0; i < n && 16 * n <= bytes; i++)
        data += hdr[2 * i];
    if (16 * n > bytes || data != bytes - 16 * n)
        return hcomm__err(HCOMM_ERR_INTERNAL, x->c->call_fn,
                          "malformed bruck message of %zu bytes from rank %d", bytes, from);
    const char *d = msg + 16 * n;
    for (int j = 1; j < p; j++)
        if (j & dist) {
            b[j] = (blk_t){d, hdr[0], hdr[1]};
            d += hdr[0];
            hdr += 2;
        }
    return HCOMM_OK;
}

static hcomm_result_t bruck_steps(const hcomm__xfer_t *x, blk_t *b, void **held) {
    int p = x->c->size, me = x->c->rank;
    for (int dist = 1, k = 0; dist < p; dist <<= 1, k++) {
        size_t sbytes;
        char *out = bruck_pack(b, p, dist, &sbytes);
        if (!out)
            return hcomm__a2a_nomem(x, sbytes);
        hcomm__env_t env;
        int from = (me - dist + p) % p;
        hcomm_result_t res = hcomm__a2a_swap(x, (me + dist) % p, out, sbytes, 0, from, NULL, 0,
                                             true, &env, &held[k]);
        free(out);
        HCOMM__TRY(res);
        HCOMM__TRY(bruck_unpack(x, b, p, dist, held[k], (size_t)env.bytes, from));
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm__a2a_bruck(const hcomm__xfer_t *x, const hcomm__a2a_t *v) {
    int p = x->c->size, me = x->c->rank;
    blk_t *b = malloc(sizeof(blk_t) * (size_t)p);
    void **held = calloc(64, sizeof(void *)); /* one received message per step */
    if (!b || !held) {
        free(b);
        free(held);
        return hcomm__a2a_nomem(x, sizeof(blk_t) * (size_t)p);
    }
    for (int j = 0; j < p; j++) {
        int d = (me + j) % p;
        b[j] = (blk_t){hcomm__a2a_sblock(v, d), v->scounts[d], v->rcounts[d]};
    }
    hcomm__a2a_bad_t bad = {0};
    hcomm_result_t res = bruck_steps(x, b, held);
    for (int j = 0; res == HCOMM_OK && j < p; j++) {
        int src = (me - j + p) % p;
        if (hcomm__a2a_check_pair(x, v, src, b[j].len, b[j].expect, &bad) && b[j].len)
            memcpy(hcomm__a2a_rblock(v, src), b[j].data, b[j].len);
    }
    for (int k = 0; k < 64; k++)
        free(held[k]);
    free(held);
    free(b);
    return res != HCOMM_OK ? res : hcomm__a2a_verdict(x, &bad);
}

/* --- direct: read each block from its sender's buffer --- */

typedef struct desc {
    hcomm__peer_buf_t block; /* the block for the receiver in the sender's memory */
    uint64_t len, expect;
} desc_t;

/* Every peer's descriptor of its block for this rank: all receives posted, then the sends. */
static hcomm_result_t exchange_descs(const hcomm__xfer_t *x, const desc_t *mine, desc_t *theirs,
                                     hcomm__req_t **reqs) {
    int p = x->c->size, me = x->c->rank;
    hcomm_result_t res = HCOMM_OK;
    for (int q = 0; q < p && res == HCOMM_OK; q++)
        if (q != me)
            res = hcomm__irecv(x->c, HCOMM__CH_COLL, x->tag, q, &theirs[q], sizeof *theirs,
                               HCOMM__RECV_EXACT, &reqs[q]);
    for (int q = 0; q < p && res == HCOMM_OK; q++)
        if (q != me)
            res = hcomm__isend(x->c, HCOMM__CH_COLL, x->tag, q, &mine[q], sizeof *mine, &x->desc,
                               &reqs[p + q]);
    for (int q = 0; q < p; q++) {
        hcomm__env_t env = {0};
        hcomm_result_t r = reqs[q] ? hcomm__wait(reqs[q], &env, NULL) : HCOMM_OK;
        reqs[q] = NULL;
        if (env.kind == HCOMM__ENV_DATA && (r == HCOMM_OK || r == HCOMM_ERR_MISMATCH)) {
            hcomm_result_t sig = x->check(x, q, &env);
            r = sig != HCOMM_OK ? sig : r;
        }
        res = res != HCOMM_OK ? res : r;
    }
    hcomm_result_t s = hcomm__wait_all(reqs + p, p);
    return res != HCOMM_OK ? res : s;
}

static hcomm_result_t read_blocks(const hcomm__xfer_t *x, const hcomm__a2a_t *v,
                                  const desc_t *theirs, hcomm__a2a_bad_t *b) {
    int p = x->c->size, me = x->c->rank;
    for (int s = 1; s < p; s++) {
        int q = (me + s) % p; /* staggered: the ranks do not all read rank 0 first */
        if (hcomm__a2a_check_pair(x, v, q, theirs[q].len, theirs[q].expect, b) && theirs[q].len) {
            hcomm__remote_t from = hcomm__x_remote(x, q, &theirs[q].block, theirs[q].len);
            HCOMM__TRY(hcomm__x_peer_copy(x, q, &from, 0, hcomm__a2a_rblock(v, q), theirs[q].len));
        }
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm__a2a_direct(const hcomm__xfer_t *x, const hcomm__a2a_t *v) {
    size_t p = (size_t)x->c->size;
    desc_t *d = malloc(2 * p * sizeof *d);
    hcomm__req_t **reqs = calloc(2 * p, sizeof *reqs);
    hcomm_result_t res = d && reqs ? HCOMM_OK : hcomm__a2a_nomem(x, 2 * p * sizeof *d);
    hcomm__a2a_bad_t b = {0};
    for (size_t q = 0; res == HCOMM_OK && q < p; q++) {
        d[q] = (desc_t){.len = v->scounts[q], .expect = v->rcounts[q]};
        hcomm__x_export(x, hcomm__a2a_sblock(v, (int)q), v->scounts[q], &d[q].block);
    }
    if (res == HCOMM_OK)
        res = exchange_descs(x, d, d + p, reqs);
    if (res == HCOMM_OK) {
        hcomm__a2a_self_copy(x, v, &b);
        res = hcomm__x_tell_peers(x, read_blocks(x, v, d + p, &b));
    }
    if (res == HCOMM_OK)
        res = hcomm__x_release_all(x); /* every rank has read its blocks */
    free(reqs);
    free(d);
    return res != HCOMM_OK ? res : hcomm__a2a_verdict(x, &b);
}

/* A 32-bit digest of the pair (s -> d, n bytes). */
static int64_t pair_digest(int s, int d, size_t n) {
    uint64_t h = ((uint64_t)(uint32_t)s << 32 | (uint32_t)d) * 0x9E3779B97F4A7C15ull ^ n;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return (int64_t)((h ^ (h >> 29)) >> 32);
}

/* The bit length of a block size, capped at what the agreement's terms hold. */
static int bit_length(size_t most) {
    int bits = 0;
    while (bits < HCOMM__A2A_BITS - 1 && most >> bits)
        bits++;
    return bits;
}

/* The largest block rounded down to a power of two, as hcomm__a2a_largest gives it. */
static size_t round_largest(size_t most) {
    int bits = bit_length(most);
    return bits ? (size_t)1 << (bits - 1) : 0;
}

/* The pair's message: this rank's counts to and from the peer and to itself, and its largest
 * block, then the block for the peer when it fits. */
enum { PAIR_TO, PAIR_FROM, PAIR_SELF_S, PAIR_SELF_R, PAIR_MOST, PAIR_WIDE, PAIR_WORDS };

/* The lowest (receiver, sender) pair whose counts differ, as the agreement's diagnosis names
 * it; both ranks hold all four counts, so both name the same. */
static hcomm_result_t pair_verdict(const hcomm__xfer_t *x, const uint64_t *mine,
                                   const uint64_t *theirs) {
    int me = x->c->rank;
    const uint64_t *w[2] = {me == 0 ? mine : theirs, me == 0 ? theirs : mine};
    hcomm__a2a_bad_t b = {0};
    for (int r = 0; r < 2; r++) {
        if (w[r][PAIR_SELF_S] != w[r][PAIR_SELF_R])
            note(&b, r, r, w[r][PAIR_SELF_S], w[r][PAIR_SELF_R]);
        if (w[1 - r][PAIR_TO] != w[r][PAIR_FROM]) /* 1 - r sends to r */
            note(&b, r, 1 - r, w[1 - r][PAIR_TO], w[r][PAIR_FROM]);
    }
    return hcomm__a2a_verdict_as(x, &b, "no data was moved");
}

hcomm_result_t hcomm__a2a_pair(const hcomm__xfer_t *x, const hcomm__a2a_t *v, size_t *largest,
                               bool *wide_any, bool *done) {
    enum { HEAD = PAIR_WORDS * sizeof(uint64_t) };
    _Alignas(16) unsigned char out[HCOMM__LANE_MAX], in[HCOMM__LANE_MAX];
    int me = x->c->rank, peer = 1 - me;
    size_t room = HCOMM__LANE_MAX - HCOMM__LANE_HDR - HEAD, got = 0;
    uint64_t mine[PAIR_WORDS] = {v->scounts[peer],
                                 v->rcounts[peer],
                                 v->scounts[me],
                                 v->rcounts[me],
                                 0,
                                 hcomm__a2a_wide(v, 2)},
             theirs[PAIR_WORDS];
    for (int i = 0; i < PAIR_MOST; i++)
        mine[PAIR_MOST] = mine[i] > mine[PAIR_MOST] ? mine[i] : mine[PAIR_MOST];
    memcpy(out + HCOMM__LANE_HDR, mine, HEAD);
    size_t inline_bytes = mine[PAIR_TO] <= room ? mine[PAIR_TO] : 0;
    if (inline_bytes)
        memcpy(out + HCOMM__LANE_HDR + HEAD, hcomm__a2a_sblock(v, peer), inline_bytes);
    hcomm__env_t env = {.kind = HCOMM__ENV_DATA};
    HCOMM__TRY(hcomm__lane_step(x->c, (uint32_t)x->tag, &x->desc.sig, peer, out,
                                HEAD + inline_bytes, peer, in, HCOMM__LANE_MAX - HCOMM__LANE_HDR,
                                &env.sig, &got));
    HCOMM__TRY(x->check(x, peer, &env));
    if (got < HEAD)
        return hcomm__err(HCOMM_ERR_MISMATCH, x->c->call_fn,
                          "rank %d sent a %zu-byte count message, not %d bytes", peer, got,
                          (int)HEAD);
    memcpy(theirs, in + HCOMM__LANE_HDR, HEAD);
    HCOMM__TRY(pair_verdict(x, mine, theirs));
    size_t most = mine[PAIR_MOST] > theirs[PAIR_MOST] ? mine[PAIR_MOST] : theirs[PAIR_MOST];
    *largest = round_largest(most);
    *wide_any = mine[PAIR_WIDE] || theirs[PAIR_WIDE];
    *done = mine[PAIR_TO] <= room && theirs[PAIR_TO] <= room;
    if (*done && got != HEAD + theirs[PAIR_TO])
        return hcomm__err(HCOMM_ERR_MISMATCH, x->c->call_fn,
                          "rank %d sent %zu bytes, not the %llu it announced", peer, got - HEAD,
                          (unsigned long long)theirs[PAIR_TO]);
    if (*done && v->rcounts[me])
        memcpy(hcomm__a2a_rblock(v, me), hcomm__a2a_sblock(v, me), v->rcounts[me]);
    if (*done && v->rcounts[peer])
        memcpy(hcomm__a2a_rblock(v, peer), in + HCOMM__LANE_HDR + HEAD, v->rcounts[peer]);
    return HCOMM_OK;
}

static bool wide(size_t count, size_t displ) {
    return count > 0 && (count > INT_MAX || displ > INT_MAX);
}

bool hcomm__a2a_wide(const hcomm__a2a_t *v, int p) {
    for (int q = 0; q < p; q++)
        if (wide(v->scounts[q], v->sdispls[q]) || wide(v->rcounts[q], v->rdispls[q]))
            return true;
    return false;
}

void hcomm__a2a_terms(const hcomm__a2a_t *v, int p, int me, int64_t *t) {
    size_t most = 0;
    memset(t, 0, sizeof(int64_t) * HCOMM__A2A_AGREE);
    for (int q = 0; q < p; q++) {
        t[0] += pair_digest(me, q, v->scounts[q]) - pair_digest(q, me, v->rcounts[q]);
        most = v->scounts[q] > most ? v->scounts[q] : most;
        most = v->rcounts[q] > most ? v->rcounts[q] : most;
    }
    t[1 + bit_length(most)] = 1;
    t[HCOMM__A2A_WIDE] = hcomm__a2a_wide(v, p);
}

size_t hcomm__a2a_largest(const int64_t *sums) {
    int bits = HCOMM__A2A_BITS - 1;
    while (bits > 0 && sums[1 + bits] == 0)
        bits--;
    return bits ? (size_t)1 << (bits - 1) : 0;
}
