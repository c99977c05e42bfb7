/* The algorithms layer's interface: collectives as the public calls and the primitives call
 * them. Each call gets a sequence number on its communicator, a signature (call, dtype, op,
 * root, count, extra, algorithm) that every rank must share, a flight-recorder entry (call.h),
 * an algorithm (choose.h: the selection tables, the cost model, HCOMM_ALGO and
 * hcomm_comm_set_algo), an agreement on the signature where the algorithm needs one
 * (agree.h), and the run (run.h): one entry path for all of them (coll.c).
 * Reductions: f16/bf16 SUM, PROD and AVG accumulate in f32 and round once; AVG divides before
 * rounding. twoshot and direct (and the shared-memory native path) do it as they read each
 * piece of every input; every other algorithm runs on widened f32 copies, so partial sums
 * travel in f32.
 * A rank whose own argument checks failed calls hcomm__coll_fail: its peers in the same call
 * fail with HCOMM_ERR_PEER (naming it and its message) instead of waiting for a timeout. */
#ifndef HCOMM_C_ALGO_COLL_H_
#define HCOMM_C_ALGO_COLL_H_

#include "algo/alltoallv.h"
#include "algo/call.h"
#include "algo/choose.h"
#include "algo/window.h"

hcomm_result_t hcomm__coll_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t count, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__coll_all_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t bytes_per_rank);
hcomm_result_t hcomm__coll_reduce_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                          size_t count, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__coll_broadcast(hcomm_comm_t *c, void *buf, size_t bytes, int root);
hcomm_result_t hcomm__coll_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                                  hcomm_dtype_t dt, hcomm_op_t op, int root);
hcomm_result_t hcomm__coll_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf, size_t bytes,
                                  int root);
hcomm_result_t hcomm__coll_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                   size_t bytes, int root);
hcomm_result_t hcomm__coll_all_gatherv(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                       const size_t *bytes);
hcomm_result_t hcomm__coll_reduce_scatterv(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                           const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__coll_barrier(hcomm_comm_t *c);
hcomm_result_t hcomm__coll_split(hcomm_comm_t *c, int color, int key, hcomm_comm_t **out);
/* The duplicate of c that a nonblocking worker owns (collective: a first nonblocking call,
 * named so in a mismatch). */
hcomm_result_t hcomm__coll_worker_dup(hcomm_comm_t *c, hcomm_comm_t **out);

/* This rank's checks failed with res (its message is the thread's last error): joins the call
 * its peers are making so they fail with HCOMM_ERR_PEER, and returns res with the message. */
hcomm_result_t hcomm__coll_fail(hcomm_comm_t *c, hcomm_result_t res);

#endif /* HCOMM_C_ALGO_COLL_H_ */
