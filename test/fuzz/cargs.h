/* Arguments of the raw collectives: one agreed set, mutated per rank (fuzz.h: fz_mut_t). */
#ifndef HCOMM_FUZZ_CARGS_H_
#define HCOMM_FUZZ_CARGS_H_

#include "fuzz.h"

typedef struct cargs {
    size_t n; /* count or bytes, as the call takes it */
    hcomm_dtype_t dt;
    hcomm_op_t op;
    int root;
    int inplace;  /* the documented in-place form */
    int misalign; /* buffers one byte past their alignment */
    int overlap;  /* the output starts inside the input */
    int null_buf; /* the buffer every rank passes is NULL */
    int huge;     /* n is a size no buffer can have */
    fz_expect_t own;
    /* set by the kind's layout: bytes of input and output on this rank, the output's offsets
     * from the input that are documented in-place forms, and (overlap) the one it gets */
    size_t in_bytes, out_bytes, inplace_off[2], off;
    int ninplace;
} cargs_t;

/* A kind's buffer layout for comm rank crank's arguments (fills in_bytes .. ninplace). */
typedef void (*fz_layout_fn)(const fz_t *f, int crank, cargs_t *a);

#define FZ_TAKES(m) (1u << (m))
#define FZ_TAKES_BYTES                                                                             \
    (FZ_TAKES(FZ_MUT_NULL) | FZ_TAKES(FZ_MUT_HUGE) | FZ_TAKES(FZ_MUT_COUNT) |                      \
     FZ_TAKES(FZ_MUT_UNALIGNED) | FZ_TAKES(FZ_MUT_OVERLAP))
#define FZ_TAKES_TYPED (FZ_TAKES_BYTES | FZ_TAKES(FZ_MUT_DTYPE) | FZ_TAKES(FZ_MUT_OP))

/* The agreed arguments of this call: a size up to @p small, dtype, op, root, in place. */
cargs_t fz_cargs_draw(fz_t *f, size_t small, int typed);
/* Rank wrank's arguments: the agreed ones with its mutation (one of @p takes) applied. */
cargs_t fz_cargs_for(const fz_t *f, const cargs_t *agreed, int wrank, unsigned takes);
/* What the members' arguments make of the call: any invalid or disagreeing -> FZ_EXPECT_ERR. */
fz_expect_t fz_cargs_expect(const fz_t *f, const cargs_t *agreed, unsigned takes,
                            fz_layout_fn layout, cargs_t *mine);
/* The input and output buffers of @p a (filled by nobody), overlapping as the mutation says. */
void fz_cargs_buffers(fz_t *f, const cargs_t *a, char **in, char **out);
/* a * b, or SIZE_MAX when it overflows. */
size_t fz_mul(size_t a, size_t b);
/* Bytes to allocate for a buffer of @p bytes: a huge size gets a small real buffer. */
size_t fz_real(size_t bytes);

#endif /* HCOMM_FUZZ_CARGS_H_ */
