/* hcomm-bench's window into the library (bench_internal.h): each call hands on to the layer that
 * owns it. */
#include "bench/bench_internal.h"

#include "algo/coll.h"
#include "core/topo_spec.h"
#include "prims/moe_common.h"

#include <stdio.h>

int hcomm__bench_algos(void) {
    return HCOMM__ALGO_COUNT;
}

const char *hcomm__bench_algo_name(int algo) {
    return hcomm__algo_name(algo);
}

bool hcomm__bench_algo_valid(const char *coll, size_t len, int algo) {
    char spec[96];
    hcomm__algo_set_t set;
    snprintf(spec, sizeof spec, "%.*s:%s", (int)len, coll, hcomm__algo_name(algo));
    return hcomm__algo_parse("hcomm-bench", "--algo", spec, &set) == HCOMM_OK;
}

bool hcomm__bench_bypasses_links(hcomm_comm_t *c, const char *coll, int algo) {
    return hcomm__coll_bypasses_links(c, coll, algo);
}

const char *hcomm__bench_take_algo(hcomm_comm_t *c) {
    return hcomm__coll_take_algo(c);
}

bool hcomm__bench_take_probed(hcomm_comm_t *c) {
    return hcomm__coll_take_probed(c);
}

void hcomm__bench_counts(hcomm_comm_t *c, uint64_t *calls, uint64_t *agreements) {
    hcomm__coll_counts(c, calls, agreements);
}

hcomm_result_t hcomm__bench_send(hcomm_comm_t *c, int tag, int peer, const void *buf,
                                 size_t bytes) {
    return hcomm__send(c, HCOMM__CH_USER, tag, peer, buf, bytes, NULL);
}

hcomm_result_t hcomm__bench_recv(hcomm_comm_t *c, int tag, int peer, void *buf, size_t bytes) {
    return hcomm__recv(c, HCOMM__CH_USER, tag, peer, buf, bytes, HCOMM__RECV_EXACT, NULL);
}

hcomm_result_t hcomm__bench_sendrecv(hcomm_comm_t *c, int tag, int to, const void *sbuf, int from,
                                     void *rbuf, size_t bytes) {
    hcomm__req_t *s = NULL;
    HCOMM__TRY(hcomm__isend(c, HCOMM__CH_USER, tag, to, sbuf, bytes, NULL, &s));
    hcomm_result_t r =
        hcomm__recv(c, HCOMM__CH_USER, tag, from, rbuf, bytes, HCOMM__RECV_EXACT, NULL);
    hcomm_result_t ws = hcomm__wait(s, NULL, NULL);
    return r != HCOMM_OK ? r : ws;
}

double hcomm__bench_now(void) {
    return hcomm__now();
}

uint64_t hcomm__bench_hash(const void *p, size_t n) {
    return hcomm__fnv(p, n, HCOMM__FNV_SEED);
}

bool hcomm__bench_dtype_is_float(hcomm_dtype_t dt) {
    return hcomm__dtype_is_float(dt);
}

float hcomm__bench_half_to_f32(uint16_t v, hcomm_dtype_t dt) {
    return dt == HCOMM_BF16 ? hcomm__bf16_to_f32(v) : hcomm__f16_to_f32(v);
}

uint16_t hcomm__bench_f32_to_half(float f, hcomm_dtype_t dt) {
    return dt == HCOMM_BF16 ? hcomm__f32_to_bf16(f) : hcomm__f32_to_f16(f);
}

void hcomm__bench_reduce(void *dst, const void *src, size_t count, hcomm_dtype_t dt,
                         hcomm_op_t op) {
    hcomm__reduce(dst, src, count, dt, op);
}

long hcomm__bench_launch_job_size(void) {
    return hcomm__launch_job_size();
}

hcomm_result_t hcomm__bench_err(hcomm_result_t res, const char *fn, const char *text) {
    return hcomm__err(res, fn, "%s", text);
}

void hcomm__bench_moe_gather_rows(void *dst, const void *src, const int64_t *idx, int64_t n,
                                  size_t rb) {
    hcomm__moe_gather_rows(dst, src, idx, n, rb);
}

void hcomm__bench_moe_scatter_rows(void *dst, const void *src, const int64_t *idx, int64_t n,
                                   size_t rb) {
    hcomm__moe_scatter_rows(dst, src, idx, n, rb);
}
