/* Call kinds: the TP collectives along a dim (tp.h), blocking and nonblocking, and the region
 * forward/backward pairs, on tensors of 1..3 dims (zero extents too). Per-rank mistakes: a bad
 * dim, a split dim that does not divide or an out shape not as stated, a size other ranks do not
 * pass, dtypes that differ, a bad op, NULL tensors or data, misaligned or overlapping data. */
#include "cargs.h"

#include <string.h>

enum { TP_AR, TP_AG, TP_RS, TP_SPLIT, TP_ID };

typedef struct tpa {
    int call, ndim, d, dim; /* d: the split dim; dim: as passed (maybe negative, maybe bad) */
    hcomm_dtype_t dt, odt;
    hcomm_op_t op;
    int64_t in[3], out[3];
    int inplace, mis, ovl, null_t, null_data;
    int takes_op, takes_dim, blocking; /* what the public call takes */
    fz_expect_t own;
} tpa_t;

static int64_t numel(const int64_t *s, int ndim) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= s[i];
    return n;
}

/* The agreed shapes: out from in by the call (all_gather: out[d] = size * in[d]; reduce_scatter
 * and split: in[d] = size * out[d]). */
static tpa_t tpa_draw(fz_t *f, int call) {
    tpa_t a = {.call = call, .ndim = 1 + (int)fz_below(&f->ag, 3), .blocking = 1};
    a.d = (int)fz_below(&f->ag, (uint64_t)a.ndim);
    a.dim = fz_chance(&f->ag, 50) ? a.d : a.d - a.ndim;
    for (int i = 0; i < a.ndim; i++)
        a.in[i] = a.out[i] = fz_chance(&f->ag, 8) ? 0 : 1 + (int64_t)fz_below(&f->ag, 5);
    if (call == TP_AG)
        a.out[a.d] *= f->size;
    if (call == TP_RS || call == TP_SPLIT)
        a.in[a.d] *= f->size;
    a.dt = a.odt = fz_dtype(&f->ag);
    a.op = call == TP_RS || call == TP_AR ? fz_op(&f->ag) : HCOMM_SUM;
    a.inplace = (call == TP_AR || call == TP_ID) && fz_chance(&f->ag, 25);
    return a;
}

/* Shape mistakes: another size than the other ranks (still valid here), or out's shape (or a
 * split dim) this rank's own checks refuse. */
static void tpa_shape(const fz_t *f, tpa_t *a, fz_rng_t *r, int other_size) {
    int x = (int)fz_below(r, (uint64_t)a->ndim);
    if (other_size) {
        int64_t before = numel(a->in, a->ndim);
        a->in[x]++, a->out[x]++;
        if (x == a->d && a->call == TP_AG)
            a->out[x] += f->size - 1;
        if (x == a->d && (a->call == TP_RS || a->call == TP_SPLIT))
            a->in[x] += f->size - 1;
        if (numel(a->in, a->ndim) == before) /* an empty tensor stays empty */
            a->own = FZ_EXPECT_ANY;
        return;
    }
    if ((a->call == TP_RS || a->call == TP_SPLIT) && f->size > 1 && fz_chance(r, 50))
        a->in[a->d]++; /* does not divide */
    else
        a->out[x] = fz_chance(r, 50) ? a->out[x] + 1 : (int64_t)1 << 40;
    a->own = FZ_EXPECT_ERR;
}

