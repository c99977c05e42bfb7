/* all_to_allv algorithms over p2p (see a2a.h). */
#include "algo/a2a.h"

#include "algo/select.h"
#include "topo/topo.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first count mismatch this rank saw, lowest (receiver, sender) first. */
typedef struct bad {
    bool set;
    int receiver, sender;
    size_t sent, expected;
} bad_t;

static void note(bad_t *b, int receiver, int sender, size_t sent, size_t expected) {
    if (b->set && (b->receiver < receiver || (b->receiver == receiver && b->sender < sender)))
        return;
    *b = (bad_t){true, receiver, sender, sent, expected};
}

/* A block from `from` arrived with sent bytes and what `from` expects back (their_expect):
 * both directions of the pair checked against this rank's counts. True when it may land. */
static bool check_pair(const hcomm__xfer_t *x, const hcomm__a2a_t *v, int from, uint64_t sent,
                       uint64_t their_expect, bad_t *b) {
    int me = x->c->rank;
    if (their_expect != v->scounts[from])
        note(b, from, me, v->scounts[from], (size_t)their_expect);
    if (sent == v->rcounts[from])
        return true;
    note(b, me, from, (size_t)sent, v->rcounts[from]);
    return false;
}

/* what: what happened to the data ("that block was not moved", "no data was moved"). */
static hcomm_result_t verdict_as(const hcomm__xfer_t *x, const bad_t *b, const char *what) {
    if (!b->set)
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_MISMATCH, x->c->call_fn,
                      "sendcounts[%d]=%zu on rank %d but recvcounts[%d]=%zu on rank %d; %s",
                      b->receiver, b->sent, b->sender, b->sender, b->expected, b->receiver, what);
}

static hcomm_result_t verdict(const hcomm__xfer_t *x, const bad_t *b) {
    return verdict_as(x, b, "that block was not moved");
}

static const char *sblock(const hcomm__a2a_t *v, int peer) {
    return v->scounts[peer] ? v->send + v->sdispls[peer] : NULL;
}

static char *rblock(const hcomm__a2a_t *v, int peer) {
    return v->rcounts[peer] ? v->recv + v->rdispls[peer] : NULL;
}

static void self_copy(const hcomm__xfer_t *x, const hcomm__a2a_t *v, bad_t *b) {
    int me = x->c->rank;
    if (check_pair(x, v, me, v->scounts[me], v->rcounts[me], b) && v->rcounts[me])
        memcpy(rblock(v, me), sblock(v, me), v->rcounts[me]);
}

static hcomm_result_t nomem(const hcomm__xfer_t *x, size_t bytes) {
    return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes of scratch",
                      bytes);
}

/* Receives from `from` into buf (exactly cap bytes; any size when alloc: a malloc'd buffer
 * in *got, sized from a probe, since p2p's own would map fresh pages per message) and checks
 * the sender's signature. A size other than cap is no error here: env tells the caller,
 * which checks the counts (nothing landed). */
