/* Context-parallel primitives (cp.h) against serial references. HCOMM_TEST_MPI
 * Every rank builds the full tensors from index formulas, so it checks its own result against
 * a reference made locally. Values are small integers: every dtype holds them and every
 * summation order gives the same result. The layout references are written from the
 * definitions (zigzag: rank i holds chunks i and 2cp-1-i), not from the library's code. */
#include "harness.h"

#include "hcomm/cp.h"
#include "hcomm/topo.h"

#include <stdbool.h>

#define MAX_WORLD 8

static double val(int who, size_t i, hcomm_dtype_t dt) {
    int v = (int)(((size_t)who * 5 + i * 3) % 11) - 5;
    return dt == HCOMM_U8 ? v + 5 : v;
}

static size_t numel(int ndim, const int64_t *s) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)s[i];
    return n;
}

static hcomm_tensor_t make(hcomm_dtype_t dt, int ndim, const int64_t *s) {
    hcomm_tensor_t t;
    hcomm_tensor_init(&t, calloc(numel(ndim, s) * 8 + 1, 1), dt, ndim, s);
    return t;
}

static void expect_values(const hcomm_tensor_t *t, const double *ref, const char *what, int p) {
    size_t n = numel(t->ndim, t->shape), bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (t_get_val(t->dtype, t->data, i) != ref[i])
            bad = i;
    T_CHECK(bad == n, "%s dtype %d size %d: element %zu is %g, expected %g", what, (int)t->dtype, p,
            bad, bad < n ? t_get_val(t->dtype, t->data, bad) : 0.0, bad < n ? ref[bad] : 0.0);
}

static void expect_text(const char *want) {
    T_CHECK(strstr(hcomm_last_error(), want) != NULL, "last error '%s' lacks '%s'",
            hcomm_last_error(), want);
}

/* The full-sequence position of row t of rank r's part (part rows each). */
static int64_t global_row(int64_t t, int r, int p, int64_t part, int flags) {
    if (flags == HCOMM_CP_CONTIGUOUS)
        return r * part + t;
    int64_t c = part / 2;
    return t < c ? r * c + t : (2 * p - 1 - r) * c + (t - c);
}

/* Flat index in the full tensor [outer][S][inner] of part element i of rank r. */
static size_t full_index(size_t i, int r, int p, size_t outer_unused, int64_t part, size_t inner,
                         int flags) {
    (void)outer_unused;
    size_t o = i / ((size_t)part * inner), rest = i % ((size_t)part * inner);
    int64_t t = (int64_t)(rest / inner);
    size_t in = rest % inner;
    int64_t s = (int64_t)p * part;
    return (o * (size_t)s + (size_t)global_row(t, r, p, part, flags)) * inner + in;
}

typedef struct seq_case {
    int ndim, d;
    int64_t part[4]; /* a rank's part; the full tensor has p * part[d] along d */
} seq_case_t;

static const seq_case_t SEQ[] = {
    {1, 0, {4}},       {2, 1, {3, 2}}, {3, 1, {2, 4, 3}},
    {3, 0, {2, 2, 2}}, {2, 0, {0, 3}}, {2, 1, {0, 2}},
};
#define NSEQ (int)(sizeof SEQ / sizeof SEQ[0])

static void shapes_of(const seq_case_t *c, int p, int64_t *full, size_t *outer, size_t *inner) {
    *outer = *inner = 1;
    for (int i = 0; i < c->ndim; i++) {
        full[i] = c->part[i] * (i == c->d ? p : 1);
        if (i < c->d)
            *outer *= (size_t)c->part[i];
        if (i > c->d)
            *inner *= (size_t)c->part[i];
    }
}

