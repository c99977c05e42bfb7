/* Edge cases found by review: AVG over groups larger than the dtype's range, zero-sized
 * collectives that must still be matched by peers, and element counts that overflow. */
#include "harness.h"

/* u8 and i8 AVG over 256 ranks: the group size does not fit the dtype. */
static hcomm_result_t avg_wide_group(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int rank, size;
    hcomm_comm_rank(world, &rank);
    hcomm_comm_size(world, &size);
    uint8_t u = rank == 0 ? 255 : 1, uavg = 0;
    int8_t s = rank == 0 ? 100 : 0, savg = 1;
    T_OK(hcomm_all_reduce(world, &u, &uavg, 1, HCOMM_U8, HCOMM_AVG));
    T_OK(hcomm_all_reduce(world, &s, &savg, 1, HCOMM_I8, HCOMM_AVG));
    /* The u8 sum wraps: (255 + 255 * 1) mod 256 = 254, and 254 / 256 = 0. */
    T_EQ_INT(uavg, (uint8_t)(255 + (size - 1)) / size);
    T_EQ_INT(savg, 100 / size);
    return HCOMM_OK;
}

/* Rank 0 reduces nothing while its peers reduce 4 elements: everyone must fail together,
 * and the next matched call must work. */
static hcomm_result_t zero_count_mismatch(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int rank, size;
    hcomm_comm_rank(world, &rank);
    hcomm_comm_size(world, &size);
    float v[4] = {1, 2, 3, 4}, out[4] = {0};
    hcomm_result_t r = hcomm_all_reduce(world, v, out, rank == 0 ? 0 : 4, HCOMM_F32, HCOMM_SUM);
    if (size > 1)
        T_EQ_INT(r, HCOMM_ERR_MISMATCH);
    T_OK(hcomm_all_reduce(world, v, out, 4, HCOMM_F32, HCOMM_SUM));
    T_CHECK(out[1] == 2.0f * (float)size, "sum %g with %d ranks", out[1], size);
    /* Zero-sized calls on every rank are fine, with NULL buffers too. */
    T_OK(hcomm_all_reduce(world, NULL, NULL, 0, HCOMM_F32, HCOMM_SUM));
    T_OK(hcomm_all_gather(world, NULL, NULL, 0));
    T_OK(hcomm_broadcast(world, NULL, 0, 0));
    return HCOMM_OK;
}

/* The public reduce_scatter and all_to_allv against a serial reference, and their bad input. */
static hcomm_result_t public_rs_and_a2a(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int rank, n;
    hcomm_comm_rank(world, &rank);
    hcomm_comm_size(world, &n);
    enum { PER = 3 };
    int32_t send[8 * PER], recv[PER];
    for (int i = 0; i < n * PER; i++)
        send[i] = rank * 100 + i;
    T_OK(hcomm_reduce_scatter(world, send, recv, PER, HCOMM_I32, HCOMM_SUM));
    for (int j = 0; j < PER; j++) /* sum over ranks r of r*100 + rank*PER + j */
        T_EQ_INT(recv[j], 100 * n * (n - 1) / 2 + n * (rank * PER + j));
    T_ERR(hcomm_reduce_scatter(world, send, NULL, PER, HCOMM_I32, HCOMM_SUM), HCOMM_ERR_NULL);
    T_ERR(hcomm_reduce_scatter(world, send, recv, PER, (hcomm_dtype_t)99, HCOMM_SUM),
          HCOMM_ERR_DTYPE);
    T_ERR(hcomm_reduce_scatter(world, send, recv, PER, HCOMM_I32, (hcomm_op_t)-1),
          HCOMM_ERR_INVALID_ARG);

    /* all_to_allv: rank r sends p+1 bytes, all equal to r, to each peer p. */
    unsigned char out[64], in[64];
    size_t sc[8], sd[8], rc[8], rd[8], off = 0, roff = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = (size_t)p + 1, sd[p] = off, off += sc[p];
        rc[p] = (size_t)rank + 1, rd[p] = roff, roff += rc[p];
    }
    memset(out, rank, off);
    memset(in, 0xee, sizeof in);
    T_OK(hcomm_all_to_allv(world, out, sc, sd, in, rc, rd));
    for (int p = 0; p < n; p++)
        for (size_t k = 0; k < rc[p]; k++)
            T_EQ_INT(in[rd[p] + k], p);
    T_ERR(hcomm_all_to_allv(world, out, NULL, sd, in, rc, rd), HCOMM_ERR_NULL);
    T_ERR(hcomm_all_to_allv(NULL, out, sc, sd, in, rc, rd), HCOMM_ERR_NULL);
    return HCOMM_OK;
}

