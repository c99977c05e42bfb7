/* The operations hcomm-bench measures: the collectives and the TP, PP and DP primitives, each
 * with its buffers, inputs, a serial reference for #wrong and, on mpi, the raw MPI call on the
 * same buffers. Inputs are small integers, exact in every dtype, so every reduction order gives
 * the same result and a difference is a real error (AVG of floats is allowed its rounding).
 * Sizes follow nccl-tests: bytes and count are those of the largest buffer of a rank (the output
 * of all_gather and gather, the input of reduce_scatter and scatter). */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(HCOMM_BENCH_MPI)
#include <limits.h>
#include <mpi.h>
#endif

const char *const bench_op_names[HCOMM_OP_COUNT] = {"sum", "prod", "max", "min", "avg"};

#define SENTINEL 120.0 /* in no op's output for groups of fewer than 30 ranks */

double bench_get(hcomm_dtype_t dt, const void *buf, size_t i) {
    switch (dt) {
    case HCOMM_F32:
        return ((const float *)buf)[i];
    case HCOMM_F64:
        return ((const double *)buf)[i];
    case HCOMM_F16:
        return hcomm__bench_half_to_f32(((const uint16_t *)buf)[i], HCOMM_F16);
    case HCOMM_BF16:
        return hcomm__bench_half_to_f32(((const uint16_t *)buf)[i], HCOMM_BF16);
    case HCOMM_I8:
        return ((const int8_t *)buf)[i];
    case HCOMM_U8:
        return ((const uint8_t *)buf)[i];
    case HCOMM_I32:
        return ((const int32_t *)buf)[i];
    case HCOMM_I64:
        return (double)((const int64_t *)buf)[i];
    default:
        return NAN;
    }
}

void bench_put(hcomm_dtype_t dt, void *buf, size_t i, double v) {
    switch (dt) {
    case HCOMM_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case HCOMM_F64:
        ((double *)buf)[i] = v;
        break;
    case HCOMM_F16:
        ((uint16_t *)buf)[i] = hcomm__bench_f32_to_half((float)v, HCOMM_F16);
        break;
    case HCOMM_BF16:
        ((uint16_t *)buf)[i] = hcomm__bench_f32_to_half((float)v, HCOMM_BF16);
        break;
    case HCOMM_I8:
        ((int8_t *)buf)[i] = (int8_t)(int64_t)v; /* wraps as hcomm's sum does */
        break;
    case HCOMM_U8:
        ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; /* wraps as hcomm's sum does */
        break;
    case HCOMM_I32:
        ((int32_t *)buf)[i] = (int32_t)(int64_t)v; /* wraps as hcomm's sum does */
        break;
    case HCOMM_I64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    default:
        break;
    }
}

/* --- blocks of n elements over p ranks: ceil for the first n mod p, floor for the rest --- */

static size_t blk(size_t n, int p, int i) {
    return n / (size_t)p + ((size_t)i < n % (size_t)p);
}

static size_t blk_off(size_t n, int p, int i) {
    size_t r = n % (size_t)p;
    return (size_t)i * (n / (size_t)p) + ((size_t)i < r ? (size_t)i : r);
}

/* --- inputs and the serial reference --- */

unsigned bench_pattern(int r, size_t g, unsigned range) {
    uint64_t x = (uint64_t)g * 0x9E3779B97F4A7C15u ^ (uint64_t)(unsigned)r << 40;
    x ^= x >> 33; /* MurmurHash3's 64-bit finalizer */
    x *= 0xFF51AFD7ED558CCDu;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53u;
    x ^= x >> 33;
    return (unsigned)(x % range);
}

/* Rank r's input element g, hashed from (r, g) so that a block from the wrong rank or offset
 * shows whatever the group size and block length (a periodic pattern hid a shifted block when
 * the block was a multiple of the period). SUM and AVG: 0..4 (a sum over p ranks is at most
 * 4p); PROD: 2 or 1 on ranks 0..5, 1 elsewhere (the product is at most 64, exact in int8);
 * MAX, MIN and data movement: 0..60. */