/* split, all_gather (blocking and not) and reduce_scatter of one case, one dtype, one layout. */
static void check_seq(hcomm_comm_t *g, const seq_case_t *c, hcomm_dtype_t dt, int flags, bool nb) {
    int p = t_size(g), r = t_rank(g);
    int64_t full[4];
    size_t outer, inner;
    shapes_of(c, p, full, &outer, &inner);
    size_t np = numel(c->ndim, c->part), nf = numel(c->ndim, full);
    hcomm_tensor_t f = make(dt, c->ndim, full), part = make(dt, c->ndim, c->part);
    hcomm_tensor_t f2 = make(dt, c->ndim, full);
    double *ref = calloc(nf + 1, sizeof *ref);
    int dim = nb ? c->d - c->ndim : c->d;
    for (size_t i = 0; i < nf; i++)
        t_set_val(dt, f.data, i, val(100, i, dt));
    T_OK(hcomm_cp_split(g, &f, &part, dim, flags));
    for (size_t i = 0; i < np; i++)
        ref[i] = val(100, full_index(i, r, p, outer, c->part[c->d], inner, flags), dt);
    expect_values(&part, ref, "cp_split", p);
    /* gather: every rank's part of the same full tensor gives it back */
    if (nb) {
        hcomm_request_t *q = NULL;
        T_OK(hcomm_cp_iall_gather(g, &part, &f2, dim, flags, &q));
        T_OK(hcomm_wait(q));
    } else
        T_OK(hcomm_cp_all_gather(g, &part, &f2, dim, flags));
    for (size_t i = 0; i < nf; i++)
        ref[i] = val(100, i, dt);
    expect_values(&f2, ref, "cp_all_gather", p);
    /* reduce_scatter: rank q's gradient is val(q, i); this rank gets its part of the sum */
    for (size_t i = 0; i < nf; i++)
        t_set_val(dt, f.data, i, val(r, i, dt));
    if (nb) {
        hcomm_request_t *q = NULL;
        T_OK(hcomm_cp_ireduce_scatter(g, &f, &part, dim, flags, &q));
        T_OK(hcomm_wait(q));
    } else
        T_OK(hcomm_cp_reduce_scatter(g, &f, &part, dim, flags));
    for (size_t i = 0; i < np; i++) {
        size_t fi = full_index(i, r, p, outer, c->part[c->d], inner, flags);
        ref[i] = 0;
        for (int q = 0; q < p; q++)
            ref[i] += val(q, fi, dt);
    }
    expect_values(&part, ref, "cp_reduce_scatter", p);
    free(ref);
    free(f.data);
    free(f2.data);
    free(part.data);
}

static void test_seq(hcomm_comm_t *g) {
    for (int c = 0; c < NSEQ; c++)
        for (int dt = 0; dt < HCOMM_DTYPE_COUNT; dt++)
            for (int flags = 0; flags < 2; flags++) {
                if (flags == HCOMM_CP_ZIGZAG && SEQ[c].part[SEQ[c].d] % 2)
                    continue;
                check_seq(g, &SEQ[c], (hcomm_dtype_t)dt, flags, (dt + c) % 3 == 0);
            }
}

/* The forward and backward rings: after step s a rank holds rank (r -/+ s)'s chunk. */
static void check_ring(hcomm_comm_t *g, hcomm_dtype_t dt, int ndim, const int64_t *shape, int dir) {
    int p = t_size(g), r = t_rank(g);
    size_t n = numel(ndim, shape);
    hcomm_tensor_t mine = make(dt, ndim, shape), cur = mine, next;
    double *ref = calloc(n + 1, sizeof *ref);
    for (size_t i = 0; i < n; i++)
        t_set_val(dt, mine.data, i, val(r, i, dt));
    hcomm_cp_ring_t *ring = NULL;
    T_OK(hcomm_cp_ring_create(g, &mine, dir, &ring));
    for (int s = 1; ring && s < p + 1; s++) {
        T_OK(hcomm_cp_ring_start(ring, &cur));
        T_OK(hcomm_cp_ring_wait(ring, &next));
        int from = dir == HCOMM_CP_RING_FORWARD ? (r - s % p + p) % p : (r + s) % p;
        for (size_t i = 0; i < n; i++)
            ref[i] = val(from, i, dt);
        expect_values(&next, ref, dir ? "ring backward" : "ring forward", p);
        cur = next;
    }
    T_OK(hcomm_cp_ring_destroy(ring));
    free(ref);
    free(mine.data);
}

