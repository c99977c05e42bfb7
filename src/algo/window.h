/* One-copy reads of buffers that the members of a communicator expose to each other on one node
 * (window.c): what MoE's dispatch and combine use to read rows where they lie instead of
 * packing them, sending them and unpacking them. A member exports a buffer (its description
 * travels in the caller's own exchange or in hcomm__coll_exports), every reader loads the rows
 * it needs (through a mapping where the transport has one, else copied: mpi's cross-memory
 * attach), and hcomm__coll_reads_done ends the epoch as MPI_Win_fence does: no owner returns
 * while a peer may still read its buffer, and a failed read fails every member. */
#ifndef HCOMM_C_ALGO_WINDOW_H_
#define HCOMM_C_ALGO_WINDOW_H_

#include "algo/xfer.h"

/* Every member of c can load every other's memory and the topology puts them on one node (a
 * simulated multi-node topology keeps its links): the same answer on every rank. */
bool hcomm__coll_reads_ok(hcomm_comm_t *c);
/* bytes at byte offset off of peer's buffer r: *at points at them where this rank loads them
 * in place, else at tmp, into which they were copied. fn names the public call in an error. */
hcomm_result_t hcomm__coll_load(hcomm_comm_t *c, const char *fn, int peer, const hcomm__remote_t *r,
                                size_t off, void *tmp, size_t bytes, const void **at);
/* Buffers that peers read should come from hcomm_mem_alloc: this transport's peers load those
 * in place but copy private memory (mpi); local's threads load any memory. */
bool hcomm__coll_wants_shared(hcomm_comm_t *c);
/* Collective: every member's export of [p, p + bytes) into all[0..size), as this rank reads it
 * (one all_gather). */
hcomm_result_t hcomm__coll_exports(hcomm_comm_t *c, const void *p, size_t bytes,
                                   hcomm__remote_t *all);
/* Collective, after this rank's last read (mine: how its reads went): HCOMM_OK once every
 * member finished reading with success; else this rank's error, or HCOMM_ERR_PEER naming the
 * rank that failed (one all_reduce). */
hcomm_result_t hcomm__coll_reads_done(hcomm_comm_t *c, const char *fn, hcomm_result_t mine);

#endif /* HCOMM_C_ALGO_WINDOW_H_ */
