/* Drawing and mutating the raw collectives' arguments (cargs.h). */
#include "cargs.h"

#include <stdint.h>

size_t fz_mul(size_t a, size_t b) {
    return b && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}

size_t fz_real(size_t bytes) {
    return bytes > ((size_t)1 << 30) ? 64 : bytes;
}

cargs_t fz_cargs_draw(fz_t *f, size_t small, int typed) {
    cargs_t a = {0};
    a.n = fz_size(&f->ag, small);
    a.dt = typed ? fz_dtype(&f->ag) : HCOMM_U8;
    a.op = typed ? fz_op(&f->ag) : HCOMM_SUM;
    a.root = (int)fz_below(&f->ag, (uint64_t)f->size);
    a.inplace = fz_chance(&f->ag, 30);
    return a;
}

static void apply(const fz_t *f, cargs_t *a, fz_mut_t m, int wrank) {
    switch (m) {
    case FZ_MUT_NULL:
        a->null_buf = 1;
        a->own = a->n ? FZ_EXPECT_ERR : FZ_EXPECT_OK;
        break;
    case FZ_MUT_HUGE:
        a->n = fz_huge(f, wrank);
        a->huge = 1;
        a->own = FZ_EXPECT_ERR;
        break;
    case FZ_MUT_COUNT:
        a->n += 1 + (size_t)fz_bad_enum(f, wrank, 3) % 3u;
        break;
    case FZ_MUT_DTYPE:
        a->dt = (hcomm_dtype_t)fz_bad_enum(f, wrank, HCOMM_DTYPE_COUNT);
        a->own = FZ_EXPECT_ERR;
        break;
    case FZ_MUT_OP:
        a->op = (hcomm_op_t)fz_bad_enum(f, wrank, HCOMM_OP_COUNT);
        a->own = FZ_EXPECT_ERR;
        break;
    case FZ_MUT_ROOT:
        a->root = fz_bad_enum(f, wrank, f->size);
        a->own = FZ_EXPECT_ERR;
        break;
    case FZ_MUT_UNALIGNED:
        a->misalign = 1;
        a->own = fz_dsize(a->dt) > 1 ? FZ_EXPECT_ANY : FZ_EXPECT_OK;
        break;
    case FZ_MUT_OVERLAP:
        a->overlap = 1;
        a->inplace = 0;
        a->own = a->n ? FZ_EXPECT_ERR : FZ_EXPECT_OK;
        break;
    default:
        break;
    }
}

cargs_t fz_cargs_for(const fz_t *f, const cargs_t *agreed, int wrank, unsigned takes) {
    cargs_t a = *agreed;
    a.own = FZ_EXPECT_OK;
    apply(f, &a, fz_mutation(f, wrank, takes), wrank);
    return a;
}

/* An overlapping output starts at the first offset that is no in-place form; it overlaps the
 * input partly when that offset lies inside the input and the output is not empty. */
static void overlap(cargs_t *a) {
    a->off = 1;
    for (int again = 1; again;) {
        again = 0;
        for (int i = 0; i < a->ninplace; i++)
            if (a->inplace_off[i] == a->off) {
                a->off++;
                again = 1;
            }
    }
    a->own = a->off < a->in_bytes && a->out_bytes ? FZ_EXPECT_ERR : FZ_EXPECT_OK;
}

void fz_cargs_buffers(fz_t *f, const cargs_t *a, char **in, char **out) {
    size_t ib = fz_real(a->in_bytes), ob = fz_real(a->out_bytes);
    if (a->overlap) {
        *in = fz_alloc(f, a->off + ob > ib ? a->off + ob : ib, a->misalign);
        *out = *in + a->off;
        return;
    }
    *in = fz_alloc(f, ib, a->misalign);
    /* a huge in-place offset is formed in integers: pointer arithmetic past the buffer is UB */
    *out = a->inplace ? (char *)((uintptr_t)*in + a->inplace_off[0]) : fz_alloc(f, ob, a->misalign);
}

fz_expect_t fz_cargs_expect(const fz_t *f, const cargs_t *agreed, unsigned takes,
                            fz_layout_fn layout, cargs_t *mine) {
    fz_expect_t e = FZ_EXPECT_OK;
    cargs_t first = {0};
    for (int r = 0; r < f->size; r++) {
        cargs_t a = fz_cargs_for(f, agreed, f->members[r], takes);
        layout(f, r, &a);
        if (a.overlap)
            overlap(&a);
        if (r == 0)
            first = a;
        if (r == f->rank)
            *mine = a;
        e = fz_worst(e, a.own);
        if (a.n != first.n || a.dt != first.dt || a.op != first.op || a.root != first.root)
            e = FZ_EXPECT_ERR; /* ranks disagree: MISMATCH everywhere */
    }
    return e;
}