/* dK/dV home: an accumulator that travels forward with its chunk and gains each rank's part
 * comes back to its owner after cp steps holding every rank's contribution. */
static void check_ring_return(hcomm_comm_t *g) {
    int p = t_size(g), r = t_rank(g);
    const int64_t shape[2] = {3, 5};
    hcomm_tensor_t acc = make(HCOMM_F64, 2, shape), cur = acc, next;
    double *a = acc.data, ref[15];
    for (size_t i = 0; i < 15; i++)
        a[i] = val(r * 8 + r, i, HCOMM_F64);
    hcomm_cp_ring_t *ring = NULL;
    T_OK(hcomm_cp_ring_create(g, &acc, HCOMM_CP_RING_FORWARD, &ring));
    for (int s = 1; ring && s <= p; s++) {
        T_OK(hcomm_cp_ring_start(ring, &cur));
        T_OK(hcomm_cp_ring_wait(ring, &next));
        int owner = (r - s % p + p) % p;
        for (size_t i = 0; s < p && i < 15; i++)
            ((double *)next.data)[i] += val(r * 8 + owner, i, HCOMM_F64);
        cur = next;
    }
    for (size_t i = 0; i < 15; i++) {
        ref[i] = 0;
        for (int q = 0; q < p; q++)
            ref[i] += val(q * 8 + r, i, HCOMM_F64);
    }
    expect_values(&cur, ref, "ring dKV return", p);
    T_OK(hcomm_cp_ring_destroy(ring));
    free(acc.data);
}

static void test_ring(hcomm_comm_t *g) {
    const int64_t s1[4] = {2, 3, 2, 4}, s0[2] = {0, 4}, big[1] = {70000};
    for (int dt = 0; dt < HCOMM_DTYPE_COUNT; dt++)
        check_ring(g, (hcomm_dtype_t)dt, 4, s1, dt % 2);
    check_ring(g, HCOMM_F32, 2, s0, HCOMM_CP_RING_FORWARD);
    check_ring(g, HCOMM_F32, 1, big, HCOMM_CP_RING_FORWARD);
    check_ring(g, HCOMM_I64, 1, big, HCOMM_CP_RING_BACKWARD);
    check_ring_return(g);
}

/* Ulysses: a global X[b][s][h][d] = val(h * 131 + s * 7 + b, d); a rank's input is its sequence
 * part, in the dim order perm (perm[k] = which of b, s, h, d sits at dim k). */
static double xval(int64_t b, int64_t s, int64_t h, int64_t d, hcomm_dtype_t dt) {
    return val((int)(h * 131 + s * 7 + b), (size_t)d, dt);
}

/* Fills t (dims in perm order, logical extents ext[b, s, h, d]) with X at offsets s0, h0 (h0 <
 * 0: the head of the GQA replica, -h0 - 1). */
static void fill_x(hcomm_tensor_t *t, const int *perm, const int64_t *ext, int64_t s0, int64_t h0,
                   bool check, const char *what, int p) {
    int64_t L[4], shape[4];
    for (int k = 0; k < 4; k++)
        shape[k] = ext[perm[k]];
    size_t n = numel(4, shape), bad = n;
    double want = 0, got = 0;
    for (size_t i = 0; i < n; i++) {
        size_t f = i;
        for (int k = 3; k >= 0; k--) {
            L[perm[k]] = (int64_t)(f % (size_t)shape[k]);
            f /= (size_t)shape[k];
        }
        double v = xval(L[0], L[1] + s0, h0 < 0 ? -h0 - 1 : L[2] + h0, L[3], t->dtype);
        if (!check)
            t_set_val(t->dtype, t->data, i, v);
        else if (bad == n && t_get_val(t->dtype, t->data, i) != v) {
            bad = i;
            want = v;
            got = t_get_val(t->dtype, t->data, i);
        }
    }
    if (check)
        T_CHECK(bad == n, "%s dtype %d size %d: element %zu is %g, expected %g", what,
                (int)t->dtype, p, bad, got, want);
}

