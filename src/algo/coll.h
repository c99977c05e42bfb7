/* The algorithms layer: collectives as the primitives call them. It picks an algorithm per
 * call; today every op goes to the backend's native collective ("native"), with AVG built
 * as SUM then divide. hcomm's own ring / halving-doubling / hierarchical algorithms over
 * point-to-point plug in here without touching the primitives. */
#ifndef HCOMM_C_ALGO_COLL_H_
#define HCOMM_C_ALGO_COLL_H_

#include "backend/backend.h"

hcomm_result_t hcomm__coll_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t count, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__coll_all_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t bytes_per_rank);
hcomm_result_t hcomm__coll_reduce_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                          size_t count, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__coll_broadcast(hcomm_comm_t *c, void *buf, size_t bytes, int root);
hcomm_result_t hcomm__coll_all_to_allv(hcomm_comm_t *c, const void *sendbuf,
                                       const size_t *sendcounts, const size_t *sdispls,
                                       void *recvbuf, const size_t *recvcounts,
                                       const size_t *rdispls);

#endif /* HCOMM_C_ALGO_COLL_H_ */
