#include "algo/coll.h"

#include <string.h>

/* Zero-sized calls still reach the backend: they are collective calls that peers match, and
 * skipping them on one rank would pair its next call with a peer's current one. */

hcomm_result_t hcomm__coll_all_reduce(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    hcomm_op_t native = op == HCOMM_AVG ? HCOMM_SUM : op;
    HCOMM__TRY(c->ops->all_reduce(c, sendbuf, recvbuf, count, dt, native));
    if (op == HCOMM_AVG)
        hcomm__scale_div(recvbuf, count, dt, c->size);
    return HCOMM_OK;
}

hcomm_result_t hcomm__coll_all_gather(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                      size_t bytes_per_rank) {
    return c->ops->all_gather(c, sendbuf, recvbuf, bytes_per_rank);
}

hcomm_result_t hcomm__coll_reduce_scatter(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                          size_t count, hcomm_dtype_t dt, hcomm_op_t op) {
    hcomm_op_t native = op == HCOMM_AVG ? HCOMM_SUM : op;
    HCOMM__TRY(c->ops->reduce_scatter(c, sendbuf, recvbuf, count, dt, native));
    if (op == HCOMM_AVG)
        hcomm__scale_div(recvbuf, count, dt, c->size);
    return HCOMM_OK;
}

hcomm_result_t hcomm__coll_broadcast(hcomm_comm_t *c, void *buf, size_t bytes, int root) {
    return c->ops->broadcast(c, buf, bytes, root);
}

hcomm_result_t hcomm__coll_all_to_allv(hcomm_comm_t *c, const void *sendbuf,
                                       const size_t *sendcounts, const size_t *sdispls,
                                       void *recvbuf, const size_t *recvcounts,
                                       const size_t *rdispls) {
    return c->ops->all_to_allv(c, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls);
}