static hcomm_tensor_t make_perm(hcomm_dtype_t dt, const int *perm, const int64_t *ext) {
    int64_t shape[4];
    for (int k = 0; k < 4; k++)
        shape[k] = ext[perm[k]];
    return make(dt, 4, shape);
}

static int dim_of(const int *perm, int logical) {
    for (int k = 0; k < 4; k++)
        if (perm[k] == logical)
            return k;
    return -1;
}

/* seq_to_head then head_to_seq with H heads, in layout perm. */
static void check_a2a(hcomm_comm_t *g, hcomm_dtype_t dt, const int *perm, int64_t heads, bool nb) {
    int p = t_size(g), r = t_rank(g);
    int64_t sl = 2, hl = heads % p == 0 ? heads / p : 1;
    const int64_t ein[4] = {2, sl, heads, 3}, eout[4] = {2, sl * p, hl, 3};
    int sd = dim_of(perm, 1), hd = dim_of(perm, 2) - (nb ? 4 : 0);
    hcomm_tensor_t in = make_perm(dt, perm, ein), out = make_perm(dt, perm, eout);
    hcomm_tensor_t back = make_perm(dt, perm, ein);
    fill_x(&in, perm, ein, r * sl, 0, false, NULL, p);
    if (nb) {
        hcomm_request_t *q = NULL;
        T_OK(hcomm_cp_ia2a_seq_to_head(g, &in, &out, sd, hd, &q));
        T_OK(hcomm_wait(q));
    } else
        T_OK(hcomm_cp_a2a_seq_to_head(g, &in, &out, sd, hd));
    int64_t h0 = heads % p == 0 ? r * hl : -(r / (p / heads)) - 1;
    fill_x(&out, perm, eout, 0, h0, true, "a2a_seq_to_head", p);
    if (heads % p == 0) {
        T_OK(hcomm_cp_a2a_head_to_seq(g, &out, &back, sd, hd));
        fill_x(&back, perm, ein, r * sl, 0, true, "a2a_head_to_seq", p);
    } else { /* GQA: the replicas' gradients sum: every replica sends X, so rep * X comes back */
        T_OK(hcomm_cp_a2a_head_to_seq(g, &out, &back, sd, hd));
        hcomm_tensor_t want = make_perm(dt, perm, ein);
        fill_x(&want, perm, ein, r * sl, 0, false, NULL, p);
        double *ref = calloc(numel(4, want.shape), sizeof *ref);
        for (size_t i = 0; i < numel(4, want.shape); i++)
            ref[i] = t_get_val(dt, want.data, i) * (double)(p / heads);
        expect_values(&back, ref, "a2a_head_to_seq GQA sum", p);
        free(ref);
        free(want.data);
    }
    free(in.data);
    free(out.data);
    free(back.data);
}

static void test_a2a(hcomm_comm_t *g) {
    const int bshd[4] = {0, 1, 2, 3}, hbsd[4] = {2, 0, 1, 3}, sbdh[4] = {1, 0, 3, 2};
    int p = t_size(g);
    for (int dt = 0; dt < HCOMM_DTYPE_COUNT; dt++) {
        check_a2a(g, (hcomm_dtype_t)dt, bshd, 2 * p, dt % 2);
        check_a2a(g, (hcomm_dtype_t)dt, hbsd, p, false);
    }
    check_a2a(g, HCOMM_F32, sbdh, 3 * p, true);
    check_a2a(g, HCOMM_F64, bshd, 1, false); /* GQA: one KV head for every rank */
    if (p % 2 == 0)
        check_a2a(g, HCOMM_I32, sbdh, 2, true);
}