static void tpa_mutate(const fz_t *f, tpa_t *a, int wrank) {
    fz_rng_t r = fz_rank_rng(f, wrank, 131);
    unsigned takes = FZ_TAKES_TYPED | FZ_TAKES(FZ_MUT_ROOT);
    switch (fz_mutation(f, wrank, takes)) {
    case FZ_MUT_NULL:
        a->null_t = a->blocking && fz_chance(&r, 50); /* a NULL tensor is not issued at all */
        a->null_data = !a->null_t;
        a->own = a->null_t || numel(a->in, a->ndim) ? FZ_EXPECT_ERR : FZ_EXPECT_OK;
        break;
    case FZ_MUT_HUGE:
    case FZ_MUT_COUNT:
        tpa_shape(f, a, &r, fz_chance(&r, 50));
        break;
    case FZ_MUT_DTYPE:
        a->odt = fz_chance(&r, 50) ? (hcomm_dtype_t)((a->dt + 1) % HCOMM_DTYPE_COUNT)
                                   : (hcomm_dtype_t)fz_bad_enum(f, wrank, HCOMM_DTYPE_COUNT);
        a->own = FZ_EXPECT_ERR;
        break;
    case FZ_MUT_OP:
        if (a->takes_op)
            a->op = (hcomm_op_t)fz_bad_enum(f, wrank, HCOMM_OP_COUNT), a->own = FZ_EXPECT_ERR;
        break;
    case FZ_MUT_ROOT:
        a->dim = fz_chance(&r, 50) ? a->ndim : fz_bad_enum(f, wrank, a->ndim);
        a->dim = a->dim == -1 ? -a->ndim - 1 : a->dim; /* -1 is the last dim */
        a->own = a->takes_dim ? FZ_EXPECT_ERR : FZ_EXPECT_OK;
        break;
    case FZ_MUT_UNALIGNED: /* tp tensors must be aligned to their dtype (core.h) */
        a->mis = 1;
        a->own = fz_dsize(a->dt) == 1    ? FZ_EXPECT_OK
                 : numel(a->in, a->ndim) ? FZ_EXPECT_ERR
                                         : FZ_EXPECT_ANY;
        break;
    case FZ_MUT_OVERLAP: /* out one element into in */
        a->ovl = 1, a->inplace = 0;
        a->own = numel(a->in, a->ndim) > 1 && numel(a->out, a->ndim) ? FZ_EXPECT_ERR : FZ_EXPECT_OK;
        break;
    default:
        break;
    }
}

static tpa_t tpa_for(const fz_t *f, const tpa_t *ag, int wrank) {
    tpa_t a = *ag;
    tpa_mutate(f, &a, wrank);
    return a;
}

/* Collective calls: any member's mistake fails every member; local calls: this rank's only. */
static fz_expect_t tpa_expect(const fz_t *f, const tpa_t *ag, int collective, tpa_t *mine) {
    *mine = tpa_for(f, ag, f->wrank);
    if (!collective)
        return mine->own;
    fz_expect_t e = FZ_EXPECT_OK;
    for (int r = 0; r < f->size; r++) {
        tpa_t a = tpa_for(f, ag, f->members[r]);
        e = fz_worst(e, a.own);
        if (numel(a.in, a.ndim) != numel(mine->in, mine->ndim))
            e = FZ_EXPECT_ERR;                        /* members disagree on the size: MISMATCH */
        else if (memcmp(a.in, mine->in, sizeof a.in)) /* tp.h asks for the same shapes but */
            e = fz_worst(e, FZ_EXPECT_ANY);           /* can tell only sizes apart */
    }
    return e;
}

static double tp_val(const fz_t *f, const tpa_t *a, int crank, int64_t i) {
    return fz_val(f, f->members[crank], 130, (size_t)i, fz_range(a->op));
}

/* Tensors in and out of a (data filled with this rank's values). */
static void tp_tensors(fz_t *f, const tpa_t *a, hcomm_tensor_t *in, hcomm_tensor_t *out) {
    size_t es = fz_dsize(a->dt), ni = (size_t)numel(a->in, a->ndim);
    size_t no = fz_real(fz_mul((size_t)numel(a->out, a->ndim), fz_dsize(a->odt)));
    char *ib = fz_alloc(f, ni * es + (a->ovl ? no + es : 0), a->mis);
    char *ob = a->inplace ? ib : a->ovl ? ib + es : fz_alloc(f, no, a->mis);
    hcomm_tensor_init(in, a->null_data ? NULL : ib, HCOMM_U8, a->ndim, a->in);
    hcomm_tensor_init(out, ob, HCOMM_U8, a->ndim, a->out);
    in->data = a->null_data ? NULL : ib; /* tensor_init refuses some of these: set past it */
    in->dtype = a->dt, out->dtype = a->odt;
    for (size_t i = 0; i < ni && (unsigned)a->dt < HCOMM_DTYPE_COUNT; i++)
        fz_put(a->dt, ib, i, tp_val(f, a, f->rank, (int64_t)i));
}

