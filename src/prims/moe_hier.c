/* Hierarchical token exchange of MoE dispatch for EP groups spanning several nodes (DeepEP's
 * internode dispatch; Tutel's 2D hierarchical all_to_all): a token bound for experts on
 * several ranks of one remote node crosses the inter-node link once, to a relay on that node,
 * which fans it out to those ranks over the intra-node links.
 *
 * Relays: source s's relay on node b is the rank with local index local(s) mod |b| there
 * (rail-aligned: on equal nodes, the same local index; on its own node, s itself). The count
 * exchange is the flat path's (one meta all_to_all over the EP group); each meta row also says
 * how many rows the source relays through that peer, so both token exchanges are sized without
 * another count exchange:
 *   1. inter-node: an all_to_allv over the EP group in which s sends each relay one row per
 *      token with a kept slot on the relay's node (the copy to its own node goes to itself),
 *      followed by k int32 global expert ids per row (-1: the slot is empty, dropped or on
 *      another node);
 *   2. intra-node: an all_to_allv over the EP group in which each relay sends each rank of its
 *      node, for each source it relays (ascending), that source's rows with a slot there and
 *      their k local expert ids: the very block the flat path would have carried from s.
 * The receiver expands those blocks exactly as the flat path does, so the received rows, the
 * handle's maps and every later pass are bitwise the same as with the flat path. Redispatch
 * takes the same two exchanges (the handle keeps the ids and the relay counts); combine and
 * the backward passes send each slot's row straight
 * between its two ranks (as on the flat path): summing a token's slots per node before the
 * inter-node link would change the order of the f32 sum that makes combine deterministic and
 * layout-independent. */
#include "prims/moe_common.h"

#include "topo/topo.h"

#include <string.h>

hcomm_result_t hcomm__moe_hier_setup(const char *fn, hcomm_moe_handle_t *h, int path) {
    hcomm__topo_t *t = NULL;
    h->nnodes = 1;
    h->hier = false;
    if (h->pad)
        return HCOMM_OK;
    (void)fn; /* named by the caller's hcomm__enter */
    hcomm_result_t res = hcomm__topo_get(h->group, &t);
    if (res != HCOMM_OK) /* no model: the flat path, unless asked for the other */
        return path == HCOMM_MOE_PATH_HIER ? res : HCOMM_OK;
    h->topo = t;
    h->nnodes = t->nnodes;
    h->hier = path == HCOMM_MOE_PATH_HIER || (path == HCOMM_MOE_PATH_AUTO && t->nnodes > 1);
    return HCOMM_OK;
}

/* Header entries sit after rows of any byte length, so they are read and written unaligned. */
static int32_t get_id(const char *hdr, int64_t i) {
    int32_t v;
    memcpy(&v, hdr + sizeof v * (size_t)i, sizeof v);
    return v;
}

static void put_id(char *hdr, int64_t i, int32_t v) {
    memcpy(hdr + sizeof v * (size_t)i, &v, sizeof v);
}

static int relay_of(const hcomm__topo_t *t, int s, int b) {
    int size = t->node_off[b + 1] - t->node_off[b];
    return t->members[t->node_off[b] + t->local[s] % size];
}

static int node_of_expert(const hcomm_moe_handle_t *h, int32_t e) {
    return h->topo->node[e / h->num_local];
}

/* Rows this rank sends each node: its tokens with a kept slot there. last holds nnodes. */
static void count_node_rows(const hcomm_moe_handle_t *h, const int32_t *ids, int64_t *rows,
                            int64_t *last) {
    for (int b = 0; b < h->nnodes; b++) {
        rows[b] = 0;
        last[b] = -1;
    }
    for (int64_t s = 0; s < h->n * h->k; s++) {
        if (h->slot_pair[s] < 0)
            continue;
        int b = node_of_expert(h, ids[s]);
        if (last[b] != s / h->k) {
            last[b] = s / h->k;
            rows[b]++;
        }
    }
}

void hcomm__moe_hier_meta(hcomm_moe_handle_t *h, const int32_t *ids, int64_t *meta, int w) {
    const hcomm__topo_t *t = h->topo;
    h->internode_rows = 0;
    if (t == NULL)
        return;
    int me = h->group->rank, mine = t->node[me];
    if (!h->hier) {
        for (int p = 0; p < h->size; p++)
            h->internode_rows += t->node[p] != mine ? h->send_rows[p] : 0;
        return;
    }
    int64_t *rows = calloc(2 * (size_t)h->nnodes, sizeof *rows);
    if (rows == NULL) /* the exchange recounts; only this rank's statistic is lost */
        return;
    count_node_rows(h, ids, rows, rows + h->nnodes);
    for (int b = 0; b < h->nnodes; b++) {
        meta[relay_of(t, me, b) * w + META_NODE_ROWS] = rows[b];
        h->internode_rows += b != mine ? rows[b] : 0;
    }
    free(rows);
}

