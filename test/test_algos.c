/* Every algorithm x collective x dtype x op x count {0, 1, p-1, p+1, 1009, ~1M} x in place / out
 * of place x root {0, p-1}, forced with hcomm_comm_set_algo (pairwise-covering in CI, the
 * whole product with HCOMM_TEST_FULL=1: see matrix), against a serial reference computed here in
 * double from random inputs; world sizes 1..9 (local) or the mpirun job (HCOMM_TEST_MPI).
 * Integers and MAX/MIN compare exactly; floats within a bound scaled by the sum of |inputs|
 * (the algorithms associate differently). Every rank's result must have the same bits: a
 * digest of it is compared across ranks. Also: HCOMM_ALGO parsing, good and bad. */
#include "algo/algos.h"
#include "algo/coll.h"
#include "choose_default.h"
#include "harness.h"

#include <math.h>
#include <stdint.h>

static const char *const op_names[HCOMM_OP_COUNT] = {"sum", "prod", "max", "min", "avg"};

typedef struct tcase {
    hcomm_comm_t *w;
    const char *spec;
    hcomm_dtype_t dt;
    hcomm_op_t op;
    size_t count;
    bool in_place;
    int root;
} tcase_t;

/* --- inputs and the serial reference --- */

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static bool is_float(hcomm_dtype_t dt) {
    return dt == HCOMM_F32 || dt == HCOMM_F64 || dt == HCOMM_F16 || dt == HCOMM_BF16;
}

/* Input element i of rank r, already representable in dt: random floats in [-1, 1) (PROD:
 * [0.5, 1.5)), small integers (-3..3, u8 0..6) so that sums and AVG stay in range. */
static double input(hcomm_dtype_t dt, hcomm_op_t op, int r, size_t i) {
    uint64_t h =
        mix(((uint64_t)r << 40) ^ (uint64_t)i ^ ((uint64_t)dt << 56) ^ ((uint64_t)op << 60));
    double v;
    if (is_float(dt))
        v = op == HCOMM_PROD ? 0.5 + (double)(h >> 11) * 0x1p-53
                             : (double)(h >> 11) * 0x1p-52 - 1.0;
    else
        v = (double)(h % 7) - (dt == HCOMM_U8 ? 0.0 : 3.0);
    _Alignas(8) unsigned char b[8];
    t_set_val(dt, b, 0, v);
    return t_get_val(dt, b, 0);
}

/* Integer results wrap like the dtype's (two's complement). */
static double wrap(hcomm_dtype_t dt, int64_t v) {
    switch (dt) {
    case HCOMM_I8:
        return (double)(int8_t)(uint8_t)v;
    case HCOMM_U8:
        return (double)(uint8_t)v;
    case HCOMM_I32:
        return (double)(int32_t)(uint32_t)v;
    default:
        return (double)v;
    }
}

/* Element i reduced over p ranks, and the sum of |inputs| (the float error scale). */
static double reference(hcomm_dtype_t dt, hcomm_op_t op, int p, size_t i, double *scale) {
    double acc = input(dt, op, 0, i);
    int64_t iacc = (int64_t)acc;
    *scale = fabs(acc);
    for (int r = 1; r < p; r++) {
        double v = input(dt, op, r, i);
        *scale += fabs(v);
        acc = op == HCOMM_PROD  ? acc * v
              : op == HCOMM_MAX ? (v > acc ? v : acc)
              : op == HCOMM_MIN ? (v < acc ? v : acc)
                                : acc + v;
        iacc = op == HCOMM_PROD ? (int64_t)((uint64_t)iacc * (uint64_t)(int64_t)v) : (int64_t)acc;
    }
    if (op == HCOMM_PROD)
        *scale = fabs(acc);
    if (!is_float(dt))
        return op == HCOMM_AVG ? wrap(dt, iacc / p)
                               : wrap(dt, op == HCOMM_PROD ? iacc : (int64_t)acc);
    return op == HCOMM_AVG ? acc / p : acc;
}

static double tolerance(hcomm_dtype_t dt, int p) {
    switch (dt) {
    case HCOMM_F32:
        return 4e-7 * (p + 1);
    case HCOMM_F64:
        return 1e-15 * (p + 1);
    case HCOMM_F16:
        return 1e-3; /* accumulated in f32, rounded once: half an f16 ulp */
    case HCOMM_BF16:
        return 8e-3;
    default:
        return 0.0;
    }
}

