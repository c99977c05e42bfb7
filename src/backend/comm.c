/* Communicators: the object every backend fills, its public queries, split/destroy/barrier,
 * and hcomm_launch, which picks the backend that runs the ranks. */
#include "backend/backend.h"

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

hcomm_result_t hcomm_launch(const char *backend, int nranks, hcomm_rank_fn_t fn, void *arg) {
    HCOMM__CHECK_NULL(fn);
    HCOMM__TRY(hcomm__launch_detect(__func__, backend, &backend));
    if (strcmp(backend, "local") == 0) {
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
