#include "core/internal.h"

#include <stddef.h>
#include <stdio.h>

hcomm_result_t hcomm_tensor_init(hcomm_tensor_t *t, void *data, hcomm_dtype_t dtype, int ndim,
                                 const int64_t *shape) {
    HCOMM__CHECK_NULL(t);
    if (!hcomm__dtype_valid(dtype))
        return hcomm__err(HCOMM_ERR_DTYPE, __func__, "dtype=%d is not a valid hcomm_dtype_t",
                          (int)dtype);
    if (ndim < 0 || ndim > HCOMM_MAX_DIMS)
        return hcomm__err(HCOMM_ERR_SHAPE, __func__, "ndim=%d outside 0..%d", ndim, HCOMM_MAX_DIMS);
    if (ndim > 0 && shape == NULL)
        return hcomm__err(HCOMM_ERR_NULL, __func__, "argument 'shape' is NULL with ndim=%d", ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return hcomm__err(HCOMM_ERR_SHAPE, __func__, "shape[%d]=%lld is negative", i,
                              (long long)shape[i]);
    *t = (hcomm_tensor_t){.data = data, .dtype = dtype, .ndim = ndim};
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    return HCOMM_OK;
}

hcomm_result_t hcomm__span(const char *fn, const char *name, size_t count, size_t es, size_t times,
                           size_t *bytes) {
    size_t most = HCOMM__MAX_BUFFER_BYTES / (es ? es : 1) / (times ? times : 1);
    if (count > most && times > 1)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "%s=%zu times %zu ranks is larger than any buffer can be (%zu bytes)",
                          name, count, times, (size_t)HCOMM__MAX_BUFFER_BYTES);
    if (count > most)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "%s=%zu is larger than any buffer can be (%zu bytes)", name, count,
                          (size_t)HCOMM__MAX_BUFFER_BYTES);
    if (bytes)
        *bytes = count * es * times;
    return HCOMM_OK;
}

hcomm_result_t hcomm__check_aligned(const char *fn, const char *name, const void *buf,
                                    hcomm_dtype_t dt) {
    size_t es = hcomm__dtype_size(dt);
    if ((uintptr_t)buf % es == 0)
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s=%p is not aligned to %s's %zu-byte elements",
                      name, buf, hcomm__dtype_str(dt), es);
}

hcomm_result_t hcomm_tensor_numel(const hcomm_tensor_t *t, size_t *count) {
    HCOMM__CHECK_NULL(count);
    return hcomm__tensor_check(__func__, "t", t, count);
}

hcomm_result_t hcomm__tensor_check(const char *fn, const char *arg, const hcomm_tensor_t *t,
                                   size_t *numel) {
    if (t == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument '%s' is NULL", arg);
    if (!hcomm__dtype_valid(t->dtype))
        return hcomm__err(HCOMM_ERR_DTYPE, fn, "%s->dtype=%d is not a valid hcomm_dtype_t", arg,
                          (int)t->dtype);
    if (t->ndim < 0 || t->ndim > HCOMM_MAX_DIMS)
        return hcomm__err(HCOMM_ERR_SHAPE, fn, "%s->ndim=%d outside 0..%d", arg, t->ndim,
                          HCOMM_MAX_DIMS);
    size_t n = 1, limit = HCOMM__MAX_BUFFER_BYTES / hcomm__dtype_size(t->dtype);
    bool zero = false;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return hcomm__err(HCOMM_ERR_SHAPE, fn, "%s->shape[%d]=%lld is negative", arg, i,
                              (long long)t->shape[i]);
        zero |= t->shape[i] == 0;
    }
    for (int i = 0; !zero && i < t->ndim; i++) {
        if ((size_t)t->shape[i] > limit / n)
            return hcomm__err(HCOMM_ERR_SHAPE, fn,
                              "%s has more than %zu elements (shape[%d]=%lld overflows the size)",
                              arg, limit, i, (long long)t->shape[i]);
        n *= (size_t)t->shape[i];
    }
    if (zero)
        n = 0;
    if (n > 0 && t->data == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "%s->data is NULL with %zu elements", arg, n);
    if (n > 0 && (uintptr_t)t->data % hcomm__dtype_size(t->dtype) != 0) {
        char data[64]; /* named only on failure (docs/tuning.md: pp.blocking-no-request) */
        snprintf(data, sizeof data, "%s->data", arg);
        return hcomm__check_aligned(fn, data, t->data, t->dtype);
    }
    if (numel)
        *numel = n;
    return HCOMM_OK;
}

hcomm_result_t hcomm__tensor_dim(const char *fn, const char *arg, const hcomm_tensor_t *t, int dim,
                                 int *out) {
    int d = dim < 0 ? dim + t->ndim : dim;
    if (d < 0 || d >= t->ndim)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "dim=%d out of range for %s->ndim=%d", dim,
                          arg, t->ndim);
    *out = d;
    return HCOMM_OK;
}

size_t hcomm__tensor_bytes(const hcomm_tensor_t *t) {
    size_t n = hcomm__dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

const char *hcomm__shape_str(const hcomm_tensor_t *t, char *buf, size_t cap) {
    size_t off = 0;
    off += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && off < cap; i++)
        off +=
            (size_t)snprintf(buf + off, cap - off, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (off < cap)
        snprintf(buf + off, cap - off, "]");
    return buf;
}

hcomm_result_t hcomm__tensor_same_shape(const char *fn, const char *an, const hcomm_tensor_t *a,
                                        const char *bn, const hcomm_tensor_t *b) {
    bool same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; i++)
        same = a->shape[i] == b->shape[i];
    if (same)
        return HCOMM_OK;
    char sa[128], sb[128];
    return hcomm__err(HCOMM_ERR_SHAPE, fn, "%s shape %s differs from %s shape %s", an,
                      hcomm__shape_str(a, sa, sizeof sa), bn, hcomm__shape_str(b, sb, sizeof sb));
}