/* Shapes and dtypes that differ across ranks fail on every rank, naming both. */
static void test_mismatch(hcomm_comm_t *g) {
    int p = t_size(g), r = t_rank(g);
    if (p == 1)
        return;
    bool odd = r == p - 1;
    const int64_t part[2] = {2, odd ? 6 : 4}, full[2] = {2, part[1] * p};
    hcomm_tensor_t in = make(HCOMM_F32, 2, part), out = make(HCOMM_F32, 2, full);
    char want[200];
    snprintf(want, sizeof want,
             "hcomm_cp_all_gather: rank 0 passed in f32 [2, 4] (seq_dim=1, flags=1) but rank %d "
             "passed in f32 [2, 6] (seq_dim=1, flags=1)",
             p - 1);
    T_ERR(hcomm_cp_all_gather(g, &in, &out, 1, HCOMM_CP_ZIGZAG), HCOMM_ERR_MISMATCH);
    expect_text(want);
    hcomm_tensor_t ci = make(odd ? HCOMM_F64 : HCOMM_F32, 2, (int64_t[]){2, 4});
    hcomm_cp_ring_t *ring = NULL;
    T_ERR(hcomm_cp_ring_create(g, &ci, HCOMM_CP_RING_FORWARD, &ring), HCOMM_ERR_MISMATCH);
    snprintf(want, sizeof want, "but rank %d passed chunk f64 [2, 4]", p - 1);
    expect_text(want);
    T_CHECK(ring == NULL, "a failed create returned a ring");
    /* heads differ */
    const int64_t a[4] = {1, 2, odd ? 2 * p : p, 2}, b[4] = {1, 2 * p, odd ? 2 : 1, 2};
    hcomm_tensor_t ai = make(HCOMM_F32, 4, a), ao = make(HCOMM_F32, 4, b);
    T_ERR(hcomm_cp_a2a_seq_to_head(g, &ai, &ao, 1, 2), HCOMM_ERR_MISMATCH);
    expect_text("hcomm_cp_a2a_seq_to_head: rank 0 passed in f32 [1, 2, ");
    /* a rank whose own check fails: peers get HCOMM_ERR_PEER, not a hang */
    const int64_t bad[2] = {2, odd ? 5 : 4};
    hcomm_tensor_t bi = make(HCOMM_F32, 2, bad), bo = make(HCOMM_F32, 2, (int64_t[]){2, 4 * p});
    T_ERR(hcomm_cp_reduce_scatter(g, &bo, &bi, 1, HCOMM_CP_CONTIGUOUS),
          odd ? HCOMM_ERR_SHAPE : HCOMM_ERR_PEER);
    free(in.data);
    free(out.data);
    free(ci.data);
    free(ai.data);
    free(ao.data);
    free(bi.data);
    free(bo.data);
}

