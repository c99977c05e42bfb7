/* Call kinds: the raw collectives (core.h), blocking. */
#include "cargs.h"

#include <string.h>

/* Rank wrank's input element i (salt tells buffers apart), within op's exact range. */
static double in_val(const fz_t *f, const cargs_t *a, int wrank, size_t i) {
    return fz_val(f, wrank, 0, i, fz_range(a->op));
}

static int typed_ok(const cargs_t *a) {
    return (unsigned)a->dt < HCOMM_DTYPE_COUNT && !a->huge;
}

static void fill(const fz_t *f, const cargs_t *a, void *buf, size_t n, size_t first) {
    if (!typed_ok(a) || !buf)
        return;
    for (size_t i = 0; i < n; i++)
        fz_put(a->dt, buf, i, in_val(f, a, f->wrank, first + i));
}

static double reduced(const fz_t *f, const cargs_t *a, size_t i) {
    double v[FZ_MAX_RANKS];
    for (int r = 0; r < f->size; r++)
        v[r] = in_val(f, a, f->members[r], i);
    return fz_reduce(a->dt, a->op, v, f->size);
}

static void layout_ar(const fz_t *f, int crank, cargs_t *a) {
    (void)f, (void)crank;
    a->in_bytes = a->out_bytes = fz_mul(a->n, fz_dsize(a->dt));
    a->ninplace = 1; /* recvbuf == sendbuf */
}

static void verify_ar(fz_t *f, const cargs_t *a, const char *out) {
    long wrong = 0;
    for (size_t i = 0; i < a->n; i++)
        wrong += fz_get(a->dt, out, i) != reduced(f, a, i);
    fz_check_data(f, "hcomm_all_reduce", wrong, "against the serial reduction");
}

static void k_all_reduce(fz_t *f) {
    cargs_t ag = fz_cargs_draw(f, 300, 1), a;
    fz_expect_t e = fz_cargs_expect(f, &ag, FZ_TAKES_TYPED, layout_ar, &a);
    char *in, *out;
    fz_cargs_buffers(f, &a, &in, &out);
    fill(f, &a, in, a.n, 0);
    fz_describe(f, "hcomm_all_reduce(n=%zu, dtype %d, op %d, inplace %d, mis %d, ovl %d, null %d)",
                a.n, a.dt, a.op, a.inplace, a.misalign, a.overlap, a.null_buf);
    if (a.null_buf)
        in = out = NULL;
    hcomm_result_t r = hcomm_all_reduce(f->comm, in, out, a.n, a.dt, a.op);
    if (fz_check_coll(f, "hcomm_all_reduce", r, e) && e != FZ_EXPECT_ERR)
        verify_ar(f, &a, out);
}

static void layout_bytes(const fz_t *f, int crank, cargs_t *a) {
    (void)f, (void)crank;
    a->in_bytes = a->out_bytes = a->n;
}

static void k_broadcast(fz_t *f) {
    cargs_t ag = fz_cargs_draw(f, 3000, 0), a;
    unsigned takes = (FZ_TAKES_BYTES & ~FZ_TAKES(FZ_MUT_OVERLAP)) | FZ_TAKES(FZ_MUT_ROOT);
    fz_expect_t e = fz_cargs_expect(f, &ag, takes, layout_bytes, &a);
    unsigned char *buf = fz_alloc(f, fz_real(a.n), a.misalign);
    for (size_t i = 0; i < fz_real(a.n); i++)
        buf[i] = (unsigned char)(f->rank == a.root ? in_val(f, &a, f->wrank, i) : 0xee);
    fz_describe(f, "hcomm_broadcast(bytes=%zu, root %d, null %d)", a.n, a.root, a.null_buf);
    hcomm_result_t r = hcomm_broadcast(f->comm, a.null_buf ? NULL : buf, a.n, a.root);
    if (!fz_check_coll(f, "hcomm_broadcast", r, e) || e == FZ_EXPECT_ERR)
        return;
    long wrong = 0;
    for (size_t i = 0; i < a.n; i++)
        wrong += buf[i] != (unsigned char)in_val(f, &a, f->members[a.root], i);
    fz_check_data(f, "hcomm_broadcast", wrong, "against the root's bytes");
}

static void layout_ag(const fz_t *f, int crank, cargs_t *a) {
    (void)crank;
    a->in_bytes = a->n;
    a->out_bytes = fz_mul(a->n, (size_t)f->size);
}

