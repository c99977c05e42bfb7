/* Ulysses all-to-all (DeepSpeed Ulysses, Jacobs et al. 2023; Megatron-Core cp_comm_type "a2a"):
 * before attention each rank trades its sequence part of every head for every rank's part of
 * its heads, after attention the reverse. Block j of the exchange is a box of the tensor (all
 * dims whole but the split one), packed in the tensor's own dim order, so any dim order works.
 * Grouped-query attention with fewer KV heads than ranks replicates each head to P/H ranks as
 * yunchang and Megatron do; the reverse sums the replicas' gradients in rank order. */
#include "prims/cp_common.h"

#include <string.h>

/* The exchange's geometry: the sequence and head dims, the full heads and those per rank. */
typedef struct a2a_geo {
    int sd, hd, p;
    int64_t heads, local; /* H, and H/P (1 where GQA replicates) */
    int64_t rep;          /* ranks per head under GQA, else 0 */
} a2a_geo_t;

/* Heads per rank for H heads over p ranks, or HCOMM_ERR_SHAPE naming both numbers. */
static hcomm_result_t heads_per_rank(const char *fn, const char *name, int hd, int64_t h, int p,
                                     a2a_geo_t *geo) {
    geo->heads = h;
    geo->rep = 0;
    if (h % p == 0) {
        geo->local = h / p;
        return HCOMM_OK;
    }
    if (h > 0 && p % h == 0) { /* GQA: each head goes to p/h ranks */
        geo->local = 1;
        geo->rep = p / h;
        return HCOMM_OK;
    }
    return hcomm__err(HCOMM_ERR_SHAPE, fn,
                      "%s->shape[%d]=%lld heads are not divisible by cp=%d (nor cp by the "
                      "heads, as grouped-query attention needs)",
                      name, hd, (long long)h, p);
}

/* The head of block j: rank j's first head. */
static int64_t head_of(const a2a_geo_t *g, int j) {
    return g->rep ? j / g->rep : j * g->local;
}

static hcomm_result_t check_common(const cp_op_t *op, const hcomm_tensor_t *in,
                                   const hcomm_tensor_t *out, a2a_geo_t *geo) {
    HCOMM__TRY(hcomm__tensor_check(op->fn, "in", in, NULL));
    HCOMM__TRY(hcomm__tensor_check(op->fn, "out", out, NULL));
    HCOMM__TRY(hcomm__same_dtype(op->fn, "in", in, "out", out));
    HCOMM__TRY(hcomm__cp_disjoint(op->fn, "in", in, "out", out));
    HCOMM__TRY(hcomm__tensor_dim(op->fn, "in", in, op->a, &geo->sd));
    HCOMM__TRY(hcomm__tensor_dim(op->fn, "in", in, op->b, &geo->hd));
    if (geo->sd == geo->hd)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, op->fn,
                          "seq_dim=%d and head_dim=%d name the same dim", op->a, op->b);
    return HCOMM_OK;
}

/* in [.., S/P, .., H, ..] -> out [.., S, .., H/P, ..]. */
static hcomm_result_t check_s2h(const cp_op_t *op, hcomm_comm_t *g, const hcomm_tensor_t *in,
                                const hcomm_tensor_t *out, a2a_geo_t *geo) {
    HCOMM__TRY(check_common(op, in, out, geo));
    geo->p = g->size;
    HCOMM__TRY(heads_per_rank(op->fn, "in", geo->hd, in->shape[geo->hd], g->size, geo));
    return hcomm__cp_shape_as(op->fn, "out", out, in, geo->sd, in->shape[geo->sd] * g->size,
                              geo->hd, geo->local);
}

/* in [.., S, .., H/P, ..] -> out [.., S/P, .., H, ..]. */
static hcomm_result_t check_h2s(const cp_op_t *op, hcomm_comm_t *g, const hcomm_tensor_t *in,
                                const hcomm_tensor_t *out, a2a_geo_t *geo) {
    HCOMM__TRY(check_common(op, in, out, geo));
    geo->p = g->size;
    int64_t s = in->shape[geo->sd];
    if (s % g->size != 0)
        return hcomm__err(HCOMM_ERR_SHAPE, op->fn,
                          "in->shape[%d]=%lld (the sequence) is not divisible by cp=%d", geo->sd,
                          (long long)s, g->size);
    if (out->ndim != in->ndim)
        return hcomm__cp_shape_as(op->fn, "out", out, in, geo->sd, s / g->size, -1, 0);
    HCOMM__TRY(heads_per_rank(op->fn, "out", geo->hd, out->shape[geo->hd], g->size, geo));
    if (in->shape[geo->hd] != geo->local)
        return hcomm__err(HCOMM_ERR_SHAPE, op->fn,
                          "in->shape[%d]=%lld heads, expected %lld (out's %lld heads over cp=%d)",
                          geo->hd, (long long)in->shape[geo->hd], (long long)geo->local,
                          (long long)geo->heads, g->size);
    return hcomm__cp_shape_as(op->fn, "out", out, in, geo->sd, s / g->size, geo->hd, geo->heads);
}

