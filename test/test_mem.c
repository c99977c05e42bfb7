/* hcomm_mem_alloc: buffers that work with every call, shared-memory backed (peers on a node map
 * them and load from them directly), freed once; a pointer that did not come from it is refused.
 * The one-node algorithms that read peers' buffers (twoshot, direct) must give the same results
 * whether a peer's buffer is mapped, read with cross-memory attach, or a mix of both across the
 * ranks. HCOMM_TEST_MPI */
#include "harness.h"
#include "core/internal.h"
#include "transport/transport.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static hcomm_result_t check_registry(void) {
    double *buf = NULL;
    size_t n = 1000;
    T_TRY(hcomm_mem_alloc(n * sizeof *buf, (void **)&buf));
    T_CHECK(((uintptr_t)buf & 4095) == 0, "hcomm_mem_alloc memory is not page-aligned");
    uint32_t id = 0;
    uint64_t off = 0;
    T_CHECK(hcomm__mem_shared(buf + 10, 8, &id, &off) && off == 10 * sizeof *buf && id != 0,
            "a buffer from hcomm_mem_alloc is not a shared object");
    T_CHECK(!hcomm__mem_shared(buf + 10, n * sizeof *buf, &id, &off),
            "a range past the end of its buffer counts as shared");
    T_CHECK(!hcomm__mem_shared(&n, 1, &id, &off), "a stack variable counts as shared memory");
    for (size_t i = 0; i < n; i++)
        buf[i] = (double)i;
    hcomm__mem_shared(buf, n * sizeof *buf, &id, &off);
    const double *view = hcomm__shm_view((int)getpid(), id, 8 * sizeof *buf, 8);
    T_CHECK(view && view != buf + 8 && *view == 8.0, "a view of the object does not show its data");
    T_CHECK(!hcomm__shm_view((int)getpid(), id, 0, n * sizeof *buf + 1),
            "a view past the object's end was granted");
    T_CHECK(!hcomm__shm_view((int)getpid(), 0, 0, 8), "object id 0 has a view");
    T_TRY(hcomm_mem_free(buf));
    return HCOMM_OK;
}

/* A buffer of bytes: from hcomm_mem_alloc when shared, else malloc. */
static void *alloc(size_t bytes, bool shared) {
    void *p = NULL;
    if (shared)
        return hcomm_mem_alloc(bytes ? bytes : 1, &p) == HCOMM_OK ? p : NULL;
    return malloc(bytes ? bytes : 1);
}

static void release(void *p, bool shared) {
    if (shared)
        hcomm_mem_free(p);
    else
        free(p);
}

/* all_reduce, all_gather, reduce_scatter, reduce, broadcast and all_to_all on buffers of one kind
 * on this rank (shared or not), checked element by element. */
static hcomm_result_t run_ops(hcomm_comm_t *w, bool shared, size_t n) {
    int p = t_size(w), r = t_rank(w);
    size_t total = n * (size_t)p;
    double *in = alloc(total * sizeof *in, shared), *out = alloc(total * sizeof *out, shared);
    T_CHECK(in && out, "out of memory");
    long bad = 0;
    for (size_t i = 0; i < total; i++)
        in[i] = (double)(r * 7 + (int)(i % 13));
    T_TRY(hcomm_all_reduce(w, in, out, total, HCOMM_F64, HCOMM_SUM));
    for (size_t i = 0; i < total; i++)
        bad += out[i] != (double)(p * (int)(i % 13)) + 7.0 * p * (p - 1) / 2;
    T_TRY(hcomm_all_gather(w, in, out, n * sizeof *in));
    for (size_t i = 0; i < total; i++)
        bad += out[i] != (double)((int)(i / n) * 7 + (int)(i % n % 13));
    T_TRY(hcomm_reduce_scatter(w, in, out, n, HCOMM_F64, HCOMM_SUM));
    for (size_t i = 0; i < n; i++)
        bad += out[i] != (double)(p * (int)(((size_t)r * n + i) % 13)) + 7.0 * p * (p - 1) / 2;
    memcpy(out, in, total * sizeof *in); /* reduce in place on the root */
    T_TRY(hcomm_reduce(w, r == p - 1 ? out : in, out, total, HCOMM_F64, HCOMM_SUM, p - 1));
    for (size_t i = 0; i < total && r == p - 1; i++)
        bad += out[i] != (double)(p * (int)(i % 13)) + 7.0 * p * (p - 1) / 2;
    memcpy(out, in, total * sizeof *in);
    T_TRY(hcomm_broadcast(w, out, total * sizeof *out, p - 1));
    for (size_t i = 0; i < total; i++)
        bad += out[i] != (double)((p - 1) * 7 + (int)(i % 13));
    size_t *cnt = malloc(2 * (size_t)p * sizeof *cnt);
    T_CHECK(cnt, "out of memory");
    for (int q = 0; q < p; q++) {
        cnt[q] = n * sizeof *in;
        cnt[p + q] = (size_t)q * n * sizeof *in;
    }
    T_TRY(hcomm_all_to_allv(w, in, cnt, cnt + p, out, cnt, cnt + p));
    free(cnt);
    for (size_t i = 0; i < total; i++) /* block q of out: rank q's block r */
        bad += out[i] != (double)((int)(i / n) * 7 + (int)(((size_t)r * n + i % n) % 13));
    release(in, shared);
    release(out, shared);
    T_CHECK(bad == 0, "%ld wrong elements (%s buffers, n=%zu)", bad, shared ? "shared" : "private",
            n);
    return HCOMM_OK;
}