static double in(const bench_case_t *c, int r, size_t g) {
    if (!c->op->reduces)
        return bench_pattern(r, g, 61);
    switch (c->o->redop) {
    case HCOMM_PROD:
        return r < 6 ? 1.0 + bench_pattern(r, g, 2) : 1.0;
    case HCOMM_MAX:
    case HCOMM_MIN:
        return bench_pattern(r, g, 61);
    default:
        return bench_pattern(r, g, 5);
    }
}

/* The reduction over ranks of element g, rounded to the dtype as hcomm rounds it. */
static double ref(const bench_case_t *c, size_t g) {
    double acc = in(c, 0, g);
    for (int r = 1; r < c->size; r++) {
        double x = in(c, r, g);
        switch (c->o->redop) {
        case HCOMM_PROD:
            acc *= x;
            break;
        case HCOMM_MAX:
            acc = x > acc ? x : acc;
            break;
        case HCOMM_MIN:
            acc = x < acc ? x : acc;
            break;
        default:
            acc += x;
            break;
        }
    }
    double tmp[1];
    if (c->o->redop == HCOMM_AVG && !hcomm__bench_dtype_is_float(c->dt)) {
        bench_put(c->dt, tmp, 0, acc); /* the sum wraps in the dtype, then divides (core.h) */
        acc = trunc(bench_get(c->dt, tmp, 0) / c->size);
    } else if (c->o->redop == HCOMM_AVG) {
        acc /= c->size;
    }
    bench_put(c->dt, tmp, 0, acc);
    return bench_get(c->dt, tmp, 0);
}

static long differs(const bench_case_t *c, double got, double want) {
    if (c->op->reduces && c->o->redop == HCOMM_AVG && hcomm__bench_dtype_is_float(c->dt))
        return fabs(got - want) > 1e-2 * fabs(want) + 1e-6; /* rounding of the mean */
    return got != want;
}

static void fill_in(const bench_case_t *c, void *buf, size_t n, int r, size_t g0) {
    for (size_t j = 0; j < n; j++)
        bench_put(c->dt, buf, j, in(c, r, g0 + j));
}

static void fill_sentinel(const bench_case_t *c, void *buf, size_t n) {
    for (size_t j = 0; j < n; j++)
        bench_put(c->dt, buf, j, SENTINEL);
}

static char *at(const bench_case_t *c, void *buf, size_t elems) {
    return (char *)buf + elems * c->es;
}

/* --- shapes --- */

/* At least one element, except for a requested size of 0: a row of empty calls. */
static void shape_any(bench_case_t *c, size_t req) {
    c->count = req / c->es > 0 || req == 0 ? req / c->es : 1;
    c->bytes = c->count * c->es;
}

/* A multiple of p elements: blocks of equal size (the collective needs it). */
static void shape_multiple(bench_case_t *c, size_t req) {
    size_t p = (size_t)c->size, n = req / c->es / p * p;
    c->count = n > 0 || req == 0 ? n : p;
    c->bytes = c->count * c->es;
}

static size_t cap_count(const bench_case_t *c) {
    return c->bytes;
}

static double f_allreduce(int p) {
    return 2.0 * (p - 1) / p;
}
static double f_gather(int p) {
    return (double)(p - 1) / p;
}
static double f_one(int p) {
    (void)p;
    return 1.0;
}

/* --- all_reduce, tp_all_reduce, dp_all_reduce --- */

static void fill_all_reduce(bench_case_t *c) {
    fill_in(c, c->inplace ? c->recv : c->send, c->count, c->rank, 0);
    if (!c->inplace)
        fill_sentinel(c, c->recv, c->count);
}

static long wrong_all_reduce(const bench_case_t *c) {
    long w = 0;
    for (size_t i = 0; i < c->count; i++)
        w += differs(c, bench_get(c->dt, c->recv, i), ref(c, i));
    return w;
}

static const void *src_of(const bench_case_t *c) {
    return c->inplace ? c->recv : c->send;
}

static hcomm_result_t run_all_reduce(bench_case_t *c) {
    return hcomm_all_reduce(c->w, src_of(c), c->recv, c->count, c->dt, c->o->redop);
}

static hcomm_result_t vector(bench_case_t *c, void *data, size_t n, hcomm_tensor_t *t) {
    int64_t shape = (int64_t)n;
    return hcomm_tensor_init(t, data, c->dt, 1, &shape);
}

