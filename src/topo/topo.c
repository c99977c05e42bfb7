/* Per-communicator topology models (see topo.h). */
#include "topo/topo.h"

#include "core/log.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef HCOMM_C_HAVE_HWLOC
#include <hwloc.h>
#endif

/* The layer's state on one communicator. */
typedef hcomm__topo_state_t topo_state_t;

static void model_free(hcomm__topo_t *m) {
    if (!m)
        return;
    free((void *)m->node); /* node, local, node_off and members share one allocation */
    free(m);
}

static void state_free(void *p) {
    topo_state_t *st = p;
    model_free(st->model);
    free(st);
}

static topo_state_t *state_of(hcomm_comm_t *c) {
    return hcomm__layer_state(&c->layer[HCOMM__LAYER_TOPO], &c->layer_free[HCOMM__LAYER_TOPO],
                              sizeof(topo_state_t), calloc, state_free);
}

static hcomm_result_t nomem(hcomm_comm_t *c) {
    return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for the topology model");
}

/* ids[r]: a node id per comm rank, from HCOMM_TOPO (world ranks) or the transport. */
static hcomm_result_t env_or_detected_ids(hcomm_comm_t *c, const hcomm__topo_spec_t *env,
                                          uint64_t *ids) {
    int declared = hcomm__topo_spec_ranks(env);
    if (env->kind == HCOMM__TOPO_NODES && c->is_world && declared != c->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, c->call_fn,
                          "HCOMM_TOPO=\"%s\" declares %d ranks but the world has %d",
                          getenv("HCOMM_TOPO"), declared, c->size);
    for (int r = 0; r < c->size; r++) {
        int w = c->world_ranks[r];
        if (env->kind == HCOMM__TOPO_NODES) {
            int n = hcomm__topo_spec_node(env, w);
            if (n < 0)
                return hcomm__err(HCOMM_ERR_INVALID_ARG, c->call_fn,
                                  "HCOMM_TOPO=\"%s\" declares %d ranks but world rank %d is in "
                                  "this communicator",
                                  getenv("HCOMM_TOPO"), declared, w);
            ids[r] = (uint64_t)n;
        } else {
            ids[r] = c->tr->node_of ? c->tr->node_of(c, r) : 0;
        }
    }
    return HCOMM_OK;
}

/* Numbers the nodes by their lowest rank and lists each node's ranks in rank order. */
static hcomm_result_t group(hcomm_comm_t *c, const uint64_t *ids, hcomm__topo_t *m) {
    int p = c->size;
    int *mem = malloc(sizeof(int) * (4 * (size_t)p + 1));
    if (!mem)
        return nomem(c);
    int *node = mem, *local = mem + p, *off = mem + 2 * p, *members = mem + 3 * p + 1;
    m->nnodes = 0;
    for (int r = 0; r < p; r++) {
        node[r] = -1;
        for (int q = 0; q < r && node[r] < 0; q++)
            if (ids[q] == ids[r])
                node[r] = node[q];
        if (node[r] < 0)
            node[r] = m->nnodes++;
    }
    for (int n = 0, k = 0; n < m->nnodes; n++) {
        off[n] = k;
        for (int r = 0; r < p; r++)
            if (node[r] == n) {
                local[r] = k - off[n];
                members[k++] = r;
            }
    }
    off[m->nnodes] = p;
    m->min_node = p, m->max_node = 0;
    for (int n = 0; n < m->nnodes; n++) {
        int sz = off[n + 1] - off[n];
        m->min_node = sz < m->min_node ? sz : m->min_node;
        m->max_node = sz > m->max_node ? sz : m->max_node;
    }
    m->size = p;
    m->node = node, m->local = local, m->node_off = off, m->members = members;
    return HCOMM_OK;
}

/* The simulation delays only inter-node frames: within a node, messages run at the machine's
 * own pace (the tuning file's or the defaults), which a declared intra class cannot make
 * faster. So each of its terms is the slower of the two. */
static void machine_intra(hcomm__link_t *declared) {
    hcomm__link_t own[HCOMM__LINK_CLASSES];
    hcomm__link_default(own);
    const hcomm__link_t *o = &own[HCOMM__LINK_INTRA];
    declared->alpha = fmax(declared->alpha, o->alpha);
    declared->beta = fmax(declared->beta, o->beta);
    declared->gamma = fmax(declared->gamma, o->gamma);
}

