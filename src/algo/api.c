/* The public raw collectives: thin wrappers that check arguments, then hand the call to the
 * algorithms layer. */
#include "algo/coll.h"

static hcomm_result_t check_reduce_args(const char *fn, size_t count, hcomm_dtype_t dt,
                                        hcomm_op_t op) {
    if (!hcomm__dtype_valid(dt))
        return hcomm__err(HCOMM_ERR_DTYPE, fn, "dtype=%d is not a valid hcomm_dtype_t", (int)dt);
    if (!hcomm__op_valid(op))
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "op=%d is not a valid hcomm_op_t", (int)op);
    (void)count;
    return HCOMM_OK;
}

hcomm_result_t hcomm_all_reduce(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                size_t count, hcomm_dtype_t dtype, hcomm_op_t op) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__TRY(check_reduce_args(__func__, count, dtype, op));
    if (count > 0) {
        HCOMM__CHECK_NULL(sendbuf);
        HCOMM__CHECK_NULL(recvbuf);
    }
    return hcomm__coll_all_reduce(comm, sendbuf, recvbuf, count, dtype, op);
}

hcomm_result_t hcomm_broadcast(hcomm_comm_t *comm, void *buf, size_t bytes, int root) {
    HCOMM__CHECK_NULL(comm);
    if (root < 0 || root >= comm->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "root=%d outside 0..%d", root,
                          comm->size - 1);
    if (bytes > 0)
        HCOMM__CHECK_NULL(buf);
    return hcomm__coll_broadcast(comm, buf, bytes, root);
}

hcomm_result_t hcomm_all_gather(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                size_t bytes) {
    HCOMM__CHECK_NULL(comm);
    if (bytes > 0) {
        HCOMM__CHECK_NULL(sendbuf);
        HCOMM__CHECK_NULL(recvbuf);
    }
    return hcomm__coll_all_gather(comm, sendbuf, recvbuf, bytes);
}

hcomm_result_t hcomm_reduce_scatter(hcomm_comm_t *comm, const void *sendbuf, void *recvbuf,
                                    size_t recvcount, hcomm_dtype_t dtype, hcomm_op_t op) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__TRY(check_reduce_args(__func__, recvcount, dtype, op));
    if (recvcount > 0) {
        HCOMM__CHECK_NULL(sendbuf);
        HCOMM__CHECK_NULL(recvbuf);
    }
    return hcomm__coll_reduce_scatter(comm, sendbuf, recvbuf, recvcount, dtype, op);
}

hcomm_result_t hcomm_all_to_allv(hcomm_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
                                 const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                 const size_t *rdispls) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(sendcounts);
    HCOMM__CHECK_NULL(sdispls);
    HCOMM__CHECK_NULL(recvcounts);
    HCOMM__CHECK_NULL(rdispls);
    size_t out = 0, in = 0;
    for (int p = 0; p < comm->size; p++) {
        out += sendcounts[p];
        in += recvcounts[p];
    }
    if (out > 0)
        HCOMM__CHECK_NULL(sendbuf);
    if (in > 0)
        HCOMM__CHECK_NULL(recvbuf);
    return hcomm__coll_all_to_allv(comm, sendbuf, sendcounts, sdispls, recvbuf, recvcounts,
                                   rdispls);
}
