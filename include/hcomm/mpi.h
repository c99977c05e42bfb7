/**
 * @file mpi.h
 * @brief Using hcomm inside an existing MPI application: wrap one of its communicators.
 *
 * Not included by hcomm/api.h, because it needs <mpi.h>; available only when hcomm is
 * built with the mpi backend (link with hcomm and MPI::MPI_C, or pkg-config hcomm).
 *
 * Threads: when hcomm initializes MPI (hcomm_launch with backend "mpi") it asks for
 * MPI_THREAD_MULTIPLE, so distinct communicators may be used from distinct threads. An
 * application that initializes MPI itself with less than MPI_THREAD_MULTIPLE must call hcomm
 * from one thread at a time (as MPI requires for its own calls).
 *
 * Errors: hcomm never lets an MPI error abort the job. Whenever it initializes or first uses
 * MPI (hcomm_launch, hcomm_comm_wrap_mpi) it sets MPI_ERRORS_RETURN on MPI_COMM_WORLD and
 * MPI_COMM_SELF, where Open MPI reports errors of nonblocking collectives; an application that
 * relies on MPI_ERRORS_ARE_FATAL must set it again on those two.
 */
#ifndef HCOMM_C_MPI_H_
#define HCOMM_C_MPI_H_

#include "hcomm/core.h"

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Makes an hcomm communicator over the MPI communicator @p comm, in @p *out.
 *
 *  hcomm works on its own duplicate of @p comm (MPI_Comm_idup, polled so that HCOMM_TIMEOUT
 *  bounds it), so its messages never match
 *  the application's; @p comm itself is not modified and may be freed afterwards. The
 *  result has the same ranks in the same order, reports backend "mpi", lists its members
 *  as ranks of MPI_COMM_WORLD, and is freed with hcomm_comm_destroy() (collective) before
 *  MPI_Finalize. Every hcomm call works on it, including hcomm_comm_split(). Its waits end
 *  after HCOMM_TIMEOUT seconds (env, default 300) with HCOMM_ERR_TIMEOUT; outside
 *  hcomm_launch a failed peer is not announced, so it shows as that timeout.
 *
 *  Speed: it takes the paths a launched communicator takes. The members' hosts are gathered
 *  over @p comm, so members on one host meet in shared memory (the board) and read each
 *  other's buffers once (cross-memory attach, where the kernel allows it on every member);
 *  its waits spin while no host has more of the live wrapped communicators' members than
 *  cores, else they yield the core at once. It cannot tell about the application's other
 *  processes on a host (those outside @p comm), so an application that runs more processes
 *  than cores should expect the yielding waits' latency.
 *
 *  Collective over @p comm: every process of @p comm calls it. MPI must already be
 *  initialized (hcomm does not initialize MPI here). Call it from the thread that
 *  initialized MPI.
 *  Errors: HCOMM_ERR_NULL (@p out), HCOMM_ERR_INVALID_ARG (@p comm is MPI_COMM_NULL or an
 *  intercommunicator, or an HCOMM_* variable is malformed, checked as hcomm_launch does),
 * HCOMM_ERR_STATE (MPI not initialized, or already finalized), HCOMM_ERR_NOMEM, HCOMM_ERR_BACKEND
 * (an MPI call failed; the message has MPI's text). */
HCOMM_API hcomm_result_t hcomm_comm_wrap_mpi(MPI_Comm comm, hcomm_comm_t **out);

#ifdef __cplusplus
}
#endif
#endif /* HCOMM_C_MPI_H_ */
