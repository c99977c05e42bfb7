/* Data-parallel gradient all-reduce, bucketed as PyTorch DDP (Li et al. 2020): many small
 * tensors share one all_reduce, so the per-call latency is paid per bucket, not per tensor.
 * Dtypes are handled in order of first appearance; within a dtype, tensors go into buckets in
 * list order. A bucket holding a single tensor is reduced in place without packing. */
#include "hcomm/dp.h"
#include "prims/prims.h"

#include <stdio.h>
#include <string.h>

/* One bucket: tensors of dtype dt among grads[first..end-1], bytes in all. */
typedef struct bucket {
    hcomm_dtype_t dt;
    int first, end, count;
    size_t bytes;
} bucket_t;

/* Extends b from grads[b->end] over the next tensors of b->dt that fit in cap bytes (one
 * tensor at least, however large). False when no tensor of the dtype is left. */
static bool next_bucket(const hcomm_tensor_t *grads, int n, size_t cap, bucket_t *b) {
    b->first = b->end;
    b->count = 0;
    b->bytes = 0;
    for (int i = b->first; i < n; i++) {
        size_t tb = hcomm__tensor_bytes(&grads[i]);
        if (grads[i].dtype != b->dt || tb == 0) {
            if (b->count == 0)
                b->first = i + 1;
            continue;
        }
        if (b->count > 0 && b->bytes + tb > cap)
            break;
        b->bytes += tb;
        b->count++;
        b->end = i + 1;
    }
    if (b->count == 0)
        b->end = n;
    return b->count > 0;
}

/* Largest bucket that needs packing (two or more tensors): the one scratch buffer's size. */
static size_t max_packed_bytes(const hcomm_tensor_t *grads, int n, size_t cap) {
    size_t max = 0;
    for (int d = 0; d < HCOMM_DTYPE_COUNT; d++) {
        bucket_t b = {.dt = (hcomm_dtype_t)d};
        while (next_bucket(grads, n, cap, &b))
            if (b.count > 1 && b.bytes > max)
                max = b.bytes;
    }
    return max;
}

static hcomm_result_t reduce_bucket(hcomm_comm_t *g, hcomm_tensor_t *grads, const bucket_t *b,
                                    char *buf, hcomm_op_t op) {
    size_t es = hcomm__dtype_size(b->dt);
    if (b->count == 1) {
        hcomm_tensor_t *t = &grads[b->end - 1];
        size_t count = hcomm__tensor_bytes(t) / es;
        return hcomm__coll_all_reduce(g, t->data, t->data, count, b->dt, op);
    }
    size_t off = 0;
    for (int i = b->first; i < b->end; i++)
        if (grads[i].dtype == b->dt) {
            size_t tb = hcomm__tensor_bytes(&grads[i]);
            memcpy(buf + off, grads[i].data, tb);
            off += tb;
        }
    HCOMM__TRY(hcomm__coll_all_reduce(g, buf, buf, b->bytes / es, b->dt, op));
    off = 0;
    for (int i = b->first; i < b->end; i++)
        if (grads[i].dtype == b->dt) {
            size_t tb = hcomm__tensor_bytes(&grads[i]);
            memcpy(grads[i].data, buf + off, tb);
            off += tb;
        }
    return HCOMM_OK;
}

static hcomm_result_t dp_buckets(hcomm_comm_t *dp_group, hcomm_tensor_t *grads, int n,
                                 hcomm_op_t op, size_t bucket_bytes);

hcomm_result_t hcomm__dp_check_grads(const char *fn, const hcomm_tensor_t *grads, int n,
                                     hcomm_op_t op) {
    if (n < 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "n=%d is negative", n);
    if (op != HCOMM_SUM && op != HCOMM_AVG)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "op=%d is not HCOMM_SUM or HCOMM_AVG",
                          (int)op);
    if (n > 0 && grads == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'grads' is NULL with n=%d", n);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "grads[%d]", i);
        HCOMM__TRY(hcomm__tensor_check(fn, name, &grads[i], NULL));
    }
    return HCOMM_OK;
}

/* FNV-1a over the list's dtypes and shapes, and a short text of it for messages: peers compare
 * the digest in every bucket's signature, so lists in another order fail instead of mixing. */
uint64_t hcomm__dp_list_digest(const hcomm_tensor_t *grads, int n, char *desc, size_t cap) {
    uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    MIX(n);
    int len = snprintf(desc, cap, "grads=[");
    for (int i = 0; i < n; i++) {
        MIX(grads[i].dtype);
        MIX(grads[i].ndim);
        for (int d = 0; d < grads[i].ndim; d++)
            MIX(grads[i].shape[d]);
        char shape[96];
        if (len > 0 && (size_t)len < cap)
            len += snprintf(desc + len, cap - (size_t)len, "%s%s%s", i ? ", " : "",
                            hcomm__dtype_str(grads[i].dtype),
                            hcomm__shape_str(&grads[i], shape, sizeof shape));
    }
#undef MIX
    if (len > 0 && (size_t)len < cap)
        snprintf(desc + len, cap - (size_t)len, "]");
    return h;
}

static hcomm_result_t dp_all_reduce(hcomm_comm_t *dp_group, hcomm_tensor_t *grads, int n,
                                    hcomm_op_t op, size_t bucket_bytes) {
    const char *fn = dp_group->call_fn;
    hcomm_result_t chk = hcomm__dp_check_grads(fn, grads, n, op);
    if (chk != HCOMM_OK)
        return hcomm__coll_fail(dp_group, chk);
    char desc[200];
    hcomm__coll_set_extra(dp_group, hcomm__dp_list_digest(grads, n, desc, sizeof desc), desc);
    hcomm_result_t res = dp_buckets(dp_group, grads, n, op, bucket_bytes);
    hcomm__coll_clear_extra(dp_group);
    return res;
}

hcomm_result_t hcomm_dp_all_reduce_grads(hcomm_comm_t *dp_group, hcomm_tensor_t *grads, int n,
                                         hcomm_op_t op, size_t bucket_bytes) {
    HCOMM__CHECK_NULL(dp_group);
    hcomm__enter(dp_group, __func__);
    return hcomm__leave(dp_group, dp_all_reduce(dp_group, grads, n, op, bucket_bytes));
}

static hcomm_result_t dp_buckets(hcomm_comm_t *dp_group, hcomm_tensor_t *grads, int n,
                                 hcomm_op_t op, size_t bucket_bytes) {
    const char *fn = dp_group->call_fn;
    size_t cap = bucket_bytes ? bucket_bytes : HCOMM_DP_BUCKET_BYTES_DEFAULT;
    char *buf = NULL;
    HCOMM__TRY(hcomm__alloc(fn, max_packed_bytes(grads, n, cap), (void **)&buf));
    bool seen[HCOMM_DTYPE_COUNT] = {false};
    hcomm_result_t res = HCOMM_OK;
    int buckets = 0;
    for (int i = 0; i < n && res == HCOMM_OK; i++) {
        if (seen[grads[i].dtype])
            continue;
        seen[grads[i].dtype] = true;
        bucket_t b = {.dt = grads[i].dtype};
        for (; res == HCOMM_OK && next_bucket(grads, n, cap, &b); buckets++)
            res = reduce_bucket(dp_group, grads, &b, buf, op);
    }
    free(buf);
    /* Nothing to reduce still meets the peers: a list that differs, or a rank whose checks
     * failed, is then reported in this call rather than in the next. */
    return buckets == 0 ? hcomm__coll_all_reduce(dp_group, NULL, NULL, 0, HCOMM_U8, HCOMM_SUM)
                        : res;
}