static hcomm_result_t run_tp_all_reduce(bench_case_t *c) {
    hcomm_tensor_t in_t, out_t;
    BENCH_TRY(vector(c, (void *)src_of(c), c->count, &in_t));
    BENCH_TRY(vector(c, c->recv, c->count, &out_t));
    return hcomm_tp_all_reduce(c->w, &in_t, &out_t, c->o->redop);
}

/* Gradients of uneven sizes (blocks of the count), reduced in place in one buffer. */
static hcomm_result_t run_dp(bench_case_t *c) {
    int n = c->o->dp_buffers;
    hcomm_tensor_t *t = malloc(sizeof *t * (size_t)n);
    hcomm_result_t r = t ? HCOMM_OK : HCOMM_ERR_NOMEM;
    for (int i = 0; r == HCOMM_OK && i < n; i++)
        r = vector(c, at(c, c->recv, blk_off(c->count, n, i)), blk(c->count, n, i), &t[i]);
    if (r == HCOMM_OK)
        r = hcomm_dp_all_reduce_grads(c->w, t, n, c->o->redop, 0);
    free(t);
    return r;
}

/* --- reduce_scatter(v), tp_reduce_scatter --- */

static void fill_reduce_scatter(bench_case_t *c) {
    fill_in(c, c->inplace ? c->recv : c->send, c->count, c->rank, 0);
    if (!c->inplace)
        fill_sentinel(c, c->recv, c->count);
}

static long wrong_reduce_scatter(const bench_case_t *c) {
    long w = 0;
    size_t n = blk(c->count, c->size, c->rank), off = blk_off(c->count, c->size, c->rank);
    for (size_t i = 0; i < n; i++)
        w += differs(c, bench_get(c->dt, c->recv, i), ref(c, off + i));
    return w;
}

static hcomm_result_t run_reduce_scatter(bench_case_t *c) {
    return hcomm_reduce_scatter(c->w, src_of(c), c->recv, c->count / (size_t)c->size, c->dt,
                                c->o->redop);
}

static void v_counts(bench_case_t *c, size_t scale) {
    for (int p = 0; p < c->size; p++) {
        c->counts[p] = blk(c->count, c->size, p) * scale;
        c->displs[p] = blk_off(c->count, c->size, p) * scale;
    }
}

static hcomm_result_t run_reduce_scatterv(bench_case_t *c) {
    v_counts(c, 1);
    return hcomm_reduce_scatterv(c->w, src_of(c), c->recv, c->counts, c->dt, c->o->redop);
}

static hcomm_result_t run_tp_reduce_scatter(bench_case_t *c) {
    hcomm_tensor_t in_t, out_t;
    BENCH_TRY(vector(c, (void *)src_of(c), c->count, &in_t));
    BENCH_TRY(vector(c, c->recv, c->count / (size_t)c->size, &out_t));
    return hcomm_tp_reduce_scatter(c->w, &in_t, &out_t, 0, c->o->redop);
}

/* --- reduce --- */

static hcomm_result_t run_reduce(bench_case_t *c) {
    bool root = c->rank == c->o->root;
    return hcomm_reduce(c->w, src_of(c), root ? c->recv : NULL, c->count, c->dt, c->o->redop,
                        c->o->root);
}

static long wrong_reduce(const bench_case_t *c) {
    return c->rank == c->o->root ? wrong_all_reduce(c) : 0;
}

/* --- all_gather(v), gather, tp_all_gather: rank r's block r lands at its offset --- */

/* In place, the input is this rank's block of recv (and send too, for a gather leaf). */
static void fill_gather(bench_case_t *c) {
    size_t n = blk(c->count, c->size, c->rank), off = blk_off(c->count, c->size, c->rank);
    fill_sentinel(c, c->recv, c->count);
    fill_in(c, c->send, n, c->rank, 0);
    if (c->inplace)
        fill_in(c, at(c, c->recv, off), n, c->rank, 0);
}

static long wrong_all_gather(const bench_case_t *c) {
    long w = 0;
    for (int r = 0; r < c->size; r++) {
        size_t n = blk(c->count, c->size, r), off = blk_off(c->count, c->size, r);
        for (size_t j = 0; j < n; j++)
            w += differs(c, bench_get(c->dt, c->recv, off + j), in(c, r, j));
    }
    return w;
}

