/* Backend conformance, collectives: all_reduce, broadcast and all_gather through the public
 * API, reduce_scatter and all_to_allv through the algorithms layer, against a serial
 * reference, for world sizes 1..8 (local) or the MPI world (HCOMM_TEST_MPI).
 * Inputs are small integers chosen so that every dtype holds every partial result exactly:
 * any reduction order then gives bit-identical results. */
#include "algo/coll.h"
#include "harness.h"

#include <stdint.h>

static const size_t counts[] = {0, 1, 7, 1000};
enum { NCOUNTS = sizeof counts / sizeof counts[0] };
static const char *const op_names[HCOMM_OP_COUNT] = {"sum", "prod", "max", "min", "avg"};

/* --- test values and the serial reference --- */

/* Input element i of rank r. SUM/MAX/MIN/AVG: -2..2 (0..4 for u8), so 8 ranks sum to at most
 * 32 in magnitude. PROD: 1, -1 (signed) or 2, where 2 comes from at most 2 of any 8
 * consecutive ranks, so products stay within +-4. */
static int64_t input(hcomm_dtype_t dt, hcomm_op_t op, int r, size_t i) {
    if (op == HCOMM_PROD) {
        int p = (int)(((size_t)r * 3 + i) % 7);
        return p == 0 ? 2 : (p <= 2 && dt != HCOMM_U8) ? -1 : 1;
    }
    int k = (int)(((size_t)r * 7 + i * 3) % 5);
    return dt == HCOMM_U8 ? k : k - 2;
}

/* Element i reduced over ranks 0..n-1, before AVG's division. */
static int64_t reduced(hcomm_dtype_t dt, hcomm_op_t op, int n, size_t i) {
    int64_t acc = input(dt, op, 0, i);
    for (int r = 1; r < n; r++) {
        int64_t v = input(dt, op, r, i);
        acc = op == HCOMM_PROD  ? acc * v
              : op == HCOMM_MAX ? (v > acc ? v : acc)
              : op == HCOMM_MIN ? (v < acc ? v : acc)
                                : acc + v;
    }
    return acc;
}

/* Stores s / div as dtype dt, divided the way hcomm's AVG does: in the dtype's arithmetic
 * (f16/bf16 through f32, integers truncating toward zero). */
static void store(void *buf, size_t i, hcomm_dtype_t dt, int64_t s, int div) {
    float f = (float)s / (float)div;
    switch (dt) {
    case HCOMM_F32:
        ((float *)buf)[i] = f;
        break;
    case HCOMM_F64:
        ((double *)buf)[i] = (double)s / (double)div;
        break;
    case HCOMM_F16:
        ((uint16_t *)buf)[i] = hcomm__f32_to_f16(f);
        break;
    case HCOMM_BF16:
        ((uint16_t *)buf)[i] = hcomm__f32_to_bf16(f);
        break;
    case HCOMM_I8:
        ((int8_t *)buf)[i] = (int8_t)(s / div);
        break;
    case HCOMM_U8:
        ((uint8_t *)buf)[i] = (uint8_t)(s / div);
        break;
    case HCOMM_I32:
        ((int32_t *)buf)[i] = (int32_t)(s / div);
        break;
    case HCOMM_I64:
        ((int64_t *)buf)[i] = s / div;
        break;
    default:
        break;
    }
}

/* Fills buf[0..count-1] with this rank's inputs for elements first..first+count-1. */
static void fill_inputs(void *buf, hcomm_dtype_t dt, hcomm_op_t op, int r, size_t first,
                        size_t count) {
    for (size_t i = 0; i < count; i++)
        store(buf, i, dt, input(dt, op, r, first + i), 1);
}

/* Reference result for elements first..first+count-1 over n ranks. */
static void fill_expected(void *buf, hcomm_dtype_t dt, hcomm_op_t op, int n, size_t first,
                          size_t count) {
    for (size_t i = 0; i < count; i++)
        store(buf, i, dt, reduced(dt, op, n, first + i), op == HCOMM_AVG ? n : 1);
}

/* Bitwise comparison; reports the first differing element with both values. */
static void expect_equal(const void *got, const void *want, size_t count, hcomm_dtype_t dt,
                         const char *what, hcomm_op_t op, const hcomm_comm_t *c) {
    size_t es = hcomm__dtype_size(dt), i = 0;
    const char *dname = "?";
    hcomm_dtype_name(dt, &dname);
    while (i < count && memcmp((const char *)got + i * es, (const char *)want + i * es, es) == 0)
        i++;
    double g = i < count ? t_get_val(dt, got, i) : 0.0,
           w = i < count ? t_get_val(dt, want, i) : 0.0;
    T_CHECK(i == count, "%s %s %s count=%zu (world %d, rank %d): element %zu is %g, expected %g",
            what, dname, op_names[op], count, c->size, c->rank, i, g, w);
}

