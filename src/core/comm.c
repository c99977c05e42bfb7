/* Public communicator calls and the launcher: thin wrappers that check arguments and hand
 * the work to the algorithms layer or the backend. */
#include "algo/coll.h"

#include <stdlib.h>
#include <string.h>

hcomm_comm_t *hcomm__comm_alloc(const hcomm__backend_ops_t *ops, void *impl, int rank, int size) {
    hcomm_comm_t *c = calloc(1, sizeof *c);
    int *wr = malloc(sizeof(int) * (size_t)(size > 0 ? size : 1));
    if (!c || !wr) {
        free(c);
        free(wr);
        return NULL;
    }
    *c = (hcomm_comm_t){.ops = ops, .impl = impl, .rank = rank, .size = size, .world_ranks = wr};
    return c;
}

void hcomm__comm_free(hcomm_comm_t *c) {
    if (!c)
        return;
    if (c->ops && c->ops->destroy)
        c->ops->destroy(c);
    free(c->world_ranks);
    free(c);
}

hcomm_result_t hcomm_comm_rank(const hcomm_comm_t *comm, int *rank) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(rank);
    *rank = comm->rank;
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_size(const hcomm_comm_t *comm, int *size) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(size);
    *size = comm->size;
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_members(const hcomm_comm_t *comm, int *ranks, int cap) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(ranks);
    if (cap < comm->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "cap=%d is less than the group size %d",
                          cap, comm->size);
    memcpy(ranks, comm->world_ranks, sizeof(int) * (size_t)comm->size);
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_backend(const hcomm_comm_t *comm, const char **name) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(name);
    *name = comm->ops->name;
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_split(hcomm_comm_t *comm, int color, int key, hcomm_comm_t **out) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(out);
    *out = NULL;
    return comm->ops->split(comm, color, key, out);
}

hcomm_result_t hcomm_comm_destroy(hcomm_comm_t *comm) {
    if (!comm)
        return HCOMM_OK;
    if (comm->is_world)
        return hcomm__err(HCOMM_ERR_STATE, __func__,
                          "comm is the world communicator of a rank function; it is freed when "
                          "the rank function returns");
    hcomm__comm_free(comm);
    return HCOMM_OK;
}

hcomm_result_t hcomm_barrier(hcomm_comm_t *comm) {
    HCOMM__CHECK_NULL(comm);
    return comm->ops->barrier(comm);
}

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

hcomm_result_t hcomm_launch(const char *backend, int nranks, hcomm_rank_fn_t fn, void *arg) {
    HCOMM__CHECK_NULL(fn);
    if (backend == NULL)
        backend = getenv("HCOMM_BACKEND");
    if (backend == NULL || backend[0] == '\0' || strcmp(backend, "local") == 0) {
        if (nranks < 1 || nranks > 4096)
            return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__,
                              "nranks=%d outside 1..4096 for the local backend", nranks);
        return hcomm__local_launch(nranks, fn, arg);
    }
    if (strcmp(backend, "mpi") == 0) {
        if (nranks < 0)
            return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "nranks=%d is negative", nranks);
        return hcomm__mpi_launch(nranks, fn, arg);
    }
    return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__,
                      "backend=\"%s\" is unknown (expected \"local\" or \"mpi\")", backend);
}
