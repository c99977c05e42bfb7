/**
 * @file topo.h
 * @brief Topology: which ranks share a node, what the links between them cost, and this
 *        host's cores. hcomm's algorithm selection and hierarchical algorithms use it
 *        (docs/architecture.md, "topo").
 *
 * Nodes are detected (the mpi backend groups processes by host name; the local backend is one
 * node) or declared, process-wide with the environment variable HCOMM_TOPO or per
 * communicator with hcomm_comm_set_topo(). Declarations (fields separated by ';'):
 * "mesh" (every pair linked alike), "ring" (neighbours linked), "nodes=NxG" (N nodes of G
 * ranks in rank order), "nodes=A,B,..." (uneven node sizes), and per-class cost tables
 * "intra=LAT,BW[,RED]" / "inter=LAT,BW[,RED]" (latency in ns/us/ms/s; bandwidth and reduction
 * rate in B/s, KB/s, MB/s, GB/s, decimal), e.g. "nodes=2x4;intra=1us,10GB/s;inter=10us,1GB/s".
 * Under HCOMM_TOPO="nodes=..." the local backend also simulates the inter-node links: a
 * message between ranks of different declared nodes arrives no sooner than latency +
 * bytes / bandwidth after its sender's previous inter-node message left (one link per rank,
 * as one NIC per GPU), so hierarchical algorithms can be measured on one machine. Messages
 * within a node are not delayed, so there the selection's model takes the slower of the
 * declared intra class and the machine's own (HCOMM_TUNING_FILE or the defaults).
 */
#ifndef HCOMM_C_TOPO_H_
#define HCOMM_C_TOPO_H_

#include "hcomm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Declares the topology of @p comm's ranks (comm ranks in order, overriding HCOMM_TOPO and
 *  detection for this communicator, not for communicators split from it); NULL or "" returns
 *  to HCOMM_TOPO or detection. It changes the model that hcomm's algorithm selection and
 *  hierarchical algorithms use, not the local backend's simulated links (HCOMM_TOPO only).
 *  Collective: every rank of @p comm calls it with the same @p spec; not thread-safe with other
 *  calls on @p comm.
 *  Errors: HCOMM_ERR_NULL (comm), HCOMM_ERR_INVALID_ARG (unknown syntax, naming the valid
 *  forms; a node shape whose ranks differ from the communicator's size), HCOMM_ERR_MISMATCH
 *  (ranks passed different specs), and the errors of a collective. */
HCOMM_API hcomm_result_t hcomm_comm_set_topo(hcomm_comm_t *comm, const char *spec);

/** Where the calling rank sits in @p comm's topology: *@p nnodes nodes (numbered in order of
 *  their lowest rank), this rank on node *@p node, as the *@p local_rank-th of its node's
 *  *@p local_size ranks (rank order). Any output pointer may be NULL. Local to the calling
 *  rank, not thread-safe with calls on @p comm. Errors: HCOMM_ERR_NULL (comm),
 *  HCOMM_ERR_INVALID_ARG (HCOMM_TOPO declares other ranks than the world has), HCOMM_ERR_NOMEM. */
HCOMM_API hcomm_result_t hcomm_comm_node(hcomm_comm_t *comm, int *nnodes, int *node,
                                         int *local_rank, int *local_size);

/** This host's physical cores and NUMA nodes, from hwloc (without hwloc at build time: the
 *  online processors and 1). Local, thread-safe. Errors: HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_host_info(int *cores, int *numa_nodes);

#ifdef __cplusplus
}
#endif

#endif /* HCOMM_C_TOPO_H_ */
