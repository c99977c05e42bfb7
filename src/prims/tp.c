/* Tensor-parallel primitives (Megatron-LM, Shoeybi et al. 2019; region mappings follow
 * megatron/core/tensor_parallel/mappings.py). The backend collectives move flat byte blocks in
 * rank order; gathering or scattering along an inner dim is a permutation on top:
 * a tensor [outer, size * k, inner] viewed as [outer][size][block] is the concatenation, and
 * [size][outer][block] is the rank-major stack the backend works on. */
#include "hcomm/tp.h"
#include "algo/async.h"
#include "prims/prims.h"

#include <string.h>

/* The public function being served and the names its tensors have in its signature, so one
 * implementation serves e.g. hcomm_tp_split and hcomm_tp_gather_from_bwd with exact messages. */
typedef struct tp_call {
    const char *fn, *in, *out;
} tp_call_t;

#define TP_CALL(in_name, out_name) (&(tp_call_t){__func__, in_name, out_name})

/* Checks group, both tensors and that their dtypes agree; *numel is the element count of in. */
static hcomm_result_t check_pair(const tp_call_t *c, hcomm_comm_t *group, const hcomm_tensor_t *in,
                                 const hcomm_tensor_t *out, size_t *numel) {
    if (group == NULL)
        return hcomm__err(HCOMM_ERR_NULL, c->fn, "argument 'group' is NULL");
    HCOMM__TRY(hcomm__tensor_check(c->fn, c->in, in, numel));
    HCOMM__TRY(hcomm__tensor_check(c->fn, c->out, out, NULL));
    if (in->data != out->data &&
        hcomm__overlaps(in->data, hcomm__tensor_bytes(in), out->data, hcomm__tensor_bytes(out)))
        return hcomm__err(HCOMM_ERR_INVALID_ARG, c->fn,
                          "%s->data and %s->data partially overlap; pass the same tensor (in "
                          "place, where allowed) or separate buffers",
                          c->in, c->out);
    return hcomm__same_dtype(c->fn, c->in, in, c->out, out);
}

/* For the calls with no in-place form: out is larger (all_gather) or a slice (split) of in, so
 * one buffer for both would be read after it was written (a group of one copies nothing). */
static hcomm_result_t check_distinct(const tp_call_t *c, const hcomm_comm_t *group,
                                     const hcomm_tensor_t *in, const hcomm_tensor_t *out) {
    if (in->data != out->data || hcomm__tensor_bytes(in) == 0 || group->size == 1)
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_INVALID_ARG, c->fn,
                      "%s->data and %s->data are the same buffer (%p); this call has no in-place "
                      "form, pass separate buffers",
                      c->in, c->out, in->data);
}

static hcomm_result_t check_op(const tp_call_t *c, hcomm_op_t op) {
    if (!hcomm__op_valid(op))
        return hcomm__err(HCOMM_ERR_INVALID_ARG, c->fn, "op=%d is not a valid hcomm_op_t", (int)op);
    return HCOMM_OK;
}

/* Fails unless big->shape[d] splits evenly over the group. */
static hcomm_result_t check_divisible(const tp_call_t *c, const char *name,
                                      const hcomm_tensor_t *big, int d, int size) {
    if (big->shape[d] % size == 0)
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_SHAPE, c->fn,
                      "%s->shape[%d]=%lld is not divisible by group size %d", name, d,
                      (long long)big->shape[d], size);
}

/* Fails unless t has ref's ndim and shape except shape[d] == want_d. */
static hcomm_result_t check_shape_but_dim(const tp_call_t *c, const char *name,
                                          const hcomm_tensor_t *t, const hcomm_tensor_t *ref, int d,
                                          int64_t want_d) {
    hcomm_tensor_t want = *ref;
    want.shape[d] = want_d;
    bool same = t->ndim == want.ndim;
    for (int i = 0; same && i < want.ndim; i++)
        same = t->shape[i] == want.shape[i];
    if (same)
        return HCOMM_OK;
    char got[160], exp[160];
    return hcomm__err(HCOMM_ERR_SHAPE, c->fn, "%s shape %s, expected %s (dim %d)", name,
                      hcomm__shape_str(t, got, sizeof got),
                      hcomm__shape_str(&want, exp, sizeof exp), d);
}

/* A failed check inside a collective body: this rank joins its peers' call (they get
 * HCOMM_ERR_PEER) and returns its own error. */
#define TP_CHECK(group, call)                                                                      \
    do {                                                                                           \
        hcomm_result_t chk_ = (call);                                                              \
        if (chk_ != HCOMM_OK)                                                                      \
            return hcomm__coll_fail(group, chk_);                                                  \
    } while (0)