/* One hierarchical exchange: byte counts and offsets of its two exchanges ([4][size] each:
 * send counts, send offsets, receive counts, receive offsets), the relay's counts and the
 * pooled buffers. */
typedef struct plan2 {
    size_t rb; /* bytes of one token row (headers come on top) */
    size_t *v1, *v2;
    int64_t *cnt;   /* [node size][size] rows the relay forwards to each node member per source */
    int64_t *stamp; /* [size] */
    int64_t *node_rows; /* [3 * nnodes]: rows to each node, then pack_inter's cursors */
    char *sbuf1, *raw1, *sbuf2, *raw2; /* each exchange's send and receive buffers */
} plan2_t;

static size_t row_bytes(size_t rb, int64_t k) {
    return rb + sizeof(int32_t) * (size_t)k;
}

static void scan(size_t *counts, size_t *offs, int n) {
    size_t sum = 0;
    for (int i = 0; i < n; i++) {
        offs[i] = sum;
        sum += counts[i];
    }
}

/* Exchange 1: what this rank sends each relay and receives as one. */
static void size_inter(const hcomm_moe_handle_t *h, const int64_t *node_rows, size_t rb,
                       size_t *v) {
    int p = h->size, me = h->group->rank;
    memset(v, 0, 4 * (size_t)p * sizeof *v);
    for (int b = 0; b < h->nnodes; b++)
        v[relay_of(h->topo, me, b)] = (size_t)node_rows[b] * row_bytes(rb, h->k);
    for (int s = 0; s < p; s++)
        v[2 * p + s] = (size_t)h->relay_rows[s] * row_bytes(rb, h->src_k[s]);
    scan(v, v + p, p);
    scan(v + 2 * p, v + 3 * p, p);
}

/* Packs exchange 1: per relay its rows, then their k global expert ids (-1 elsewhere). */
static void pack_inter(const hcomm_moe_handle_t *h, const void *tokens, const int32_t *ids,
                       const size_t *v, const int64_t *node_rows, int64_t *cur, size_t rb,
                       char *buf) {
    int k = h->k, me = h->group->rank;
    for (int b = 0; b < h->nnodes; b++)
        cur[b] = -1;
    for (int64_t t = 0; t < h->n; t++)
        for (int j = 0; j < k; j++) {
            int64_t s = t * k + j;
            if (h->slot_pair[s] < 0)
                continue;
            int b = node_of_expert(h, ids[s]);
            char *seg = buf + v[h->size + relay_of(h->topo, me, b)];
            char *hdr = seg + (size_t)node_rows[b] * rb;
            if (cur[b] < 0 || cur[b + h->nnodes] != t) { /* the token's first slot on b */
                cur[b + h->nnodes] = t;
                cur[b]++;
                memcpy(seg + (size_t)cur[b] * rb, (const char *)tokens + (size_t)t * rb, rb);
                for (int q = 0; q < k; q++)
                    put_id(hdr, cur[b] * k + q, -1);
            }
            put_id(hdr, cur[b] * k + j, ids[s]);
        }
}

/* Exchange 2, relay side: rows forwarded to each member q of this node per source s
 * (cnt[(q - first) * size + s]); checks that every id belongs to this node. */
static hcomm_result_t count_intra(const char *fn, const hcomm_moe_handle_t *h, const char *raw,
                                  const size_t *v1, plan2_t *pl) {
    const hcomm__topo_t *t = h->topo;
    int p = h->size, mine = t->node[h->group->rank], first = t->node_off[mine];
    size_t rb = pl->rb;
    int64_t stamp = 0;
    for (int q = 0; q < p; q++)
        pl->stamp[q] = -1;
    for (int s = 0; s < p; s++) {
        int64_t n = h->relay_rows[s];
        int ks = (int)h->src_k[s];
        const char *hdr = raw + v1[3 * p + s] + (size_t)n * rb;
        for (int64_t i = 0; i < n; i++, stamp++)
            for (int j = 0; j < ks; j++) {
                int32_t e = get_id(hdr, i * ks + j);
                if (e < 0)
                    continue;
                int q = e / h->num_local;
                if (e >= p * h->num_local || t->node[q] != mine)
                    return hcomm__err(HCOMM_ERR_INTERNAL, fn,
                                      "rank %d relayed a slot for expert %d to node %d", s, e,
                                      mine);
                if (pl->stamp[q] != stamp) {
                    pl->stamp[q] = stamp;
                    pl->cnt[(q - first) * p + s]++;
                }
            }
    }
    return HCOMM_OK;
}