/* got[0..n) against the reference of elements first..first+n; the first bad one is reported. */
static void check_reduced(const tcase_t *t, const char *what, const void *got, size_t first,
                          size_t n) {
    int p = t_size(t->w);
    const char *dname = "?";
    hcomm_dtype_name(t->dt, &dname);
    for (size_t i = 0; i < n; i++) {
        double scale, want = reference(t->dt, t->op, p, first + i, &scale),
                      g = t_get_val(t->dt, got, i);
        bool exact = !is_float(t->dt) || t->op == HCOMM_MAX || t->op == HCOMM_MIN;
        double tol = exact ? 0.0 : tolerance(t->dt, p) * (scale + 1e-30);
        if (fabs(g - want) > tol || isnan(g)) {
            T_FAIL_("%s [%s] %s %s count=%zu %s (world %d, rank %d): element %zu is %.17g, "
                    "expected %.17g (tolerance %g)",
                    what, t->spec, dname, op_names[t->op], t->count,
                    t->in_place ? "in place" : "out of place", p, t_rank(t->w), first + i, g, want,
                    tol);
            return;
        }
    }
    atomic_fetch_add(&t_checks, 1);
}

/* Every rank's bytes must be identical: min and max of a digest agree. */
static hcomm_result_t check_same_bits(const tcase_t *t, const char *what, const void *buf,
                                      size_t bytes) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ ((const unsigned char *)buf)[i]) * 0x100000001b3ull;
    int64_t lo = (int64_t)(h >> 1), hi = lo;
    T_TRY(hcomm_all_reduce(t->w, &lo, &lo, 1, HCOMM_I64, HCOMM_MIN));
    T_TRY(hcomm_all_reduce(t->w, &hi, &hi, 1, HCOMM_I64, HCOMM_MAX));
    T_CHECK(lo == hi, "%s [%s] count=%zu: ranks got different bits", what, t->spec, t->count);
    return HCOMM_OK;
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes + 16);
    T_CHECK(p != NULL, "out of memory");
    if (p)
        memset(p, 0x5a, bytes + 16);
    return p;
}

static void fill(const tcase_t *t, void *buf, int r, size_t first, size_t n) {
    for (size_t i = 0; i < n; i++)
        t_set_val(t->dt, buf, i, input(t->dt, t->op, r, first + i));
}

/* --- the reductions --- */

static hcomm_result_t t_all_reduce(const tcase_t *t) {
    size_t es = hcomm__dtype_size(t->dt), n = t->count;
    char *in = xmalloc(n * es), *out = t->in_place ? in : xmalloc(n * es);
    if (!in || !out)
        return HCOMM_ERR_NOMEM;
    fill(t, in, t_rank(t->w), 0, n);
    T_TRY(hcomm_all_reduce(t->w, in, out, n, t->dt, t->op));
    check_reduced(t, "all_reduce", out, 0, n);
    T_TRY(check_same_bits(t, "all_reduce", out, n * es));
    if (out != in)
        free(out);
    free(in);
    return HCOMM_OK;
}

static hcomm_result_t t_reduce_scatter(const tcase_t *t, bool vary) {
    int p = t_size(t->w), me = t_rank(t->w);
    size_t es = hcomm__dtype_size(t->dt), *counts = malloc(sizeof(size_t) * (size_t)p), total = 0,
           mine = 0;
    for (int r = 0; counts && r < p; r++) {
        counts[r] = vary ? (t->count + (size_t)r) % (t->count + 2) : t->count;
        mine = r == me ? total : mine;
        total += counts[r];
    }
    char *in = xmalloc(total * es), *out = t->in_place ? in : xmalloc(counts ? counts[me] * es : 0);
    if (!in || !out || !counts)
        return HCOMM_ERR_NOMEM;
    /* in place takes both forms the API allows: the buffer's start, or (odd counts) this
     * rank's own block of it */
    bool own_block = t->in_place && t->count % 2 == 1;
    if (own_block)
        out = in + mine * es;
    fill(t, in, me, 0, total);
    if (vary)
        T_TRY(hcomm_reduce_scatterv(t->w, in, out, counts, t->dt, t->op));
    else
        T_TRY(hcomm_reduce_scatter(t->w, in, out, t->count, t->dt, t->op));
    check_reduced(t, vary ? "reduce_scatterv" : "reduce_scatter", out, mine, counts[me]);
    if (!t->in_place) /* the byte after the receive block stays untouched */
        T_CHECK((unsigned char)out[counts[me] * es] == 0x5a, "reduce_scatter wrote past its block");
    if (!t->in_place)
        free(out);
    free(in);
    free(counts);
    return HCOMM_OK;
}

static hcomm_result_t t_reduce(const tcase_t *t) {
    size_t es = hcomm__dtype_size(t->dt), n = t->count;
    bool root = t_rank(t->w) == t->root;
    char *in = xmalloc(n * es), *out = t->in_place && root ? in : xmalloc(n * es);
    if (!in || !out)
        return HCOMM_ERR_NOMEM;
    fill(t, in, t_rank(t->w), 0, n);
    /* recvbuf matters on the root only, and not even there with count 0 */
    T_TRY(hcomm_reduce(t->w, in, root && n ? out : NULL, n, t->dt, t->op, t->root));
    if (root)
        check_reduced(t, "reduce", out, 0, n);
    if (out != in)
        free(out);
    free(in);
    return HCOMM_OK;
}

