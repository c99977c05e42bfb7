/* The public calls of hcomm/fault.h: revoke tells the peers through the p2p layer's notices;
 * agree and shrink run on the transport's slots (transport/ft.c). */
#include "hcomm/fault.h"
#include "p2p/p2p.h"

#include <stdlib.h>

hcomm_result_t hcomm_comm_revoke(hcomm_comm_t *comm) {
    HCOMM__CHECK_NULL(comm);
    for (hcomm_comm_t *c = comm; c; c = atomic_load(&c->abort_with)) {
        int none = 0;
        atomic_compare_exchange_strong(&c->aborted, &none, HCOMM__REVOKE_CALLED);
    }
    const char *keep = comm->call_fn;
    comm->call_fn = __func__;
    hcomm__abort_tell(comm); /* now: the peers may be waiting on this rank */
    comm->call_fn = keep;
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_agree(hcomm_comm_t *comm, int *flag) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(flag);
    bool *lost = calloc((size_t)comm->size, sizeof *lost);
    if (!lost)
        return hcomm__err(HCOMM_ERR_NOMEM, __func__, "out of memory");
    uint64_t v = (uint64_t)(int64_t)*flag;
    hcomm_result_t r = hcomm__ft_agree(comm, __func__, &v, lost);
    int first = -1, n = 0;
    for (int i = 0; r == HCOMM_OK && i < comm->size; i++)
        if (lost[i] && n++ == 0)
            first = i;
    free(lost);
    if (r != HCOMM_OK)
        return r;
    *flag = (int)(int64_t)v;
    if (n > 0)
        return hcomm__err(HCOMM_ERR_PEER_LOST, __func__,
                          "%d member%s lost (the first: rank %d, world rank %d); flag=%d agreed "
                          "among the %d survivors",
                          n, n == 1 ? " was" : "s were", first, comm->world_ranks[first], *flag,
                          comm->size - n);
    return HCOMM_OK;
}

hcomm_result_t hcomm_comm_shrink(hcomm_comm_t *comm, hcomm_comm_t **out) {
    HCOMM__CHECK_NULL(out);
    *out = NULL;
    HCOMM__CHECK_NULL(comm);
    return hcomm__ft_shrink(comm, __func__, out);
}

hcomm_result_t hcomm_comm_lost(hcomm_comm_t *comm, int *ranks, int cap, int *n) {
    HCOMM__CHECK_NULL(comm);
    HCOMM__CHECK_NULL(n);
    if (cap > 0)
        HCOMM__CHECK_NULL(ranks);
    *n = 0;
    for (int r = 0; comm->tr->lost && r < comm->size; r++)
        if (r != comm->rank && comm->tr->lost(comm, r)) {
            if (*n < cap)
                ranks[*n] = r;
            ++*n;
        }
    return HCOMM_OK;
}

hcomm_result_t hcomm_fault_stop(hcomm_comm_t *comm) {
    HCOMM__CHECK_NULL(comm);
    if (!comm->tr->stop)
        return hcomm__err(HCOMM_ERR_UNSUPPORTED, __func__, "the %s backend cannot stop a rank",
                          comm->tr->name);
    return comm->tr->stop(comm);
}