/* In place, the input is this rank's block of the output. */
static void ag_buffers(fz_t *f, const cargs_t *a, char **in, char **out) {
    if (!a->inplace || a->overlap) {
        fz_cargs_buffers(f, a, in, out);
        return;
    }
    *out = fz_alloc(f, fz_real(a->out_bytes), a->misalign);
    *in = a->huge ? *out : *out + (size_t)f->rank * a->n;
}

static void verify_ag(fz_t *f, const cargs_t *a, const char *out) {
    long wrong = 0;
    for (int p = 0; p < f->size; p++)
        for (size_t i = 0; i < a->n; i++)
            wrong += fz_get(a->dt, out, (size_t)p * a->n + i) != in_val(f, a, f->members[p], i);
    fz_check_data(f, "hcomm_all_gather", wrong, "against every rank's block");
}

static void k_all_gather(fz_t *f) {
    cargs_t ag = fz_cargs_draw(f, 1000, 0), a;
    fz_expect_t e = fz_cargs_expect(f, &ag, FZ_TAKES_BYTES, layout_ag, &a);
    char *in, *out;
    ag_buffers(f, &a, &in, &out);
    fill(f, &a, in, a.n, 0);
    fz_describe(f, "hcomm_all_gather(bytes=%zu, inplace %d, ovl %d, null %d)", a.n, a.inplace,
                a.overlap, a.null_buf);
    if (a.null_buf)
        in = out = NULL;
    hcomm_result_t r = hcomm_all_gather(f->comm, in, out, a.n);
    if (fz_check_coll(f, "hcomm_all_gather", r, e) && e != FZ_EXPECT_ERR)
        verify_ag(f, &a, out);
}

static void layout_rs(const fz_t *f, int crank, cargs_t *a) {
    size_t blk = fz_mul(a->n, fz_dsize(a->dt));
    a->in_bytes = fz_mul(blk, (size_t)f->size);
    a->out_bytes = blk;
    a->ninplace = 2; /* recvbuf == sendbuf, or this rank's block */
    a->inplace_off[1] = fz_mul(blk, (size_t)crank);
}

static void verify_rs(fz_t *f, const cargs_t *a, const char *out) {
    long wrong = 0;
    for (size_t i = 0; i < a->n; i++)
        wrong += fz_get(a->dt, out, i) != reduced(f, a, (size_t)f->rank * a->n + i);
    fz_check_data(f, "hcomm_reduce_scatter", wrong, "against the serial reduction of my block");
}

static void k_reduce_scatter(fz_t *f) {
    cargs_t ag = fz_cargs_draw(f, 200, 1), a;
    fz_expect_t e = fz_cargs_expect(f, &ag, FZ_TAKES_TYPED, layout_rs, &a);
    char *in, *out;
    fz_cargs_buffers(f, &a, &in, &out);
    fill(f, &a, in, fz_mul(a.n, (size_t)f->size), 0);
    fz_describe(f,
                "hcomm_reduce_scatter(n=%zu, dtype %d, op %d, inplace %d, mis %d, ovl %d, null %d)",
                a.n, a.dt, a.op, a.inplace, a.misalign, a.overlap, a.null_buf);
    if (a.null_buf)
        in = out = NULL;
    hcomm_result_t r = hcomm_reduce_scatter(f->comm, in, out, a.n, a.dt, a.op);
    if (fz_check_coll(f, "hcomm_reduce_scatter", r, e) && e != FZ_EXPECT_ERR)
        verify_rs(f, &a, out);
}

static void layout_reduce(const fz_t *f, int crank, cargs_t *a) {
    (void)f;
    a->in_bytes = fz_mul(a->n, fz_dsize(a->dt));
    a->out_bytes = crank == a->root ? a->in_bytes : 0; /* recvbuf is the root's only */
    a->ninplace = 1;
}

