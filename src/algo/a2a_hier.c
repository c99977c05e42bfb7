/* all_to_allv in two levels over the topology's nodes (see a2a.h). */
#include "algo/a2a.h"

#include "topo/topo.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
                    hcomm__a2a_bad_t *b) {
    rec_t r;
    const char *data;
    for (size_t off = 0; next_rec(msg, bytes, &off, &r, &data);)
        if (r.dst == x->c->rank && r.src >= 0 && r.src < x->c->size &&
            hcomm__a2a_check_pair(x, v, r.src, r.len, r.expect, b) && r.len)
            memcpy(hcomm__a2a_rblock(v, r.src), data, (size_t)r.len);
}

/* Messages a leader gathers: its members' bundles, then the other leaders'. */
typedef struct inbox {
    void **msg;
    size_t *bytes;
    int n;
} inbox_t;

static hcomm_result_t recv_into(const hcomm__xfer_t *x, int from, inbox_t *in) {
    hcomm__env_t env;
    HCOMM__TRY(hcomm__a2a_recv_msg(x, from, NULL, 0, true, &env, &in->msg[in->n]));
    in->bytes[in->n++] = (size_t)env.bytes;
    return HCOMM_OK;
}

static hcomm_result_t send_bundle(const hcomm__xfer_t *x, int to, const bundle_t *u) {
    if (u->failed)
        return hcomm__a2a_nomem(x, u->cap);
    return hcomm__x_send(x, to, u->p, u->n);
}

/* This rank's blocks for ranks off its node, as one bundle. */
static void own_offnode(const hcomm__xfer_t *x, const hcomm__a2a_t *v, const hcomm__topo_t *t,
                        bundle_t *u) {
    int me = x->c->rank;
    for (int d = 0; d < t->size; d++)
        if (t->node[d] != t->node[me]) {
            rec_t r = {me, d, v->scounts[d], v->rcounts[d]};
            put_rec(u, &r, hcomm__a2a_sblock(v, d));
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
    hcomm_result_t res = u.failed ? hcomm__a2a_nomem(x, u.cap)
                                  : hcomm__a2a_swap(x, peer, u.p, u.n, 0, from, NULL, 0, true, &env,
                                                    &in->msg[in->n]);
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
                           inbox_t *in, hcomm__a2a_bad_t *b) {
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
                                   const hcomm__topo_t *t, hcomm__a2a_bad_t *b) {
    int me = x->c->rank, leader = t->members[t->node_off[t->node[me]]];
    inbox_t in = inbox_new((size_t)t->max_node + (size_t)t->nnodes);
    bundle_t own = {0};
    own_offnode(x, v, t, &own);
    hcomm_result_t res =
        in.msg && in.bytes && !own.failed ? HCOMM_OK : hcomm__a2a_nomem(x, own.cap);
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
            put_rec(u, &r, hcomm__a2a_sblock(v, d));
        }
}

/* Rails (every node has G ranks): within the node, local rank l collects every block of the
 * node bound for local rank l of any node (G - 1 steps); then local rank l of each node swaps
 * with local rank l of every other node one bundle of the G x G blocks between the two
 * nodes on that rail (N - 1 steps). Every rank drives its own inter-node messages. */
static hcomm_result_t hier_rails(const hcomm__xfer_t *x, const hcomm__a2a_t *v,
                                 const hcomm__topo_t *t, inbox_t *in, hcomm__a2a_bad_t *b) {
    int me = x->c->rank, a = t->node[me], l = t->local[me], G = t->max_node, N = t->nnodes;
    int first = t->node_off[a];
    for (int s = 0; s < G; s++) {
        int to = t->members[first + (l + s) % G], from = t->members[first + (l - s + G) % G];
        bundle_t u = {0};
        own_for_rail(x, v, t, t->local[to], &u);
        hcomm__env_t env;
        hcomm_result_t res = u.failed ? hcomm__a2a_nomem(x, u.cap) : HCOMM_OK;
        if (res == HCOMM_OK && s == 0)
            in->msg[in->n] = u.p, in->bytes[in->n++] = u.n, u.p = NULL;
        else if (res == HCOMM_OK)
            res = hcomm__a2a_swap(x, to, u.p, u.n, 0, from, NULL, 0, true, &env, &in->msg[in->n]);
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
    hcomm__a2a_bad_t b = {0};
    if (t->nnodes > 1 && t->min_node == t->max_node) { /* rails */
        size_t cap = (size_t)t->max_node + (size_t)t->nnodes;
        inbox_t in = inbox_new(cap);
        hcomm_result_t res =
            in.msg && in.bytes ? hier_rails(x, v, t, &in, &b) : hcomm__a2a_nomem(x, cap);
        inbox_free(&in);
        return res != HCOMM_OK ? res : hcomm__a2a_verdict(x, &b);
    }
    hcomm__a2a_self_copy(x, v, &b);
    HCOMM__TRY(hcomm__a2a_pairwise_over(x, v, t->members + first,
                                        t->node_off[t->node[me] + 1] - first, t->local[me], &b));
    if (t->nnodes > 1)
        HCOMM__TRY(hier_offnode(x, v, t, &b));
    return hcomm__a2a_verdict(x, &b);
}
