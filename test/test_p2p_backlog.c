/* Backlogged point-to-point: a send that returned complete is receivable without any further
 * call by its sender (HCOMM_TEST_MPI: also runs under mpirun). Each even rank 2k sends bursts
 * to rank 2k+1 on a communicator split off the world, then waits in barriers on the world
 * (once after a sleep) and makes no other call on the pair's communicator; the receiver must
 * get every message, in order, with the right contents. The local transport's per-pair rings
 * hold 64 frames, so 65 is the smallest burst past them; where the sends are eager the
 * receiver starts only once the whole burst is queued, so it does not depend on timing. */
#include "harness.h"

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define MAX_WORLD 4
#define BIG_WORDS 256 /* 1 KiB: above what a frame carries inline on local */

/* A stalled receive fails within seconds, not after HCOMM_TIMEOUT. */
static const double PAIR_TIMEOUT_S = 5.0;

typedef struct burst {
    int count;     /* messages */
    bool mixed;    /* every 7th message is BIG_WORDS long, the rest one word */
    long sleep_ms; /* the sender sleeps this long after its sends, before the barrier */
    bool queued;   /* the receiver starts after the whole burst is queued (eager sends only) */
} burst_t;

static const burst_t BURSTS[] = {
    {65, false, 0, true}, {3000, false, 200, false}, {3000, false, 0, true}, {500, true, 0, true}};

/* Whether a send of BIG_WORDS words completes before its receive (HCOMM_EAGER_LIMIT, 8 KiB by
 * default); if not, a sender cannot queue a whole burst before its receiver starts. */
static bool sends_eager(void) {
    const char *s = getenv("HCOMM_EAGER_LIMIT");
    if (!s)
        return true;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    v <<= *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 : 0;
    return v >= BIG_WORDS * sizeof(int32_t);
}

/* Word j of message m of burst b from world rank src: distinct per sender, burst, message. */
static int32_t word_of(int src, int b, int m, size_t j) {
    return (int32_t)(src * 1000003 + b * 65537 + m * 7 + (int)j);
}

static size_t words_of(const burst_t *b, int m) {
    return b->mixed && m % 7 == 3 ? BIG_WORDS : 1;
}

static hcomm_tensor_t tensor_of(int32_t *buf, size_t words) {
    int64_t shape[1] = {(int64_t)words};
    hcomm_tensor_t t;
    hcomm_tensor_init(&t, buf, HCOMM_I32, 1, shape);
    return t;
}

static hcomm_result_t send_burst(hcomm_comm_t *pair, int src, int bi) {
    const burst_t *b = &BURSTS[bi];
    int32_t buf[BIG_WORDS];
    for (int m = 0; m < b->count; m++) {
        size_t n = words_of(b, m);
        for (size_t j = 0; j < n; j++)
            buf[j] = word_of(src, bi, m, j);
        hcomm_tensor_t t = tensor_of(buf, n);
        T_TRY(hcomm_pp_send(pair, &t, 1, bi));
    }
    if (b->sleep_ms > 0)
        nanosleep(&(struct timespec){0, b->sleep_ms * 1000000L}, NULL);
    return HCOMM_OK;
}

/* Receives burst bi from world rank src and checks it; reports the first wrong message. */
static hcomm_result_t recv_burst(hcomm_comm_t *pair, int src, int bi) {
    const burst_t *b = &BURSTS[bi];
    int32_t buf[BIG_WORDS];
    int bad = -1;
    size_t bad_j = 0;
    for (int m = 0; m < b->count; m++) {
        size_t n = words_of(b, m);
        hcomm_tensor_t t = tensor_of(buf, n);
        hcomm_result_t r = hcomm_pp_recv(pair, &t, 0, bi);
        T_CHECK(r == HCOMM_OK, "burst %d (%d messages): receive %d from rank %d returned %s (%s)",
                bi, b->count, m, src, hcomm_result_name(r), hcomm_last_error());
        if (r != HCOMM_OK)
            return r;
        for (size_t j = 0; j < n && bad < 0; j++)
            if (buf[j] != word_of(src, bi, m, j))
                bad = m, bad_j = j;
    }
    T_CHECK(bad < 0, "burst %d: word %zu of message %d from rank %d is wrong (order or contents)",
            bi, bad_j, bad, src);
    return HCOMM_OK;
}

/* One burst per barrier: the sender's waits are on the world, never on the pair's comm. */
static hcomm_result_t run_bursts(hcomm_comm_t *world, hcomm_comm_t *pair) {
    int me = t_rank(world);
    bool sender = t_size(pair) == 2 && t_rank(pair) == 0;
    bool receiver = t_size(pair) == 2 && !sender;
    for (int bi = 0; bi < (int)(sizeof BURSTS / sizeof BURSTS[0]); bi++) {
        if (sender)
            T_TRY(send_burst(pair, me, bi));
        if (BURSTS[bi].queued && sends_eager())
            T_TRY(hcomm_barrier(world)); /* every send of the burst is queued */
        if (receiver)
            T_TRY(recv_burst(pair, me - 1, bi));
        T_TRY(hcomm_barrier(world));
    }
    return HCOMM_OK;
}

static hcomm_result_t backlog_world(hcomm_comm_t *world, void *arg) {
    (void)arg;
    hcomm_comm_t *pair = NULL;
    int me = t_rank(world);
    T_TRY(hcomm_comm_split(world, me / 2, me, &pair));
    T_TRY(hcomm_comm_set_timeout(pair, PAIR_TIMEOUT_S));
    hcomm_result_t r = run_bursts(world, pair);
    if (r != HCOMM_OK)
        return r;
    T_TRY(hcomm_comm_destroy(pair));
    return hcomm_barrier(world);
}

int main(void) {
    t_for_each_world(backlog_world, NULL, MAX_WORLD);
    return t_finish("test_p2p_backlog");
}