/* Bad input that is the same on every rank. */
static void test_errors(hcomm_comm_t *g) {
    int p = t_size(g);
    char want[200];
    const int64_t f7[2] = {3, 2 * p + 1}, pp[2] = {3, 2};
    hcomm_tensor_t f = make(HCOMM_F32, 2, f7), part = make(HCOMM_F32, 2, pp);
    snprintf(want, sizeof want,
             "hcomm_cp_split: in->shape[1]=%d (the sequence) is not divisible by 2*cp=%d",
             2 * p + 1, 2 * p);
    T_ERR(hcomm_cp_split(g, &f, &part, 1, HCOMM_CP_ZIGZAG), HCOMM_ERR_SHAPE);
    expect_text(want);
    T_ERR(hcomm_cp_reduce_scatter(g, &f, &part, -1, HCOMM_CP_ZIGZAG), HCOMM_ERR_SHAPE);
    expect_text("not divisible by 2*cp=");
    T_ERR(hcomm_cp_split(g, &f, &part, 1, 7), HCOMM_ERR_INVALID_ARG);
    expect_text("flags=7");
    T_ERR(hcomm_cp_all_gather(g, &part, &part, 1, 0), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_cp_all_gather(g, &part, &f, 2, 0), HCOMM_ERR_INVALID_ARG);
    expect_text("dim=2 out of range");
    T_ERR(hcomm_cp_all_gather(NULL, &part, &f, 1, 0), HCOMM_ERR_NULL);
    T_ERR(hcomm_cp_all_gather(g, NULL, &f, 1, 0), HCOMM_ERR_NULL);
    T_ERR(hcomm_cp_iall_gather(g, &part, &f, 1, 0, NULL), HCOMM_ERR_NULL);
    hcomm_request_t *q = NULL;
    T_OK(hcomm_cp_iall_gather(g, NULL, &f, 1, 0, &q));
    T_ERR(hcomm_wait(q), HCOMM_ERR_NULL);
    /* overlapping buffers: the gather's in inside its out */
    const int64_t fp[2] = {3, 2 * p};
    hcomm_tensor_t full = make(HCOMM_F32, 2, fp), inside = part;
    inside.data = full.data;
    T_ERR(hcomm_cp_all_gather(g, &inside, &full, 1, 0), HCOMM_ERR_INVALID_ARG);
    expect_text("hcomm_cp_all_gather: in->data and out->data overlap");
    /* heads not divisible */
    const int64_t h3[4] = {1, 2, 2 * p + 1, 2}, o3[4] = {1, 2 * p, 1, 2};
    hcomm_tensor_t hi = make(HCOMM_F32, 4, h3), ho = make(HCOMM_F32, 4, o3);
    if (p > 1) {
        snprintf(want, sizeof want,
                 "hcomm_cp_a2a_seq_to_head: in->shape[2]=%d heads are not divisible by cp=%d",
                 2 * p + 1, p);
        T_ERR(hcomm_cp_a2a_seq_to_head(g, &hi, &ho, 1, 2), HCOMM_ERR_SHAPE);
        expect_text(want);
    }
    T_ERR(hcomm_cp_a2a_seq_to_head(g, &hi, &ho, 1, -3), HCOMM_ERR_INVALID_ARG);
    expect_text("seq_dim=1 and head_dim=-3 name the same dim");
    free(f.data);
    free(part.data);
    free(full.data);
    free(hi.data);
    free(ho.data);
}

/* Ring misuse: a second start before the wait, a chunk of another shape, overlap. */
static void test_ring_errors(hcomm_comm_t *g) {
    int r = t_rank(g);
    const int64_t s[2] = {4, 4};
    hcomm_tensor_t c = make(HCOMM_F32, 2, s), next;
    hcomm_cp_ring_t *ring = NULL;
    T_ERR(hcomm_cp_ring_create(g, &c, 2, &ring), HCOMM_ERR_INVALID_ARG);
    expect_text("direction=2");
    T_OK(hcomm_cp_ring_create(g, &c, HCOMM_CP_RING_FORWARD, &ring));
    if (!ring)
        return;
    T_ERR(hcomm_cp_ring_wait(ring, &next), HCOMM_ERR_STATE);
    T_OK(hcomm_cp_ring_start(ring, &c));
    T_ERR(hcomm_cp_ring_start(ring, &c), HCOMM_ERR_STATE);
    expect_text("hcomm_cp_ring_start: a step is already started");
    T_OK(hcomm_cp_ring_wait(ring, &next));
    /* one rank passes a chunk of another shape: it fails at start, its peers at their wait */
    hcomm_tensor_t wide = make(HCOMM_F32, 2, (int64_t[]){4, 5});
    bool bad = r == 0;
    if (bad) {
        T_ERR(hcomm_cp_ring_start(ring, &wide), HCOMM_ERR_SHAPE);
        expect_text("hcomm_cp_ring_start: cur shape [4, 5], expected [4, 4]");
    } else {
        T_OK(hcomm_cp_ring_start(ring, &c));
        T_ERR(hcomm_cp_ring_wait(ring, &next), HCOMM_ERR_PEER);
    }
    /* every rank passes a chunk of another shape: each fails with its own error */
    T_ERR(hcomm_cp_ring_start(ring, &wide), HCOMM_ERR_SHAPE);
    T_OK(hcomm_cp_ring_step(ring, &c, &next));
    T_OK(hcomm_cp_ring_destroy(ring));
    free(c.data);
    free(wide.data);
}

