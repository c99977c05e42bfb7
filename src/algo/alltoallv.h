/* all_to_allv's entry path (alltoallv.c), whose choice waits for the sizes its agreement
 * carries; the other collectives take coll.h's. */
#ifndef HCOMM_C_ALGO_ALLTOALLV_H_
#define HCOMM_C_ALGO_ALLTOALLV_H_

#include "p2p/p2p.h"

/* all_to_allv of byte counts and displacements per peer. counts_proved: the caller's previous
 * exchange on c proved that every rank makes this call with matching counts (the token exchange
 * after MoE's count exchange), so no signature agreement runs before a native call, nor the
 * transport's own count check (mpi: an MPI_Ialltoall of the counts and an MPI_Iallreduce). */
hcomm_result_t hcomm__coll_all_to_allv(hcomm_comm_t *c, const void *sendbuf,
                                       const size_t *sendcounts, const size_t *sdispls,
                                       void *recvbuf, const size_t *recvcounts,
                                       const size_t *rdispls, bool counts_proved);
/* all_to_all of bytes per rank whose checks ride on the data: over p2p the signature travels
 * in every message (no separate agreement), on shared memory in the posted slots. For a
 * caller's small count exchange that carries its own argument checks (MoE dispatch). */
hcomm_result_t hcomm__coll_all_to_all_checked(hcomm_comm_t *c, const void *sendbuf, void *recvbuf,
                                              size_t bytes);

#endif /* HCOMM_C_ALGO_ALLTOALLV_H_ */
