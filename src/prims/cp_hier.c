/* Hierarchical context parallelism (Megatron-Core cp_comm_type "a2a+p2p",
 * hierarchical_context_parallel_sizes [a2a, p2p]; USP, Fang & Zhao 2024): Ulysses over groups
 * of consecutive ranks, normally one node's, and the ring across them. The a2a size comes from
 * the caller or from the node layout the topology layer knows (hosts, or HCOMM_TOPO). */
#include "prims/cp_common.h"
#include "topo/topo.h"

struct hcomm_cp_hier {
    hcomm_comm_t *a2a, *p2p;
    int a2a_size, p2p_size;
};

/* The ranks per node where every node holds that many consecutive ranks of g. */
static hcomm_result_t node_size(hcomm_comm_t *g, const char *fn, int *out) {
    hcomm__topo_t *t = NULL;
    HCOMM__TRY(hcomm__topo_get(g, &t));
    int per = t->max_node;
    bool even = t->min_node == t->max_node;
    for (int r = 0; even && r < g->size; r++)
        even = t->node[r] == r / per;
    if (!even)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                          "the group's %d ranks lie on %d nodes of %d to %d ranks (%s), not on "
                          "equal nodes of consecutive ranks; pass a2a_size",
                          g->size, t->nnodes, t->min_node, t->max_node, t->source);
    *out = per;
    return HCOMM_OK;
}

static hcomm_result_t check_size(hcomm_comm_t *g, const char *fn, int a2a_size,
                                 hcomm_cp_hier_t **hier, int *a2a) {
    if (hier == NULL)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'hier' is NULL");
    *hier = NULL;
    if (a2a_size < 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "a2a_size=%d is negative", a2a_size);
    if (a2a_size == 0)
        return node_size(g, fn, a2a);
    if (g->size % a2a_size != 0)
        return hcomm__err(HCOMM_ERR_SHAPE, fn, "cp=%d is not divisible by a2a_size=%d", g->size,
                          a2a_size);
    *a2a = a2a_size;
    return HCOMM_OK;
}

static hcomm_result_t hier_create(hcomm_comm_t *g, int a2a_size, hcomm_cp_hier_t **hier) {
    const char *fn = g->call_fn;
    int a = 0;
    CP_CHECK(g, check_size(g, fn, a2a_size, hier, &a));
    cp_desc_t mine = hcomm__cp_desc(NULL, a2a_size, a, 0);
    HCOMM__TRY(hcomm__cp_agree(g, fn, &mine, "no tensor", "a2a_size,a2a"));
    hcomm_cp_hier_t *h = calloc(1, sizeof *h);
    CP_CHECK(g, h ? HCOMM_OK : hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory"));
    *h = (hcomm_cp_hier_t){.a2a_size = a, .p2p_size = g->size / a};
    hcomm_result_t res = hcomm__coll_split(g, g->rank / a, g->rank, &h->a2a);
    if (res == HCOMM_OK)
        res = hcomm__coll_split(g, g->rank % a, g->rank, &h->p2p);
    if (res != HCOMM_OK) {
        hcomm_comm_destroy(h->a2a);
        free(h);
        return res;
    }
    *hier = h;
    return HCOMM_OK;
}

hcomm_result_t hcomm_cp_hier_create(hcomm_comm_t *group, int a2a_size, hcomm_cp_hier_t **hier) {
    HCOMM__CHECK_NULL(group);
    hcomm__enter(group, __func__);
    return hcomm__leave(group, hier_create(group, a2a_size, hier));
}

hcomm_result_t hcomm_cp_hier_groups(const hcomm_cp_hier_t *hier, hcomm_comm_t **a2a,
                                    hcomm_comm_t **p2p, int *a2a_size, int *p2p_size) {
    HCOMM__CHECK_NULL(hier);
    if (a2a)
        *a2a = hier->a2a;
    if (p2p)
        *p2p = hier->p2p;
    if (a2a_size)
        *a2a_size = hier->a2a_size;
    if (p2p_size)
        *p2p_size = hier->p2p_size;
    return HCOMM_OK;
}

hcomm_result_t hcomm_cp_hier_destroy(hcomm_cp_hier_t *hier) {
    if (hier == NULL)
        return HCOMM_OK;
    hcomm_result_t a = hcomm_comm_destroy(hier->a2a), b = hcomm_comm_destroy(hier->p2p);
    free(hier);
    return a != HCOMM_OK ? a : b;
}