static long wrong_gather(const bench_case_t *c) {
    return c->rank == c->o->root ? wrong_all_gather(c) : 0;
}

static const void *my_block(bench_case_t *c) {
    return c->inplace ? at(c, c->recv, blk_off(c->count, c->size, c->rank)) : c->send;
}

static hcomm_result_t run_all_gather(bench_case_t *c) {
    return hcomm_all_gather(c->w, my_block(c), c->recv, c->count / (size_t)c->size * c->es);
}

static hcomm_result_t run_all_gatherv(bench_case_t *c) {
    v_counts(c, c->es);
    return hcomm_all_gatherv(c->w, my_block(c), c->recv, c->counts);
}

static hcomm_result_t run_gather(bench_case_t *c) {
    bool root = c->rank == c->o->root;
    const void *s = c->inplace && root ? my_block(c) : c->send;
    return hcomm_gather(c->w, s, root ? c->recv : NULL, c->count / (size_t)c->size * c->es,
                        c->o->root);
}

static hcomm_result_t run_tp_all_gather(bench_case_t *c) {
    hcomm_tensor_t in_t, out_t;
    BENCH_TRY(vector(c, c->send, c->count / (size_t)c->size, &in_t));
    BENCH_TRY(vector(c, c->recv, c->count, &out_t));
    return hcomm_tp_all_gather(c->w, &in_t, &out_t, 0);
}

/* --- scatter: the root's count elements, block r to rank r --- */

static void fill_scatter(bench_case_t *c) {
    bool root = c->rank == c->o->root;
    if (root)
        fill_in(c, c->send, c->count, c->rank, 0);
    if (!(c->inplace && root))
        fill_sentinel(c, c->recv, c->count / (size_t)c->size);
}

static long wrong_scatter(const bench_case_t *c) {
    size_t per = c->count / (size_t)c->size;
    const void *got =
        c->inplace && c->rank == c->o->root ? at(c, c->send, per * (size_t)c->rank) : c->recv;
    long w = 0;
    for (size_t j = 0; j < per; j++)
        w += differs(c, bench_get(c->dt, got, j), in(c, c->o->root, per * (size_t)c->rank + j));
    return w;
}

static hcomm_result_t run_scatter(bench_case_t *c) {
    size_t per = c->count / (size_t)c->size;
    bool root = c->rank == c->o->root;
    void *dst = c->inplace && root ? at(c, c->send, per * (size_t)c->rank) : c->recv;
    return hcomm_scatter(c->w, root ? c->send : NULL, dst, per * c->es, c->o->root);
}

/* --- broadcast: one buffer --- */

static void fill_broadcast(bench_case_t *c) {
    if (c->rank == c->o->root)
        fill_in(c, c->recv, c->count, c->rank, 0);
    else
        fill_sentinel(c, c->recv, c->count);
}

static long wrong_broadcast(const bench_case_t *c) {
    long w = 0;
    for (size_t i = 0; i < c->count; i++)
        w += differs(c, bench_get(c->dt, c->recv, i), in(c, c->o->root, i));
    return w;
}

static hcomm_result_t run_broadcast(bench_case_t *c) {
    return hcomm_broadcast(c->w, c->recv, c->bytes, c->o->root);
}

/* --- all_to_all(v): rank r sends block q of its count elements to q. all_to_allv's blocks
 * are uneven: r sends blk(count, p, (q + r) mod p) elements to q, and so gets as many from q
 * as q sends it: both directions total count. --- */

static size_t a2a_n(const bench_case_t *c, int from, int to) {
    if (c->op->shape == shape_multiple)
        return c->count / (size_t)c->size;
    return blk(c->count, c->size, (from + to) % c->size);
}

static size_t a2a_off(const bench_case_t *c, int from, int to) {
    size_t off = 0;
    for (int q = 0; q < to; q++)
        off += a2a_n(c, from, q);
    return off;
}

