/* Hierarchical two-level collectives over the topology's nodes (src/topo): the slow
 * inter-node links carry 1/G of the data, each of a node's G ranks driving its own share (as
 * NCCL's tree/CollNet and the "rail" layout of multi-NIC nodes; Thakur, Rabenseifner & Gropp
 * 2005 for the ring and halving phases within).
 *
 * Lanes: with L = the fewest ranks on any node, local rank j < L of every node is the
 * representative of lane j. Ranks with local rank >= L (uneven nodes only) belong to lane
 * local % L and hand their data to, or get it from, their node's representative.
 *   all_reduce:     intra-node reduce_scatter into L blocks (block j on local rank j);
 *                   all_reduce of block j among lane j's representatives (ring: reduce_scatter
 *                   + all_gather over the nodes); intra-node all_gather of the L blocks.
 *   reduce_scatter: the send blocks reordered by lane; intra-node reduce_scatter (local rank j
 *                   gets the node's partial sums of lane j's blocks); inter-node
 *                   reduce_scatter among lane j's representatives (each keeps its node's lane
 *                   j blocks); each representative hands the others of its lane their block.
 *   all_gather:     the reverse: lane members' blocks to their representative; inter-node
 *                   all_gather among each lane's representatives (only this moves between
 *                   nodes: each rank's block once per other node); intra-node all_gather of
 *                   the lanes; the blocks put back in rank order.
 * Every output element is computed on one rank and copied to the others, so all ranks get the
 * same bits. Steps whose block is empty on both ends send nothing (both ends know the sizes). */
#include "algo/algos.h"

#include "topo/topo.h"

#include <stdlib.h>
#include <string.h>

/* A group of comm ranks in ring order; me is this rank's index in it. */
typedef struct grp {
    const hcomm__xfer_t *x;
    const int *ranks;
    int n, me;
} grp_t;

static int mod(int a, int p) {
    return ((a % p) + p) % p;
}

static hcomm_result_t xchg(const hcomm__xfer_t *x, int to, const void *sb, size_t sbytes, int from,
                           void *rb, size_t rbytes) {
    if (sbytes && rbytes)
        return hcomm__x_sendrecv(x, to, sb, sbytes, from, rb, rbytes);
    if (sbytes)
        return hcomm__x_send(x, to, sb, sbytes);
    return rbytes ? hcomm__x_recv(x, from, rb, rbytes) : HCOMM_OK;
}

/* Ring reduce_scatter over g on buf (block b: elements [offs[b], offs[b+1])); member i ends
 * with block i reduced over the group. tmp holds the largest block. */
static hcomm_result_t g_rs(const grp_t *g, char *buf, const size_t *offs, size_t es, void *tmp,
                           hcomm_dtype_t dt, hcomm_op_t op) {
    int right = g->ranks[mod(g->me + 1, g->n)], left = g->ranks[mod(g->me - 1, g->n)];
    for (int s = 0; s < g->n - 1; s++) {
        int sb = mod(g->me - 1 - s, g->n), rb = mod(g->me - 2 - s, g->n);
        size_t rlen = offs[rb + 1] - offs[rb];
        HCOMM__TRY(xchg(g->x, right, buf + offs[sb] * es, (offs[sb + 1] - offs[sb]) * es, left, tmp,
                        rlen * es));
        hcomm__reduce(buf + offs[rb] * es, tmp, rlen, dt, op);
    }
    return HCOMM_OK;
}

/* Ring all_gather over g: member i starts with block i, all end with every block. */
static hcomm_result_t g_ag(const grp_t *g, char *buf, const size_t *offs, size_t es) {
    int right = g->ranks[mod(g->me + 1, g->n)], left = g->ranks[mod(g->me - 1, g->n)];
    for (int s = 0; s < g->n - 1; s++) {
        int sb = mod(g->me - s, g->n), rb = mod(g->me - s - 1, g->n);
        HCOMM__TRY(xchg(g->x, right, buf + offs[sb] * es, (offs[sb + 1] - offs[sb]) * es, left,
                        buf + offs[rb] * es, (offs[rb + 1] - offs[rb]) * es));
    }
    return HCOMM_OK;
}

/* This rank's view of the topology: its node's group and its lane's representatives. */
typedef struct view {
    const hcomm__topo_t *t;
    int L, lane, node;
    grp_t node_g, lane_g; /* lane_g.n == 0 unless this rank represents its lane */
    int *reps;            /* [nnodes] lane representatives, node order */
    size_t *pos;          /* [p] place of each rank in lane order (lane, node, local rank) */
    size_t *start;        /* [L + 1] where each lane begins in lane order */
    size_t *offs;         /* [max(nnodes, max_node) + 1] scratch offsets */
} view_t;

