/* Nonblocking collectives (async.c): issued in order on a communicator, run by a worker that
 * owns a private duplicate of it, completed through hcomm_request_t. */
#ifndef HCOMM_C_ALGO_ASYNC_H_
#define HCOMM_C_ALGO_ASYNC_H_

#include "algo/coll.h"

typedef enum { HCOMM__IALL_REDUCE, HCOMM__IALL_GATHER, HCOMM__IREDUCE_SCATTER } hcomm__icoll_t;

/* Queues one collective (arguments as the blocking hcomm__coll_* calls; count is bytes for
 * all_gather) and returns its request. Collective: every rank issues the same sequence. */
hcomm_result_t hcomm__icoll(hcomm_comm_t *c, hcomm__icoll_t kind, const void *send, void *recv,
                            size_t count, hcomm_dtype_t dt, hcomm_op_t op, hcomm_request_t **req);
/* A primitive's whole body as one queued operation: fn(dup, ctx) runs on the worker with a
 * copy of ctx (at most HCOMM__ICALL_CTX bytes), e.g. a TP all_gather along an inner dim with
 * its permutation. */
#define HCOMM__ICALL_CTX 512
typedef hcomm_result_t (*hcomm__icall_fn_t)(hcomm_comm_t *c, void *ctx);
hcomm_result_t hcomm__icall(hcomm_comm_t *c, hcomm__icall_fn_t fn, const void *ctx, size_t bytes,
                            hcomm_request_t **req);
/* This rank's checks failed with why (message in the thread's last error): queues its part
 * so its peers' operation fails with HCOMM_ERR_PEER; the request completes with why. */
hcomm_result_t hcomm__icoll_fail(hcomm_comm_t *c, hcomm_result_t why, hcomm_request_t **req);
/* As hcomm__icoll_fail for a call that has no request to return (its req argument was NULL):
 * the failure joins the peers' operation on the worker and is waited for here; returns why. */
hcomm_result_t hcomm__icoll_fail_now(hcomm_comm_t *c, hcomm_result_t why);
hcomm_result_t hcomm__request_done(hcomm_request_t *q, bool *done);
/* Blocks until q completed, frees it and returns its result (message set on failure). */
hcomm_result_t hcomm__request_wait(hcomm_request_t *q);

#endif /* HCOMM_C_ALGO_ASYNC_H_ */
