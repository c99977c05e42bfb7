/* The failure flags of hcomm-train: --max-failures (recovery in the job, real/recover.c) and
 * --inject-failure (a rank that stops for good at a chosen step). */
#include "opts.h"

#include <stdlib.h>
#include <string.h>

static int parse_inject(train_opts_t *o, FILE *err) {
    const int world = o->tp * o->cp * o->pp * o->dp; /* opts_validate checked its bound */
    o->inject_rank = o->inject_step = -1;
    if (o->inject_failure == NULL)
        return 0;
    char *end = NULL;
    long rank = strtol(o->inject_failure, &end, 10), step = -1;
    if (end != o->inject_failure && *end == ':') {
        const char *s = end + 1;
        step = strtol(s, &end, 10);
        if (end == s || *end != '\0')
            step = -1;
    }
    if (rank < 0 || step < 0 || rank >= world || step >= o->steps) {
        fprintf(err,
                "hcomm-train: --inject-failure %s: expected RANK:STEP with RANK in 0..%d and STEP "
                "in 0..%d\n",
                o->inject_failure, world - 1, o->steps - 1);
        return -1;
    }
    o->inject_rank = (int)rank;
    o->inject_step = (int)step;
    return 0;
}

/* In-job recovery drops whole replicas, which only works where every replica holds the whole
 * state: the flag that breaks that is named. */
static const char *recovery_conflict(const train_opts_t *o) {
    if (o->ep != 1)
        return "--ep (experts are split over DP ranks; use --ep 1)";
    if (o->zero != 0 && (o->dp_shard == 0 || o->dp_shard == o->dp))
        return "--zero without HSDP (the state is sharded over every DP rank: no replica "
               "survives a lost rank; use --dp-shard smaller than --dp, or --zero 0)";
    if (o->dp < 2)
        return "--dp (a run survives a lost replica only with another one; use --dp 2 or more)";
    return NULL;
}

/* DP ranks one lost rank takes away: its whole replica (under HSDP, its shard group). */
static int replica_dp(const train_opts_t *o) {
    return o->zero != 0 && o->dp_shard > 0 ? o->dp_shard : 1;
}

int opts_validate_fault(train_opts_t *o, FILE *err) {
    if (parse_inject(o, err) != 0)
        return -1;
    if (o->max_failures == 0)
        return 0;
    const char *conflict = recovery_conflict(o);
    if (conflict != NULL) {
        fprintf(err, "hcomm-train: --max-failures %d conflicts with %s\n", o->max_failures,
                conflict);
        return -1;
    }
    const int rd = replica_dp(o), last = o->dp - o->max_failures * rd;
    for (int lost = 1; lost <= o->max_failures && lost * rd < o->dp; lost++)
        if (o->batch % ((o->dp - lost * rd) * o->micro_batches) != 0) {
            fprintf(err,
                    "hcomm-train: --max-failures %d: after %d lost replica%s --dp is %d, and "
                    "--batch %d is not divisible by dp * micro-batches = %d; pick a --batch "
                    "that every dp down to %d divides\n",
                    o->max_failures, lost, lost == 1 ? "" : "s", o->dp - lost * rd, o->batch,
                    (o->dp - lost * rd) * o->micro_batches, last > 0 ? last : rd);
            return -1;
        }
    return 0;
}