static hcomm_result_t nomem(const hcomm__xfer_t *x, size_t bytes) {
    return hcomm__err(HCOMM_ERR_NOMEM, x->c->call_fn, "cannot allocate %zu bytes of scratch",
                      bytes);
}

static void view_free(view_t *v) {
    free(v->reps);
    free(v->pos);
    free(v->start);
    free(v->offs);
}

/* Lane order: lane 0's ranks node by node (each node's in rank order), then lane 1's, ... */
static void lane_order(view_t *v) {
    const hcomm__topo_t *t = v->t;
    size_t k = 0;
    for (int lane = 0; lane < v->L; lane++) {
        v->start[lane] = k;
        for (int n = 0; n < t->nnodes; n++)
            for (int i = t->node_off[n] + lane; i < t->node_off[n + 1]; i += v->L)
                v->pos[t->members[i]] = k++;
    }
    v->start[v->L] = k;
}

static hcomm_result_t view_make(const hcomm__xfer_t *x, view_t *v) {
    memset(v, 0, sizeof *v);
    hcomm__topo_t *t;
    HCOMM__TRY(hcomm__topo_get(x->c, &t));
    int me = x->c->rank, p = t->size, wide = t->nnodes > t->max_node ? t->nnodes : t->max_node;
    v->t = t;
    v->L = t->min_node;
    v->node = t->node[me];
    v->lane = t->local[me] % v->L;
    v->reps = malloc(sizeof(int) * (size_t)t->nnodes);
    v->pos = malloc(sizeof(size_t) * (size_t)p);
    v->start = malloc(sizeof(size_t) * ((size_t)v->L + 1));
    v->offs = malloc(sizeof(size_t) * ((size_t)wide + 1));
    if (!v->reps || !v->pos || !v->start || !v->offs) {
        view_free(v);
        return nomem(x, sizeof(size_t) * (3 * (size_t)p + 2));
    }
    int first = t->node_off[v->node];
    v->node_g = (grp_t){x, t->members + first, t->node_off[v->node + 1] - first, t->local[me]};
    for (int n = 0; n < t->nnodes; n++)
        v->reps[n] = t->members[t->node_off[n] + v->lane];
    if (t->local[me] < v->L)
        v->lane_g = (grp_t){x, v->reps, t->nnodes, v->node};
    lane_order(v);
    return HCOMM_OK;
}

/* Node-phase offsets (units of unit elements): local rank j < L owns lane j's part
 * [lo(j), lo(j+1)), the others own nothing. lo: the lane boundaries in those units. */
static void node_offsets(const view_t *v, const size_t *lo, size_t unit) {
    for (int j = 0; j <= v->node_g.n; j++)
        v->offs[j] = lo[j < v->L ? j : v->L] * unit;
}

/* Lane-phase offsets: node n's share of this lane starts at its representative's place. */
static void lane_offsets(const view_t *v, size_t unit) {
    for (int n = 0; n < v->t->nnodes; n++)
        v->offs[n] = v->pos[v->reps[n]] * unit;
    v->offs[v->t->nnodes] = v->start[v->lane + 1] * unit;
}

/* --- all_reduce's node phases by direct reads, where a node's ranks can read each other --- */

/* Elements reduced per piece: the accumulator and the piece read stay in cache. */
#define NODE_PIECE_BYTES ((size_t)256 << 10)

/* Every rank of the comm can read every other's memory (so the node's members can). */
static bool node_reads(const hcomm__xfer_t *x) {
    return hcomm__peer_reads(x->c);
}

/* g as xfer.c's groups see it. */
static hcomm__group_t group_of(const grp_t *g) {
    return (hcomm__group_t){g->ranks, g->n, g->me};
}

static hcomm_result_t g_barrier(const grp_t *g) {
    hcomm__group_t h = group_of(g);
    return hcomm__x_barrier(g->x, &h);
}

/* Every member's two buffers (bytes each). */
static hcomm_result_t g_addrs(const grp_t *g, const void *send, void *recv, size_t bytes,
                              hcomm__buf_pair_t *all) {
    hcomm__group_t h = group_of(g);
    return hcomm__x_addrs(g->x, &h, send, bytes, recv, bytes, all);
}

/* Elements [lo, lo + len) of the node's sum: every member's input read where it lies (tmp
 * takes a piece that has to be copied) and reduced into this rank's recv, a piece at a time. */