static void a2a_counts(bench_case_t *c) {
    for (int q = 0; q < c->size; q++) {
        c->counts[q] = a2a_n(c, c->rank, q) * c->es;
        c->displs[q] = a2a_off(c, c->rank, q) * c->es;
        c->rcounts[q] = a2a_n(c, q, c->rank) * c->es;
        c->rdispls[q] = q == 0 ? 0 : c->rdispls[q - 1] + c->rcounts[q - 1];
    }
}

static void fill_a2a(bench_case_t *c) {
    fill_in(c, c->send, c->count, c->rank, 0);
    fill_sentinel(c, c->recv, c->count);
    a2a_counts(c);
}

static long wrong_a2a(const bench_case_t *c) {
    long w = 0;
    for (int q = 0; q < c->size; q++) {
        size_t n = a2a_n(c, q, c->rank), src = a2a_off(c, q, c->rank), dst = c->rdispls[q] / c->es;
        for (size_t j = 0; j < n; j++)
            w += differs(c, bench_get(c->dt, c->recv, dst + j), in(c, q, src + j));
    }
    return w;
}

static hcomm_result_t run_a2a(bench_case_t *c) {
    return hcomm_all_to_allv(c->w, c->send, c->counts, c->displs, c->recv, c->rcounts, c->rdispls);
}

/* --- pp_send_recv: every rank sends to the next and receives from the previous at once --- */

static void fill_pp(bench_case_t *c) {
    fill_in(c, c->send, c->count, c->rank, 0);
    fill_sentinel(c, c->recv, c->count);
}

static long wrong_pp(const bench_case_t *c) {
    if (c->size == 1)
        return 0;
    int prev = (c->rank + c->size - 1) % c->size;
    long w = 0;
    for (size_t i = 0; i < c->count; i++)
        w += differs(c, bench_get(c->dt, c->recv, i), in(c, prev, i));
    return w;
}

static hcomm_result_t run_pp(bench_case_t *c) {
    if (c->size == 1)
        return HCOMM_OK;
    hcomm_tensor_t s, r;
    BENCH_TRY(vector(c, c->send, c->count, &s));
    BENCH_TRY(vector(c, c->recv, c->count, &r));
    return hcomm_pp_send_recv(c->w, &s, (c->rank + 1) % c->size, 1, &r,
                              (c->rank + c->size - 1) % c->size, 1);
}

/* The same exchange one layer down, on hcomm's p2p layer (PP's overhead is the difference). */
static hcomm_result_t p2p_pp(bench_case_t *c) {
    if (c->size == 1)
        return HCOMM_OK;
    return hcomm__bench_sendrecv(c->w, 3, (c->rank + 1) % c->size, c->send,
                                 (c->rank + c->size - 1) % c->size, c->recv, c->bytes);
}

/* --- raw MPI on the same buffers (mpi backend) --- */