/* --- all_reduce --- */

static hcomm_result_t check_all_reduce(hcomm_comm_t *c, hcomm_dtype_t dt, hcomm_op_t op,
                                       size_t count, bool in_place) {
    size_t bytes = count * hcomm__dtype_size(dt);
    char *send = malloc(bytes + 1), *recv = malloc(bytes + 1), *want = malloc(bytes + 1);
    char *orig = malloc(bytes + 1);
    hcomm_result_t r = HCOMM_ERR_NOMEM;
    T_CHECK(send && recv && want && orig, "out of memory");
    if (send && recv && want && orig) {
        fill_inputs(send, dt, op, c->rank, 0, count);
        memcpy(orig, send, bytes);
        memset(recv, 0x5a, bytes);
        fill_expected(want, dt, op, c->size, 0, count);
        void *out = in_place ? send : recv;
        r = hcomm_all_reduce(c, send, out, count, dt, op);
        T_CHECK(r == HCOMM_OK, "all_reduce count=%zu: %s (%s)", count, hcomm_result_name(r),
                hcomm_last_error());
        if (r == HCOMM_OK) {
            expect_equal(out, want, count, dt, in_place ? "all_reduce in place" : "all_reduce", op,
                         c);
            if (!in_place)
                T_CHECK(memcmp(send, orig, bytes) == 0, "all_reduce changed its sendbuf");
        }
    }
    free(send);
    free(recv);
    free(want);
    free(orig);
    return r;
}

/* --- reduce_scatter: sendbuf holds size blocks of count; rank r gets block r reduced --- */

typedef enum { RS_OUT_OF_PLACE, RS_SAME_BUFFER, RS_OWN_BLOCK } rs_mode_t;

static hcomm_result_t check_reduce_scatter(hcomm_comm_t *c, hcomm_dtype_t dt, hcomm_op_t op,
                                           size_t count, rs_mode_t mode) {
    static const char *const what[] = {"reduce_scatter", "reduce_scatter (sendbuf == recvbuf)",
                                       "reduce_scatter (recvbuf = own block of sendbuf)"};
    size_t es = hcomm__dtype_size(dt), total = count * (size_t)c->size;
    char *send = malloc(total * es + 1), *recv = malloc(count * es + 1);
    char *want = malloc(count * es + 1);
    hcomm_result_t r = HCOMM_ERR_NOMEM;
    T_CHECK(send && recv && want, "out of memory");
    if (send && recv && want) {
        fill_inputs(send, dt, op, c->rank, 0, total);
        fill_expected(want, dt, op, c->size, count * (size_t)c->rank, count);
        void *out = mode == RS_OUT_OF_PLACE  ? recv
                    : mode == RS_SAME_BUFFER ? send
                                             : send + count * es * (size_t)c->rank;
        r = hcomm__coll_reduce_scatter(c, send, out, count, dt, op);
        T_CHECK(r == HCOMM_OK, "%s count=%zu: %s (%s)", what[mode], count, hcomm_result_name(r),
                hcomm_last_error());
        if (r == HCOMM_OK)
            expect_equal(out, want, count, dt, what[mode], op, c);
    }
    free(send);
    free(recv);
    free(want);
    return r;
}

static hcomm_result_t reductions(hcomm_comm_t *c) {
    for (int d = 0; d < HCOMM_DTYPE_COUNT; d++) {
        for (int o = 0; o < HCOMM_OP_COUNT; o++) {
            for (int k = 0; k < NCOUNTS; k++) {
                hcomm_dtype_t dt = (hcomm_dtype_t)d;
                hcomm_op_t op = (hcomm_op_t)o;
                HCOMM__TRY(check_all_reduce(c, dt, op, counts[k], false));
                HCOMM__TRY(check_all_reduce(c, dt, op, counts[k], true));
                for (int m = RS_OUT_OF_PLACE; m <= RS_OWN_BLOCK; m++)
                    HCOMM__TRY(check_reduce_scatter(c, dt, op, counts[k], (rs_mode_t)m));
            }
        }
    }
    return HCOMM_OK;
}

/* Integer SUM and PROD wrap around (two's complement) instead of saturating or trapping; the
 * wrapped result does not depend on the reduction order. */