static hcomm_result_t node_reduce(const grp_t *g, const hcomm__buf_pair_t *all, const void *send,
                                  void *recv, size_t lo, size_t len, hcomm_dtype_t dt,
                                  hcomm_op_t op, void *tmp) {
    size_t es = hcomm__dtype_size(dt), step = NODE_PIECE_BYTES / es;
    for (size_t done = 0; done < len; done += step) {
        size_t n = len - done < step ? len - done : step, off = (lo + done) * es;
        char *acc = (char *)recv + off;
        const void *first = (const char *)send + off, *in;
        for (int i = 0; i < g->n; i++) {
            if (i == g->me)
                continue;
            HCOMM__TRY(hcomm__x_peer_load(g->x, g->ranks[i], &all[i].send, off, tmp, n * es, &in));
            if (first != acc)
                hcomm__reduce_to(acc, first, in, n, dt, op);
            else
                hcomm__reduce(acc, in, n, dt, op);
            first = acc;
        }
        if (first != acc) /* a node of one */
            memcpy(acc, first, n * es);
    }
    return HCOMM_OK;
}

/* Every other member's block of the result (offs: member i owns [offs[i], offs[i+1])), read
 * from its output into this rank's. */
static hcomm_result_t node_gather(const grp_t *g, const hcomm__buf_pair_t *all, void *recv,
                                  const size_t *offs, size_t es) {
    for (int d = 1; d < g->n; d++) {
        int i = mod(g->me + d, g->n); /* each member starts at a different owner */
        size_t off = offs[i] * es;
        HCOMM__TRY(hcomm__x_peer_copy(g->x, g->ranks[i], &all[i].recv, off, (char *)recv + off,
                                      (offs[i + 1] - offs[i]) * es));
    }
    return HCOMM_OK;
}

/* all_reduce's scratch: the ring's largest block, or a piece for direct reads. */
static size_t ar_scratch_bytes(size_t count, int L, size_t es, bool direct) {
    size_t ring = (count / (size_t)L + 1) * es;
    return direct && NODE_PIECE_BYTES > ring ? NODE_PIECE_BYTES : ring;
}

/* all_reduce of send into recv (may alias). Where the node's ranks can read each other (the
 * local backend, mpi on one host under a declared topology) the node phases are twoshot's
 * (peer_reduce.c): each lane's representative reduces its block straight from its node's inputs,
 * and after the lane phase every rank copies the other blocks from their owners; one pass per
 * byte and phase instead of the ring's copy and reduction per step. Barriers keep every input
 * alive until its block is reduced (in place, a rank's gather overwrites what its node's
 * members read) and every output until it is copied. Elsewhere the node phases are rings. */
hcomm_result_t hcomm__ar_hier(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                              hcomm_dtype_t dt, hcomm_op_t op) {
    view_t v;
    HCOMM__TRY(view_make(x, &v));
    bool direct = node_reads(x);
    size_t es = hcomm__dtype_size(dt), *lo = malloc(sizeof(size_t) * ((size_t)v.L + 1)),
           scratch = ar_scratch_bytes(count, v.L, es, direct);
    void *tmp = hcomm__x_scratch(x, scratch); /* kept: a fresh 32 MiB+ malloc faults */
    hcomm__buf_pair_t *all = direct ? calloc((size_t)v.node_g.n, sizeof *all) : NULL;
    hcomm_result_t res = lo && tmp && (all || !direct) ? HCOMM_OK : nomem(x, scratch);
    for (int j = 0; res == HCOMM_OK && j < v.L; j++) {
        size_t len;
        hcomm__block(count, v.L, j, &lo[j], &len);
    }
    if (res == HCOMM_OK) {
        lo[v.L] = count;
        node_offsets(&v, lo, 1);
        if (!direct && send != recv && count)
            memcpy(recv, send, count * es);
        if (direct)
            res = g_addrs(&v.node_g, send, recv, count * es, all);
        if (direct && res == HCOMM_OK)
            res = hcomm__x_tell_peers(
                x, node_reduce(&v.node_g, all, send, recv, v.offs[v.node_g.me],
                               v.offs[v.node_g.me + 1] - v.offs[v.node_g.me], dt, op, tmp));
        else if (res == HCOMM_OK)
            res = g_rs(&v.node_g, recv, v.offs, es, tmp, dt, op);
    }
    if (res == HCOMM_OK && v.lane_g.n > 1) { /* block lane of the vector, across the nodes */
        size_t base = lo[v.lane], n = lo[v.lane + 1] - base, *inner = v.offs;
        for (int k = 0; k < v.lane_g.n; k++) {
            size_t len;
            hcomm__block(n, v.lane_g.n, k, &inner[k], &len);
            inner[k] += base;
        }
        inner[v.lane_g.n] = base + n;
        res = g_rs(&v.lane_g, recv, inner, es, tmp, dt, op);
        if (res == HCOMM_OK)
            res = g_ag(&v.lane_g, recv, inner, es);
    }
    if (res == HCOMM_OK) {
        node_offsets(&v, lo, 1);
        if (direct) {
            res = g_barrier(&v.node_g);
            if (res == HCOMM_OK)
                res = hcomm__x_tell_peers(x, node_gather(&v.node_g, all, recv, v.offs, es));
            if (res == HCOMM_OK)
                res = g_barrier(&v.node_g);
        } else {
            res = g_ag(&v.node_g, recv, v.offs, es);
        }
    }
    free(all);
    free(lo);
    view_free(&v);
    return res;
}