static void expect_text(const char *want) {
    T_CHECK(strstr(hcomm_last_error(), want) != NULL, "last error '%s' lacks '%s'",
            hcomm_last_error(), want);
}

/* Sizes no buffer can have are refused as such before any pointer arithmetic (one rank or
 * many), and an empty block's displacement is never looked at. */
static hcomm_result_t huge_sizes(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int rank = t_rank(world), n = t_size(world);
    unsigned char a[64] = {0}, b[64] = {0};
    T_ERR(hcomm_all_gather(world, a, b, SIZE_MAX), HCOMM_ERR_INVALID_ARG);
    expect_text("hcomm_all_gather: bytes=18446744073709551615");
    expect_text("larger than any buffer");
    size_t huge = ((size_t)1 << 62) + 3;
    T_ERR(hcomm_all_gather(world, a, b, huge), HCOMM_ERR_INVALID_ARG);
    expect_text("larger than any buffer");
    T_ERR(hcomm_broadcast(world, a, huge, 0), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_all_reduce(world, a, b, huge, HCOMM_U8, HCOMM_SUM), HCOMM_ERR_INVALID_ARG);
    size_t sc[8], sd[8], rc[8], rd[8];
    for (int p = 0; p < n; p++) /* one byte to each peer; nothing from peer 0 at a wild offset */
        sc[p] = 1, sd[p] = (size_t)p, rc[p] = 1, rd[p] = (size_t)p;
    sd[0] = huge;
    T_ERR(hcomm_all_to_allv(world, a, sc, sd, b, rc, rd), HCOMM_ERR_INVALID_ARG);
    expect_text("sendcounts[0]=1 + sdispls[0]=4611686018427387907 is beyond any buffer");
    for (int p = 0; p < n; p++) { /* rank 0's blocks empty, at displacements no buffer has */
        a[p] = (unsigned char)(rank * 16 + p);
        if (p == 0 || rank == 0)
            sc[p] = rc[p] = 0, sd[p] = rd[p] = huge;
    }
    T_OK(hcomm_all_to_allv(world, a, sc, sd, b, rc, rd));
    for (int p = 1; p < n && rank > 0; p++)
        T_EQ_INT(b[p], p * 16 + rank);
    return hcomm_barrier(world);
}

/* Sizes between 2^47 (the bound) and the bound of old, 2^56, with a 64-byte buffer: accepted
 * then, a broadcast's chain received segments past the buffer and a nonblocking bf16 AVG
 * all_reduce's twoshot read past it on mpi (fuzz corpus mpi-*-2p48). Refused on every rank,
 * blocking or not, and the next call works. */