/* --- the data movers: byte patterns --- */

static unsigned char byte_of(int r, size_t i) {
    return (unsigned char)mix(((uint64_t)r << 40) ^ i);
}

static void check_blocks(const tcase_t *t, const char *what, const unsigned char *buf,
                         const size_t *bytes, int p) {
    size_t off = 0;
    for (int r = 0; r < p; r++)
        for (size_t i = 0; i < bytes[r]; i++, off++)
            if (buf[off] != byte_of(r, i)) {
                T_FAIL_("%s [%s] bytes=%zu %s (world %d, rank %d): byte %zu of rank %d's block "
                        "is %d, expected %d",
                        what, t->spec, t->count, t->in_place ? "in place" : "out of place", p,
                        t_rank(t->w), i, r, buf[off], byte_of(r, i));
                return;
            }
    atomic_fetch_add(&t_checks, 1);
}

static hcomm_result_t t_all_gather(const tcase_t *t, bool vary) {
    int p = t_size(t->w), me = t_rank(t->w);
    size_t *bytes = malloc(sizeof(size_t) * (size_t)p), total = 0, mine = 0;
    for (int r = 0; bytes && r < p; r++) {
        bytes[r] = vary ? (t->count * (size_t)(r + 1)) % (t->count + 3) : t->count;
        mine = r == me ? total : mine;
        total += bytes[r];
    }
    unsigned char *out = xmalloc(total), *in = t->in_place ? out + mine : xmalloc(t->count * 3);
    if (!bytes || !out || !in)
        return HCOMM_ERR_NOMEM;
    for (size_t i = 0; i < bytes[me]; i++)
        in[i] = byte_of(me, i);
    if (vary)
        T_TRY(hcomm_all_gatherv(t->w, in, out, bytes));
    else
        T_TRY(hcomm_all_gather(t->w, in, out, t->count));
    check_blocks(t, vary ? "all_gatherv" : "all_gather", out, bytes, p);
    if (!t->in_place)
        free(in);
    free(out);
    free(bytes);
    return HCOMM_OK;
}

static hcomm_result_t t_rooted(const tcase_t *t, int kind) { /* 0 broadcast, 1 gather, 2 scatter */
    int p = t_size(t->w), me = t_rank(t->w);
    size_t n = t->count, *bytes = malloc(sizeof(size_t) * (size_t)p);
    unsigned char *all = xmalloc(n * (size_t)p), *one = xmalloc(n);
    if (!bytes || !all || !one)
        return HCOMM_ERR_NOMEM;
    for (int r = 0; r < p; r++)
        bytes[r] = n;
    for (size_t i = 0; i < n; i++)
        one[i] = byte_of(kind == 0 ? t->root : me, i);
    for (int r = 0; r < p && me == t->root; r++)
        for (size_t i = 0; i < n; i++)
            all[(size_t)r * n + i] = byte_of(r, i);
    unsigned char *mine = all + (size_t)t->root * n;
    bool ip = t->in_place && me == t->root;
    if (kind == 0) {
        if (me != t->root)
            memset(one, 0, n);
        T_TRY(hcomm_broadcast(t->w, one, n, t->root));
        for (size_t i = 0; i < n; i++)
            T_CHECK(one[i] == byte_of(t->root, i),
                    "broadcast [%s] bytes=%zu root %d: rank %d byte %zu is %d, expected %d",
                    t->spec, n, t->root, me, i, one[i], byte_of(t->root, i));
    } else if (kind == 1) {
        T_TRY(hcomm_gather(t->w, ip ? mine : one, me == t->root ? all : NULL, n, t->root));
        if (me == t->root)
            check_blocks(t, "gather", all, bytes, p);
    } else {
        if (!ip)
            memset(one, 0, n);
        unsigned char *dst = ip ? mine : one;
        T_TRY(hcomm_scatter(t->w, me == t->root ? all : NULL, dst, n, t->root));
        for (size_t i = 0; i < n; i++)
            T_CHECK(dst[i] == byte_of(me, i), "scatter [%s] bytes=%zu root %d: rank %d byte %zu",
                    t->spec, n, t->root, me, i);
    }
    free(bytes);
    free(all);
    free(one);
    return HCOMM_OK;
}

/* --- the matrix --- */

typedef struct algo_case {
    const char *spec;
    int coll;
} algo_case_t;