/* The lane's representative on this node, and whether this rank is it. */
static int my_rep(const view_t *v) {
    return v->reps[v->node];
}

hcomm_result_t hcomm__rs_hier(const hcomm__xfer_t *x, const void *send, void *recv, size_t m,
                              hcomm_dtype_t dt, hcomm_op_t op) {
    view_t v;
    HCOMM__TRY(view_make(x, &v));
    int p = v.t->size, me = x->c->rank;
    size_t es = hcomm__dtype_size(dt), bytes = (size_t)p * m * es;
    void *pa, *ptmp;
    hcomm__x_scratch_pair(x, bytes, bytes, &pa, &ptmp);
    char *a = pa, *tmp = ptmp;
    hcomm_result_t res = a ? HCOMM_OK : nomem(x, 2 * bytes);
    for (int r = 0; res == HCOMM_OK && m && r < p; r++) /* send copied in lane order */
        memcpy(a + v.pos[r] * m * es, (const char *)send + (size_t)r * m * es, m * es);
    if (res == HCOMM_OK) {
        node_offsets(&v, v.start, m);
        res = g_rs(&v.node_g, a, v.offs, es, tmp, dt, op);
    }
    if (res == HCOMM_OK && v.lane_g.n > 1) {
        lane_offsets(&v, m);
        res = g_rs(&v.lane_g, a, v.offs, es, tmp, dt, op);
    }
    if (res == HCOMM_OK && me == my_rep(&v)) { /* hand the lane's other ranks their blocks */
        const hcomm__topo_t *t = v.t;
        for (int i = t->node_off[v.node] + v.lane + v.L;
             res == HCOMM_OK && m && i < t->node_off[v.node + 1]; i += v.L)
            res = hcomm__x_send(x, t->members[i], a + v.pos[t->members[i]] * m * es, m * es);
        if (res == HCOMM_OK && m)
            memcpy(recv, a + v.pos[me] * m * es, m * es);
    } else if (res == HCOMM_OK && m) {
        res = hcomm__x_recv(x, my_rep(&v), recv, m * es);
    }
    view_free(&v);
    return res;
}

hcomm_result_t hcomm__ag_hier(const hcomm__xfer_t *x, void *buf, size_t m) {
    view_t v;
    HCOMM__TRY(view_make(x, &v));
    const hcomm__topo_t *t = v.t;
    int p = t->size, me = x->c->rank;
    char *a = hcomm__x_scratch(x, (size_t)p * m), *out = buf;
    hcomm_result_t res = a ? HCOMM_OK : nomem(x, (size_t)p * m);
    if (res == HCOMM_OK && m && me == my_rep(&v)) { /* the lane's blocks on this node */
        memcpy(a + v.pos[me] * m, out + (size_t)me * m, m);
        for (int i = t->node_off[v.node] + v.lane + v.L;
             res == HCOMM_OK && i < t->node_off[v.node + 1]; i += v.L)
            res = hcomm__x_recv(x, t->members[i], a + v.pos[t->members[i]] * m, m);
    } else if (res == HCOMM_OK && m) {
        res = hcomm__x_send(x, my_rep(&v), out + (size_t)me * m, m);
    }
    if (res == HCOMM_OK && v.lane_g.n > 1) {
        lane_offsets(&v, m);
        res = g_ag(&v.lane_g, a, v.offs, 1);
    }
    if (res == HCOMM_OK) {
        node_offsets(&v, v.start, m);
        res = g_ag(&v.node_g, a, v.offs, 1);
    }
    for (int r = 0; res == HCOMM_OK && m && r < p; r++)
        if (r != me)
            memcpy(out + (size_t)r * m, a + v.pos[r] * m, m);
    view_free(&v);
    return res;
}