static hcomm_result_t sizes_past_2p47(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int n = t_size(world);
    _Alignas(16) unsigned char a[64] = {0};
    size_t p48 = (size_t)1 << 48, bf16_past = ((size_t)1 << 46) + 1; /* 2^47 + 2 bytes */
    T_ERR(hcomm_broadcast(world, a, p48, n - 1), HCOMM_ERR_INVALID_ARG);
    expect_text("hcomm_broadcast: bytes=281474976710656 is larger than any buffer");
    T_ERR(hcomm_all_reduce(world, a, a, bf16_past, HCOMM_BF16, HCOMM_AVG), HCOMM_ERR_INVALID_ARG);
    expect_text("hcomm_all_reduce: count=70368744177665");
    hcomm_request_t *req = NULL;
    hcomm_result_t r = hcomm_iall_reduce(world, a, a, p48, HCOMM_BF16, HCOMM_AVG, &req);
    T_ERR(r == HCOMM_OK ? hcomm_wait(req) : r, HCOMM_ERR_INVALID_ARG);
    expect_text("hcomm_iall_reduce: count=281474976710656");
    r = hcomm_ireduce_scatter(world, a, a, p48, HCOMM_F32, HCOMM_SUM, &req);
    T_ERR(r == HCOMM_OK ? hcomm_wait(req) : r, HCOMM_ERR_INVALID_ARG);
    memset(a, 1, sizeof a);
    T_OK(hcomm_broadcast(world, a, sizeof a, 0));
    T_OK(hcomm_all_reduce(world, a, a, sizeof a, HCOMM_U8, HCOMM_SUM));
    T_EQ_INT(a[63], n);
    return hcomm_barrier(world);
}

/* A buffer not aligned to its dtype's element size is refused, never read with misaligned
 * loads; u8 has no alignment. */
static hcomm_result_t misaligned(hcomm_comm_t *world, void *arg) {
    (void)arg;
    int n = t_size(world);
    double a[16] = {0}, b[16] = {0};
    char *odd = (char *)a + 1;
    T_ERR(hcomm_all_reduce(world, odd, b, 4, HCOMM_F32, HCOMM_SUM), HCOMM_ERR_INVALID_ARG);
    expect_text("hcomm_all_reduce: sendbuf=");
    expect_text("not aligned to f32's 4-byte elements");
    T_ERR(hcomm_reduce_scatter(world, a, (char *)b + 2, 1, HCOMM_F64, HCOMM_MAX),
          HCOMM_ERR_INVALID_ARG);
    expect_text("recvbuf=");
    size_t counts[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    T_ERR(hcomm_reduce_scatterv(world, odd, odd, counts, HCOMM_F32, HCOMM_SUM),
          HCOMM_ERR_INVALID_ARG);
    expect_text("hcomm_reduce_scatterv: sendbuf=");
    memset(a, 1, sizeof a);
    T_OK(hcomm_all_reduce(world, odd, (char *)b + 3, 5, HCOMM_U8, HCOMM_SUM));
    T_EQ_INT(((unsigned char *)b)[3], n);
    hcomm_tensor_t t;
    int64_t len = 2;
    hcomm_tensor_init(&t, (char *)a + 2, HCOMM_F32, 1, &len);
    T_ERR(hcomm_dp_all_reduce_grads(world, &t, 1, HCOMM_SUM, 0), HCOMM_ERR_INVALID_ARG);
    expect_text("grads[0]->data=");
    return hcomm_barrier(world);
}

static void test_numel_overflow(void) {
    hcomm_tensor_t t;
    int64_t shape[2] = {INT64_C(1) << 32, INT64_C(1) << 32};
    T_OK(hcomm_tensor_init(&t, NULL, HCOMM_F32, 2, shape));
    size_t n = 0;
    T_ERR(hcomm_tensor_numel(&t, &n), HCOMM_ERR_SHAPE);
    T_CHECK(strstr(hcomm_last_error(), "overflows") != NULL, "got '%s'", hcomm_last_error());
    shape[0] = 0; /* a zero extent makes any other extent harmless */
    T_OK(hcomm_tensor_init(&t, NULL, HCOMM_F32, 2, shape));
    T_OK(hcomm_tensor_numel(&t, &n));
    T_EQ_INT(n, 0);
}

int main(void) {
    test_numel_overflow();
    if (strcmp(t_backend(), "local") == 0)
        T_OK(hcomm_launch("local", 256, avg_wide_group, NULL));
    t_for_each_world(zero_count_mismatch, NULL, 8);
    t_for_each_world(public_rs_and_a2a, NULL, 8);
    t_for_each_world(huge_sizes, NULL, 8);
    t_for_each_world(sizes_past_2p47, NULL, 8);
    t_for_each_world(misaligned, NULL, 8);
    return t_finish("test_edge");
}
/* HCOMM_TEST_MPI */
