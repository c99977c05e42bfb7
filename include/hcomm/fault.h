/**
 * @file fault.h
 * @brief Going on after a lost rank: failure detection, revoke, agree and shrink (the meaning
 *        of MPI's ULFM: MPIX_Comm_revoke, MPIX_Comm_agree, MPIX_Comm_shrink; NCCL 2.27-2.28's
 *        ncclCommShrink and ncclCommRevoke), and a hook that stops a rank for good in tests.
 *
 * Detection: a rank whose process was killed (mpi) or whose thread called hcomm_fault_stop()
 * (local) is noticed by every peer waiting on it, or in a collective of a group it belongs
 * to, within HCOMM_FAILURE_DETECT seconds (default 2; 0 turns the search off). The call then
 * fails with HCOMM_ERR_PEER_LOST naming the call, the lost rank (group and world rank) and the
 * call's sequence number. A rank that is alive but slow is never declared lost: only
 * HCOMM_TIMEOUT applies to it. Point-to-point calls fail only when their own peer is lost.
 *
 * Where it works: local (threads) always; mpi among processes on one host, where a peer's
 * process id shows whether it still runs (a zombie counts as gone) and the agreement runs in
 * shared memory. A communicator that spans hosts gets HCOMM_ERR_UNSUPPORTED from agree and
 * shrink: restart the job from a checkpoint instead (scripts/hcomm-restart.sh). Under mpirun,
 * pass --enable-recovery, or mpirun kills every process when one dies.
 *
 * Recovery, as ULFM writes it: a rank that sees HCOMM_ERR_PEER_LOST (or HCOMM_ERR_REVOKED)
 * revokes the communicators its peers may be waiting on, every live rank calls
 * hcomm_comm_agree() on the world to learn that a rank was lost, then hcomm_comm_shrink() to
 * get a world of the survivors, and hcomm_ctx_rebuild() (domain.h) for the groups.
 */
#ifndef HCOMM_C_FAULT_H_
#define HCOMM_C_FAULT_H_

#include "hcomm/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Revokes @p comm: every pending and later call on it fails with HCOMM_ERR_REVOKED on this
 *  rank and on every live member (the notice travels at once, and each member that gets it
 *  passes it on, so it reaches members that wait on other ranks). hcomm_comm_agree(),
 *  hcomm_comm_shrink() and hcomm_comm_destroy() still work on it. Local to the calling rank
 *  (the owning thread); revoking twice is a no-op. Errors: HCOMM_ERR_NULL. */
HCOMM_API hcomm_result_t hcomm_comm_revoke(hcomm_comm_t *comm);

/** Fault-tolerant agreement (ULFM's MPIX_Comm_agree): *@p flag becomes the bitwise AND of
 *  every live member's *@p flag, the same on every survivor, even when members are lost
 *  before or during the call (a member lost before it posted its flag is left out). Collective
 *  over the live members of @p comm, revoked or not; every live member must call it, in the
 *  same order as its other agreements and shrinks on @p comm. Returns HCOMM_ERR_PEER_LOST
 *  (with *@p flag still agreed) when a member was found lost, so that every survivor learns it
 *  in the same call. Errors: HCOMM_ERR_NULL, HCOMM_ERR_PEER_LOST, HCOMM_ERR_UNSUPPORTED (mpi:
 *  members on several hosts), HCOMM_ERR_TIMEOUT (a live member did not call it),
 *  HCOMM_ERR_NOMEM. */
HCOMM_API hcomm_result_t hcomm_comm_agree(hcomm_comm_t *comm, int *flag);

/** A new communicator of @p comm's live members, in @p comm's rank order, the same on every
 *  survivor (ULFM's MPIX_Comm_shrink); a member lost while it runs is left out. Collective
 *  over the live members of @p comm (revoked or not), ordered with its agreements. The new
 *  communicator has @p comm's settings (timeout, determinism); destroy it with
 *  hcomm_comm_destroy(). Errors: HCOMM_ERR_NULL, HCOMM_ERR_UNSUPPORTED, HCOMM_ERR_TIMEOUT,
 *  HCOMM_ERR_NOMEM, HCOMM_ERR_BACKEND. */
HCOMM_API hcomm_result_t hcomm_comm_shrink(hcomm_comm_t *comm, hcomm_comm_t **out);

/** The members of @p comm known lost now: *@p n of them, their ranks in @p comm ascending in
 *  @p ranks (room for @p cap; *@p n may exceed cap, then only cap are written). Local; a
 *  member found lost stays lost. Errors: HCOMM_ERR_NULL (ranks may be NULL when cap is 0). */
HCOMM_API hcomm_result_t hcomm_comm_lost(hcomm_comm_t *comm, int *ranks, int cap, int *n);

/** Test hook: this rank stops for good, as a crash would. local: the rank is marked lost and
 *  the calling thread blocks until every other rank's function has returned, then gets
 *  HCOMM_ERR_PEER_LOST and must return from its rank function (hcomm_launch does not count it
 *  as failed). mpi: the process sends itself SIGKILL and never returns. @p comm: any
 *  communicator of this rank. Errors: HCOMM_ERR_NULL, HCOMM_ERR_PEER_LOST (local, after the
 *  wait), HCOMM_ERR_UNSUPPORTED (a backend without it). */
HCOMM_API hcomm_result_t hcomm_fault_stop(hcomm_comm_t *comm);

#ifdef __cplusplus
}
#endif

#endif /* HCOMM_C_FAULT_H_ */
