/* How the ranks of a call agree on its signature before data moves (agree.c):
 *   - a shared-memory transport (local) checks it in the slots its collectives post anyway
 *     (hcomm__run_posted; a rank that failed its own checks shows there too);
 *   - a communicator with a board (mpi on one host) meets there, one meeting per checked call;
 *   - elsewhere an empty recursive doubling over p2p runs first, as HCOMM_CHECK says (always,
 *     first use per signature, off), unless the algorithm carries the signature in every
 *     message itself (hcomm__agree_p2p).
 * And the call's messaging context for the algorithms (hcomm__call_xfer): its signature checked
 * in every message and meeting. */
#ifndef HCOMM_C_ALGO_AGREE_H_
#define HCOMM_C_ALGO_AGREE_H_

#include "algo/state.h"
#include "algo/xfer.h"

/* The transport checks calls in its posted slots (hcomm__transport_t.posted_only). */
static inline bool hcomm__posted_transport(const hcomm_comm_t *c) {
    return c->tr->posted_only != NULL;
}

/* Calls on c meet on its board where it has one, unless a declared topology simulates several
 * nodes (whose links the board would bypass); the same answer on every rank. */
bool hcomm__on_board(hcomm_comm_t *c);
/* Messages of this call may take the transport's lane (and posted checks do not apply). */
bool hcomm__on_lane(const hcomm_comm_t *c);
/* Two ranks on a lane run the one-exchange algorithms (rd all_gather, rhd reduce_scatter, tree
 * broadcast) as pair.c's exchange, which checks the signature in its messages. */
bool hcomm__on_pair_lane(const hcomm__call_t *k, int algo);
/* all_gather's rd among more than two ranks sends the whole vector in one lane message where it
 * fits (hcomm__ag_rd_whole). */
bool hcomm__ag_whole_on_lane(const hcomm__call_t *k, int algo);

/* The messaging context of call k for the algorithms. */
hcomm__xfer_t hcomm__call_xfer(hcomm__call_t *k);

/* Every rank of the call meets and compares signatures (a barrier): on the board, else in an
 * empty recursive doubling over p2p. */
hcomm_result_t hcomm__agree_all(hcomm__call_t *k);
/* The agreement as HCOMM_CHECK mode says (always, first use per signature, off). */
hcomm_result_t hcomm__agree_as(hcomm__call_t *k, int mode);
/* Before algo runs k: the agreement it needs (none where its messages check the signature). */
hcomm_result_t hcomm__agree_p2p(hcomm__call_t *k, int algo);
/* all[0..n) = the sum over ranks of mine[0..n), with the signature agreement: one meeting on
 * the board. */
hcomm_result_t hcomm__agree_board_sum(hcomm__call_t *k, const int64_t *mine, int64_t *all, int n);

/* A native collective of a shared-memory transport, run with k's signature posted: fn(c, arg)
 * is the call; a mismatch is worded from every rank's post. */
typedef hcomm_result_t (*hcomm__posted_fn_t)(hcomm_comm_t *c, const void *arg);
hcomm_result_t hcomm__run_posted(hcomm__call_t *k, hcomm__posted_fn_t fn, const void *arg);
/* A posted-slot meeting and nothing else (arg unused): the agreement alone, as a posted fn. */
hcomm_result_t hcomm__posted_barrier(hcomm_comm_t *c, const void *arg);

/* This rank's own checks failed with res (message text): joins the call its peers make, in
 * the posted slots, on the board and in a notice to every peer. */
void hcomm__agree_failed(hcomm__call_t *k, hcomm_result_t res, const char *text);

#endif /* HCOMM_C_ALGO_AGREE_H_ */