static hcomm_result_t build(hcomm_comm_t *c, topo_state_t *st, hcomm__topo_t *m) {
    const hcomm__topo_spec_t *env = hcomm__topo_spec_env();
    const hcomm__topo_spec_t *spec = st->has_over ? &st->over : env;
    uint64_t *ids = malloc(sizeof(uint64_t) * (size_t)c->size);
    if (!ids)
        return nomem(c);
    hcomm_result_t res = HCOMM_OK;
    if (st->has_over)
        for (int r = 0; r < c->size; r++)
            ids[r] =
                st->over.kind == HCOMM__TOPO_NODES ? (uint64_t)hcomm__topo_spec_node(spec, r) : 0;
    else
        res = env_or_detected_ids(c, env, ids);
    if (res == HCOMM_OK)
        res = group(c, ids, m);
    free(ids);
    HCOMM__TRY(res);
    m->kind = spec->kind;
    memcpy(m->link, spec->link, sizeof m->link);
    m->simulated = !st->has_over && env->kind == HCOMM__TOPO_NODES && c->tr->posted_only != NULL;
    if (m->simulated)
        machine_intra(&m->link[HCOMM__LINK_INTRA]);
    m->source = st->has_over                     ? "hcomm_comm_set_topo"
                : env->kind == HCOMM__TOPO_NODES ? "HCOMM_TOPO"
                : c->tr->node_of                 ? "host names"
                                                 : "one node";
    for (int k = 0; k < HCOMM__CHOICE_COLLS; k++)
        for (int b = 0; b < HCOMM__CHOICE_BANDS; b++)
            m->choice[k][b].algo = -1;
    return HCOMM_OK;
}

static void log_model(hcomm_comm_t *c, const hcomm__topo_t *m) {
    if (!hcomm__log_on(HCOMM__LOG_INFO, HCOMM__SUB_ALGO))
        return;
    int cores, numa;
    hcomm__host_info(&cores, &numa);
    hcomm__log(HCOMM__LOG_INFO, HCOMM__SUB_ALGO,
               "rank %d/%d: topology from %s: %d node%s (%d..%d ranks each), this rank on node "
               "%d; intra %.3g us + %.3g GB/s, inter %.3g us + %.3g GB/s%s; host: %d cores, %d "
               "NUMA nodes",
               c->rank, c->size, m->source, m->nnodes, m->nnodes == 1 ? "" : "s", m->min_node,
               m->max_node, m->node[c->rank], m->link[0].alpha * 1e6, 1e-9 / m->link[0].beta,
               m->link[1].alpha * 1e6, 1e-9 / m->link[1].beta,
               m->simulated ? " (inter simulated by the local backend)" : "", cores, numa);
}

hcomm_result_t hcomm__topo_get(hcomm_comm_t *c, hcomm__topo_t **out) {
    topo_state_t *st = c->layer[HCOMM__LAYER_TOPO];
    if (st && st->model) { /* the per-call path: one load and a test */
        *out = st->model;
        return HCOMM_OK;
    }
    st = state_of(c);
    hcomm__topo_t *m = st ? calloc(1, sizeof *m) : NULL;
    if (!m)
        return nomem(c);
    hcomm_result_t res = build(c, st, m);
    if (res != HCOMM_OK) {
        free(m);
        return res;
    }
    m->one_node = m->nnodes == 1 && m->kind != HCOMM__TOPO_MESH && m->kind != HCOMM__TOPO_RING;
    st->model = m;
    log_model(c, m);
    *out = m;
    return HCOMM_OK;
}

hcomm_result_t hcomm__topo_set(hcomm_comm_t *c, const hcomm__topo_spec_t *spec) {
    topo_state_t *st = state_of(c);
    if (!st)
        return nomem(c);
    if (spec && spec->kind == HCOMM__TOPO_NODES && hcomm__topo_spec_ranks(spec) != c->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, c->call_fn,
                          "spec declares %d ranks but the communicator has %d",
                          hcomm__topo_spec_ranks(spec), c->size);
    st->has_over = spec != NULL;
    if (spec)
        st->over = *spec;
    model_free(st->model);
    st->model = NULL;
    return HCOMM_OK;
}

/* --- this host --- */

static int host_cores = 1, host_numa = 1;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

static void read_host(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    host_cores = n > 0 ? (int)n : 1;
#ifdef HCOMM_C_HAVE_HWLOC
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0)
        return;
    if (hwloc_topology_load(t) == 0) {
        int cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
        int numa = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
        host_cores = cores > 0 ? cores : host_cores;
        host_numa = numa > 0 ? numa : 1;
    }
    hwloc_topology_destroy(t);
#endif
}

void hcomm__host_info(int *cores, int *numa_nodes) {
    pthread_once(&host_once, read_host);
    *cores = host_cores;
    *numa_nodes = host_numa;
}