static hcomm_result_t integer_wrap(hcomm_comm_t *c) {
    static const hcomm_dtype_t dts[] = {HCOMM_I8, HCOMM_U8, HCOMM_I32, HCOMM_I64};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        for (hcomm_op_t op = HCOMM_SUM; op <= HCOMM_PROD; op++) {
            hcomm_dtype_t dt = dts[d];
            size_t es = hcomm__dtype_size(dt);
            unsigned bits = (unsigned)es * 8;
            uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1, acc = op == HCOMM_PROD;
            uint64_t base = op == HCOMM_SUM ? mask / 2 - 2 : (mask / 4) | 3; /* near the top */
            int64_t mine = (int64_t)(base + (uint64_t)c->rank), got = 0, want = 0;
            for (int r = 0; r < c->size; r++)
                acc = op == HCOMM_SUM ? acc + base + (uint64_t)r : acc * (base + (uint64_t)r);
            acc &= mask;
            memcpy(&want, &acc, es); /* little-endian: the low bytes are the value */
            int64_t buf = mine;
            T_TRY(hcomm_all_reduce(c, &buf, &got, 1, dt, op));
            T_CHECK(memcmp(&got, &want, es) == 0,
                    "dtype %d %s wrap (world %d): got 0x%llx, expected 0x%llx", (int)dt,
                    op_names[op], c->size, (unsigned long long)got & mask,
                    (unsigned long long)want & mask);
        }
    }
    return HCOMM_OK;
}

/* --- broadcast and all_gather --- */

static unsigned char pattern(int r, size_t j) {
    return (unsigned char)(r * 31 + (int)(j % 251) * 7 + 1);
}

static hcomm_result_t check_broadcast(hcomm_comm_t *c, size_t bytes, int root) {
    unsigned char *buf = malloc(bytes + 1);
    T_CHECK(buf != NULL, "out of memory");
    if (!buf)
        return HCOMM_ERR_NOMEM;
    for (size_t j = 0; j < bytes; j++)
        buf[j] = pattern(c->rank, j);
    hcomm_result_t r = hcomm_broadcast(c, buf, bytes, root);
    T_CHECK(r == HCOMM_OK, "broadcast bytes=%zu root=%d: %s (%s)", bytes, root,
            hcomm_result_name(r), hcomm_last_error());
    size_t j = 0;
    while (r == HCOMM_OK && j < bytes && buf[j] == pattern(root, j))
        j++;
    T_CHECK(r != HCOMM_OK || j == bytes,
            "broadcast bytes=%zu root=%d (world %d, rank %d): byte %zu is %d, expected %d", bytes,
            root, c->size, c->rank, j, j < bytes ? buf[j] : 0, pattern(root, j));
    free(buf);
    return r;
}

static hcomm_result_t check_all_gather(hcomm_comm_t *c, size_t bytes, bool in_place) {
    size_t total = bytes * (size_t)c->size;
    unsigned char *send = malloc(bytes + 1), *recv = malloc(total + 1);
    hcomm_result_t r = HCOMM_ERR_NOMEM;
    T_CHECK(send && recv, "out of memory");
    if (send && recv) {
        memset(recv, 0xee, total);
        unsigned char *mine = in_place ? recv + bytes * (size_t)c->rank : send;
        for (size_t j = 0; j < bytes; j++)
            mine[j] = pattern(c->rank, j);
        r = hcomm_all_gather(c, mine, recv, bytes);
        T_CHECK(r == HCOMM_OK, "all_gather bytes=%zu: %s (%s)", bytes, hcomm_result_name(r),
                hcomm_last_error());
        size_t k = 0;
        while (r == HCOMM_OK && k < total && recv[k] == pattern((int)(k / bytes), k % bytes))
            k++;
        T_CHECK(r != HCOMM_OK || k == total,
                "all_gather%s bytes=%zu (world %d, rank %d): byte %zu of block %zu is wrong",
                in_place ? " in place" : "", bytes, c->size, c->rank, bytes ? k % bytes : 0,
                bytes ? k / bytes : 0);
    }
    free(send);
    free(recv);
    return r;
}

static hcomm_result_t byte_collectives(hcomm_comm_t *c) {
    for (int k = 0; k < NCOUNTS; k++) {
        for (int root = 0; root < c->size; root++)
            HCOMM__TRY(check_broadcast(c, counts[k], root));
        HCOMM__TRY(check_all_gather(c, counts[k], false));
        HCOMM__TRY(check_all_gather(c, counts[k], true));
    }
    return HCOMM_OK;
}