/* Exchange 2 sizes: sends from the relay's counts, receives from the sources' meta rows (the
 * flat path's row counts), grouped by relay, then source; roff[s] where s's block lands. */
static void size_intra(const hcomm_moe_handle_t *h, plan2_t *pl, size_t *roff) {
    const hcomm__topo_t *t = h->topo;
    int p = h->size, mine = t->node[h->group->rank];
    size_t *v = pl->v2;
    memset(v, 0, 4 * (size_t)p * sizeof *v);
    for (int q = t->node_off[mine]; q < t->node_off[mine + 1]; q++)
        for (int s = 0; s < p; s++)
            v[q] +=
                (size_t)pl->cnt[(q - t->node_off[mine]) * p + s] * row_bytes(pl->rb, h->src_k[s]);
    for (int s = 0; s < p; s++)
        v[2 * p + relay_of(t, s, mine)] += (size_t)h->recv_rows[s] * row_bytes(pl->rb, h->src_k[s]);
    scan(v, v + p, p);
    scan(v + 2 * p, v + 3 * p, p);
    size_t *at = pl->v1; /* reused: the next free byte of each relay's block */
    memcpy(at, v + 3 * p, (size_t)p * sizeof *at);
    for (int s = 0; s < p; s++) {
        int r = relay_of(t, s, mine);
        roff[s] = at[r];
        at[r] += (size_t)h->recv_rows[s] * row_bytes(pl->rb, h->src_k[s]);
    }
}

/* Packs exchange 2: for each member q, for each source (ascending), the source's rows with a
 * slot on q, then their local expert ids for q. */
static void pack_intra(const hcomm_moe_handle_t *h, const char *raw, const size_t *v1_roff,
                       plan2_t *pl, size_t *blk, char *buf) {
    const hcomm__topo_t *t = h->topo;
    int p = h->size, mine = t->node[h->group->rank], first = t->node_off[mine];
    int g = t->node_off[mine + 1] - first;
    size_t rb = pl->rb;
    int64_t *cur = pl->stamp; /* reused: rows placed in (q, s)'s block so far */
    for (int q = 0; q < g; q++)
        blk[q] = pl->v2[p + first + q];
    for (int s = 0; s < p; s++) {
        int64_t n = h->relay_rows[s];
        int ks = (int)h->src_k[s];
        if (n == 0)
            continue;
        const char *rows = raw + v1_roff[s];
        const char *hdr = rows + (size_t)n * rb;
        for (int q = 0; q < g; q++)
            cur[q] = -1;
        for (int64_t i = 0; i < n; i++)
            for (int j = 0; j < ks; j++) {
                int32_t e = get_id(hdr, i * ks + j);
                if (e < 0)
                    continue;
                int q = e / h->num_local - first;
                int64_t c = pl->cnt[q * p + s];
                char *seg = buf + blk[q];
                char *out_hdr = seg + (size_t)c * rb;
                if (cur[q] < 0 || cur[q + g] != i) {
                    cur[q + g] = i;
                    cur[q]++;
                    memcpy(seg + (size_t)cur[q] * rb, rows + (size_t)i * rb, rb);
                    for (int x = 0; x < ks; x++)
                        put_id(out_hdr, cur[q] * ks + x, -1);
                }
                put_id(out_hdr, cur[q] * ks + j, e % h->num_local);
            }
        for (int q = 0; q < g; q++)
            blk[q] += (size_t)pl->cnt[q * p + s] * row_bytes(rb, ks);
    }
}

hcomm_result_t hcomm__moe_hier_keep(const char *fn, hcomm_moe_handle_t *h, const int64_t *meta) {
    int w = hcomm__moe_meta_width(h);
    h->relay_rows = calloc((size_t)h->size, sizeof *h->relay_rows);
    h->src_k = calloc((size_t)h->size, sizeof *h->src_k);
    h->ids = malloc(sizeof *h->ids * (size_t)(h->n * h->k + 1));
    if (!h->relay_rows || !h->src_k || !h->ids)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for the relay counts");
    for (int s = 0; s < h->size; s++) {
        h->relay_rows[s] = meta[s * w + META_NODE_ROWS];
        h->src_k[s] = meta[s * w + META_K];
    }
    return HCOMM_OK;
}

