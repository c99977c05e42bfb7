/* Call kinds: hcomm_all_gatherv and hcomm_reduce_scatterv (core.h) with per-rank counts that
 * differ (zero ones too) and per-rank mistakes: a counts array other ranks do not pass, NULL
 * counts or buffers, a huge count, out-of-range dtype or op, misaligned or overlapping buffers. */
#include "cargs.h"

#include <string.h>

typedef struct vargs {
    size_t cnt[FZ_MAX_RANKS]; /* per comm rank: bytes (gatherv) or elements (scatterv) */
    hcomm_dtype_t dt;
    hcomm_op_t op;
    int inplace, misalign, overlap, null_counts, null_buf;
    fz_expect_t own;
    size_t total, mine, displ; /* in units of cnt: the sum, this rank's block and its start */
    size_t in_bytes, out_bytes, off;
} vargs_t;

static size_t add_sat(size_t a, size_t b) {
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

/* The agreed counts: mostly small, a quarter zero, sometimes past the eager limits. */
static vargs_t vargs_draw(fz_t *f, int typed) {
    vargs_t v = {0};
    for (int q = 0; q < f->size; q++) {
        uint64_t k = fz_below(&f->ag, 12);
        v.cnt[q] = k < 3 ? 0 : k == 11 ? 1000 + fz_below(&f->ag, 4000) : fz_below(&f->ag, 90);
    }
    v.dt = typed ? fz_dtype(&f->ag) : HCOMM_U8;
    v.op = typed ? fz_op(&f->ag) : HCOMM_SUM;
    v.inplace = fz_chance(&f->ag, 30) ? 1 + (int)fz_below(&f->ag, 2) : 0; /* 2: the block */
    return v;
}

static void v_mutate(const fz_t *f, vargs_t *v, int wrank, unsigned takes) {
    fz_rng_t r = fz_rank_rng(f, wrank, 121);
    int peer = (int)fz_below(&r, (uint64_t)f->size);
    switch (fz_mutation(f, wrank, takes)) {
    case FZ_MUT_NULL:
        if (fz_chance(&r, 50))
            v->null_counts = 1, v->own = FZ_EXPECT_ERR;
        else
            v->null_buf = 1; /* an error where the call has bytes: v_layout decides */
        break;
    case FZ_MUT_HUGE:
        v->cnt[peer] = fz_huge(f, wrank), v->own = FZ_EXPECT_ERR;
        break;
    case FZ_MUT_COUNT:
        v->cnt[peer] += 1 + (size_t)fz_below(&r, 3); /* MISMATCH unless every rank does so */
        break;
    case FZ_MUT_DTYPE:
        v->dt = (hcomm_dtype_t)fz_bad_enum(f, wrank, HCOMM_DTYPE_COUNT), v->own = FZ_EXPECT_ERR;
        break;
    case FZ_MUT_OP:
        v->op = (hcomm_op_t)fz_bad_enum(f, wrank, HCOMM_OP_COUNT), v->own = FZ_EXPECT_ERR;
        break;
    case FZ_MUT_UNALIGNED:
        v->misalign = 1;
        if (fz_dsize(v->dt) > 1 && takes & FZ_TAKES(FZ_MUT_DTYPE)) /* reductions only */
            v->own = fz_worst(v->own, FZ_EXPECT_ANY);
        break;
    case FZ_MUT_OVERLAP:
        v->overlap = 1, v->inplace = 0;
        break;
    default:
        break;
    }
}

/* Sizes of comm rank crank's buffers; an overlapping output starts at the first offset past
 * the input's start that is no in-place form, and is an error where it shares a byte. */
static void v_layout(const fz_t *f, int crank, vargs_t *v, int gatherv) {
    size_t es = gatherv ? 1 : fz_dsize(v->dt);
    for (int q = 0; q < f->size; q++) {
        if (q == crank)
            v->displ = v->total;
        v->total = add_sat(v->total, v->cnt[q]);
    }
    v->mine = v->cnt[crank];
    v->in_bytes = fz_mul(gatherv ? v->mine : v->total, es);
    v->out_bytes = fz_mul(gatherv ? v->total : v->mine, es);
    size_t inplace = fz_mul(v->displ, es);
    v->off = 1 + (!gatherv && inplace == 1);
    if (v->overlap && v->off < v->in_bytes && v->out_bytes)
        v->own = FZ_EXPECT_ERR;
    if (v->null_buf && v->total)
        v->own = FZ_EXPECT_ERR;
}

/* What the members' arguments make of the call; *mine gets this rank's. */
static fz_expect_t v_expect(const fz_t *f, const vargs_t *ag, unsigned takes, vargs_t *mine) {
    fz_expect_t e = FZ_EXPECT_OK;
    vargs_t first = {0};
    for (int r = 0; r < f->size; r++) {
        vargs_t v = *ag;
        v_mutate(f, &v, f->members[r], takes);
        v_layout(f, r, &v, !(takes & FZ_TAKES(FZ_MUT_DTYPE)));
        if (r == 0)
            first = v;
        if (r == f->rank)
            *mine = v;
        e = fz_worst(e, v.own);
        if (memcmp(v.cnt, first.cnt, sizeof v.cnt) || v.dt != first.dt || v.op != first.op)
            e = FZ_EXPECT_ERR; /* ranks disagree: MISMATCH everywhere */
    }
    return e;
}

/* Input and output; in place, the input is this rank's block of the output (gatherv) or the
 * output is the input itself or its block (scatterv). */
static void v_buffers(fz_t *f, const vargs_t *v, int gatherv, char **in, char **out) {
    size_t ib = fz_real(v->in_bytes), ob = fz_real(v->out_bytes);
    size_t blk = gatherv ? v->displ : fz_mul(v->displ, fz_dsize(v->dt));
    if (v->overlap) {
        *in = fz_alloc(f, v->off + ob > ib ? v->off + ob : ib, v->misalign);
        *out = *in + v->off;
    } else if (v->inplace && gatherv) {
        *out = fz_alloc(f, ob, v->misalign);
        *in = blk < ob ? *out + blk : *out;
    } else {
        *in = fz_alloc(f, ib, v->misalign);
        *out = !v->inplace                   ? fz_alloc(f, ob, v->misalign)
               : v->inplace == 2 && blk < ib ? *in + blk
                                             : *in;
    }
}

static double gv_val(const fz_t *f, int crank, size_t i) {
    return fz_val(f, f->members[crank], 122, i, 256);
}

static void k_all_gatherv(fz_t *f) {
    vargs_t ag = vargs_draw(f, 0), v;
    unsigned takes = FZ_TAKES_BYTES;
    fz_expect_t e = v_expect(f, &ag, takes, &v);
    char *in, *out;
    v_buffers(f, &v, 1, &in, &out);
    for (size_t i = 0; i < v.mine && v.own != FZ_EXPECT_ERR; i++)
        in[i] = (char)gv_val(f, f->rank, i);
    fz_describe(f, "hcomm_all_gatherv(total=%zu, mine=%zu, inplace %d, mis %d, ovl %d, null %d/%d)",
                v.total, v.mine, v.inplace, v.misalign, v.overlap, v.null_counts, v.null_buf);
    hcomm_result_t r = hcomm_all_gatherv(f->comm, v.null_buf ? NULL : in, v.null_buf ? NULL : out,
                                         v.null_counts ? NULL : v.cnt);
    if (!fz_check_coll(f, "hcomm_all_gatherv", r, e) || e == FZ_EXPECT_ERR)
        return;
    long wrong = 0;
    size_t at = 0;
    for (int p = 0; p < f->size; p++)
        for (size_t i = 0; i < v.cnt[p]; i++)
            wrong += (unsigned char)out[at++] != (unsigned char)gv_val(f, p, i);
    fz_check_data(f, "hcomm_all_gatherv", wrong, "against every rank's block");
}

static double rsv_val(const fz_t *f, const vargs_t *v, int crank, size_t i) {
    return fz_val(f, f->members[crank], 123, i, fz_range(v->op));
}

static long rsv_wrong(const fz_t *f, const vargs_t *v, const char *out) {
    long wrong = 0;
    for (size_t j = 0; j < v->mine; j++) {
        double x[FZ_MAX_RANKS];
        for (int p = 0; p < f->size; p++)
            x[p] = rsv_val(f, v, p, v->displ + j);
        wrong += fz_get(v->dt, out, j) != fz_reduce(v->dt, v->op, x, f->size);
    }
    return wrong;
}

static void k_reduce_scatterv(fz_t *f) {
    vargs_t ag = vargs_draw(f, 1), v;
    fz_expect_t e = v_expect(f, &ag, FZ_TAKES_TYPED, &v);
    char *in, *out;
    v_buffers(f, &v, 0, &in, &out);
    int fill = (unsigned)v.dt < HCOMM_DTYPE_COUNT && v.own != FZ_EXPECT_ERR;
    for (size_t i = 0; fill && i < v.total; i++)
        fz_put(v.dt, in, i, rsv_val(f, &v, f->rank, i));
    fz_describe(f,
                "hcomm_reduce_scatterv(total=%zu, mine=%zu, dtype %d, op %d, inplace %d, mis %d, "
                "ovl %d, null %d/%d)",
                v.total, v.mine, v.dt, v.op, v.inplace, v.misalign, v.overlap, v.null_counts,
                v.null_buf);
    hcomm_result_t r =
        hcomm_reduce_scatterv(f->comm, v.null_buf ? NULL : in, v.null_buf ? NULL : out,
                              v.null_counts ? NULL : v.cnt, v.dt, v.op);
    if (fz_check_coll(f, "hcomm_reduce_scatterv", r, e) && e != FZ_EXPECT_ERR)
        fz_check_data(f, "hcomm_reduce_scatterv", rsv_wrong(f, &v, out),
                      "against the serial reduction of my block");
}

const fz_kind_t fz_collv_kinds[] = {
    {"all_gatherv", 4, k_all_gatherv},
    {"reduce_scatterv", 4, k_reduce_scatterv},
};
const int fz_collv_nkinds = (int)(sizeof fz_collv_kinds / sizeof fz_collv_kinds[0]);