/* --- all_to_allv --- */

/* Bytes rank `from` sends to rank `to`: uneven, and zero for a quarter of the pairs. */
static size_t a2a_count(int from, int to) {
    return (size_t)((from + 2 * to) % 4) * 3 + (size_t)(from == to);
}

static unsigned char a2a_byte(int from, int to, size_t j) {
    return (unsigned char)(from * 17 + to * 5 + (int)j + 3);
}

/* Send blocks go in peer order with a 2-byte gap after each; receive blocks in reverse peer
 * order, packed: displacements must be honoured, and gaps stay untouched. */
static hcomm_result_t check_all_to_allv(hcomm_comm_t *c) {
    int n = c->size, me = c->rank;
    size_t *v = calloc((size_t)n * 4, sizeof *v);
    size_t *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n, soff = 0, roff = 0;
    for (int p = 0; v && p < n; p++) {
        sc[p] = a2a_count(me, p);
        sd[p] = soff;
        soff += sc[p] + 2;
    }
    for (int p = n - 1; v && p >= 0; p--) {
        rc[p] = a2a_count(p, me);
        rd[p] = roff;
        roff += rc[p];
    }
    unsigned char *send = malloc(soff + 1), *recv = malloc(roff + 1);
    hcomm_result_t r = HCOMM_ERR_NOMEM;
    T_CHECK(v && send && recv, "out of memory");
    if (v && send && recv) {
        memset(send, 0xcc, soff);
        memset(recv, 0xdd, roff);
        for (int p = 0; p < n; p++)
            for (size_t j = 0; j < sc[p]; j++)
                send[sd[p] + j] = a2a_byte(me, p, j);
        r = hcomm__coll_all_to_allv(c, send, sc, sd, recv, rc, rd, false);
        T_CHECK(r == HCOMM_OK, "all_to_allv: %s (%s)", hcomm_result_name(r), hcomm_last_error());
        for (int p = 0; r == HCOMM_OK && p < n; p++) {
            size_t j = 0;
            while (j < rc[p] && recv[rd[p] + j] == a2a_byte(p, me, j))
                j++;
            T_CHECK(j == rc[p], "all_to_allv (world %d, rank %d): byte %zu from rank %d is %d", n,
                    me, j, p, j < rc[p] ? recv[rd[p] + j] : 0);
        }
    }
    free(v);
    free(send);
    free(recv);
    return r;
}

/* Every count zero: nothing moves, NULL buffers are fine. */
static hcomm_result_t all_to_allv_empty(hcomm_comm_t *c) {
    size_t *zeros = calloc((size_t)c->size, sizeof *zeros);
    T_CHECK(zeros != NULL, "out of memory");
    if (!zeros)
        return HCOMM_ERR_NOMEM;
    hcomm_result_t r = hcomm__coll_all_to_allv(c, NULL, zeros, zeros, NULL, zeros, zeros, false);
    T_CHECK(r == HCOMM_OK, "empty all_to_allv: %s (%s)", hcomm_result_name(r), hcomm_last_error());
    free(zeros);
    return r;
}

/* --- ranks that disagree: HCOMM_ERR_MISMATCH, and the comm stays usable --- */

static void expect_mismatch(hcomm_result_t r, const char *what, const hcomm_comm_t *c) {
    T_CHECK(r == HCOMM_ERR_MISMATCH, "%s (world %d, rank %d) returned %s, expected MISMATCH (%s)",
            what, c->size, c->rank, hcomm_result_name(r), hcomm_last_error());
    T_CHECK(r == HCOMM_OK || strstr(hcomm_last_error(), "rank") != NULL,
            "%s: the message names no rank: '%s'", what, hcomm_last_error());
}

/* Send blocks of 3 bytes at 8-byte strides; receive blocks likewise. */
static void a2a_layout(int n, size_t *sc, size_t *sd, size_t *rc, size_t *rd) {
    for (int p = 0; p < n; p++) {
        sc[p] = rc[p] = 3;
        sd[p] = rd[p] = 8 * (size_t)p;
    }
}

/* Calls all_to_allv with this rank's counts; every rank fails with MISMATCH (both backends
 * check all counts first), nothing reaches recvbuf, and the message has want in it. */
