/* The topology layer: where each rank of a communicator runs and what its links cost, as the
 * algorithms layer's hierarchical algorithms and cost-model selection need it.
 *
 * Nodes come from, in order of precedence: the communicator's own declaration
 * (hcomm_comm_set_topo: comm ranks in order), HCOMM_TOPO (world ranks in order), or detection
 * (the transport's node_of: host names on mpi; the local backend is one node). Link classes
 * (intra-node, inter-node) come from the declaration's tables, else HCOMM_TUNING_FILE, else
 * the defaults (core/topo_spec.h). This host's cores and NUMA nodes come from hwloc when hcomm
 * was built with it. The model is built on first use per communicator and kept with it. */
#ifndef HCOMM_C_TOPO_TOPO_H_
#define HCOMM_C_TOPO_TOPO_H_

#include "core/topo_spec.h"
#include "transport/transport.h"

/* One cached selection: per (collective, power-of-two size band); see algo/cost.c. */
typedef struct hcomm__choice {
    uint32_t allowed; /* the allowed-algorithm mask it was chosen from */
    int32_t algo;     /* -1: not filled */
    double est;       /* its estimate, seconds */
} hcomm__choice_t;

enum { HCOMM__CHOICE_COLLS = 16, HCOMM__CHOICE_BANDS = 64 };

typedef struct hcomm__topo {
    int kind; /* HCOMM__TOPO_*: DETECT when nodes were detected */
    int size, nnodes;
    const int *node;        /* [size] node of each comm rank; nodes numbered by their lowest rank */
    const int *local;       /* [size] index of each rank among its node's ranks */
    const int *node_off;    /* [nnodes + 1] where each node's ranks start in members */
    const int *members;     /* [size] node 0's ranks in rank order, then node 1's, ... */
    int min_node, max_node; /* fewest and most ranks on one node */
    bool simulated; /* the transport imposes the inter-node class itself (local, HCOMM_TOPO) */
    hcomm__link_t link[HCOMM__LINK_CLASSES];
    const char *source; /* "hcomm_comm_set_topo", "HCOMM_TOPO", "host names" or "one node" */
    hcomm__choice_t choice[HCOMM__CHOICE_COLLS][HCOMM__CHOICE_BANDS];
    /* every rank on one node, and no mesh or ring declared: no cost model to consult */
    bool one_node;
} hcomm__topo_t;

/* The layer's state on a communicator (HCOMM__LAYER_TOPO), built on first use (topo.c). */
typedef struct hcomm__topo_state {
    hcomm__topo_t *model; /* NULL until first use or after a new declaration */
    bool has_over;
    hcomm__topo_spec_t over; /* hcomm_comm_set_topo's declaration */
} hcomm__topo_state_t;

/* True once c's model is built with every rank on one node (hcomm__topo_t.one_node): read by
 * every collective, so a few loads and no call. */
static inline bool hcomm__topo_one_node(const hcomm_comm_t *c) {
    const hcomm__topo_state_t *st = c->layer[HCOMM__LAYER_TOPO];
    return st && st->model && st->model->one_node;
}

/* The model of c (built on first use; c->call_fn names the caller in errors: a declaration
 * that does not fit the communicator, out of memory). */
hcomm_result_t hcomm__topo_get(hcomm_comm_t *c, hcomm__topo_t **out);
/* Declares c's topology (comm ranks in order); NULL returns c to HCOMM_TOPO or detection. */
hcomm_result_t hcomm__topo_set(hcomm_comm_t *c, const hcomm__topo_spec_t *spec);
/* This host's processing units and NUMA nodes (hwloc; without it the online CPUs and 1). */
void hcomm__host_info(int *cores, int *numa_nodes);

#endif /* HCOMM_C_TOPO_TOPO_H_ */
