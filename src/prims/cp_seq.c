/* Sequence layouts of context parallelism: the contiguous and zigzag splits and all-gather CP
 * (Megatron-Core's cp_comm_type "all_gather": KV gathered along the sequence forward, dKV
 * reduce-scattered backward). A rank's part is nseg segments of rows; segment k of rank r is
 * chunk chunk_of(r, k) of the full sequence, so one permutation serves every layout. */
#include "prims/cp_common.h"

#include <string.h>

/* A tensor as [outer][seq][inner bytes] around the sequence dim, and the layout's segments. */
typedef struct seq_view {
    size_t outer, row;  /* rows before the sequence dim; bytes of one sequence row */
    int64_t full, part; /* the full and one rank's sequence extent */
    int nseg, p;        /* segments per rank; ranks */
    int64_t seg;        /* rows per segment */
    int flags;
} seq_view_t;

static int chunk_of(const seq_view_t *v, int r, int k) {
    return v->flags == HCOMM_CP_ZIGZAG && k == 1 ? 2 * v->p - 1 - r : r;
}

/* Fails unless flags is a layout and full divides into its chunks (naming both numbers). */
static hcomm_result_t check_layout(const char *fn, const char *name, int d, int64_t full, int p,
                                   int flags) {
    if (flags != HCOMM_CP_CONTIGUOUS && flags != HCOMM_CP_ZIGZAG)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "flags=%d is not HCOMM_CP_CONTIGUOUS (0) or HCOMM_CP_ZIGZAG (1)", flags);
    int chunks = flags == HCOMM_CP_ZIGZAG ? 2 * p : p;
    if (full % chunks == 0)
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_SHAPE, fn,
                      "%s->shape[%d]=%lld (the sequence) is not divisible by %s=%d", name, d,
                      (long long)full, flags == HCOMM_CP_ZIGZAG ? "2*cp" : "cp", chunks);
}

static seq_view_t view_of(const hcomm_tensor_t *full, int d, int p, int flags) {
    seq_view_t v = {.outer = 1, .row = hcomm__dtype_size(full->dtype), .p = p, .flags = flags};
    for (int i = 0; i < d; i++)
        v.outer *= (size_t)full->shape[i];
    for (int i = d + 1; i < full->ndim; i++)
        v.row *= (size_t)full->shape[i];
    v.full = full->shape[d];
    v.part = v.full / p;
    v.nseg = flags == HCOMM_CP_ZIGZAG ? 2 : 1;
    v.seg = v.part / v.nseg;
    return v;
}

/* Byte offsets of segment k of rank r: in the full tensor's outer row o, and in the part. */
static size_t full_at(const seq_view_t *v, size_t o, int r, int k) {
    return (o * (size_t)v->full + (size_t)(chunk_of(v, r, k) * v->seg)) * v->row;
}
static size_t part_at(const seq_view_t *v, size_t o, int k) {
    return (o * (size_t)v->part + (size_t)(k * v->seg)) * v->row;
}

/* Rank r's part of full (or the rank-major stack's r-th part) <-> full, every segment. */
static void part_from_full(const seq_view_t *v, int r, const char *full, char *part) {
    for (size_t o = 0; o < v->outer; o++)
        for (int k = 0; k < v->nseg; k++)
            memcpy(part + part_at(v, o, k), full + full_at(v, o, r, k), (size_t)v->seg * v->row);
}
static void full_from_part(const seq_view_t *v, int r, const char *part, char *full) {
    for (size_t o = 0; o < v->outer; o++)
        for (int k = 0; k < v->nseg; k++)
            memcpy(full + full_at(v, o, r, k), part + part_at(v, o, k), (size_t)v->seg * v->row);
}

/* The checks every call shares: tensors, dtypes, no overlap, the sequence dim, the layout,
 * and the other tensor's shape (the part's from the full one's, or the full one's from the
 * part's for the gather). */
static hcomm_result_t check_call(const cp_op_t *op, hcomm_comm_t *g, const hcomm_tensor_t *in,
                                 const hcomm_tensor_t *out, bool in_is_full, int *d) {
    HCOMM__TRY(hcomm__tensor_check(op->fn, "in", in, NULL));
    HCOMM__TRY(hcomm__tensor_check(op->fn, "out", out, NULL));
    HCOMM__TRY(hcomm__same_dtype(op->fn, "in", in, "out", out));
    HCOMM__TRY(hcomm__cp_disjoint(op->fn, "in", in, "out", out));
    HCOMM__TRY(hcomm__tensor_dim(op->fn, "in", in, op->a, d));
    int64_t s = in->shape[*d];
    if (!in_is_full) {
        HCOMM__TRY(hcomm__cp_shape_as(op->fn, "out", out, in, *d, s * g->size, -1, 0));
        return check_layout(op->fn, "out", *d, s * g->size, g->size, op->b);
    }
    HCOMM__TRY(check_layout(op->fn, "in", *d, s, g->size, op->b));
    return hcomm__cp_shape_as(op->fn, "out", out, in, *d, s / g->size, -1, 0);
}