static void a2a_expect_mismatch(hcomm_comm_t *c, const size_t *v, const char *want,
                                const char *what) {
    int n = c->size;
    unsigned char send[8 * 8 + 8], recv[8 * 8 + 8];
    memset(send, 0x11, sizeof send);
    memset(recv, 0xdd, sizeof recv);
    hcomm_result_t r =
        hcomm__coll_all_to_allv(c, send, v, v + n, recv, v + 2 * n, v + 3 * n, false);
    expect_mismatch(r, what, c);
    T_CHECK(r == HCOMM_OK || strstr(hcomm_last_error(), want) != NULL,
            "%s (world %d, rank %d): '%s' lacks '%s'", what, n, c->rank, hcomm_last_error(), want);
    size_t k = 0;
    while (k < sizeof recv && recv[k] == 0xdd)
        k++;
    T_CHECK(k == sizeof recv, "%s (rank %d): recvbuf byte %zu was written", what, c->rank, k);
}

/* Every rank sends one byte more to the next rank than it expects; then only the last rank
 * sends one byte less to rank 0 than rank 0 expects, which must not pass as a short message. */
static hcomm_result_t all_to_allv_mismatch(hcomm_comm_t *c) {
    int n = c->size, last = n - 1;
    if (n > 8)
        return HCOMM_OK;
    size_t v[4 * 8], *sc = v, *rc = v + 2 * n;
    char want[96];
    a2a_layout(n, sc, v + n, rc, v + 3 * n);
    sc[(c->rank + 1) % n] = 4;
    snprintf(want, sizeof want, "sendcounts[0]=4 on rank %d but recvcounts[%d]=3 on rank 0", n - 1,
             n - 1);
    a2a_expect_mismatch(c, v, want, "all_to_allv, every rank sends 4 of 3 bytes");
    a2a_layout(n, sc, v + n, rc, v + 3 * n);
    if (c->rank == last)
        sc[0] = 2;
    snprintf(want, sizeof want, "sendcounts[0]=2 on rank %d but recvcounts[%d]=3 on rank 0", last,
             last);
    a2a_expect_mismatch(c, v, want, "all_to_allv, one rank sends 2 of 3 bytes");
    return check_all_to_allv(c);
}

/* One rank (the last) passes a different argument, or calls another collective. */
static hcomm_result_t disagreeing_args(hcomm_comm_t *c) {
    if (c->size < 2)
        return HCOMM_OK; /* one rank cannot disagree with itself */
    bool odd = c->rank == c->size - 1;
    float in[256], out[256];
    for (int i = 0; i < 256; i++)
        in[i] = 1.0f, out[i] = -7.0f;
    expect_mismatch(hcomm_all_reduce(c, in, out, odd ? 5 : 4, HCOMM_F32, HCOMM_SUM),
                    "all_reduce, count 5 on one rank and 4 on the others", c);
    T_CHECK(out[0] == -7.0f && out[4] == -7.0f, "a failed all_reduce wrote its recvbuf");
    expect_mismatch(hcomm_all_reduce(c, in, out, 4, odd ? HCOMM_I32 : HCOMM_F32, HCOMM_SUM),
                    "all_reduce, i32 on one rank and f32 on the others", c);
    expect_mismatch(hcomm_all_reduce(c, in, out, 4, HCOMM_F32, odd ? HCOMM_MAX : HCOMM_SUM),
                    "all_reduce, max on one rank and sum on the others", c);
    expect_mismatch(hcomm__coll_reduce_scatter(c, in, out, odd ? 2 : 1, HCOMM_F32, HCOMM_SUM),
                    "reduce_scatter, count 2 on one rank and 1 on the others", c);
    expect_mismatch(hcomm_all_gather(c, in, out, odd ? 8 : 4),
                    "all_gather, 8 bytes on one rank and 4 on the others", c);
    expect_mismatch(hcomm_broadcast(c, in, odd ? 8 : 4, 0),
                    "broadcast, 8 bytes on one rank and 4 on the others", c);
    expect_mismatch(hcomm_broadcast(c, in, 4, odd ? 1 : 0),
                    "broadcast, root 1 on one rank and 0 on the others", c);
    expect_mismatch(odd ? hcomm_broadcast(c, in, 16, 0)
                        : hcomm_all_reduce(c, in, out, 4, HCOMM_F32, HCOMM_SUM),
                    "broadcast on one rank, all_reduce on the others", c);
    expect_mismatch(odd ? hcomm_barrier(c) : hcomm_all_gather(c, in, out, 4),
                    "barrier on one rank, all_gather on the others", c);
    /* all_gather's rd runs over p2p, not on the lane where barriers meet: it agrees first */
    T_TRY(hcomm_comm_set_algo(c, "allgather:rd"));
    expect_mismatch(odd ? hcomm_barrier(c) : hcomm_all_gather(c, in, out, 4),
                    "barrier on one rank, all_gather (rd) on the others", c);
    T_TRY(hcomm_comm_set_algo(c, NULL));
    T_CHECK(out[0] == -7.0f, "a failed collective wrote its recvbuf");
    /* Nothing was left half done: the next collective gives the right answer. */
    int32_t one = 1, sum = 0;
    T_TRY(hcomm_all_reduce(c, &one, &sum, 1, HCOMM_I32, HCOMM_SUM));
    T_EQ_INT(sum, c->size);
    return HCOMM_OK;
}

