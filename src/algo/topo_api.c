/* The public topology calls (hcomm/topo.h): declaring a communicator's topology is collective
 * (ranks that disagree would pick different hierarchical patterns and wait on each other), so
 * it lives in the algorithms layer, which can agree across the group. */
#include "algo/coll.h"
#include "hcomm/topo.h"
#include "topo/topo.h"

#include <stdlib.h>

/* This rank's spec, parsed and sized for c (NULL text: back to HCOMM_TOPO or detection). */
static hcomm_result_t parse_for(hcomm_comm_t *c, const char *text, hcomm__topo_spec_t *spec) {
    HCOMM__TRY(hcomm__topo_spec_parse(c->call_fn, "spec", text, spec));
    int declared = hcomm__topo_spec_ranks(spec);
    if (spec->kind == HCOMM__TOPO_NODES && declared != c->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, c->call_fn,
                          "spec=\"%s\" declares %d ranks but the communicator has %d", text,
                          declared, c->size);
    return HCOMM_OK;
}

/* Every rank's spec digest; the first rank whose differs from rank 0's is named. */
static hcomm_result_t agree_digest(hcomm_comm_t *c, uint64_t mine) {
    uint64_t *all = malloc(sizeof(uint64_t) * (size_t)c->size);
    if (!all)
        return hcomm__coll_fail(c, hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory"));
    hcomm_result_t res = hcomm__coll_all_gather(c, &mine, all, sizeof mine);
    for (int r = 1; res == HCOMM_OK && r < c->size; r++)
        if (all[r] != all[0])
            res = hcomm__err(HCOMM_ERR_MISMATCH, c->call_fn,
                             "spec on rank 0 differs from spec on rank %d (pass the same spec "
                             "on every rank)",
                             r);
    free(all);
    return res;
}

static hcomm_result_t set_topo(hcomm_comm_t *c, const char *text) {
    hcomm__topo_spec_t spec;
    hcomm_result_t res = parse_for(c, text, &spec);
    if (res != HCOMM_OK)
        return hcomm__coll_fail(c, res);
    HCOMM__TRY(agree_digest(c, spec.digest));
    return hcomm__topo_set(c, text && text[0] ? &spec : NULL);
}

hcomm_result_t hcomm_comm_set_topo(hcomm_comm_t *comm, const char *spec) {
    HCOMM__CHECK_NULL(comm);
    hcomm__enter(comm, __func__);
    return hcomm__leave(comm, set_topo(comm, spec));
}

hcomm_result_t hcomm_comm_node(hcomm_comm_t *comm, int *nnodes, int *node, int *local_rank,
                               int *local_size) {
    HCOMM__CHECK_NULL(comm);
    const char *saved = comm->call_fn;
    comm->call_fn = __func__;
    hcomm__topo_t *m = NULL;
    hcomm_result_t res = hcomm__topo_get(comm, &m);
    comm->call_fn = saved;
    HCOMM__TRY(res);
    int n = m->node[comm->rank];
    if (nnodes)
        *nnodes = m->nnodes;
    if (node)
        *node = n;
    if (local_rank)
        *local_rank = m->local[comm->rank];
    if (local_size)
        *local_size = m->node_off[n + 1] - m->node_off[n];
    return HCOMM_OK;
}

hcomm_result_t hcomm_host_info(int *cores, int *numa_nodes) {
    HCOMM__CHECK_NULL(cores);
    HCOMM__CHECK_NULL(numa_nodes);
    hcomm__host_info(cores, numa_nodes);
    return HCOMM_OK;
}