/* Wrong elements of out against the serial reference: in as [A, in[d], C], out as [A, out[d],
 * C]; element (x, y, z) of out comes from index y of the split dim of some rank's input. */
static long tp_wrong(const fz_t *f, const tpa_t *a, const void *out) {
    int64_t A = numel(a->in, a->d), C = numel(a->in + a->d + 1, a->ndim - a->d - 1);
    int64_t B = a->out[a->d], Bi = a->in[a->d];
    long wrong = 0;
    for (int64_t x = 0; x < A; x++)
        for (int64_t y = 0; y < B; y++)
            for (int64_t z = 0; z < C; z++) {
                double v[FZ_MAX_RANKS], want;
                int64_t yi = a->call == TP_AG                          ? y % Bi
                             : a->call == TP_RS || a->call == TP_SPLIT ? f->rank * B + y
                                                                       : y;
                int src = a->call == TP_AG ? (int)(y / Bi) : f->rank, n = f->size;
                for (int p = 0; p < n; p++)
                    v[p] = tp_val(f, a, p, (x * Bi + yi) * C + z);
                want =
                    a->call == TP_AR || a->call == TP_RS ? fz_reduce(a->dt, a->op, v, n) : v[src];
                wrong += fz_get(a->dt, out, (size_t)((x * B + y) * C + z)) != want;
            }
    return wrong;
}

/* The public calls: which body each runs and what it takes. */
typedef struct tp_fn {
    const char *name;
    int call, coll, takes_op, takes_dim, blocking;
} tp_fn_t;

enum { F_AR, F_AG, F_RS, F_SPLIT, F_REGION, F_IAR = F_REGION + 8, F_IAG, F_IRS };

static const tp_fn_t fns[] = {
    {"hcomm_tp_all_reduce", TP_AR, 1, 1, 0, 1},
    {"hcomm_tp_all_gather", TP_AG, 1, 0, 1, 1},
    {"hcomm_tp_reduce_scatter", TP_RS, 1, 1, 1, 1},
    {"hcomm_tp_split", TP_SPLIT, 0, 0, 1, 1},
    {"hcomm_tp_copy_to_fwd", TP_ID, 0, 0, 0, 1},
    {"hcomm_tp_copy_to_bwd", TP_AR, 1, 0, 0, 1},
    {"hcomm_tp_reduce_from_fwd", TP_AR, 1, 0, 0, 1},
    {"hcomm_tp_reduce_from_bwd", TP_ID, 0, 0, 0, 1},
    {"hcomm_tp_scatter_to_fwd", TP_SPLIT, 0, 0, 1, 1},
    {"hcomm_tp_scatter_to_bwd", TP_AG, 1, 0, 1, 1},
    {"hcomm_tp_gather_from_fwd", TP_AG, 1, 0, 1, 1},
    {"hcomm_tp_gather_from_bwd", TP_SPLIT, 0, 0, 1, 1},
    {"hcomm_tp_iall_reduce|hcomm_tp_all_reduce", TP_AR, 1, 1, 0, 0},
    {"hcomm_tp_iall_gather|hcomm_tp_all_gather", TP_AG, 1, 0, 1, 0},
    {"hcomm_tp_ireduce_scatter|hcomm_tp_reduce_scatter", TP_RS, 1, 1, 1, 0},
};

/* The nonblocking forms, completed by hcomm_wait. */
static hcomm_result_t tp_nonblocking(fz_t *f, int fn, const tpa_t *a, const hcomm_tensor_t *in,
                                     hcomm_tensor_t *out) {
    hcomm_request_t *req = NULL;
    hcomm_result_t r = fn == F_IAR ? hcomm_tp_iall_reduce(f->comm, in, out, a->op, &req)
                       : fn == F_IAG
                           ? hcomm_tp_iall_gather(f->comm, in, out, a->dim, &req)
                           : hcomm_tp_ireduce_scatter(f->comm, in, out, a->dim, a->op, &req);
    fz_check(f, fns[fn].name, r, FZ_EXPECT_ANY);
    return r == HCOMM_OK ? hcomm_wait(req) : r;
}