/* Product of shape[0..d-1]: how many blocks precede dim d. */
static size_t outer_count(const hcomm_tensor_t *t, int d) {
    size_t n = 1;
    for (int i = 0; i < d; i++)
        n *= (size_t)t->shape[i];
    return n;
}

/* Rank-major stack src[size][outer][blk] -> concatenation dst[outer][size][blk]. */
static void stack_to_concat(const char *src, char *dst, int size, size_t outer, size_t blk) {
    for (int r = 0; r < size; r++)
        for (size_t o = 0; o < outer; o++)
            memcpy(dst + (o * (size_t)size + (size_t)r) * blk, src + ((size_t)r * outer + o) * blk,
                   blk);
}

/* Concatenation src[outer][size][blk] -> rank-major stack dst[size][outer][blk]. */
static void concat_to_stack(const char *src, char *dst, int size, size_t outer, size_t blk) {
    for (int r = 0; r < size; r++)
        for (size_t o = 0; o < outer; o++)
            memcpy(dst + ((size_t)r * outer + o) * blk, src + (o * (size_t)size + (size_t)r) * blk,
                   blk);
}

static hcomm_result_t tp_all_reduce_body(const tp_call_t *c, hcomm_comm_t *group,
                                         const hcomm_tensor_t *in, hcomm_tensor_t *out,
                                         hcomm_op_t op) {
    size_t n = 0;
    TP_CHECK(group, check_pair(c, group, in, out, &n));
    TP_CHECK(group, hcomm__tensor_same_shape(c->fn, c->in, in, c->out, out));
    TP_CHECK(group, check_op(c, op));
    return hcomm__coll_all_reduce(group, in->data, out->data, n, in->dtype, op);
}

static hcomm_result_t tp_all_gather_body(const tp_call_t *c, hcomm_comm_t *group,
                                         const hcomm_tensor_t *in, hcomm_tensor_t *out, int dim) {
    int d = 0;
    TP_CHECK(group, check_pair(c, group, in, out, NULL));
    TP_CHECK(group, hcomm__tensor_dim(c->fn, c->in, in, dim, &d));
    TP_CHECK(group, check_shape_but_dim(c, c->out, out, in, d, in->shape[d] * group->size));
    TP_CHECK(group, check_distinct(c, group, in, out));
    size_t bytes = hcomm__tensor_bytes(in), outer = outer_count(in, d);
    if (outer == 1 || bytes == 0) /* the stack already is the concatenation */
        return hcomm__coll_all_gather(group, in->data, out->data, bytes);
    void *tmp = NULL;
    TP_CHECK(group, hcomm__alloc(c->fn, bytes * (size_t)group->size, &tmp));
    hcomm_result_t res = hcomm__coll_all_gather(group, in->data, tmp, bytes);
    if (res == HCOMM_OK)
        stack_to_concat(tmp, out->data, group->size, outer, bytes / outer);
    free(tmp);
    return res;
}

static hcomm_result_t tp_reduce_scatter_body(const tp_call_t *c, hcomm_comm_t *group,
                                             const hcomm_tensor_t *in, hcomm_tensor_t *out, int dim,
                                             hcomm_op_t op) {
    int d = 0;
    size_t n = 0;
    TP_CHECK(group, check_pair(c, group, in, out, &n));
    TP_CHECK(group, hcomm__tensor_dim(c->fn, c->in, in, dim, &d));
    TP_CHECK(group, check_divisible(c, c->in, in, d, group->size));
    TP_CHECK(group, check_shape_but_dim(c, c->out, out, in, d, in->shape[d] / group->size));
    TP_CHECK(group, check_op(c, op));
    size_t count = n / (size_t)group->size, outer = outer_count(in, d);
    if (outer == 1 || count == 0)
        return hcomm__coll_reduce_scatter(group, in->data, out->data, count, in->dtype, op);
    void *tmp = NULL;
    size_t bytes = hcomm__tensor_bytes(in);
    TP_CHECK(group, hcomm__alloc(c->fn, bytes, &tmp));
    concat_to_stack(in->data, tmp, group->size, outer, bytes / outer / (size_t)group->size);
    hcomm_result_t res = hcomm__coll_reduce_scatter(group, tmp, out->data, count, in->dtype, op);
    free(tmp);
    return res;
}

/* The three collectives, as data: one function runs any of them now, one on the worker. */
typedef enum { TP_ALL_REDUCE, TP_ALL_GATHER, TP_REDUCE_SCATTER } tp_coll_t;