/* bf16 all_reduce (AVG, out of place and in place), reduce_scatter and reduce (SUM) on
 * buffers of one kind: twoshot and direct accumulate each piece in f32 wherever it is read
 * from (a view or a cross-memory copy), and AVG divides before the one rounding. The inputs
 * 1 + k/128 are exact in bf16 and their sums exact in f32, so the reference is that sum
 * (divided by p) rounded once. all_reduce and reduce take one element more than the group
 * divides. (The order of division and rounding on random values is test_determinism's.) */
static float half_in(int r, size_t i) {
    return 1.0f + (float)(r + 1 + (int)(i % 7)) / 128.0f;
}

static float half_sum(int p, size_t i) {
    float s = 0;
    for (int q = 0; q < p; q++)
        s += half_in(q, i);
    return s;
}

static hcomm_result_t run_half(hcomm_comm_t *w, bool shared, size_t n) {
    int p = t_size(w), r = t_rank(w);
    size_t total = n * (size_t)p, odd = total + 1;
    uint16_t *in = alloc(odd * 2, shared), *out = alloc(odd * 2, shared);
    T_CHECK(in && out, "out of memory");
    long bad = 0;
    for (size_t i = 0; i < odd; i++)
        in[i] = hcomm__f32_to_bf16(half_in(r, i));
    T_TRY(hcomm_all_reduce(w, in, out, odd, HCOMM_BF16, HCOMM_AVG));
    for (size_t i = 0; i < odd; i++)
        bad += out[i] != hcomm__f32_to_bf16(half_sum(p, i) / (float)p);
    memcpy(out, in, odd * 2);
    T_TRY(hcomm_all_reduce(w, out, out, odd, HCOMM_BF16, HCOMM_AVG));
    for (size_t i = 0; i < odd; i++)
        bad += out[i] != hcomm__f32_to_bf16(half_sum(p, i) / (float)p);
    T_TRY(hcomm_reduce_scatter(w, in, out, n, HCOMM_BF16, HCOMM_SUM));
    for (size_t i = 0; i < n; i++)
        bad += out[i] != hcomm__f32_to_bf16(half_sum(p, (size_t)r * n + i));
    T_TRY(hcomm_reduce(w, in, out, odd, HCOMM_BF16, HCOMM_SUM, p - 1));
    for (size_t i = 0; i < odd && r == p - 1; i++)
        bad += out[i] != hcomm__f32_to_bf16(half_sum(p, i));
    release(in, shared);
    release(out, shared);
    T_CHECK(bad == 0, "%ld wrong bf16 elements (%s buffers, n=%zu)", bad,
            shared ? "shared" : "private", n);
    return HCOMM_OK;
}

static hcomm_result_t body(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int r = t_rank(w);
    T_TRY(check_registry());
    T_ERR(hcomm_mem_free(&r), HCOMM_ERR_INVALID_ARG);
    T_OK(hcomm_mem_free(NULL));
    T_ERR(hcomm_mem_alloc(8, NULL), HCOMM_ERR_NULL);
    double *once = NULL;
    T_TRY(hcomm_mem_alloc(64, (void **)&once));
    T_TRY(hcomm_barrier(w)); /* no rank (thread) maps anything new until the second barrier */
    T_TRY(hcomm_mem_free(once));
    T_ERR(hcomm_mem_free(once), HCOMM_ERR_INVALID_ARG);
    T_TRY(hcomm_barrier(w));
    static const char *const algos[] = {
        NULL, "allreduce:twoshot;allgather:direct;reducescatter:direct;broadcast:direct;"
              "alltoallv:direct;reduce:direct"};
    static const size_t sizes[] = {0, 1, 1000, 300000};
    for (int a = 0; a < 2; a++) {
        T_TRY(hcomm_comm_set_algo(w, algos[a]));
        for (int s = 0; s < 4; s++) {
            T_TRY(run_ops(w, true, sizes[s]));
            T_TRY(run_ops(w, false, sizes[s]));
            T_TRY(run_ops(w, r % 2 == 0, sizes[s])); /* mapped from some peers, read from others */
            T_TRY(run_half(w, true, sizes[s]));
            T_TRY(run_half(w, false, sizes[s]));
            T_TRY(run_half(w, r % 2 == 0, sizes[s]));
        }
    }
    T_TRY(hcomm_comm_set_algo(w, NULL));
    return hcomm_barrier(w);
}

int main(void) {
    t_for_each_world(body, NULL, 4);
    return t_finish("test_mem");
}