/* --- argument errors (checked locally: no rank communicates) --- */

static void error_paths(hcomm_comm_t *c) {
    float buf[4] = {0};
    T_ERR(hcomm_all_reduce(NULL, buf, buf, 4, HCOMM_F32, HCOMM_SUM), HCOMM_ERR_NULL);
    T_ERR(hcomm_all_reduce(c, NULL, buf, 4, HCOMM_F32, HCOMM_SUM), HCOMM_ERR_NULL);
    T_CHECK(strstr(hcomm_last_error(), "sendbuf") != NULL, "got '%s'", hcomm_last_error());
    T_ERR(hcomm_all_reduce(c, buf, NULL, 4, HCOMM_F32, HCOMM_SUM), HCOMM_ERR_NULL);
    T_CHECK(strstr(hcomm_last_error(), "recvbuf") != NULL, "got '%s'", hcomm_last_error());
    T_ERR(hcomm_all_reduce(c, buf, buf, 4, (hcomm_dtype_t)99, HCOMM_SUM), HCOMM_ERR_DTYPE);
    T_CHECK(strstr(hcomm_last_error(), "99") != NULL, "got '%s'", hcomm_last_error());
    T_ERR(hcomm_all_reduce(c, buf, buf, 4, (hcomm_dtype_t)-1, HCOMM_SUM), HCOMM_ERR_DTYPE);
    T_ERR(hcomm_all_reduce(c, buf, buf, 4, HCOMM_F32, (hcomm_op_t)77), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), "77") != NULL, "got '%s'", hcomm_last_error());
    T_ERR(hcomm_all_reduce(c, buf, buf, 4, HCOMM_F32, HCOMM_OP_COUNT), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_broadcast(NULL, buf, 4, 0), HCOMM_ERR_NULL);
    T_ERR(hcomm_broadcast(c, NULL, 4, 0), HCOMM_ERR_NULL);
    T_ERR(hcomm_broadcast(c, buf, 4, -1), HCOMM_ERR_INVALID_ARG);
    T_CHECK(strstr(hcomm_last_error(), "root=-1") != NULL, "got '%s'", hcomm_last_error());
    T_ERR(hcomm_broadcast(c, buf, 4, c->size), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_all_gather(NULL, buf, buf, 4), HCOMM_ERR_NULL);
    T_ERR(hcomm_all_gather(c, NULL, buf, 4), HCOMM_ERR_NULL);
    T_ERR(hcomm_all_gather(c, buf, NULL, 4), HCOMM_ERR_NULL);
    T_ERR(hcomm_barrier(NULL), HCOMM_ERR_NULL);
    /* Zero elements need no buffers. */
    T_OK(hcomm_all_reduce(c, NULL, NULL, 0, HCOMM_F32, HCOMM_SUM));
    T_OK(hcomm_broadcast(c, NULL, 0, 0));
    T_OK(hcomm_all_gather(c, NULL, NULL, 0));
}

static hcomm_result_t rank_main(hcomm_comm_t *c, void *arg) {
    (void)arg;
    error_paths(c);
    /* The failed calls left no state behind: a collective still works. */
    int32_t one = 1, n = 0;
    T_TRY(hcomm_all_reduce(c, &one, &n, 1, HCOMM_I32, HCOMM_SUM));
    T_EQ_INT(n, c->size);
    HCOMM__TRY(reductions(c));
    HCOMM__TRY(integer_wrap(c));
    HCOMM__TRY(byte_collectives(c));
    HCOMM__TRY(check_all_to_allv(c));
    HCOMM__TRY(all_to_allv_empty(c));
    HCOMM__TRY(all_to_allv_mismatch(c));
    HCOMM__TRY(disagreeing_args(c));
    T_TRY(hcomm_barrier(c));
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(rank_main, NULL, 8);
    return t_finish("test_coll");
}