static hcomm_result_t split_body(hcomm_comm_t *g, const cp_op_t *op, const hcomm_tensor_t *in,
                                 hcomm_tensor_t *out) {
    int d = 0;
    HCOMM__TRY(check_call(op, g, in, out, true, &d));
    seq_view_t v = view_of(in, d, g->size, op->b);
    if (hcomm__tensor_bytes(out) > 0)
        part_from_full(&v, g->rank, in->data, out->data);
    return HCOMM_OK;
}

static hcomm_result_t gather_body(hcomm_comm_t *g, const cp_op_t *op, const hcomm_tensor_t *in,
                                  hcomm_tensor_t *out) {
    int d = 0;
    CP_CHECK(g, check_call(op, g, in, out, false, &d));
    cp_desc_t mine = hcomm__cp_desc(in, d, op->b, 0);
    HCOMM__TRY(hcomm__cp_agree(g, op->fn, &mine, "in", "seq_dim,flags"));
    size_t bytes = hcomm__tensor_bytes(in);
    seq_view_t v = view_of(out, d, g->size, op->b);
    if (bytes == 0 || (v.outer == 1 && v.nseg == 1)) /* the stack already is the sequence */
        return hcomm__coll_all_gather(g, in->data, out->data, bytes);
    char *tmp = NULL;
    HCOMM__TRY(hcomm__alloc(op->fn, bytes * (size_t)g->size, (void **)&tmp));
    hcomm_result_t res = hcomm__coll_all_gather(g, in->data, tmp, bytes);
    for (int r = 0; res == HCOMM_OK && r < g->size; r++)
        full_from_part(&v, r, tmp + (size_t)r * bytes, out->data);
    free(tmp);
    return res;
}

static hcomm_result_t reduce_scatter_body(hcomm_comm_t *g, const cp_op_t *op,
                                          const hcomm_tensor_t *in, hcomm_tensor_t *out) {
    int d = 0;
    size_t n = 0;
    CP_CHECK(g, check_call(op, g, in, out, true, &d));
    CP_CHECK(g, hcomm__tensor_check(op->fn, "in", in, &n));
    cp_desc_t mine = hcomm__cp_desc(in, d, op->b, 0);
    HCOMM__TRY(hcomm__cp_agree(g, op->fn, &mine, "in", "seq_dim,flags"));
    size_t count = n / (size_t)g->size, bytes = hcomm__tensor_bytes(out);
    seq_view_t v = view_of(in, d, g->size, op->b);
    if (count == 0 || (v.outer == 1 && v.nseg == 1))
        return hcomm__coll_reduce_scatter(g, in->data, out->data, count, in->dtype, HCOMM_SUM);
    char *tmp = NULL;
    HCOMM__TRY(hcomm__alloc(op->fn, bytes * (size_t)g->size, (void **)&tmp));
    for (int r = 0; r < g->size; r++)
        part_from_full(&v, r, in->data, tmp + (size_t)r * bytes);
    hcomm_result_t res = hcomm__coll_reduce_scatter(g, tmp, out->data, count, in->dtype, HCOMM_SUM);
    free(tmp);
    return res;
}

hcomm_result_t hcomm_cp_split(hcomm_comm_t *group, const hcomm_tensor_t *in, hcomm_tensor_t *out,
                              int seq_dim, int flags) {
    if (group == NULL)
        return hcomm__err(HCOMM_ERR_NULL, __func__, "argument 'group' is NULL");
    cp_op_t op = {__func__, split_body, .a = seq_dim, .b = flags};
    return split_body(group, &op, in, out);
}

hcomm_result_t hcomm_cp_all_gather(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                   hcomm_tensor_t *out, int seq_dim, int flags) {
    return hcomm__cp_run(group, in, out,
                         (cp_op_t){__func__, gather_body, .a = seq_dim, .b = flags});
}

hcomm_result_t hcomm_cp_reduce_scatter(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                       hcomm_tensor_t *out, int seq_dim, int flags) {
    return hcomm__cp_run(group, in, out,
                         (cp_op_t){__func__, reduce_scatter_body, .a = seq_dim, .b = flags});
}

hcomm_result_t hcomm_cp_iall_gather(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                    hcomm_tensor_t *out, int seq_dim, int flags,
                                    hcomm_request_t **req) {
    return hcomm__cp_issue(group, in, out,
                           (cp_op_t){__func__, gather_body, .a = seq_dim, .b = flags}, req);
}

hcomm_result_t hcomm_cp_ireduce_scatter(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                        hcomm_tensor_t *out, int seq_dim, int flags,
                                        hcomm_request_t **req) {
    return hcomm__cp_issue(group, in, out,
                           (cp_op_t){__func__, reduce_scatter_body, .a = seq_dim, .b = flags}, req);
}
