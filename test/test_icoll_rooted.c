/* Nonblocking broadcast, reduce and all_to_allv: several in flight with the blocking calls'
 * results against a serial reference (every root, zero sizes, uneven all_to_allv blocks), a
 * bad root on one rank failing its peers' request with HCOMM_ERR_PEER, and the count arrays
 * reusable at once after issue. HCOMM_TEST_MPI */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

enum { COUNT = 1001 };

static int64_t value(int rank, int k) {
    return (int64_t)rank * 1000 + k % 97;
}

/* Rank r sends (r + p) % 3 * 8 bytes to rank p (some blocks empty). */
static size_t block(int from, int to) {
    return (size_t)((from + to) % 3) * 8;
}

static hcomm_result_t check_a2av(hcomm_comm_t *w, hcomm_request_t **q, unsigned char **bufs) {
    int p = t_size(w), r = t_rank(w);
    size_t *k = calloc(4 * (size_t)p, sizeof(size_t)), sent = 0, got = 0;
    for (int s = 0; s < p; s++) {
        k[s] = block(r, s), k[p + s] = sent, sent += k[s];
        k[2 * p + s] = block(s, r), k[3 * p + s] = got, got += k[2 * p + s];
    }
    bufs[0] = malloc(sent + 1), bufs[1] = malloc(got + 1);
    for (size_t i = 0; i < sent; i++)
        bufs[0][i] = (unsigned char)(r * 31 + i);
    hcomm_result_t res = hcomm_iall_to_allv(w, bufs[0], k, k + p, bufs[1], k + 2 * p, k + 3 * p, q);
    memset(k, 0xff, 4 * (size_t)p * sizeof(size_t)); /* copied at issue: reusable at once */
    free(k);
    return res;
}

static long a2av_bad(hcomm_comm_t *w, const unsigned char *out) {
    int p = t_size(w), r = t_rank(w);
    long bad = 0;
    size_t at = 0;
    for (int s = 0; s < p; s++) {
        size_t off = 0; /* where rank s's block for r starts in s's send buffer */
        for (int d = 0; d < r; d++)
            off += block(s, d);
        for (size_t i = 0; i < block(s, r); i++)
            bad += out[at + i] != (unsigned char)(s * 31 + off + i);
        at += block(s, r);
    }
    return bad;
}

static hcomm_result_t in_flight(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int p = t_size(w), r = t_rank(w);
    int64_t *b = malloc(sizeof(int64_t) * COUNT * (size_t)p), *in = malloc(sizeof(int64_t) * COUNT);
    int64_t *red = malloc(sizeof(int64_t) * COUNT * (size_t)p), empty = 0;
    hcomm_request_t *q[64];
    int nq = 0;
    for (int root = 0; root < p; root++) {
        for (int k = 0; k < COUNT; k++)
            b[root * COUNT + k] = r == root ? value(r, k) : -1;
        T_TRY(hcomm_ibroadcast(w, b + root * COUNT, COUNT * sizeof(int64_t), root, &q[nq++]));
    }
    for (int k = 0; k < COUNT; k++)
        in[k] = value(r, k);
    for (int root = 0; root < p; root++)
        T_TRY(
            hcomm_ireduce(w, in, red + root * COUNT, COUNT, HCOMM_I64, HCOMM_SUM, root, &q[nq++]));
    T_TRY(hcomm_ibroadcast(w, &empty, 0, p - 1, &q[nq++])); /* zero bytes */
    unsigned char *bufs[2];
    T_TRY(check_a2av(w, &q[nq++], bufs));
    for (int i = nq - 1; i >= 0; i--) /* completed out of issue order */
        T_TRY(hcomm_wait(q[i]));
    long bad = 0;
    for (int root = 0; root < p; root++)
        for (int k = 0; k < COUNT; k++) {
            int64_t sum = 0;
            for (int s = 0; s < p; s++)
                sum += value(s, k);
            bad += b[root * COUNT + k] != value(root, k);
            bad += r == root && red[root * COUNT + k] != sum;
        }
    T_CHECK(bad == 0, "%ld wrong elements of ibroadcast/ireduce", bad);
    bad = a2av_bad(w, bufs[1]);
    T_CHECK(bad == 0, "%ld wrong bytes of iall_to_allv", bad);
    free(bufs[0]), free(bufs[1]), free(b), free(in), free(red);
    return HCOMM_OK;
}

/* The last rank names a root outside the group: its request fails with INVALID_ARG, its
 * peers' with PEER, and the next call works everywhere. */
static hcomm_result_t bad_root(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int p = t_size(w), r = t_rank(w);
    if (p < 2)
        return HCOMM_OK;
    int64_t v = r;
    hcomm_request_t *q = NULL;
    T_TRY(hcomm_ibroadcast(w, &v, sizeof v, r == p - 1 ? p : 0, &q));
    T_ERR(hcomm_wait(q), r == p - 1 ? HCOMM_ERR_INVALID_ARG : HCOMM_ERR_PEER);
    T_TRY(hcomm_ibroadcast(w, &v, sizeof v, 1, &q));
    T_TRY(hcomm_wait(q));
    T_EQ_INT((int)v, 1);
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(in_flight, NULL, 8);
    t_for_each_world(bad_root, NULL, 4);
    return t_finish("test_icoll_rooted");
}
