/* A call's signature (call kind, dtype, op, root, count, extra, algorithm), which every rank of
 * a collective must share, and the one wording of a difference: "hcomm_all_reduce: count=8 on
 * rank 0 but count=5 on rank 1", lower rank first, the same on every rank (sig.c). */
#ifndef HCOMM_C_ALGO_SIG_H_
#define HCOMM_C_ALGO_SIG_H_

#include "algo/state.h"

/* "all_reduce", "a nonblocking collective", ... and what the kind calls its count ("count",
 * "recvcount", "bytes"); "?" / "count" for a kind out of range. */
const char *hcomm__call_name(uint32_t kind);
const char *hcomm__call_count_name(uint32_t kind);
/* "sum", "prod", ... ("?" out of range). */
const char *hcomm__op_name(int op);

/* The signature as the shared-memory transports and the board post it (five words). */
static inline hcomm__posted_sig_t hcomm__sig_post(const hcomm__sig_t *s) {
    hcomm__posted_sig_t p = {.words = {s->call | (uint64_t)(uint32_t)s->algo << 32,
                                       (uint32_t)s->dtype | (uint64_t)(uint32_t)s->op << 32,
                                       (uint64_t)(int64_t)s->root, s->count, s->extra}};
    return p;
}

/* A v-call's signature: the total of counts[0..size) in count (and returned), their digest
 * in extra. */
uint64_t hcomm__sig_counts(hcomm__call_t *k, const size_t *counts);

/* Compares a peer's signature with the call's; a difference is worded, reported to every peer
 * and returned (HCOMM_ERR_MISMATCH). */
hcomm_result_t hcomm__sig_check(hcomm__call_t *k, int peer, const hcomm__sig_t *theirs);

/* The verdict on a meeting every rank reads alike (the transport's posted slots, or the board
 * when on_board): the first rank that failed its own checks (HCOMM_ERR_PEER naming it) or posted
 * another signature than rank 0's (HCOMM_ERR_MISMATCH), else HCOMM_OK. */
hcomm_result_t hcomm__sig_verdict(hcomm__call_t *k, const hcomm__posted_sig_t *mine, bool on_board);
/* After a posted check failed on every rank: the verdict from the slots, which it then
 * releases (transport.posted_release). */
hcomm_result_t hcomm__sig_posted_verdict(hcomm__call_t *k, const hcomm__posted_sig_t *mine);

#endif /* HCOMM_C_ALGO_SIG_H_ */
