/* Context parallelism's shared helpers: the agreement that lets every member name a peer's
 * differing tensor, strided box copies (the Ulysses exchange's packing), and the one entry
 * path of the collective calls, blocking and on the worker. */
#include "prims/cp_common.h"

#include <stdio.h>
#include <string.h>

cp_desc_t hcomm__cp_desc(const hcomm_tensor_t *t, int p0, int p1, int p2) {
    cp_desc_t d = {.dtype = -1, .p = {p0, p1, p2}};
    if (t) {
        d.dtype = (int32_t)t->dtype;
        d.ndim = t->ndim;
        for (int i = 0; i < t->ndim && i < HCOMM_MAX_DIMS; i++)
            d.shape[i] = t->shape[i];
    }
    return d;
}

static bool desc_equal(const cp_desc_t *a, const cp_desc_t *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

/* "f32 [2, 8] (seq_dim=1, flags=1)" into buf. */
static void desc_text(const cp_desc_t *d, const char *pnames, char *buf, size_t cap) {
    hcomm_tensor_t t = {.dtype = (hcomm_dtype_t)d->dtype, .ndim = d->ndim};
    for (int i = 0; i < d->ndim && i < HCOMM_MAX_DIMS; i++)
        t.shape[i] = d->shape[i];
    char shape[160], names[64];
    snprintf(names, sizeof names, "%s", pnames);
    int len = snprintf(buf, cap, "%s %s (", hcomm__dtype_str(t.dtype),
                       hcomm__shape_str(&t, shape, sizeof shape));
    char *save = NULL;
    int i = 0;
    for (char *n = strtok_r(names, ",", &save); n && i < 3 && len > 0 && (size_t)len < cap;
         n = strtok_r(NULL, ",", &save), i++)
        len += snprintf(buf + len, cap - (size_t)len, "%s%s=%d", i ? ", " : "", n, d->p[i]);
    if (len > 0 && (size_t)len < cap)
        snprintf(buf + len, cap - (size_t)len, ")");
}

hcomm_result_t hcomm__cp_agree(hcomm_comm_t *g, const char *fn, const cp_desc_t *mine,
                               const char *tname, const char *pnames) {
    if (g->size == 1)
        return HCOMM_OK;
    cp_desc_t *all = NULL;
    HCOMM__TRY(hcomm__alloc(fn, sizeof *all * (size_t)g->size, (void **)&all));
    hcomm_result_t res = hcomm__coll_all_gather(g, mine, all, sizeof *mine);
    for (int r = 1; res == HCOMM_OK && r < g->size; r++) {
        if (desc_equal(&all[0], &all[r]))
            continue;
        char a[256], b[256];
        desc_text(&all[0], pnames, a, sizeof a);
        desc_text(&all[r], pnames, b, sizeof b);
        res = hcomm__err(HCOMM_ERR_MISMATCH, fn, "rank 0 passed %s %s but rank %d passed %s %s",
                         tname, a, r, tname, b);
    }
    free(all);
    return res;
}

/* Element strides of shape (row-major). */
static void strides_of(const int64_t *shape, int ndim, size_t *st) {
    size_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        st[i] = s;
        s *= (size_t)shape[i];
    }
}

/* The first dim from which on the box spans both tensors whole: dims [lo, ndim) are one
 * contiguous run in each, so they are copied with one call per index of the dims before. */
static int first_whole(const int64_t *dshape, const int64_t *sshape, const int64_t *ext, int ndim) {
    int lo = ndim - 1;
    while (lo > 0 && ext[lo] == dshape[lo] && ext[lo] == sshape[lo])
        lo--;
    return lo;
}