#if defined(HCOMM_BENCH_MPI)
static MPI_Datatype mpi_type(hcomm_dtype_t dt) {
    switch (dt) {
    case HCOMM_F32:
        return MPI_FLOAT;
    case HCOMM_F64:
        return MPI_DOUBLE;
    case HCOMM_I8:
        return MPI_INT8_T;
    case HCOMM_U8:
        return MPI_UINT8_T;
    case HCOMM_I32:
        return MPI_INT32_T;
    case HCOMM_I64:
        return MPI_INT64_T;
    default:
        return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(hcomm_op_t op) {
    switch (op) {
    case HCOMM_SUM:
        return MPI_SUM;
    case HCOMM_PROD:
        return MPI_PROD;
    case HCOMM_MAX:
        return MPI_MAX;
    case HCOMM_MIN:
        return MPI_MIN;
    default:
        return MPI_OP_NULL;
    }
}

static hcomm_result_t mpi_res(int rc) {
    return rc == MPI_SUCCESS ? HCOMM_OK : HCOMM_ERR_BACKEND;
}

#define RAW_CHECK(c)                                                                               \
    do {                                                                                           \
        if ((c)->bytes > INT_MAX ||                                                                \
            !bench_raw_supported((c)->dt, (c)->o->redop, (c)->op->reduces))                        \
            return HCOMM_ERR_UNSUPPORTED;                                                          \
    } while (0)

static const void *mpi_src(bench_case_t *c) {
    return c->inplace ? MPI_IN_PLACE : c->send;
}

static hcomm_result_t raw_all_reduce(bench_case_t *c) {
    RAW_CHECK(c);
    return mpi_res(MPI_Allreduce(mpi_src(c), c->recv, (int)c->count, mpi_type(c->dt),
                                 mpi_op(c->o->redop), MPI_COMM_WORLD));
}

static hcomm_result_t raw_dp(bench_case_t *c) {
    RAW_CHECK(c);
    int n = c->o->dp_buffers;
    for (int i = 0; i < n; i++) {
        size_t k = blk(c->count, n, i);
        if (k > 0)
            BENCH_TRY(
                mpi_res(MPI_Allreduce(MPI_IN_PLACE, at(c, c->recv, blk_off(c->count, n, i)), (int)k,
                                      mpi_type(c->dt), mpi_op(c->o->redop), MPI_COMM_WORLD)));
    }
    return HCOMM_OK;
}

static hcomm_result_t raw_reduce_scatter(bench_case_t *c) {
    RAW_CHECK(c);
    return mpi_res(MPI_Reduce_scatter_block(mpi_src(c), c->recv, (int)(c->count / (size_t)c->size),
                                            mpi_type(c->dt), mpi_op(c->o->redop), MPI_COMM_WORLD));
}

static int *int_array(const size_t *v, int n) {
    int *out = malloc(sizeof *out * (size_t)n);
    for (int i = 0; out && i < n; i++)
        out[i] = (int)v[i];
    return out;
}

static hcomm_result_t raw_reduce_scatterv(bench_case_t *c) {
    RAW_CHECK(c);
    v_counts(c, 1);
    int *counts = int_array(c->counts, c->size);
    if (!counts)
        return HCOMM_ERR_NOMEM;
    int rc = MPI_Reduce_scatter(mpi_src(c), c->recv, counts, mpi_type(c->dt), mpi_op(c->o->redop),
                                MPI_COMM_WORLD);
    free(counts);
    return mpi_res(rc);
}

static hcomm_result_t raw_reduce(bench_case_t *c) {
    RAW_CHECK(c);
    bool root = c->rank == c->o->root;
    const void *s = c->inplace ? (root ? MPI_IN_PLACE : c->recv) : c->send;
    return mpi_res(MPI_Reduce(s, root ? c->recv : NULL, (int)c->count, mpi_type(c->dt),
                              mpi_op(c->o->redop), c->o->root, MPI_COMM_WORLD));
}

static hcomm_result_t raw_all_gather(bench_case_t *c) {
    RAW_CHECK(c);
    int per = (int)(c->count / (size_t)c->size * c->es);
    return mpi_res(
        MPI_Allgather(mpi_src(c), per, MPI_BYTE, c->recv, per, MPI_BYTE, MPI_COMM_WORLD));
}

static hcomm_result_t raw_all_gatherv(bench_case_t *c) {
    RAW_CHECK(c);
    v_counts(c, c->es);
    int *counts = int_array(c->counts, c->size), *displs = int_array(c->displs, c->size);
    int rc = MPI_ERR_NO_MEM;
    if (counts && displs)
        rc = MPI_Allgatherv(mpi_src(c), counts[c->rank], MPI_BYTE, c->recv, counts, displs,
                            MPI_BYTE, MPI_COMM_WORLD);
    free(counts);
    free(displs);
    return mpi_res(rc);
}

static hcomm_result_t raw_gather(bench_case_t *c) {
    RAW_CHECK(c);
    bool root = c->rank == c->o->root;
    int per = (int)(c->count / (size_t)c->size * c->es);
    const void *s = c->inplace && root ? MPI_IN_PLACE : c->send;
    return mpi_res(
        MPI_Gather(s, per, MPI_BYTE, c->recv, per, MPI_BYTE, c->o->root, MPI_COMM_WORLD));
}

static hcomm_result_t raw_scatter(bench_case_t *c) {
    RAW_CHECK(c);
    bool root = c->rank == c->o->root;
    int per = (int)(c->count / (size_t)c->size * c->es);
    void *dst = c->inplace && root ? MPI_IN_PLACE : c->recv;
    return mpi_res(
        MPI_Scatter(c->send, per, MPI_BYTE, dst, per, MPI_BYTE, c->o->root, MPI_COMM_WORLD));
}

static hcomm_result_t raw_broadcast(bench_case_t *c) {
    RAW_CHECK(c);
    return mpi_res(MPI_Bcast(c->recv, (int)c->bytes, MPI_BYTE, c->o->root, MPI_COMM_WORLD));
}

static hcomm_result_t raw_a2a(bench_case_t *c) {
    RAW_CHECK(c);
    int n = c->size, rc = MPI_ERR_NO_MEM;
    int *sc = int_array(c->counts, n), *sd = int_array(c->displs, n),
        *rcn = int_array(c->rcounts, n), *rd = int_array(c->rdispls, n);
    if (sc && sd && rcn && rd)
        rc = MPI_Alltoallv(c->send, sc, sd, MPI_BYTE, c->recv, rcn, rd, MPI_BYTE, MPI_COMM_WORLD);
    free(sc);
    free(sd);
    free(rcn);
    free(rd);
    return mpi_res(rc);
}

static hcomm_result_t raw_pp(bench_case_t *c) {
    RAW_CHECK(c);
    if (c->size == 1)
        return HCOMM_OK;
    return mpi_res(MPI_Sendrecv(c->send, (int)c->bytes, MPI_BYTE, (c->rank + 1) % c->size, 1,
                                c->recv, (int)c->bytes, MPI_BYTE, (c->rank + c->size - 1) % c->size,
                                1, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
}
#define RAW(f) f
#else
#define RAW(f) NULL
#endif

bool bench_raw_supported(hcomm_dtype_t dt, hcomm_op_t op, bool reduces) {
#if defined(HCOMM_BENCH_MPI)
    return !reduces || (mpi_type(dt) != MPI_DATATYPE_NULL && mpi_op(op) != MPI_OP_NULL);
#else
    (void)dt, (void)op, (void)reduces;
    return false;
#endif
}

/* The moe_dispatch_combine op lives in moe.c, cp_ring and cp_a2a in cp.c. */
extern const bench_op_t bench_moe_op, bench_cp_ring_op, bench_cp_a2a_op;

static const bench_op_t ops[] = {
    {.name = "all_reduce",
     .coll = "allreduce",
     .busbw = f_allreduce,
     .reduces = true,
     .shape = shape_any,
     .capacity = cap_count,
     .fill = fill_all_reduce,
     .run = run_all_reduce,
     .wrong = wrong_all_reduce,
     .raw = RAW(raw_all_reduce)},
    {.name = "all_gather",
     .coll = "allgather",
     .busbw = f_gather,
     .shape = shape_multiple,
     .capacity = cap_count,
     .fill = fill_gather,
     .run = run_all_gather,
     .wrong = wrong_all_gather,
     .raw = RAW(raw_all_gather)},
    {.name = "reduce_scatter",
     .coll = "reducescatter",
     .busbw = f_gather,
     .reduces = true,
     .shape = shape_multiple,
     .capacity = cap_count,
     .fill = fill_reduce_scatter,
     .run = run_reduce_scatter,
     .wrong = wrong_reduce_scatter,
     .raw = RAW(raw_reduce_scatter)},
    {.name = "broadcast",
     .coll = "broadcast",
     .busbw = f_one,
     .inplace_only = true,
     .rooted = true,
     .shape = shape_any,
     .capacity = cap_count,
     .fill = fill_broadcast,
     .run = run_broadcast,
     .wrong = wrong_broadcast,
     .raw = RAW(raw_broadcast)},
    {.name = "reduce",
     .coll = "reduce",
     .busbw = f_one,
     .rooted = true,
     .reduces = true,
     .shape = shape_any,
     .capacity = cap_count,
     .fill = fill_all_reduce,
     .run = run_reduce,
     .wrong = wrong_reduce,
     .raw = RAW(raw_reduce)},
    {.name = "gather",
     .coll = "gather",
     .busbw = f_gather,
     .rooted = true,
     .shape = shape_multiple,
     .capacity = cap_count,
     .fill = fill_gather,
     .run = run_gather,
     .wrong = wrong_gather,
     .raw = RAW(raw_gather)},
    {.name = "scatter",
     .coll = "scatter",
     .busbw = f_gather,
     .rooted = true,
     .shape = shape_multiple,
     .capacity = cap_count,
     .fill = fill_scatter,
     .run = run_scatter,
     .wrong = wrong_scatter,
     .raw = RAW(raw_scatter)},
    {.name = "all_to_all",
     .coll = "alltoall|alltoallv",
     .busbw = f_gather,
     .no_inplace = true,
     .shape = shape_multiple,
     .capacity = cap_count,
     .fill = fill_a2a,
     .run = run_a2a,
     .wrong = wrong_a2a,
     .raw = RAW(raw_a2a)},
    {.name = "all_to_allv",
     .coll = "alltoall|alltoallv",
     .busbw = f_gather,
     .no_inplace = true,
     .shape = shape_any,
     .capacity = cap_count,
     .fill = fill_a2a,
     .run = run_a2a,
     .wrong = wrong_a2a,
     .raw = RAW(raw_a2a)},
    {.name = "all_gatherv",
     .coll = "allgatherv",
     .busbw = f_gather,
     .shape = shape_any,
     .capacity = cap_count,
     .fill = fill_gather,
     .run = run_all_gatherv,
     .wrong = wrong_all_gather,
     .raw = RAW(raw_all_gatherv)},
    {.name = "reduce_scatterv",
     .coll = "reducescatterv",
     .busbw = f_gather,
     .reduces = true,
     .shape = shape_any,
     .capacity = cap_count,
     .fill = fill_reduce_scatter,
     .run = run_reduce_scatterv,
     .wrong = wrong_reduce_scatter,
     .raw = RAW(raw_reduce_scatterv)},
    {.name = "tp_all_reduce",
     .primitive = true,
     .coll = "allreduce",
     .busbw = f_allreduce,
     .reduces = true,
     .shape = shape_any,
     .capacity = cap_count,
     .fill = fill_all_reduce,
     .run = run_tp_all_reduce,
     .wrong = wrong_all_reduce,
     .raw = RAW(raw_all_reduce)},
    {.name = "tp_all_gather",
     .primitive = true,
     .coll = "allgather",
     .busbw = f_gather,
     .no_inplace = true,
     .shape = shape_multiple,
     .capacity = cap_count,
     .fill = fill_gather,
     .run = run_tp_all_gather,
     .wrong = wrong_all_gather,
     .raw = RAW(raw_all_gather)},
    {.name = "tp_reduce_scatter",
     .primitive = true,
     .coll = "reducescatter",
     .busbw = f_gather,
     .reduces = true,
     .shape = shape_multiple,
     .capacity = cap_count,
     .fill = fill_reduce_scatter,
     .run = run_tp_reduce_scatter,
     .wrong = wrong_reduce_scatter,
     .raw = RAW(raw_reduce_scatter)},
    {.name = "pp_send_recv",
     .primitive = true,
     .coll = NULL,
     .busbw = f_one,
     .no_inplace = true,
     .shape = shape_any,
     .capacity = cap_count,
     .fill = fill_pp,
     .run = run_pp,
     .wrong = wrong_pp,
     .raw = RAW(raw_pp),
     .own_variant = "p2p",
     .variant = p2p_pp},
    {.name = "dp_all_reduce",
     .primitive = true,
     .sum_avg_only = true,
     .coll = "allreduce",
     .busbw = f_allreduce,
     .inplace_only = true,
     .reduces = true,
     .shape = shape_any,
     .capacity = cap_count,
     .fill = fill_all_reduce,
     .run = run_dp,
     .wrong = wrong_all_reduce,
     .raw = RAW(raw_dp)},
};

const bench_op_t *bench_ops(int *n) {
    static bench_op_t all[BENCH_MAX_OPS];
    static int count;
    if (count == 0) {
        for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
            all[count++] = ops[i];
        all[count++] = bench_moe_op;
        all[count++] = bench_cp_ring_op;
        all[count++] = bench_cp_a2a_op;
    }
    *n = count;
    return all;
}

int bench_op_find(const char *name) {
    int n;
    const bench_op_t *all = bench_ops(&n);
    for (int i = 0; i < n; i++)
        if (!strcmp(all[i].name, name))
            return i;
    return -1;
}