/* The collective kind's body (dim and op where it has them). */
static hcomm_result_t tp_body(const tp_call_t *c, hcomm_comm_t *group, const hcomm_tensor_t *in,
                              hcomm_tensor_t *out, tp_coll_t kind, int dim, hcomm_op_t op) {
    switch (kind) {
    case TP_ALL_REDUCE:
        return tp_all_reduce_body(c, group, in, out, op);
    case TP_ALL_GATHER:
        return tp_all_gather_body(c, group, in, out, dim);
    default:
        return tp_reduce_scatter_body(c, group, in, out, dim, op);
    }
}

/* Runs a collective now, as the call c->fn on group. */
static hcomm_result_t tp_coll(const tp_call_t *c, hcomm_comm_t *group, const hcomm_tensor_t *in,
                              hcomm_tensor_t *out, tp_coll_t kind, int dim, hcomm_op_t op) {
    if (group == NULL)
        return hcomm__err(HCOMM_ERR_NULL, c->fn, "argument 'group' is NULL");
    hcomm__enter(group, c->fn);
    return hcomm__leave(group, tp_body(c, group, in, out, kind, dim, op));
}

static hcomm_result_t tp_split(const tp_call_t *c, hcomm_comm_t *group, const hcomm_tensor_t *in,
                               hcomm_tensor_t *out, int dim) {
    int d = 0;
    HCOMM__TRY(check_pair(c, group, in, out, NULL));
    HCOMM__TRY(hcomm__tensor_dim(c->fn, c->in, in, dim, &d));
    HCOMM__TRY(check_divisible(c, c->in, in, d, group->size));
    HCOMM__TRY(check_shape_but_dim(c, c->out, out, in, d, in->shape[d] / group->size));
    HCOMM__TRY(check_distinct(c, group, in, out));
    size_t outer = outer_count(in, d), bytes = hcomm__tensor_bytes(out);
    if (bytes == 0)
        return HCOMM_OK;
    if (in->data == out->data) /* a group of one, where the slice is all of in */
        return HCOMM_OK;
    size_t blk = bytes / outer, size = (size_t)group->size, rank = (size_t)group->rank;
    for (size_t o = 0; o < outer; o++)
        memcpy((char *)out->data + o * blk, (const char *)in->data + (o * size + rank) * blk, blk);
    return HCOMM_OK;
}

static hcomm_result_t tp_identity(const tp_call_t *c, hcomm_comm_t *group, const hcomm_tensor_t *in,
                                  hcomm_tensor_t *out) {
    HCOMM__TRY(check_pair(c, group, in, out, NULL));
    HCOMM__TRY(hcomm__tensor_same_shape(c->fn, c->in, in, c->out, out));
    size_t bytes = hcomm__tensor_bytes(in);
    if (bytes > 0 && in->data != out->data)
        memmove(out->data, in->data, bytes);
    return HCOMM_OK;
}

/* The region mappings' collectives: all_reduce(sum), and all_gather along dim. */
static hcomm_result_t tp_sum(const tp_call_t *c, hcomm_comm_t *group, const hcomm_tensor_t *in,
                             hcomm_tensor_t *out) {
    return tp_coll(c, group, in, out, TP_ALL_REDUCE, 0, HCOMM_SUM);
}

static hcomm_result_t tp_gather(const tp_call_t *c, hcomm_comm_t *group, const hcomm_tensor_t *in,
                                hcomm_tensor_t *out, int dim) {
    return tp_coll(c, group, in, out, TP_ALL_GATHER, dim, HCOMM_SUM);
}

static hcomm_result_t tp_scatter_sum(const tp_call_t *c, hcomm_comm_t *group,
                                     const hcomm_tensor_t *in, hcomm_tensor_t *out, int dim) {
    return tp_coll(c, group, in, out, TP_REDUCE_SCATTER, dim, HCOMM_SUM);
}

/* --- the public calls: each runs one of the calls above under its own name, naming its tensors
 * as its signature does (the parameter names are the names in the messages) --- */