/* Packs block j of each rank's send (s2h: heads of rank j; h2s: sequence part j) into buf. */
static void pack(const a2a_geo_t *geo, const hcomm_tensor_t *in, bool s2h, char *buf, size_t blk) {
    int64_t zero[HCOMM_MAX_DIMS] = {0}, off[HCOMM_MAX_DIMS] = {0}, ext[HCOMM_MAX_DIMS];
    for (int j = 0; j < geo->p; j++) {
        memcpy(ext, in->shape, sizeof ext);
        if (s2h) {
            ext[geo->hd] = geo->local;
            off[geo->hd] = head_of(geo, j);
        } else {
            ext[geo->sd] = in->shape[geo->sd] / geo->p;
            off[geo->sd] = j * ext[geo->sd];
        }
        hcomm__cp_box(buf + (size_t)j * blk, ext, zero, in->data, in->shape, off, ext, in->ndim,
                      in->dtype, false);
    }
}

/* Places each source's block in out: s2h at its sequence part, h2s at its heads (summing GQA
 * replicas after the first, in rank order). */
static void unpack(const a2a_geo_t *geo, const hcomm_tensor_t *in, hcomm_tensor_t *out, bool s2h,
                   const char *buf, size_t blk) {
    int64_t zero[HCOMM_MAX_DIMS] = {0}, off[HCOMM_MAX_DIMS] = {0}, ext[HCOMM_MAX_DIMS];
    for (int s = 0; s < geo->p; s++) {
        memcpy(ext, in->shape, sizeof ext);
        bool add = false;
        if (s2h) {
            ext[geo->hd] = geo->local;
            off[geo->sd] = s * in->shape[geo->sd];
        } else {
            ext[geo->sd] = in->shape[geo->sd] / geo->p;
            off[geo->hd] = head_of(geo, s);
            add = geo->rep && s % geo->rep != 0;
        }
        hcomm__cp_box(out->data, out->shape, off, buf + (size_t)s * blk, ext, zero, ext, out->ndim,
                      out->dtype, add);
    }
}

/* The exchange itself: pack, an all_to_all of equal blocks, unpack. */
static hcomm_result_t exchange(hcomm_comm_t *g, const char *fn, const a2a_geo_t *geo,
                               const hcomm_tensor_t *in, hcomm_tensor_t *out, bool s2h) {
    size_t p = (size_t)g->size, total = hcomm__tensor_bytes(s2h ? out : in), blk = total / p;
    if (total == 0) /* the agreement was the meeting */
        return HCOMM_OK;
    char *buf = NULL;
    size_t *c = NULL;
    HCOMM__TRY(hcomm__alloc(fn, 2 * total, (void **)&buf));
    hcomm_result_t res = hcomm__alloc(fn, 4 * p * sizeof *c, (void **)&c);
    if (res != HCOMM_OK) {
        free(buf);
        return res;
    }
    for (size_t j = 0; j < p; j++) {
        c[j] = c[2 * p + j] = blk;
        c[p + j] = c[3 * p + j] = j * blk;
    }
    pack(geo, in, s2h, buf, blk);
    res = hcomm__coll_all_to_allv(g, buf, c, c + p, buf + total, c + 2 * p, c + 3 * p, false);
    if (res == HCOMM_OK)
        unpack(geo, in, out, s2h, buf + total, blk);
    free(c);
    free(buf);
    return res;
}

static hcomm_result_t s2h_body(hcomm_comm_t *g, const cp_op_t *op, const hcomm_tensor_t *in,
                               hcomm_tensor_t *out) {
    a2a_geo_t geo = {0};
    CP_CHECK(g, check_s2h(op, g, in, out, &geo));
    cp_desc_t mine = hcomm__cp_desc(in, geo.sd, geo.hd, 0);
    HCOMM__TRY(hcomm__cp_agree(g, op->fn, &mine, "in", "seq_dim,head_dim"));
    return exchange(g, op->fn, &geo, in, out, true);
}

static hcomm_result_t h2s_body(hcomm_comm_t *g, const cp_op_t *op, const hcomm_tensor_t *in,
                               hcomm_tensor_t *out) {
    a2a_geo_t geo = {0};
    CP_CHECK(g, check_h2s(op, g, in, out, &geo));
    cp_desc_t mine = hcomm__cp_desc(in, geo.sd, geo.hd, (int)geo.heads);
    HCOMM__TRY(hcomm__cp_agree(g, op->fn, &mine, "in", "seq_dim,head_dim,out_heads"));
    return exchange(g, op->fn, &geo, in, out, false);
}

hcomm_result_t hcomm_cp_a2a_seq_to_head(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                        hcomm_tensor_t *out, int seq_dim, int head_dim) {
    return hcomm__cp_run(group, in, out,
                         (cp_op_t){__func__, s2h_body, .a = seq_dim, .b = head_dim});
}

hcomm_result_t hcomm_cp_a2a_head_to_seq(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                        hcomm_tensor_t *out, int seq_dim, int head_dim) {
    return hcomm__cp_run(group, in, out,
                         (cp_op_t){__func__, h2s_body, .a = seq_dim, .b = head_dim});
}

hcomm_result_t hcomm_cp_ia2a_seq_to_head(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                         hcomm_tensor_t *out, int seq_dim, int head_dim,
                                         hcomm_request_t **req) {
    return hcomm__cp_issue(group, in, out,
                           (cp_op_t){__func__, s2h_body, .a = seq_dim, .b = head_dim}, req);
}

hcomm_result_t hcomm_cp_ia2a_head_to_seq(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                         hcomm_tensor_t *out, int seq_dim, int head_dim,
                                         hcomm_request_t **req) {
    return hcomm__cp_issue(group, in, out,
                           (cp_op_t){__func__, h2s_body, .a = seq_dim, .b = head_dim}, req);
}