static hcomm_result_t tp_invoke(fz_t *f, int fn, const tpa_t *a, const hcomm_tensor_t *in,
                                hcomm_tensor_t *out) {
    hcomm_comm_t *g = f->comm;
    switch (fn) {
    case F_AR:
        return hcomm_tp_all_reduce(g, in, out, a->op);
    case F_AG:
        return hcomm_tp_all_gather(g, in, out, a->dim);
    case F_RS:
        return hcomm_tp_reduce_scatter(g, in, out, a->dim, a->op);
    case F_SPLIT:
        return hcomm_tp_split(g, in, out, a->dim);
    case F_REGION:
        return hcomm_tp_copy_to_fwd(g, in, out);
    case F_REGION + 1:
        return hcomm_tp_copy_to_bwd(g, in, out);
    case F_REGION + 2:
        return hcomm_tp_reduce_from_fwd(g, in, out);
    case F_REGION + 3:
        return hcomm_tp_reduce_from_bwd(g, in, out);
    case F_REGION + 4:
        return hcomm_tp_scatter_to_fwd(g, in, out, a->dim);
    case F_REGION + 5:
        return hcomm_tp_scatter_to_bwd(g, in, out, a->dim);
    case F_REGION + 6:
        return hcomm_tp_gather_from_fwd(g, in, out, a->dim);
    case F_REGION + 7:
        return hcomm_tp_gather_from_bwd(g, in, out, a->dim);
    default:
        return tp_nonblocking(f, fn, a, in, out);
    }
}

static void tp_one(fz_t *f, int fn) {
    const tp_fn_t *t = &fns[fn];
    tpa_t ag = tpa_draw(f, t->call), a;
    ag.takes_op = t->takes_op, ag.takes_dim = t->takes_dim, ag.blocking = t->blocking;
    if (!t->takes_op)
        ag.op = HCOMM_SUM; /* the region all_reduces sum */
    fz_expect_t e = tpa_expect(f, &ag, t->coll, &a);
    hcomm_tensor_t in, out;
    tp_tensors(f, &a, &in, &out);
    fz_describe(f,
                "%s(ndim %d, in [%lld,%lld,%lld], dim %d, dtype %d/%d, op %d, ip %d, mis %d, "
                "ovl %d, null %d/%d)",
                t->name, a.ndim, (long long)a.in[0], (long long)a.in[1], (long long)a.in[2], a.dim,
                a.dt, a.odt, a.op, a.inplace, a.mis, a.ovl, a.null_t, a.null_data);
    hcomm_result_t r = tp_invoke(f, fn, &a, a.null_t ? NULL : &in, &out);
    int ok = t->coll ? fz_check_coll(f, t->name, r, e) : fz_check(f, t->name, r, e);
    if (ok && e == FZ_EXPECT_OK)
        fz_check_data(f, t->name, tp_wrong(f, &a, out.data), "against the serial reference");
}

static void k_tp_all_reduce(fz_t *f) {
    tp_one(f, F_AR);
}

static void k_tp_all_gather(fz_t *f) {
    tp_one(f, F_AG);
}

static void k_tp_reduce_scatter(fz_t *f) {
    tp_one(f, F_RS);
}

static void k_tp_split(fz_t *f) {
    tp_one(f, F_SPLIT);
}

/* One region mapping: its forward, then its backward. */
static void k_tp_region(fz_t *f) {
    int region = (int)fz_below(&f->ag, 4);
    tp_one(f, F_REGION + 2 * region);
    tp_one(f, F_REGION + 2 * region + 1);
}

static void k_tp_nonblocking(fz_t *f) {
    tp_one(f, F_IAR + (int)fz_below(&f->ag, 3));
}

const fz_kind_t fz_tp_kinds[] = {
    {"tp_all_reduce", 2, k_tp_all_reduce},
    {"tp_all_gather", 2, k_tp_all_gather},
    {"tp_reduce_scatter", 2, k_tp_reduce_scatter},
    {"tp_split", 1, k_tp_split},
    {"tp_region", 3, k_tp_region},
    {"tp_nonblocking", 2, k_tp_nonblocking},
};
const int fz_tp_nkinds = (int)(sizeof fz_tp_kinds / sizeof fz_tp_kinds[0]);