void hcomm__cp_box(void *dst, const int64_t *dshape, const int64_t *doff, const void *src,
                   const int64_t *sshape, const int64_t *soff, const int64_t *ext, int ndim,
                   hcomm_dtype_t dt, bool add) {
    size_t ds[HCOMM_MAX_DIMS], ss[HCOMM_MAX_DIMS], es = hcomm__dtype_size(dt);
    int64_t idx[HCOMM_MAX_DIMS] = {0};
    for (int i = 0; i < ndim; i++)
        if (ext[i] == 0)
            return;
    strides_of(dshape, ndim, ds);
    strides_of(sshape, ndim, ss);
    const int lo = first_whole(dshape, sshape, ext, ndim);
    const size_t run = (size_t)ext[lo] * ds[lo]; /* ds[lo] == ss[lo]: the dims after are whole */
    for (;;) {
        size_t di = 0, si = 0;
        for (int i = 0; i < ndim; i++) {
            di += (size_t)(doff[i] + (i < lo ? idx[i] : 0)) * ds[i];
            si += (size_t)(soff[i] + (i < lo ? idx[i] : 0)) * ss[i];
        }
        char *d = (char *)dst + di * es;
        const char *s = (const char *)src + si * es;
        if (add)
            hcomm__reduce(d, s, run, dt, HCOMM_SUM);
        else
            memcpy(d, s, run * es);
        int i = lo - 1; /* the odometer over the dims before the run */
        while (i >= 0 && ++idx[i] == ext[i])
            idx[i--] = 0;
        if (i < 0)
            return;
    }
}

hcomm_result_t hcomm__cp_disjoint(const char *fn, const char *an, const hcomm_tensor_t *a,
                                  const char *bn, const hcomm_tensor_t *b) {
    if (!hcomm__overlaps(a->data, hcomm__tensor_bytes(a), b->data, hcomm__tensor_bytes(b)))
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                      "%s->data and %s->data overlap; this call has no in-place form, pass "
                      "separate buffers",
                      an, bn);
}

hcomm_result_t hcomm__cp_shape_as(const char *fn, const char *name, const hcomm_tensor_t *t,
                                  const hcomm_tensor_t *ref, int d0, int64_t e0, int d1,
                                  int64_t e1) {
    hcomm_tensor_t want = *ref;
    if (d0 >= 0)
        want.shape[d0] = e0;
    if (d1 >= 0)
        want.shape[d1] = e1;
    bool same = t->ndim == want.ndim;
    for (int i = 0; same && i < want.ndim; i++)
        same = t->shape[i] == want.shape[i];
    if (same)
        return HCOMM_OK;
    char got[160], exp[160];
    return hcomm__err(HCOMM_ERR_SHAPE, fn, "%s shape %s, expected %s", name,
                      hcomm__shape_str(t, got, sizeof got),
                      hcomm__shape_str(&want, exp, sizeof exp));
}

hcomm_result_t hcomm__cp_run(hcomm_comm_t *g, const hcomm_tensor_t *in, hcomm_tensor_t *out,
                             cp_op_t op) {
    if (g == NULL)
        return hcomm__err(HCOMM_ERR_NULL, op.fn, "argument 'group' is NULL");
    hcomm__enter(g, op.fn);
    return hcomm__leave(g, op.body(g, &op, in, out));
}

/* The queued form: the descriptors travel in the copy, NULL ones as flags. */
typedef struct cp_icall {
    cp_op_t op;
    bool in_null, out_null;
} cp_icall_t;

static hcomm_result_t run_icall(hcomm_comm_t *g, void *p) {
    cp_icall_t *a = p;
    return a->op.body(g, &a->op, a->in_null ? NULL : &a->op.in, a->out_null ? NULL : &a->op.out);
}

hcomm_result_t hcomm__cp_issue(hcomm_comm_t *g, const hcomm_tensor_t *in, hcomm_tensor_t *out,
                               cp_op_t op, hcomm_request_t **req) {
    if (g == NULL)
        return hcomm__err(HCOMM_ERR_NULL, op.fn, "argument 'group' is NULL");
    hcomm__enter(g, op.fn);
    if (req == NULL) { /* joins the peers' operation all the same */
        hcomm_result_t e = hcomm__err(HCOMM_ERR_NULL, op.fn, "argument 'req' is NULL");
        return hcomm__leave(g, hcomm__icoll_fail_now(g, e));
    }
    *req = NULL;
    cp_icall_t a = {.op = op, .in_null = in == NULL, .out_null = out == NULL};
    if (in)
        a.op.in = *in;
    if (out)
        a.op.out = *out;
    return hcomm__leave(g, hcomm__icall(g, run_icall, &a, sizeof a, req));
}