/* The exchange's counts (g: ranks of this node). */
static hcomm_result_t plan2_alloc(const char *fn, const hcomm_moe_handle_t *h, int g, plan2_t *pl) {
    int p = h->size;
    pl->node_rows = calloc(3 * (size_t)h->nnodes, sizeof *pl->node_rows);
    pl->v1 = malloc(4 * (size_t)p * sizeof *pl->v1);
    pl->v2 = malloc(4 * (size_t)p * sizeof *pl->v2);
    pl->cnt = calloc((size_t)g * (size_t)p, sizeof *pl->cnt);
    pl->stamp = malloc(sizeof *pl->stamp * (size_t)(p > 2 * g ? p : 2 * g));
    if (!pl->node_rows || !pl->v1 || !pl->v2 || !pl->cnt || !pl->stamp)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for the relay counts");
    return HCOMM_OK;
}

static void plan2_free(const hcomm_moe_handle_t *h, plan2_t *pl) {
    free(pl->node_rows);
    free(pl->v1);
    free(pl->v2);
    free(pl->cnt);
    free(pl->stamp);
    hcomm__moe_pool_put(h->pool, pl->sbuf1);
    hcomm__moe_pool_put(h->pool, pl->raw1);
    hcomm__moe_pool_put(h->pool, pl->sbuf2);
    hcomm__moe_pool_put(h->pool, pl->raw2);
}

/* Exchange 1: each token with a kept slot on a node goes to this rank's relay there, once. */
static hcomm_result_t move_inter(const char *fn, const hcomm_moe_handle_t *h, const void *tokens,
                                 const int32_t *ids, plan2_t *pl) {
    int p = h->size, nn = h->nnodes;
    size_t *v = pl->v1;
    count_node_rows(h, ids, pl->node_rows, pl->node_rows + nn);
    size_inter(h, pl->node_rows, pl->rb, v);
    HCOMM__TRY(hcomm__moe_pool_get(h->pool, fn, v[2 * p - 1] + v[p - 1], (void **)&pl->sbuf1));
    HCOMM__TRY(hcomm__moe_pool_get(h->pool, fn, v[4 * p - 1] + v[3 * p - 1], (void **)&pl->raw1));
    pack_inter(h, tokens, ids, v, pl->node_rows, pl->node_rows + nn, pl->rb, pl->sbuf1);
    /* The count exchange proved that every rank is in this dispatch with these counts. */
    return hcomm__coll_all_to_allv(h->group, pl->sbuf1, v, v + p, pl->raw1, v + 2 * p, v + 3 * p,
                                   true);
}

/* Exchange 2's sizes and send buffer from the rows this relay received in exchange 1 (g: ranks
 * of this node); roff[s]: where source s's block will land. */
static hcomm_result_t pack_relayed(const char *fn, const hcomm_moe_handle_t *h, int g, plan2_t *pl,
                                   size_t *roff) {
    int p = h->size;
    HCOMM__TRY(count_intra(fn, h, pl->raw1, pl->v1, pl));
    size_t *roff1 = malloc((size_t)(p + g) * sizeof *roff1); /* and g block cursors */
    if (roff1 == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for the relay counts");
    memcpy(roff1, pl->v1 + 3 * p, (size_t)p * sizeof *roff1);
    size_intra(h, pl, roff);
    size_t *v = pl->v2;
    hcomm_result_t res =
        hcomm__moe_pool_get(h->pool, fn, v[2 * p - 1] + v[p - 1], (void **)&pl->sbuf2);
    if (res == HCOMM_OK)
        res = hcomm__moe_pool_get(h->pool, fn, v[4 * p - 1] + v[3 * p - 1], (void **)&pl->raw2);
    if (res == HCOMM_OK)
        pack_intra(h, pl->raw1, roff1, pl, roff1 + p, pl->sbuf2);
    free(roff1);
    return res;
}

hcomm_result_t hcomm__moe_hier_move(const char *fn, hcomm_moe_handle_t *h, const void *tokens,
                                    const int32_t *ids, size_t rb, size_t *roff,
                                    hcomm__moe_sink_t sink, void *arg) {
    const hcomm__topo_t *t = h->topo;
    int p = h->size, mine = t->node[h->group->rank];
    int g = t->node_off[mine + 1] - t->node_off[mine];
    plan2_t pl = {.rb = rb};
    hcomm_result_t res = plan2_alloc(fn, h, g, &pl);
    if (res == HCOMM_OK)
        res = move_inter(fn, h, tokens, ids, &pl);
    if (res == HCOMM_OK)
        res = pack_relayed(fn, h, g, &pl, roff);
    if (res == HCOMM_OK) /* exchange 2: each relay fans the rows out over its node */
        res = hcomm__coll_all_to_allv(h->group, pl.sbuf2, pl.v2, pl.v2 + p, pl.raw2, pl.v2 + 2 * p,
                                      pl.v2 + 3 * p, true);
    if (res == HCOMM_OK)
        res = sink(fn, h, pl.raw2, roff, rb, arg);
    plan2_free(h, &pl);
    return res;
}