static void k_reduce(fz_t *f) {
    cargs_t ag = fz_cargs_draw(f, 300, 1), a;
    unsigned takes = FZ_TAKES_TYPED | FZ_TAKES(FZ_MUT_ROOT);
    fz_expect_t e = fz_cargs_expect(f, &ag, takes, layout_reduce, &a);
    char *in, *out;
    fz_cargs_buffers(f, &a, &in, &out);
    fill(f, &a, in, a.n, 0);
    fz_describe(f, "hcomm_reduce(n=%zu, dtype %d, op %d, root %d, inplace %d, ovl %d, null %d)",
                a.n, a.dt, a.op, a.root, a.inplace, a.overlap, a.null_buf);
    if (a.null_buf)
        in = NULL;
    if (f->rank != a.root && !a.overlap && !a.inplace)
        out = NULL;
    hcomm_result_t r = hcomm_reduce(f->comm, in, out, a.n, a.dt, a.op, a.root);
    if (!fz_check_coll(f, "hcomm_reduce", r, e) || e == FZ_EXPECT_ERR || f->rank != a.root)
        return;
    long wrong = 0;
    for (size_t i = 0; i < a.n; i++)
        wrong += fz_get(a.dt, out, i) != reduced(f, &a, i);
    fz_check_data(f, "hcomm_reduce", wrong, "against the serial reduction on the root");
}

static void layout_gather(const fz_t *f, int crank, cargs_t *a) {
    a->in_bytes = a->n;
    a->out_bytes = crank == a->root ? fz_mul(a->n, (size_t)f->size) : 0;
}

static void k_gather(fz_t *f) {
    cargs_t ag = fz_cargs_draw(f, 1000, 0), a;
    unsigned takes = FZ_TAKES_BYTES | FZ_TAKES(FZ_MUT_ROOT);
    ag.inplace = 0;
    fz_expect_t e = fz_cargs_expect(f, &ag, takes, layout_gather, &a);
    char *in, *out;
    fz_cargs_buffers(f, &a, &in, &out);
    fill(f, &a, in, a.n, 0);
    fz_describe(f, "hcomm_gather(bytes=%zu, root %d, ovl %d, null %d)", a.n, a.root, a.overlap,
                a.null_buf);
    hcomm_result_t r = hcomm_gather(f->comm, a.null_buf ? NULL : in,
                                    f->rank == a.root || a.overlap ? out : NULL, a.n, a.root);
    if (!fz_check_coll(f, "hcomm_gather", r, e) || e == FZ_EXPECT_ERR || f->rank != a.root)
        return;
    long wrong = 0;
    for (int p = 0; p < f->size; p++)
        for (size_t i = 0; i < a.n; i++)
            wrong += fz_get(a.dt, out, (size_t)p * a.n + i) != in_val(f, &a, f->members[p], i);
    fz_check_data(f, "hcomm_gather", wrong, "against every rank's block on the root");
}

static void layout_scatter(const fz_t *f, int crank, cargs_t *a) {
    a->in_bytes = crank == a->root ? fz_mul(a->n, (size_t)f->size) : 0;
    a->out_bytes = a->n;
    a->ninplace = 1; /* recvbuf == sendbuf + root * bytes, on the root */
    a->inplace_off[0] = fz_mul(a->n, (size_t)a->root);
}

static void k_scatter(fz_t *f) {
    cargs_t ag = fz_cargs_draw(f, 1000, 0), a;
    unsigned takes = FZ_TAKES_BYTES | FZ_TAKES(FZ_MUT_ROOT);
    fz_expect_t e = fz_cargs_expect(f, &ag, takes, layout_scatter, &a);
    if (f->rank != a.root)
        a.inplace = 0;
    char *in, *out;
    fz_cargs_buffers(f, &a, &in, &out);
    if (f->rank == a.root)
        fill(f, &a, in, fz_mul(a.n, (size_t)f->size), 0);
    fz_describe(f, "hcomm_scatter(bytes=%zu, root %d, inplace %d, ovl %d, null %d)", a.n, a.root,
                a.inplace, a.overlap, a.null_buf);
    hcomm_result_t r = hcomm_scatter(f->comm, f->rank == a.root || a.overlap ? in : NULL,
                                     a.null_buf ? NULL : out, a.n, a.root);
    if (!fz_check_coll(f, "hcomm_scatter", r, e) || e == FZ_EXPECT_ERR)
        return;
    long wrong = 0; /* block r of the root's buffer */
    for (size_t i = 0; i < a.n; i++)
        wrong +=
            fz_get(a.dt, out, i) != in_val(f, &a, f->members[a.root], (size_t)f->rank * a.n + i);
    fz_check_data(f, "hcomm_scatter", wrong, "against the root's block");
}