/* name(group, in, out) and name(group, in, out, dim) run body. */
#define TP_ENTRY(name, body, in, out)                                                              \
    hcomm_result_t name(hcomm_comm_t *group, const hcomm_tensor_t *in, hcomm_tensor_t *out) {      \
        return body(TP_CALL(#in, #out), group, in, out);                                           \
    }
#define TP_ENTRY_DIM(name, body, in, out)                                                          \
    hcomm_result_t name(hcomm_comm_t *group, const hcomm_tensor_t *in, hcomm_tensor_t *out,        \
                        int dim) {                                                                 \
        return body(TP_CALL(#in, #out), group, in, out, dim);                                      \
    }

hcomm_result_t hcomm_tp_all_reduce(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                   hcomm_tensor_t *out, hcomm_op_t op) {
    return tp_coll(TP_CALL("in", "out"), group, in, out, TP_ALL_REDUCE, 0, op);
}

hcomm_result_t hcomm_tp_reduce_scatter(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                       hcomm_tensor_t *out, int dim, hcomm_op_t op) {
    return tp_coll(TP_CALL("in", "out"), group, in, out, TP_REDUCE_SCATTER, dim, op);
}

TP_ENTRY_DIM(hcomm_tp_all_gather, tp_gather, in, out)
TP_ENTRY_DIM(hcomm_tp_split, tp_split, in, out)

/* Region mappings (Megatron's mappings.py), forward and backward side by side. */
TP_ENTRY(hcomm_tp_copy_to_fwd, tp_identity, in, out)
TP_ENTRY(hcomm_tp_copy_to_bwd, tp_sum, grad_out, grad_in)
TP_ENTRY(hcomm_tp_reduce_from_fwd, tp_sum, in, out)
TP_ENTRY(hcomm_tp_reduce_from_bwd, tp_identity, grad_out, grad_in)
TP_ENTRY_DIM(hcomm_tp_scatter_to_fwd, tp_split, in, out)
TP_ENTRY_DIM(hcomm_tp_scatter_to_bwd, tp_gather, grad_out, grad_in)
TP_ENTRY_DIM(hcomm_tp_gather_from_fwd, tp_gather, in, out)
TP_ENTRY_DIM(hcomm_tp_gather_from_bwd, tp_split, grad_out, grad_in)

/* Sequence-parallel regions (mappings.py's *_sequence_parallel_region). */
TP_ENTRY_DIM(hcomm_tp_gather_from_sp_fwd, tp_gather, in, out)
TP_ENTRY_DIM(hcomm_tp_gather_from_sp_bwd, tp_scatter_sum, grad_out, grad_in)
TP_ENTRY_DIM(hcomm_tp_reduce_scatter_to_sp_fwd, tp_scatter_sum, in, out)
TP_ENTRY_DIM(hcomm_tp_reduce_scatter_to_sp_bwd, tp_gather, grad_out, grad_in)
TP_ENTRY_DIM(hcomm_tp_scatter_to_sp_fwd, tp_split, in, out)
TP_ENTRY_DIM(hcomm_tp_scatter_to_sp_bwd, tp_gather, grad_out, grad_in)

/* --- nonblocking forms: the whole body (checks, permutation) runs on the group's worker --- */

typedef struct tp_icall {
    tp_call_t call;
    hcomm_tensor_t in, out;
    tp_coll_t kind;
    int dim;
    hcomm_op_t op;
} tp_icall_t;

static hcomm_result_t run_icall(hcomm_comm_t *g, void *p) {
    tp_icall_t *a = p;
    return tp_body(&a->call, g, &a->in, &a->out, a->kind, a->dim, a->op);
}

/* Copies the descriptors (the caller's may go away; the data must not) and queues the body. */
static hcomm_result_t tp_issue(const char *fn, hcomm_comm_t *group, const hcomm_tensor_t *in,
                               hcomm_tensor_t *out, tp_coll_t kind, int dim, hcomm_op_t op,
                               hcomm_request_t **req) {
    if (group == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'group' is NULL");
    hcomm__enter(group, fn);
    if (req == NULL || in == NULL || out == NULL) { /* joins the peers' operation all the same */
        hcomm_result_t e = hcomm__err(HCOMM_ERR_NULL, fn, "argument '%s' is NULL",
                                      req == NULL  ? "req"
                                      : in == NULL ? "in"
                                                   : "out");
        return hcomm__leave(group, req ? hcomm__icoll_fail(group, e, req)
                                       : hcomm__icoll_fail_now(group, e));
    }
    *req = NULL;
    tp_icall_t a = {
        .call = {fn, "in", "out"}, .in = *in, .out = *out, .kind = kind, .dim = dim, .op = op};
    return hcomm__leave(group, hcomm__icall(group, run_icall, &a, sizeof a, req));
}

hcomm_result_t hcomm_tp_iall_reduce(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                    hcomm_tensor_t *out, hcomm_op_t op, hcomm_request_t **req) {
    return tp_issue(__func__, group, in, out, TP_ALL_REDUCE, 0, op, req);
}

hcomm_result_t hcomm_tp_iall_gather(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                    hcomm_tensor_t *out, int dim, hcomm_request_t **req) {
    return tp_issue(__func__, group, in, out, TP_ALL_GATHER, dim, HCOMM_SUM, req);
}

hcomm_result_t hcomm_tp_ireduce_scatter(hcomm_comm_t *group, const hcomm_tensor_t *in,
                                        hcomm_tensor_t *out, int dim, hcomm_op_t op,
                                        hcomm_request_t **req) {
    return tp_issue(__func__, group, in, out, TP_REDUCE_SCATTER, dim, op, req);
}