/* A chunk shaped right that overlaps a ring buffer without being it. */
static void test_ring_overlap(hcomm_comm_t *g) {
    const int64_t s[1] = {8};
    hcomm_tensor_t c = make(HCOMM_F32, 1, s), next, odd;
    hcomm_cp_ring_t *ring = NULL;
    T_OK(hcomm_cp_ring_create(g, &c, HCOMM_CP_RING_BACKWARD, &ring));
    if (!ring)
        return;
    T_OK(hcomm_cp_ring_step(ring, &c, &next));
    odd = next;
    odd.data = (float *)next.data + 1;
    T_ERR(hcomm_cp_ring_start(ring, &odd), HCOMM_ERR_INVALID_ARG);
    expect_text("cur->data overlaps the ring's buffer");
    T_OK(hcomm_cp_ring_step(ring, &next, &next));
    T_OK(hcomm_cp_ring_destroy(ring));
    free(c.data);
}

/* Hierarchical groups: from the node layout, from an override, and the bad sizes. */
static void test_hier(hcomm_comm_t *g) {
    int p = t_size(g), r = t_rank(g), a = 0, b = 0;
    hcomm_cp_hier_t *h = NULL;
    hcomm_comm_t *ga = NULL, *gb = NULL;
    T_OK(hcomm_cp_hier_create(g, 0, &h)); /* one node: a2a = cp */
    T_OK(hcomm_cp_hier_groups(h, &ga, &gb, &a, &b));
    T_EQ_INT(a, p);
    T_EQ_INT(b, 1);
    T_OK(hcomm_cp_hier_destroy(h));
    if (p % 2 == 0) {
        char spec[32];
        snprintf(spec, sizeof spec, "nodes=2x%d", p / 2);
        T_OK(hcomm_comm_set_topo(g, spec));
        T_OK(hcomm_cp_hier_create(g, 0, &h));
        T_OK(hcomm_cp_hier_groups(h, &ga, &gb, &a, &b));
        T_EQ_INT(a, p / 2);
        T_EQ_INT(b, 2);
        T_EQ_INT(t_rank(ga), r % (p / 2));
        T_EQ_INT(t_rank(gb), r / (p / 2));
        T_OK(hcomm_cp_hier_destroy(h));
        T_OK(hcomm_comm_set_topo(g, NULL));
    }
    if (p == 3) {
        T_OK(hcomm_comm_set_topo(g, "nodes=1,2"));
        T_ERR(hcomm_cp_hier_create(g, 0, &h), HCOMM_ERR_INVALID_ARG);
        expect_text("not on equal nodes of consecutive ranks; pass a2a_size");
        T_OK(hcomm_comm_set_topo(g, NULL));
    }
    T_OK(hcomm_cp_hier_create(g, 1, &h));
    T_OK(hcomm_cp_hier_groups(h, &ga, &gb, &a, &b));
    T_EQ_INT(t_size(gb), p);
    T_EQ_INT(t_size(ga), 1);
    T_OK(hcomm_cp_hier_destroy(h));
    if (p == 4) {
        T_ERR(hcomm_cp_hier_create(g, 3, &h), HCOMM_ERR_SHAPE);
        expect_text("cp=4 is not divisible by a2a_size=3");
    }
    if (p > 1) {
        T_ERR(hcomm_cp_hier_create(g, r == 0 ? p : 1, &h), HCOMM_ERR_MISMATCH);
        expect_text("hcomm_cp_hier_create: rank 0 passed");
    }
}

static hcomm_result_t cp_world(hcomm_comm_t *world, void *arg) {
    (void)arg;
    test_seq(world);
    test_ring(world);
    test_a2a(world);
    test_mismatch(world);
    test_errors(world);
    test_ring_errors(world);
    test_ring_overlap(world);
    test_hier(world);
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(cp_world, NULL, MAX_WORLD);
    return t_finish("test_cp");
}