static void k_barrier(fz_t *f) {
    fz_describe(f, "hcomm_barrier");
    fz_check_coll(f, "hcomm_barrier", hcomm_barrier(f->comm), FZ_EXPECT_OK);
}

/* One nonblocking collective of a batch: its arguments, buffers and request. */
typedef struct pend {
    int which; /* 0 all_reduce, 1 all_gather, 2 reduce_scatter */
    cargs_t a;
    fz_expect_t e;
    char *in, *out;
    hcomm_request_t *req;
    hcomm_result_t r;
} pend_t;

static const char *const inames[3] = {"hcomm_iall_reduce|hcomm_all_reduce",
                                      "hcomm_iall_gather|hcomm_all_gather",
                                      "hcomm_ireduce_scatter|hcomm_reduce_scatter"};

static void issue(fz_t *f, pend_t *p) {
    static const fz_layout_fn layouts[3] = {layout_ar, layout_ag, layout_rs};
    cargs_t ag = fz_cargs_draw(f, 300, p->which != 1);
    unsigned takes = p->which == 1 ? FZ_TAKES_BYTES : FZ_TAKES_TYPED;
    p->e = fz_cargs_expect(f, &ag, takes, layouts[p->which], &p->a);
    cargs_t *a = &p->a;
    if (p->which == 1)
        ag_buffers(f, a, &p->in, &p->out);
    else
        fz_cargs_buffers(f, a, &p->in, &p->out);
    fill(f, a, p->in, p->which == 2 ? fz_mul(a->n, (size_t)f->size) : a->n, 0);
    char *in = a->null_buf ? NULL : p->in, *out = a->null_buf ? NULL : p->out;
    if (p->which == 0)
        p->r = hcomm_iall_reduce(f->comm, in, out, a->n, a->dt, a->op, &p->req);
    else if (p->which == 1)
        p->r = hcomm_iall_gather(f->comm, in, out, a->n, &p->req);
    else
        p->r = hcomm_ireduce_scatter(f->comm, in, out, a->n, a->dt, a->op, &p->req);
    fz_check(f, inames[p->which], p->r, p->e == FZ_EXPECT_OK ? FZ_EXPECT_OK : FZ_EXPECT_ANY);
}

/* Completes p with hcomm_wait or a hcomm_test loop, then checks it as the blocking call. */
static void complete(fz_t *f, pend_t *p, int by_test) {
    if (p->r == HCOMM_OK && by_test) {
        int done = 0;
        while (!done && (p->r = hcomm_test(p->req, &done)) == HCOMM_OK)
            ;
    } else if (p->r == HCOMM_OK)
        p->r = hcomm_wait(p->req);
    if (!fz_check_coll(f, inames[p->which], p->r, p->e) || p->e == FZ_EXPECT_ERR)
        return;
    if (p->which == 0)
        verify_ar(f, &p->a, p->out);
    else if (p->which == 1)
        verify_ag(f, &p->a, p->out);
    else
        verify_rs(f, &p->a, p->out);
}

static void k_nonblocking(fz_t *f) {
    pend_t p[3] = {{0}};
    int n = 1 + (int)fz_below(&f->ag, 3), by_test = fz_chance(&f->ag, 40);
    for (int i = 0; i < n; i++) {
        p[i].which = (int)fz_below(&f->ag, 3);
        issue(f, &p[i]);
    }
    fz_describe(f, "%d nonblocking collectives (%d %d %d), %s", n, p[0].which, p[1].which,
                p[2].which, by_test ? "hcomm_test" : "hcomm_wait");
    for (int i = 0; i < n; i++)
        complete(f, &p[i], by_test);
}

static void k_all_to_allv(fz_t *f) {
    fz_a2a_kind.run(f);
}

const fz_kind_t fz_coll_kinds[] = {
    {"nonblocking", 6, k_nonblocking}, {"all_to_allv", 5, k_all_to_allv},
    {"all_reduce", 6, k_all_reduce},   {"broadcast", 3, k_broadcast},
    {"all_gather", 4, k_all_gather},   {"reduce_scatter", 4, k_reduce_scatter},
    {"reduce", 3, k_reduce},           {"gather", 2, k_gather},
    {"scatter", 2, k_scatter},         {"barrier", 1, k_barrier},
};
const int fz_coll_nkinds = (int)(sizeof fz_coll_kinds / sizeof fz_coll_kinds[0]);
