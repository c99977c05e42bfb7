/* Communicators: the object every transport fills, its settings and public queries, abort,
 * destroy, and hcomm_launch, which picks the backend that runs the ranks. */
#include "transport/transport.h"

#include "core/env.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

hcomm_result_t hcomm__comm_settings(const char *fn, double *timeout_s, size_t *eager,
                                    size_t *unexpected) {
    HCOMM__TRY(hcomm__env_validate(fn));
    HCOMM__TRY(hcomm__env_timeout(fn, timeout_s));
    HCOMM__TRY(hcomm__env_bytes(fn, "HCOMM_EAGER_LIMIT", 8192, 0, (size_t)1 << 20, eager));
    return hcomm__env_bytes(fn, "HCOMM_UNEXPECTED_BYTES", (size_t)256 << 20, 0, SIZE_MAX / 2,
                            unexpected);
}

hcomm_comm_t *hcomm__comm_alloc(const hcomm__transport_t *tr, void *impl, int rank, int size,
                                const hcomm_comm_t *parent) {
    hcomm_comm_t *c = calloc(1, sizeof *c);
    int *wr = malloc(sizeof(int) * (size_t)(size > 0 ? size : 1));
    if (!c || !wr) {
        free(c);
        free(wr);
        return NULL;
    }
    *c = (hcomm_comm_t){.tr = tr, .impl = impl, .rank = rank, .size = size, .world_ranks = wr,
                        .call_fn = "hcomm"};
    atomic_init(&c->aborted, 0);
    if (parent) {
        c->timeout_s = parent->timeout_s;
        c->eager_limit = parent->eager_limit;
        c->unexpected_cap = parent->unexpected_cap;
    } else if (hcomm__comm_settings("hcomm", &c->timeout_s, &c->eager_limit,
                                    &c->unexpected_cap) != HCOMM_OK) {
        c->timeout_s = 300.0; /* launch validated the environment before any comm exists */
        c->eager_limit = 8192;
        c->unexpected_cap = (size_t)256 << 20;
    }
    return c;
}

void hcomm__comm_free(hcomm_comm_t *c) {
    if (!c)
        return;
    for (int l = HCOMM__LAYER_COUNT - 1; l >= 0; l--)
        if (c->layer[l] && c->layer_free[l])
            c->layer_free[l](c->layer[l]);
    if (c->tr && c->tr->destroy)
        c->tr->destroy(c);
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
    *name = comm->tr->name;
    return HCOMM_OK;
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

hcomm_result_t hcomm_comm_abort(hcomm_comm_t *comm) {
    HCOMM__CHECK_NULL(comm);
    atomic_store(&comm->aborted, 1);
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_set_timeout(hcomm_comm_t *comm, double seconds) {
    HCOMM__CHECK_NULL(comm);
    if (!(seconds > 0.0) || seconds > 1e9)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "seconds=%g is not in (0, 1e9]",
                          seconds);
    comm->timeout_s = seconds;
    return HCOMM_OK;
}

hcomm_result_t hcomm_launch(const char *backend, int nranks, hcomm_rank_fn_t fn, void *arg) {
    HCOMM__CHECK_NULL(fn);
    double t;
    size_t e, u;
    HCOMM__TRY(hcomm__comm_settings(__func__, &t, &e, &u));
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

/* Plain host memory today: every transport here moves any buffer, and the local one shares
 * the whole address space. A transport with registration or a node segment plugs in here. */
hcomm_result_t hcomm_mem_alloc(size_t bytes, void **ptr) {
    HCOMM__CHECK_NULL(ptr);
    *ptr = malloc(bytes ? bytes : 1);
    if (*ptr == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, __func__, "cannot allocate bytes=%zu", bytes);
    return HCOMM_OK;
}

hcomm_result_t hcomm_mem_free(void *ptr) {
    free(ptr);
    return HCOMM_OK;
}