static hcomm_result_t recv_msg(const hcomm__xfer_t *x, int from, void *buf, size_t cap, bool alloc,
                               hcomm__env_t *env, void **got) {
    memset(env, 0, sizeof *env);
    if (alloc) {
        HCOMM__TRY(hcomm__probe(x->c, HCOMM__CH_COLL, x->tag, from, env));
        cap = (size_t)env->bytes;
        buf = *got = malloc(cap + 1);
        if (!buf)
            return nomem(x, cap);
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

/* Sends bytes to `to` with expect in the envelope, and receives from `from` as recv_msg. */
static hcomm_result_t swap(const hcomm__xfer_t *x, int to, const void *sbuf, size_t sbytes,
                           uint64_t expect, int from, void *rbuf, size_t rcap, bool alloc,
                           hcomm__env_t *env, void **got) {
    hcomm__env_t desc = x->desc;
    desc.shape[0] = (int64_t)expect;
    hcomm__req_t *s = NULL;
    HCOMM__TRY(hcomm__isend(x->c, HCOMM__CH_COLL, x->tag, to, sbuf, sbytes, &desc, &s));
    hcomm_result_t res = recv_msg(x, from, rbuf, rcap, alloc, env, got);
    hcomm_result_t sres = hcomm__wait(s, NULL, NULL);
    return res != HCOMM_OK ? res : sres;
}

/* --- pairwise, over the ranks of a group (all of them, or one node's) --- */

/* One pairwise step on the lane: the block to `to` after its (size, what this rank expects
 * back) pair, the block from `from` likewise; the sizes travel, so a mismatch is found on
 * both ranks of the pair, as on p2p. */
static hcomm_result_t lane_swap(const hcomm__xfer_t *x, const hcomm__a2a_t *v, int to, int from,
                                bad_t *b) {
    _Alignas(16) unsigned char out[HCOMM__LANE_MAX], in[HCOMM__LANE_MAX];
    uint64_t head[2] = {v->scounts[to], v->rcounts[to]};
    memcpy(out + HCOMM__LANE_HDR, head, sizeof head);
    if (head[0])
        memcpy(out + HCOMM__LANE_HDR + sizeof head, sblock(v, to), head[0]);
    hcomm__env_t env = {.kind = HCOMM__ENV_DATA};
    size_t got = 0;
    HCOMM__TRY(hcomm__lane_step(x->c, (uint32_t)x->tag, &x->desc.sig, to, out,
                                sizeof head + head[0], from, in, HCOMM__LANE_MAX - HCOMM__LANE_HDR,
                                &env.sig, &got));
    HCOMM__TRY(x->check(x, from, &env));
    memcpy(head, in + HCOMM__LANE_HDR, sizeof head);
    if (got < sizeof head || got != sizeof head + head[0])
        head[0] = got; /* a short message: no block of the size it claims */
    if (check_pair(x, v, from, head[0], head[1], b) && head[0])
        memcpy(rblock(v, from), in + HCOMM__LANE_HDR + sizeof head, head[0]);
    return HCOMM_OK;
}

static hcomm_result_t pairwise_over(const hcomm__xfer_t *x, const hcomm__a2a_t *v, const int *ranks,
                                    int n, int me, bad_t *b) {
    for (int s = 1; s < n; s++) {
        int to = ranks[(me + s) % n], from = ranks[(me - s + n) % n];
        if (v->lane) {
            HCOMM__TRY(lane_swap(x, v, to, from, b));
            continue;
        }
        hcomm__env_t env;
        HCOMM__TRY(swap(x, to, sblock(v, to), v->scounts[to], v->rcounts[to], from, rblock(v, from),
                        v->rcounts[from], false, &env, NULL));
        check_pair(x, v, from, env.bytes, (uint64_t)env.shape[0], b);
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
    bad_t b = {0};
    int *all = identity(x->c->size);
    if (!all)
        return nomem(x, sizeof(int) * (size_t)x->c->size);
    self_copy(x, v, &b);
    hcomm_result_t res = pairwise_over(x, v, all, x->c->size, x->c->rank, &b);
    free(all);
    return res != HCOMM_OK ? res : verdict(x, &b);
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
            return nomem(x, sbytes);
        hcomm__env_t env;
        int from = (me - dist + p) % p;
        hcomm_result_t res =
            swap(x, (me + dist) % p, out, sbytes, 0, from, NULL, 0, true, &env, &held[k]);
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
        return nomem(x, sizeof(blk_t) * (size_t)p);
    }
    for (int j = 0; j < p; j++) {
        int d = (me + j) % p;
        b[j] = (blk_t){sblock(v, d), v->scounts[d], v->rcounts[d]};
    }
    bad_t bad = {0};
    hcomm_result_t res = bruck_steps(x, b, held);
    for (int j = 0; res == HCOMM_OK && j < p; j++) {
        int src = (me - j + p) % p;
        if (check_pair(x, v, src, b[j].len, b[j].expect, &bad) && b[j].len)
            memcpy(rblock(v, src), b[j].data, b[j].len);
    }
    for (int k = 0; k < 64; k++)
        free(held[k]);
    free(held);
    free(b);
    return res != HCOMM_OK ? res : verdict(x, &bad);
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

/* Every rank has posted its descriptors and read its blocks (xfer.c's barrier over the comm). */
static hcomm_result_t barrier(const hcomm__xfer_t *x) {
    hcomm__group_t g = hcomm__x_everyone(x);
    return hcomm__x_barrier(x, &g);
}

static hcomm_result_t read_blocks(const hcomm__xfer_t *x, const hcomm__a2a_t *v,
                                  const desc_t *theirs, bad_t *b) {
    int p = x->c->size, me = x->c->rank;
    for (int s = 1; s < p; s++) {
        int q = (me + s) % p; /* staggered: the ranks do not all read rank 0 first */
        if (check_pair(x, v, q, theirs[q].len, theirs[q].expect, b) && theirs[q].len) {
            hcomm__remote_t from = hcomm__x_remote(x, q, &theirs[q].block, theirs[q].len);
            HCOMM__TRY(hcomm__x_peer_copy(x, q, &from, 0, rblock(v, q), theirs[q].len));
        }
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm__a2a_direct(const hcomm__xfer_t *x, const hcomm__a2a_t *v) {
    size_t p = (size_t)x->c->size;
    desc_t *d = malloc(2 * p * sizeof *d);
    hcomm__req_t **reqs = calloc(2 * p, sizeof *reqs);
    hcomm_result_t res = d && reqs ? HCOMM_OK : nomem(x, 2 * p * sizeof *d);
    bad_t b = {0};
    for (size_t q = 0; res == HCOMM_OK && q < p; q++) {
        d[q] = (desc_t){.len = v->scounts[q], .expect = v->rcounts[q]};
        hcomm__x_export(x, sblock(v, (int)q), v->scounts[q], &d[q].block);
    }
    if (res == HCOMM_OK)
        res = exchange_descs(x, d, d + p, reqs);
    if (res == HCOMM_OK) {
        self_copy(x, v, &b);
        res = hcomm__x_tell_peers(x, read_blocks(x, v, d + p, &b));
    }
    if (res == HCOMM_OK)
        res = barrier(x);
    free(reqs);
    free(d);
    return res != HCOMM_OK ? res : verdict(x, &b);
}

/* --- hier: bundles of self-describing records between a node's ranks and its leader --- */

typedef struct rec {
    int32_t src, dst;
    uint64_t len, expect;
} rec_t;

typedef struct bundle {
    char *p;
    size_t n, cap;
    bool failed;
} bundle_t;

static void put(bundle_t *u, const void *data, size_t bytes) {
    if (u->failed || bytes == 0)
        return;
    if (u->n + bytes > u->cap) {
        size_t cap = 2 * (u->n + bytes) + 256;
        char *np = realloc(u->p, cap);
        if (!np) {
            u->failed = true;
            return;
        }
        u->p = np, u->cap = cap;
    }
    memcpy(u->p + u->n, data, bytes);
    u->n += bytes;
}

static void put_rec(bundle_t *u, const rec_t *r, const void *data) {
    put(u, r, sizeof *r);
    put(u, data, (size_t)r->len);
}

/* The record at *off of msg (bytes long), advancing *off; false at the end or if malformed. */
static bool next_rec(const char *msg, size_t bytes, size_t *off, rec_t *r, const char **data) {
    if (*off + sizeof *r > bytes)
        return false;
    memcpy(r, msg + *off, sizeof *r);
    if (r->len > bytes - *off - sizeof *r)
        return false;
    *data = msg + *off + sizeof *r;
    *off += sizeof *r + (size_t)r->len;
    return true;
}

/* Appends the records of msg whose destination is on node `node` (or is rank `rank`). */
static void pick(bundle_t *out, const hcomm__topo_t *t, const char *msg, size_t bytes, int node,
                 int rank) {
    rec_t r;
    const char *data;
    for (size_t off = 0; next_rec(msg, bytes, &off, &r, &data);)
        if (rank >= 0 ? r.dst == rank : t->node[r.dst] == node)
            put_rec(out, &r, data);
}

/* Lands the records of a bundle addressed to this rank. */
static void deliver(const hcomm__xfer_t *x, const hcomm__a2a_t *v, const char *msg, size_t bytes,
                    bad_t *b) {
    rec_t r;
    const char *data;
    for (size_t off = 0; next_rec(msg, bytes, &off, &r, &data);)
        if (r.dst == x->c->rank && r.src >= 0 && r.src < x->c->size &&
            check_pair(x, v, r.src, r.len, r.expect, b) && r.len)
            memcpy(rblock(v, r.src), data, (size_t)r.len);
}

/* Messages a leader gathers: its members' bundles, then the other leaders'. */
typedef struct inbox {
    void **msg;
    size_t *bytes;
    int n;
} inbox_t;

static hcomm_result_t recv_into(const hcomm__xfer_t *x, int from, inbox_t *in) {
    hcomm__env_t env;
    HCOMM__TRY(recv_msg(x, from, NULL, 0, true, &env, &in->msg[in->n]));
    in->bytes[in->n++] = (size_t)env.bytes;
    return HCOMM_OK;
}

static hcomm_result_t send_bundle(const hcomm__xfer_t *x, int to, const bundle_t *u) {
    if (u->failed)
        return nomem(x, u->cap);
    return hcomm__x_send(x, to, u->p, u->n);
}

/* This rank's blocks for ranks off its node, as one bundle. */
static void own_offnode(const hcomm__xfer_t *x, const hcomm__a2a_t *v, const hcomm__topo_t *t,
                        bundle_t *u) {
    int me = x->c->rank;
    for (int d = 0; d < t->size; d++)
        if (t->node[d] != t->node[me]) {
            rec_t r = {me, d, v->scounts[d], v->rcounts[d]};
            put_rec(u, &r, sblock(v, d));
        }
}

/* Swaps with rank peer of node `to` (receiving from rank from) one bundle of the records of
 * in's first n messages bound for node to; the message received joins in. */
static hcomm_result_t swap_node_bundle(const hcomm__xfer_t *x, const hcomm__topo_t *t, inbox_t *in,
                                       int n, int to, int peer, int from) {
    bundle_t u = {0};
    for (int i = 0; i < n; i++)
        pick(&u, t, in->msg[i], in->bytes[i], to, -1);
    hcomm__env_t env;
    hcomm_result_t res =
        u.failed ? nomem(x, u.cap)
                 : swap(x, peer, u.p, u.n, 0, from, NULL, 0, true, &env, &in->msg[in->n]);
    free(u.p);
    HCOMM__TRY(res);
    in->bytes[in->n++] = (size_t)env.bytes;
    return HCOMM_OK;
}

/* An inbox for cap messages (freed with inbox_free, its messages too). */
static inbox_t inbox_new(size_t cap) {
    return (inbox_t){calloc(cap, sizeof(void *)), calloc(cap, sizeof(size_t)), 0};
}

static void inbox_free(inbox_t *in) {
    for (int i = 0; in->msg && i < in->n; i++)
        free(in->msg[i]);
    free(in->msg);
    free(in->bytes);
}

/* The leader's part: gather the node's outgoing bundles, swap one bundle with each other
 * node's leader, and hand each rank of the node what came for it. */
static hcomm_result_t lead(const hcomm__xfer_t *x, const hcomm__a2a_t *v, const hcomm__topo_t *t,
                           inbox_t *in, bad_t *b) {
    int me = x->c->rank, a = t->node[me], first = t->node_off[a], G = t->node_off[a + 1] - first;
    int N = t->nnodes, gathered;
    for (int i = 1; i < G; i++)
        HCOMM__TRY(recv_into(x, t->members[first + i], in));
    gathered = in->n;
    for (int s = 1; s < N; s++) {
        int to = (a + s) % N, from = (a - s + N) % N;
        HCOMM__TRY(swap_node_bundle(x, t, in, gathered, to, t->members[t->node_off[to]],
                                    t->members[t->node_off[from]]));
    }
    for (int i = 0; i < G; i++) {
        int m = t->members[first + i];
        bundle_t u = {0};
        for (int k = gathered; k < in->n; k++)
            pick(&u, t, in->msg[k], in->bytes[k], -1, m);
        hcomm_result_t res = HCOMM_OK;
        if (m == me)
            deliver(x, v, u.p, u.n, b);
        else
            res = send_bundle(x, m, &u);
        free(u.p);
        HCOMM__TRY(res);
    }
    return HCOMM_OK;
}

static hcomm_result_t hier_offnode(const hcomm__xfer_t *x, const hcomm__a2a_t *v,
                                   const hcomm__topo_t *t, bad_t *b) {
    int me = x->c->rank, leader = t->members[t->node_off[t->node[me]]];
    inbox_t in = inbox_new((size_t)t->max_node + (size_t)t->nnodes);
    bundle_t own = {0};
    own_offnode(x, v, t, &own);
    hcomm_result_t res = in.msg && in.bytes && !own.failed ? HCOMM_OK : nomem(x, own.cap);
    if (res == HCOMM_OK && me == leader) {
        in.msg[0] = own.p, in.bytes[0] = own.n, in.n = 1;
        own.p = NULL;
        res = lead(x, v, t, &in, b);
    } else if (res == HCOMM_OK) {
        res = send_bundle(x, leader, &own);
        if (res == HCOMM_OK)
            res = recv_into(x, leader, &in);
        if (res == HCOMM_OK)
            deliver(x, v, in.msg[0], in.bytes[0], b);
    }
    inbox_free(&in);
    free(own.p);
    return res;
}

/* This rank's blocks for every rank whose local rank is l (on any node), as one bundle. */
static void own_for_rail(const hcomm__xfer_t *x, const hcomm__a2a_t *v, const hcomm__topo_t *t,
                         int l, bundle_t *u) {
    int me = x->c->rank;
    for (int d = 0; d < t->size; d++)
        if (t->local[d] == l) {
            rec_t r = {me, d, v->scounts[d], v->rcounts[d]};
            put_rec(u, &r, sblock(v, d));
        }
}

/* Rails (every node has G ranks): within the node, local rank l collects every block of the
 * node bound for local rank l of any node (G - 1 steps); then local rank l of each node swaps
 * with local rank l of every other node one bundle of the G x G blocks between the two
 * nodes on that rail (N - 1 steps). Every rank drives its own inter-node messages. */
static hcomm_result_t hier_rails(const hcomm__xfer_t *x, const hcomm__a2a_t *v,
                                 const hcomm__topo_t *t, inbox_t *in, bad_t *b) {
    int me = x->c->rank, a = t->node[me], l = t->local[me], G = t->max_node, N = t->nnodes;
    int first = t->node_off[a];
    for (int s = 0; s < G; s++) {
        int to = t->members[first + (l + s) % G], from = t->members[first + (l - s + G) % G];
        bundle_t u = {0};
        own_for_rail(x, v, t, t->local[to], &u);
        hcomm__env_t env;
        hcomm_result_t res = u.failed ? nomem(x, u.cap) : HCOMM_OK;
        if (res == HCOMM_OK && s == 0)
            in->msg[in->n] = u.p, in->bytes[in->n++] = u.n, u.p = NULL;
        else if (res == HCOMM_OK)
            res = swap(x, to, u.p, u.n, 0, from, NULL, 0, true, &env, &in->msg[in->n]);
        if (res == HCOMM_OK && s > 0)
            in->bytes[in->n++] = (size_t)env.bytes;
        free(u.p);
        HCOMM__TRY(res);
    }
    for (int i = 0; i < G; i++)
        deliver(x, v, in->msg[i], in->bytes[i], b);
    for (int s = 1; s < N; s++) {
        int to = (a + s) % N, from = (a - s + N) % N;
        HCOMM__TRY(swap_node_bundle(x, t, in, G, to, t->members[t->node_off[to] + l],
                                    t->members[t->node_off[from] + l]));
        deliver(x, v, in->msg[in->n - 1], in->bytes[in->n - 1], b);
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm__a2a_hier(const hcomm__xfer_t *x, const hcomm__a2a_t *v) {
    hcomm__topo_t *t;
    HCOMM__TRY(hcomm__topo_get(x->c, &t));
    int me = x->c->rank, first = t->node_off[t->node[me]];
    bad_t b = {0};
    if (t->nnodes > 1 && t->min_node == t->max_node) { /* rails */
        size_t cap = (size_t)t->max_node + (size_t)t->nnodes;
        inbox_t in = inbox_new(cap);
        hcomm_result_t res = in.msg && in.bytes ? hier_rails(x, v, t, &in, &b) : nomem(x, cap);
        inbox_free(&in);
        return res != HCOMM_OK ? res : verdict(x, &b);
    }
    self_copy(x, v, &b);
    HCOMM__TRY(pairwise_over(x, v, t->members + first, t->node_off[t->node[me] + 1] - first,
                             t->local[me], &b));
    if (t->nnodes > 1)
        HCOMM__TRY(hier_offnode(x, v, t, &b));
    return verdict(x, &b);
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
    bad_t b = {0};
    for (int r = 0; r < 2; r++) {
        if (w[r][PAIR_SELF_S] != w[r][PAIR_SELF_R])
            note(&b, r, r, w[r][PAIR_SELF_S], w[r][PAIR_SELF_R]);
        if (w[1 - r][PAIR_TO] != w[r][PAIR_FROM]) /* 1 - r sends to r */
            note(&b, r, 1 - r, w[1 - r][PAIR_TO], w[r][PAIR_FROM]);
    }
    return verdict_as(x, &b, "no data was moved");
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
        memcpy(out + HCOMM__LANE_HDR + HEAD, sblock(v, peer), inline_bytes);
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
        memcpy(rblock(v, me), sblock(v, me), v->rcounts[me]);
    if (*done && v->rcounts[peer])
        memcpy(rblock(v, peer), in + HCOMM__LANE_HDR + HEAD, v->rcounts[peer]);
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

/* --- shm: one meeting on the board agrees, checks every pair and carries small blocks --- */

/* How a rank's blocks move: in its post, read by its peers where they lie, or (when some rank
 * can do neither well) by the backend's own call for everyone. */
enum { BY_POST, BY_READ, BY_NATIVE };

/* What a rank posts: this header, then its send counts, the offsets its blocks have (posted:
 * packed after the arrays, back to back in peer order; else its sdispls in its exported send
 * buffer) and its recv counts, p of each, then the packed blocks. */
typedef struct board_hdr {
    hcomm__peer_buf_t send; /* the send buffer, where its blocks are read */
    uint64_t extent;        /* bytes of it the blocks span */
    uint8_t by, wide, pad[6];
} board_hdr_t;

typedef struct board_post {
    board_hdr_t h;
    uint64_t sc, sd; /* the block for this rank: bytes, offset */
    const char *at;  /* the post, during the meeting */
} board_post_t;

static size_t board_arrays(int p) {
    return sizeof(board_hdr_t) + 3 * sizeof(uint64_t) * (size_t)p;
}

/* How the board's all_to_allv moves each rank's blocks: in the post where they fit (8 KiB
 * with 2 processes, above which a block read where it lies wins), else read where they lie
 * (staggered, so several peers do not read one buffer at once), else the backend's call
 * (docs/tuning.md: a2a.board). */
static int board_by(const hcomm__xfer_t *x, size_t total) {
    hcomm_comm_t *c = x->c;
    int p = c->size;
    if (total <= (p == 2 ? (size_t)8 << 10 : HCOMM__BOARD_ROOM - board_arrays(p)))
        return BY_POST;
    return c->tr->peer_read_ok && c->tr->peer_read_ok(c) ? BY_READ : BY_NATIVE;
}

/* This rank's post into space (HCOMM__BOARD_ROOM bytes). */
static void board_fill(const hcomm__xfer_t *x, const hcomm__a2a_t *v, void *space) {
    int p = x->c->size, me = x->c->rank;
    size_t total = 0, extent = 0, at = 0;
    for (int q = 0; q < p; q++) {
        total += q != me ? v->scounts[q] : 0; /* the own block is copied locally */
        if (v->scounts[q] && v->sdispls[q] + v->scounts[q] > extent)
            extent = v->sdispls[q] + v->scounts[q];
    }
    board_hdr_t *h = space;
    *h = (board_hdr_t){.extent = extent, .wide = hcomm__a2a_wide(v, p)};
    hcomm__x_export(x, v->send, extent, &h->send);
    h->by = (uint8_t)board_by(x, total);
    uint64_t *sc = (uint64_t *)(h + 1), *sd = sc + p, *rc = sd + p;
    char *data = (char *)(rc + p);
    for (int q = 0; q < p; q++) {
        sc[q] = v->scounts[q];
        rc[q] = v->rcounts[q];
        sd[q] = h->by == BY_POST && q != me ? at : v->sdispls[q];
        if (h->by != BY_POST || q == me)
            continue;
        if (v->scounts[q])
            memcpy(data + at, v->send + v->sdispls[q], v->scounts[q]);
        at += v->scounts[q];
    }
}

/* Every pair's counts from the posts: every rank finds the same lowest (receiver, sender);
 * else each rank keeps what it needs of each post (its block's size and offset). */
static hcomm_result_t board_read_posts(const hcomm__xfer_t *x, board_post_t *posts) {
    hcomm_comm_t *c = x->c;
    int p = c->size, me = c->rank;
    for (int q = 0; q < p; q++) {
        const void *at;
        hcomm__board_peer(c, q, NULL, &at);
        posts[q].at = at;
    }
    for (int r = 0; r < p; r++) { /* receiver */
        const uint64_t *rc = (const uint64_t *)((const board_hdr_t *)posts[r].at + 1) + 2 * p;
        for (int q = 0; q < p; q++) { /* sender */
            const uint64_t *sc = (const uint64_t *)((const board_hdr_t *)posts[q].at + 1);
            if (sc[r] != rc[q]) {
                bad_t b = {true, r, q, (size_t)sc[r], (size_t)rc[q]};
                return verdict_as(x, &b, "no data was moved");
            }
        }
    }
    for (int q = 0; q < p; q++) {
        const board_hdr_t *h = (const board_hdr_t *)posts[q].at;
        const uint64_t *sc = (const uint64_t *)(h + 1);
        posts[q].h = *h;
        posts[q].sc = sc[me];
        posts[q].sd = sc[p + me];
    }
    return HCOMM_OK;
}

/* The blocks this rank gets from the posts (during the meeting), and its own. */
static void board_copy_posted(const hcomm__xfer_t *x, const hcomm__a2a_t *v,
                              const board_post_t *posts) {
    int p = x->c->size, me = x->c->rank;
    for (int q = 0; q < p; q++)
        if (q != me && posts[q].h.by == BY_POST && posts[q].sc)
            memcpy(v->recv + v->rdispls[q], posts[q].at + board_arrays(p) + posts[q].sd,
                   posts[q].sc);
    if (v->scounts[me])
        memmove(v->recv + v->rdispls[me], v->send + v->sdispls[me], v->scounts[me]);
}

/* The blocks of the senders that did not post them, read where they lie. */
static hcomm_result_t board_reads(const hcomm__xfer_t *x, const hcomm__a2a_t *v,
                                  const board_post_t *posts) {
    int p = x->c->size;
    for (int d = 1; d < p; d++) {
        int q = (x->c->rank + d) % p; /* staggered: the ranks do not all read rank 0 first */
        if (posts[q].h.by != BY_READ || posts[q].sc == 0)
            continue;
        hcomm__remote_t from = hcomm__x_remote(x, q, &posts[q].h.send, posts[q].h.extent);
        HCOMM__TRY(
            hcomm__x_peer_copy(x, q, &from, posts[q].sd, v->recv + v->rdispls[q], posts[q].sc));
    }
    return HCOMM_OK;
}

/* The posts' verdict on how the call goes on: BY_NATIVE when any rank asked for it, else
 * BY_READ when any rank's blocks are to be read, else BY_POST. */
static int board_plan(const board_post_t *posts, int p, bool *wide) {
    int plan = BY_POST;
    *wide = false;
    for (int q = 0; q < p; q++) {
        plan = posts[q].h.by > plan ? posts[q].h.by : plan;
        *wide |= posts[q].h.wide != 0;
    }
    return plan;
}

hcomm_result_t hcomm__a2a_shm(const hcomm__xfer_t *x, const hcomm__a2a_t *v, int *fallback) {
    hcomm_comm_t *c = x->c;
    int p = c->size, plan = BY_POST;
    *fallback = -1;
    if (board_arrays(p) > HCOMM__BOARD_ROOM)
        return hcomm__err(HCOMM_ERR_UNSUPPORTED, c->call_fn,
                          "shm all_to_allv takes at most %d ranks",
                          (int)((HCOMM__BOARD_ROOM - sizeof(board_hdr_t)) / 24));
    _Alignas(16) board_post_t stack[16];
    board_post_t *posts = p <= 16 ? stack : malloc(sizeof *posts * (size_t)p);
    void *space = NULL;
    hcomm_result_t res =
        posts ? hcomm__board_space(c, (uint32_t)x->tag, HCOMM__BOARD_ROOM, &space)
              : hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for %d posts", p);
    if (res != HCOMM_OK) { /* the peers wait in the meeting: they fail with this instead */
        if (posts != stack)
            free(posts);
        return hcomm__x_tell_peers(x, res);
    }
    board_fill(x, v, space);
    res = x->meet(x, 0, -1, -1);
    if (res == HCOMM_OK) {
        res = board_read_posts(x, posts);
        bool wide = false;
        plan = res == HCOMM_OK ? board_plan(posts, p, &wide) : BY_POST;
        if (plan == BY_NATIVE) /* counts beyond an int: MPI's call cannot take them */
            *fallback = wide ? HCOMM__ALGO_PAIRWISE : HCOMM__ALGO_NATIVE;
        else if (res == HCOMM_OK)
            board_copy_posted(x, v, posts);
        hcomm__board_leave(c);
    }
    if (res == HCOMM_OK && plan == BY_READ) { /* a last meeting lets the senders return */
        hcomm_result_t got = board_reads(x, v, posts);
        if (got != HCOMM_OK)
            res = hcomm__x_tell_peers(x, got);
        else if ((res = x->meet(x, 1, -1, -1)) == HCOMM_OK)
            hcomm__board_leave(c);
    }
    if (posts != stack)
        free(posts);
    return res;
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