static const algo_case_t cases[] = {
    {"allreduce:native", HCOMM__COLL_ALLREDUCE},
    {"allreduce:rd", HCOMM__COLL_ALLREDUCE},
    {"allreduce:ring", HCOMM__COLL_ALLREDUCE},
    {"allreduce:rhd", HCOMM__COLL_ALLREDUCE},
    {"allreduce:naive", HCOMM__COLL_ALLREDUCE},
    {"allreduce:twoshot", HCOMM__COLL_ALLREDUCE},
    {"allreduce:shm", HCOMM__COLL_ALLREDUCE},
    {"reducescatter:native", HCOMM__COLL_REDUCESCATTER},
    {"reducescatter:ring", HCOMM__COLL_REDUCESCATTER},
    {"reducescatter:rhd", HCOMM__COLL_REDUCESCATTER},
    {"reducescatter:rd", HCOMM__COLL_REDUCESCATTER},
    {"reducescatter:direct", HCOMM__COLL_REDUCESCATTER},
    {"reducescatter:shm", HCOMM__COLL_REDUCESCATTER},
    {"reduce:tree", HCOMM__COLL_REDUCE},
    {"reduce:rhd", HCOMM__COLL_REDUCE},
    {"reduce:direct", HCOMM__COLL_REDUCE},
    {"reduce:shm", HCOMM__COLL_REDUCE},
    {"reduce:native", HCOMM__COLL_REDUCE},
    {"reducescatterv:native", HCOMM__COLL_REDUCESCATTERV},
    {"reducescatterv:ring", HCOMM__COLL_REDUCESCATTERV},
    {"reducescatterv:rhd", HCOMM__COLL_REDUCESCATTERV},
    {"reducescatterv:shm", HCOMM__COLL_REDUCESCATTERV},
    {"reducescatterv:direct", HCOMM__COLL_REDUCESCATTERV},
    {"allgather:native", HCOMM__COLL_ALLGATHER},
    {"allgather:ring", HCOMM__COLL_ALLGATHER},
    {"allgather:rd", HCOMM__COLL_ALLGATHER},
    {"allgather:bruck", HCOMM__COLL_ALLGATHER},
    {"allgather:direct", HCOMM__COLL_ALLGATHER},
    {"allgather:shm", HCOMM__COLL_ALLGATHER},
    {"allgatherv:native", HCOMM__COLL_ALLGATHERV},
    {"allgatherv:ring", HCOMM__COLL_ALLGATHERV},
    {"allgatherv:rd", HCOMM__COLL_ALLGATHERV},
    {"allgatherv:bruck", HCOMM__COLL_ALLGATHERV},
    {"allgatherv:shm", HCOMM__COLL_ALLGATHERV},
    {"allgatherv:direct", HCOMM__COLL_ALLGATHERV},
    {"broadcast:native", HCOMM__COLL_BROADCAST},
    {"broadcast:tree", HCOMM__COLL_BROADCAST},
    {"broadcast:chain", HCOMM__COLL_BROADCAST},
    {"broadcast:scatter_allgather", HCOMM__COLL_BROADCAST},
    {"broadcast:rd", HCOMM__COLL_BROADCAST},
    {"broadcast:direct", HCOMM__COLL_BROADCAST},
    {"broadcast:shm", HCOMM__COLL_BROADCAST},
    {"gather:direct", HCOMM__COLL_GATHER},
    {"gather:tree", HCOMM__COLL_GATHER},
    {"gather:shm", HCOMM__COLL_GATHER},
    {"gather:native", HCOMM__COLL_GATHER},
    {"scatter:direct", HCOMM__COLL_SCATTER},
    {"scatter:tree", HCOMM__COLL_SCATTER},
    {"scatter:shm", HCOMM__COLL_SCATTER},
    {"scatter:native", HCOMM__COLL_SCATTER},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

static bool reduces(int coll) {
    return coll == HCOMM__COLL_ALLREDUCE || coll == HCOMM__COLL_REDUCESCATTER ||
           coll == HCOMM__COLL_REDUCE || coll == HCOMM__COLL_REDUCESCATTERV;
}

static hcomm_result_t run_one(tcase_t *t, int coll) {
    switch (coll) {
    case HCOMM__COLL_ALLREDUCE:
        return t_all_reduce(t);
    case HCOMM__COLL_REDUCESCATTER:
        return t_reduce_scatter(t, false);
    case HCOMM__COLL_REDUCESCATTERV:
        return t_reduce_scatter(t, true);
    case HCOMM__COLL_REDUCE:
        return t_reduce(t);
    case HCOMM__COLL_ALLGATHER:
        return t_all_gather(t, false);
    case HCOMM__COLL_ALLGATHERV:
        return t_all_gather(t, true);
    case HCOMM__COLL_BROADCAST:
        return t_rooted(t, 0);
    case HCOMM__COLL_GATHER:
        return t_rooted(t, 1);
    default:
        return t_rooted(t, 2);
    }
}

/* The matrix per algorithm: dtype x op x count x in place x root. HCOMM_TEST_FULL=1
 * (scripts/test-algorithms.sh) runs the whole product on group sizes 1..9, plus a count of
 * about 1M (past the ring's 4 MiB f32 segment and the 2^20-element f16/bf16 widening) for
 * f32, bf16 and i32 SUM and for the data movers; CI runs a pairwise-covering subset (every pair
 * of values of any two factors appears in some case, greedily chosen) and the 1M count once
 * per algorithm on 3 ranks. HCOMM_TEST_ALGO=prefix runs the algorithms whose spec starts with it
 * ("allreduce:", "broadcast:chain"); HCOMM_TEST_MAX_RANKS caps the local group sizes. */
enum { NF = 5, F_DT = 0, F_OP, F_COUNT, F_IP, F_ROOT, NCOUNTS = 5, MAXV = 8 };

typedef struct tuple {
    int v[NF];
} tuple_t;

static bool full_matrix(void) {
    const char *s = getenv("HCOMM_TEST_FULL");
    return s && strcmp(s, "1") == 0;
}

static int pairs_gained(const int *v, bool cov[NF][NF][MAXV][MAXV]) {
    int gain = 0;
    for (int f = 0; f < NF; f++)
        for (int g = f + 1; g < NF; g++)
            gain += !cov[f][g][v[f]][v[g]];
    return gain;
}

static void decode(int t, const int *sizes, int *v) {
    for (int f = NF - 1; f >= 0; f--) {
        v[f] = t % sizes[f];
        t /= sizes[f];
    }
}

/* The tuples to run: every one (full) or a greedy pairwise cover; returns how many. */
static int matrix(const int *sizes, bool full, tuple_t *out) {
    bool cov[NF][NF][MAXV][MAXV]; /* per thread: local ranks are threads */
    int total = 1, n = 0;
    for (int f = 0; f < NF; f++)
        total *= sizes[f];
    if (full) {
        for (int t = 0; t < total; t++)
            decode(t, sizes, out[t].v);
        return total;
    }
    memset(cov, 0, sizeof cov);
    for (;;) {
        int best = -1, best_gain = 0, v[NF];
        for (int t = 0; t < total; t++) {
            decode(t, sizes, v);
            int gain = pairs_gained(v, cov);
            if (gain > best_gain)
                best = t, best_gain = gain;
        }
        if (best < 0)
            return n;
        decode(best, sizes, out[n].v);
        for (int f = 0; f < NF; f++)
            for (int g = f + 1; g < NF; g++)
                cov[f][g][out[n].v[f]][out[n].v[g]] = true;
        n++;
    }
}

static hcomm_result_t run_tuple(hcomm_comm_t *w, const algo_case_t *ac, hcomm_dtype_t dt,
                                hcomm_op_t op, size_t count, bool ip, int root) {
    tcase_t t = {w, ac->spec, dt, op, count, ip, root};
    return run_one(&t, ac->coll);
}

/* About 1M elements (bytes for the data movers): f32, bf16 and i32 SUM. */
static hcomm_result_t run_large(hcomm_comm_t *w, const algo_case_t *ac, bool full) {
    int p = t_size(w);
    size_t big = ((size_t)1 << 20) + 2 * (size_t)p + 1;
    static const hcomm_dtype_t dts[] = {HCOMM_F32, HCOMM_BF16, HCOMM_I32};
    int ndt = reduces(ac->coll) ? (full ? 3 : 1) : 1;
    for (int d = 0; d < ndt; d++)
        T_TRY(run_tuple(w, ac, reduces(ac->coll) ? dts[d] : HCOMM_U8, HCOMM_SUM, big,
                        full && d == 1, p - 1));
    return HCOMM_OK;
}

static hcomm_result_t run_case(hcomm_comm_t *w, const algo_case_t *ac) {
    int p = t_size(w);
    bool full = full_matrix();
    size_t counts[NCOUNTS] = {0, 1, (size_t)p - 1, (size_t)p + 1, 1009};
    int sizes[NF] = {reduces(ac->coll) ? HCOMM_DTYPE_COUNT : 1,
                     reduces(ac->coll) ? HCOMM_OP_COUNT : 1, NCOUNTS, 2, p > 1 ? 2 : 1};
    tuple_t tuples[HCOMM_DTYPE_COUNT * HCOMM_OP_COUNT * NCOUNTS * 2 * 2];
    _Static_assert((int)HCOMM_DTYPE_COUNT <= (int)MAXV, "a factor's values fit the cover table");
    int n = matrix(sizes, full, tuples);
    T_TRY(hcomm_comm_set_algo(w, ac->spec));
    for (int i = 0; i < n; i++) {
        const int *v = tuples[i].v;
        T_TRY(run_tuple(w, ac, reduces(ac->coll) ? (hcomm_dtype_t)v[F_DT] : HCOMM_U8,
                        (hcomm_op_t)v[F_OP], counts[v[F_COUNT]], v[F_IP] == 1,
                        v[F_ROOT] ? p - 1 : 0));
    }
    if (full || p == 3)
        T_TRY(run_large(w, ac, full));
    return hcomm_comm_set_algo(w, NULL);
}

static hcomm_result_t run(hcomm_comm_t *w, void *arg) {
    (void)arg;
    const char *only = getenv("HCOMM_TEST_ALGO");
    for (int i = 0; i < NCASES; i++)
        if (!only || !only[0] || strncmp(cases[i].spec, only, strlen(only)) == 0)
            T_TRY(run_case(w, &cases[i]));
    return HCOMM_OK;
}

/* --- HCOMM_ALGO syntax --- */

static void parse_ok(const char *spec, int coll, int algo, bool allowed) {
    hcomm__algo_set_t set;
    hcomm_result_t r = hcomm__algo_parse("test", "HCOMM_ALGO", spec, &set);
    T_CHECK(r == HCOMM_OK, "\"%s\": %s", spec, hcomm_last_error());
    T_CHECK(r != HCOMM_OK || ((set.allowed[coll] >> algo) & 1) == allowed,
            "\"%s\": %s for %s should be %s", spec, hcomm__algo_name(algo), hcomm__coll_name(coll),
            allowed ? "allowed" : "excluded");
}

static void parse_bad(const char *spec, const char *must_say) {
    hcomm__algo_set_t set;
    hcomm_result_t r = hcomm__algo_parse("test", "HCOMM_ALGO", spec, &set);
    T_CHECK(r == HCOMM_ERR_INVALID_ARG && strstr(hcomm_last_error(), must_say),
            "\"%s\" gave %s (%s), expected an error saying \"%s\"", spec, hcomm_result_name(r),
            hcomm_last_error(), must_say);
}

static void test_parse(void) {
    parse_ok("allreduce:ring;allgather:native", HCOMM__COLL_ALLREDUCE, HCOMM__ALGO_RING, true);
    parse_ok("allreduce:ring;allgather:native", HCOMM__COLL_ALLREDUCE, HCOMM__ALGO_NATIVE, false);
    parse_ok("allreduce:ring;allgather:native", HCOMM__COLL_ALLGATHER, HCOMM__ALGO_RING, false);
    parse_ok("allreduce:^ring,rd", HCOMM__COLL_ALLREDUCE, HCOMM__ALGO_RHD, true);
    parse_ok("allreduce:^ring,rd", HCOMM__COLL_ALLREDUCE, HCOMM__ALGO_RD, false);
    parse_ok("ring", HCOMM__COLL_REDUCESCATTER, HCOMM__ALGO_NATIVE, false);
    parse_ok("ring", HCOMM__COLL_BROADCAST, HCOMM__ALGO_NATIVE, true); /* no ring there */
    parse_ok("^native", HCOMM__COLL_BROADCAST, HCOMM__ALGO_TREE, true);
    parse_ok("", HCOMM__COLL_ALLREDUCE, HCOMM__ALGO_NATIVE, true);
    parse_bad("allreduce:rings",
              "valid: native, rd, ring, rhd, naive, tree, direct, hier, twoshot, "
              "bruck, chain, scatter_allgather, pairwise, shm");
    parse_bad("allreduse:ring", "is not a collective; valid: allreduce");
    parse_bad("allgather:rhd",
              "leaves no algorithm for allgather; valid: native, rd, ring, direct, hier, bruck");
    parse_bad("allreduce:", "names no algorithm");
    parse_ok(" allreduce : ring , rd ; allgather:native ", HCOMM__COLL_ALLREDUCE, HCOMM__ALGO_RD,
             true);
    parse_ok(" allreduce : ring , rd ; allgather:native ", HCOMM__COLL_ALLREDUCE,
             HCOMM__ALGO_NATIVE, false);
    parse_ok("ring;allreduce:rd", HCOMM__COLL_ALLREDUCE, HCOMM__ALGO_RD, true); /* general first */
    parse_ok("ring;allreduce:rd", HCOMM__COLL_ALLREDUCE, HCOMM__ALGO_RING, false);
    parse_ok("all_reduce:ring;reduce_scatter:native", HCOMM__COLL_ALLREDUCE, HCOMM__ALGO_RD,
             false); /* the calls' spelling too */
    parse_ok("all_reduce:ring;reduce_scatter:native", HCOMM__COLL_REDUCESCATTER, HCOMM__ALGO_NATIVE,
             true);
    parse_bad("allreduce:ring;all_reduce:rd", "HCOMM_ALGO: allreduce is named by two entries");
    parse_bad("allreduce:ring;allreduce:rd", "HCOMM_ALGO: allreduce is named by two entries");
    parse_bad("allreduce:rd;ring", "HCOMM_ALGO: \"ring\" names no collective, so it must come "
                                   "before the entries that do");
    parse_bad("alltoall:direct;alltoall:pairwise", "alltoall");
    int algo;
    const char *why;
    hcomm__algo_set_t set;
    T_OK(hcomm__algo_parse("test", "HCOMM_ALGO", "allreduce:^native,rd", &set));
    algo = choose_default(&set, HCOMM__COLL_ALLREDUCE, 8, 4, false, &why);
    T_CHECK(algo == HCOMM__ALGO_RING, "allreduce:^native,rd chose %s", hcomm__algo_name(algo));
    algo = choose_default(NULL, HCOMM__COLL_ALLREDUCE, 8, 4, false, &why);
    T_CHECK(getenv("HCOMM_ALGO") || algo == HCOMM__ALGO_RD, "default small mpi allreduce: %s",
            hcomm__algo_name(algo));
    algo = choose_default(NULL, HCOMM__COLL_ALLREDUCE, 8, 4, true, &why);
    T_CHECK(getenv("HCOMM_ALGO") || algo == HCOMM__ALGO_NATIVE, "default local allreduce: %s",
            hcomm__algo_name(algo));
    /* reduce: tree for small vectors, the root's direct reads above (mpi 4 KiB; local 4 KiB with
     * 2 ranks, 64 KiB with up to 4, 256 KiB with more); gather and scatter direct (local) or
     * native (mpi); each overridable */
    static const struct {
        int coll;
        size_t bytes;
        int p;
        bool shm;
        int want;
    } rooted[] = {{HCOMM__COLL_REDUCE, 4095, 4, false, HCOMM__ALGO_TREE},
                  {HCOMM__COLL_REDUCE, 4096, 4, false, HCOMM__ALGO_DIRECT},
                  {HCOMM__COLL_REDUCE, 4095, 2, true, HCOMM__ALGO_TREE},
                  {HCOMM__COLL_REDUCE, 4096, 2, true, HCOMM__ALGO_DIRECT},
                  {HCOMM__COLL_REDUCE, (64 << 10) - 1, 4, true, HCOMM__ALGO_TREE},
                  {HCOMM__COLL_REDUCE, 64 << 10, 4, true, HCOMM__ALGO_DIRECT},
                  {HCOMM__COLL_REDUCE, (256 << 10) - 1, 8, true, HCOMM__ALGO_TREE},
                  {HCOMM__COLL_REDUCE, 256 << 10, 8, true, HCOMM__ALGO_DIRECT},
                  {HCOMM__COLL_GATHER, 1 << 20, 4, false, HCOMM__ALGO_NATIVE},
                  {HCOMM__COLL_GATHER, 1 << 20, 4, true, HCOMM__ALGO_DIRECT},
                  {HCOMM__COLL_SCATTER, 8, 4, false, HCOMM__ALGO_NATIVE},
                  {HCOMM__COLL_SCATTER, 8, 4, true, HCOMM__ALGO_DIRECT}};
    for (size_t i = 0; i < sizeof rooted / sizeof rooted[0] && !getenv("HCOMM_ALGO"); i++) {
        algo =
            choose_default(NULL, rooted[i].coll, rooted[i].bytes, rooted[i].p, rooted[i].shm, &why);
        T_CHECK(algo == rooted[i].want, "default %s of %zu bytes on %d ranks (shm %d): %s",
                hcomm__coll_name(rooted[i].coll), rooted[i].bytes, rooted[i].p, (int)rooted[i].shm,
                hcomm__algo_name(algo));
    }
    T_OK(hcomm__algo_parse("test", "HCOMM_ALGO", "reduce:rhd;gather:tree", &set));
    algo = choose_default(&set, HCOMM__COLL_REDUCE, 1 << 20, 4, true, &why);
    T_CHECK(algo == HCOMM__ALGO_RHD, "reduce:rhd chose %s", hcomm__algo_name(algo));
    algo = choose_default(&set, HCOMM__COLL_GATHER, 8, 4, true, &why);
    T_CHECK(algo == HCOMM__ALGO_TREE, "gather:tree chose %s", hcomm__algo_name(algo));
}

/* Block arithmetic in size_t past INT_MAX and UINT32_MAX, without allocating: blocks tile the
 * range, the first count % p are one longer. */
static void test_blocks(void) {
    static const size_t totals[] = {0, 1, 7, (size_t)1 << 31, ((size_t)1 << 33) + 5};
    for (int ti = 0; ti < 5; ti++)
        for (int p = 1; p <= 9; p++) {
            size_t next = 0, n = totals[ti];
            for (int r = 0; r < p; r++) {
                size_t off, len;
                hcomm__block(n, p, r, &off, &len);
                T_CHECK(off == next && len == n / (size_t)p + ((size_t)r < n % (size_t)p),
                        "block %d of %zu over %d: off %zu len %zu, expected off %zu", r, n, p, off,
                        len, next);
                next = off + len;
            }
            T_CHECK(next == n, "blocks of %zu over %d end at %zu", n, p, next);
        }
}

/* Ranks that chose different algorithms fail with MISMATCH naming them, not a hang. */
static hcomm_result_t differ(hcomm_comm_t *w, void *arg) {
    (void)arg;
    if (t_size(w) < 2)
        return HCOMM_OK;
    T_TRY(hcomm_comm_set_algo(w, t_rank(w) == 0 ? "allreduce:ring" : "allreduce:rhd"));
    float v[16] = {0};
    hcomm_result_t r = hcomm_all_reduce(w, v, v, 16, HCOMM_F32, HCOMM_SUM);
    T_CHECK(r == HCOMM_ERR_MISMATCH && strstr(hcomm_last_error(), "algo="),
            "ring vs rhd gave %s (%s)", hcomm_result_name(r), hcomm_last_error());
    T_TRY(hcomm_comm_set_algo(w, NULL));
    T_OK(hcomm_all_reduce(w, v, v, 16, HCOMM_F32, HCOMM_SUM)); /* still usable */
    return HCOMM_OK;
}

/* A v-call's mismatch of per-rank counts with the same total names both arrays with their
 * ranks on every rank: "counts=[2, 0, 1] on rank 0 but counts=[1, 1, 1] on rank 1" (rank 0
 * passed {2, 0, 1, ...}, the others {1, 1, ...}; ranks 0 and 1 send theirs to all). */
static bool counts_named(const char *msg, const char *what, int p) {
    char want[512];
    size_t len = (size_t)snprintf(want, sizeof want, ": %s=[", what);
    for (int i = 0; i < p; i++)
        len += (size_t)snprintf(want + len, sizeof want - len, "%s%d", i ? ", " : "",
                                i == 0   ? 2
                                : i == 1 ? 0
                                         : 1);
    len += (size_t)snprintf(want + len, sizeof want - len, "] on rank 0 but %s=[", what);
    for (int i = 0; i < p; i++)
        len += (size_t)snprintf(want + len, sizeof want - len, "%s1", i ? ", " : "");
    snprintf(want + len, sizeof want - len, "] on rank 1");
    const char *at = strstr(msg, want);
    return strstr(msg, "hcomm_") == msg && at && at[strlen(want)] == 0;
}

/* A rank whose arguments are bad fails with its own error, its peers with HCOMM_ERR_PEER; peers
 * that pass different per-rank counts fail with MISMATCH. The comm stays usable. */
static hcomm_result_t bad_args(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int p = t_size(w), me = t_rank(w);
    if (p < 2)
        return HCOMM_OK;
    float v[4] = {1, 2, 3, 4}, out[4];
    hcomm_result_t r = hcomm_reduce(w, v, out, 4, HCOMM_F32, HCOMM_SUM, me == 1 ? p : 0);
    T_CHECK(r == (me == 1 ? HCOMM_ERR_INVALID_ARG : HCOMM_ERR_PEER),
            "reduce with a bad root on rank 1: rank %d got %s (%s)", me, hcomm_result_name(r),
            hcomm_last_error());
    r = hcomm_gather(w, me == 0 ? NULL : v, out, 4, 0);
    T_CHECK(r == (me == 0 ? HCOMM_ERR_NULL : HCOMM_ERR_PEER),
            "gather with a NULL sendbuf on rank 0: rank %d got %s (%s)", me, hcomm_result_name(r),
            hcomm_last_error());
    size_t *counts = calloc((size_t)p, sizeof *counts);
    float *big = calloc(4 * (size_t)p + 4, sizeof *big);
    if (!counts || !big)
        return HCOMM_ERR_NOMEM;
    for (int i = 0; i < p; i++) /* the same total: only the digest tells them apart */
        counts[i] = me != 0 ? 1 : i == 0 ? 2 : i == 1 ? 0 : 1;
    r = hcomm_reduce_scatterv(w, big, out, counts, HCOMM_F32, HCOMM_SUM);
    T_CHECK(r == HCOMM_ERR_MISMATCH && counts_named(hcomm_last_error(), "counts", p),
            "reduce_scatterv with other counts on rank 0: rank %d got %s (%s)", me,
            hcomm_result_name(r), hcomm_last_error());
    r = hcomm_all_gatherv(w, big, big + 2 * p, counts);
    T_CHECK(r == HCOMM_ERR_MISMATCH && counts_named(hcomm_last_error(), "bytes", p),
            "all_gatherv with other counts on rank 0: rank %d got %s (%s)", me,
            hcomm_result_name(r), hcomm_last_error());
    free(counts);
    free(big);
    T_OK(hcomm_reduce(w, v, out, 4, HCOMM_F32, HCOMM_SUM, 0)); /* still usable */
    T_CHECK(me != 0 || out[3] == 4.0f * (float)p, "reduce after the failures: got %g", out[3]);
    return HCOMM_OK;
}

int main(void) {
    /* HCOMM_TEST_MPI */
    test_parse();
    test_blocks();
    const char *max = getenv("HCOMM_TEST_MAX_RANKS");
    t_for_each_world(run, NULL, max && atoi(max) > 0 ? atoi(max) : 9);
    t_for_each_world(differ, NULL, 4);
    t_for_each_world(bad_args, NULL, 5);
    return t_finish("test_algos");
}
