/* Call bookkeeping (call.c): the public call's name on a communicator, each collective's
 * sequence number and flight-recorder entry, and what a call leaves behind for hcomm-bench and
 * the tests (the algorithm chosen, whether it timed a candidate, counts of calls and
 * agreements). */
#ifndef HCOMM_C_ALGO_CALL_H_
#define HCOMM_C_ALGO_CALL_H_

#include "algo/state.h"

/* Names the public call running on c for every message below it (the outermost call wins);
 * hcomm__leave restores the previous name and, after a timeout, prints the flight recorder;
 * after a failure that leaves peers out of step it dumps it as JSON (dump.h). */
void hcomm__enter(hcomm_comm_t *c, const char *fn);
hcomm_result_t hcomm__leave(hcomm_comm_t *c, hcomm_result_t res);

/* c's state in this layer, made on first use; NULL: out of memory. */
algo_state_t *hcomm__algo_state(hcomm_comm_t *c);

/* Starts call k of kind on c (its sequence number, signature and flight-recorder entry);
 * fails without a sequence number where c was aborted or out of memory. */
hcomm_result_t hcomm__call_begin(hcomm_comm_t *c, hcomm__call_t *k, hcomm__call_kind_t kind,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root, uint64_t count);
/* The algorithm k runs: sig_algo into its signature and flight entry (deterministic mode
 * named), algo for hcomm__coll_take_algo. */
void hcomm__call_chosen(hcomm__call_t *k, int sig_algo, int algo);
/* Ends call k with res: tells the peers of an out-of-memory failure, records a timed
 * candidate, marks the flight entry, logs a failure; returns res (with a hint on a timeout of a
 * comm that mixes blocking and nonblocking calls). */
hcomm_result_t hcomm__call_end(hcomm__call_t *k, hcomm_result_t res);

/* A digest and a short description of what a call's count cannot say (a DP tensor list):
 * carried in the signature of the calls that follow until hcomm__coll_clear_extra. */
void hcomm__coll_set_extra(hcomm_comm_t *c, uint64_t digest, const char *desc);
void hcomm__coll_clear_extra(hcomm_comm_t *c);

/* Collective calls made on c so far (each sequence number) and the signature agreements run
 * before native calls among them: what tests count per MoE dispatch. */
void hcomm__coll_counts(hcomm_comm_t *c, uint64_t *calls, uint64_t *agreements);

/* The name of the algorithm the last collective on c chose since the previous ask (NULL if
 * none chose one), so hcomm-bench can report what the automatic choice picked. */
const char *hcomm__coll_take_algo(hcomm_comm_t *c);

/* True when a collective on c since the previous ask was one of the calls that time two
 * candidates near a switch (tune.h): the same on every rank of c, so hcomm-bench can run auto
 * past those calls before it times it. */
bool hcomm__coll_take_probed(hcomm_comm_t *c);

#endif /* HCOMM_C_ALGO_CALL_H_ */
