/* The one internal header a tool includes: what hcomm-bench needs beyond the public API to
 * name the algorithms, report what the automatic choice picked, and time hcomm's own layers
 * under the public calls (bench_internal.c implements it over the library's internal headers,
 * which no tool includes). Not installed; not for applications. */
#ifndef HCOMM_BENCH_INTERNAL_H_
#define HCOMM_BENCH_INTERNAL_H_

#include "hcomm/api.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --- the algorithms (src/algo/select.h): numbered 0 .. hcomm__bench_algos() - 1 --- */
int hcomm__bench_algos(void);
/* The algorithm's name as HCOMM_ALGO spells it ("native", "ring", ...). */
const char *hcomm__bench_algo_name(int algo);
/* True when the collective named by coll[0..len) (HCOMM_ALGO's spelling) can run algo. */
bool hcomm__bench_algo_valid(const char *coll, size_t len, int algo);
/* True when algo running coll on c moves data outside a simulated machine's links
 * (HCOMM_TOPO on the local backend): its times say nothing of that machine. */
bool hcomm__bench_bypasses_links(hcomm_comm_t *c, const char *coll, int algo);
/* The algorithm the last collective on c chose since the previous ask, or NULL. */
const char *hcomm__bench_take_algo(hcomm_comm_t *c);
/* True when a collective on c since the previous ask timed two candidates near a switch. */
bool hcomm__bench_take_probed(hcomm_comm_t *c);
/* Collective calls made on c, and the signature agreements among them. */
void hcomm__bench_counts(hcomm_comm_t *c, uint64_t *calls, uint64_t *agreements);

/* --- the point-to-point layer under PP (src/p2p/p2p.h), user channel, exact sizes --- */
hcomm_result_t hcomm__bench_send(hcomm_comm_t *c, int tag, int peer, const void *buf, size_t bytes);
hcomm_result_t hcomm__bench_recv(hcomm_comm_t *c, int tag, int peer, void *buf, size_t bytes);
/* bytes from sbuf to `to` while bytes arrive from `from` into rbuf. */
hcomm_result_t hcomm__bench_sendrecv(hcomm_comm_t *c, int tag, int to, const void *sbuf, int from,
                                     void *rbuf, size_t bytes);

/* --- core --- */
/* Monotonic clock in seconds. */
double hcomm__bench_now(void);
/* FNV-1a of n bytes. */
uint64_t hcomm__bench_hash(const void *p, size_t n);
bool hcomm__bench_dtype_is_float(hcomm_dtype_t dt);
/* One f16 or bf16 element (dt) to and from f32, as the library rounds. */
float hcomm__bench_half_to_f32(uint16_t v, hcomm_dtype_t dt);
uint16_t hcomm__bench_f32_to_half(float f, hcomm_dtype_t dt);
/* dst[0..count) op= src[0..count): the reduction kernel every algorithm uses. */
void hcomm__bench_reduce(void *dst, const void *src, size_t count, hcomm_dtype_t dt, hcomm_op_t op);
/* Processes in the job of the launcher that started this one (0: none; -1: unknown). */
long hcomm__bench_launch_job_size(void);
/* Records "fn: text" as this thread's last error and returns res. */
hcomm_result_t hcomm__bench_err(hcomm_result_t res, const char *fn, const char *text);

/* --- MoE's row permutation kernels (src/prims): dst[i] = src[idx[i]] and the reverse, n rows
 * of rb bytes --- */
void hcomm__bench_moe_gather_rows(void *dst, const void *src, const int64_t *idx, int64_t n,
                                  size_t rb);
void hcomm__bench_moe_scatter_rows(void *dst, const void *src, const int64_t *idx, int64_t n,
                                   size_t rb);

#endif /* HCOMM_BENCH_INTERNAL_H_ */
