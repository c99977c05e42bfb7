/* The point-to-point layer's private state (p2p.h is its interface and says the rules it keeps):
 * requests, unexpected messages, the per-communicator state, and the helpers the layer's files
 * share. progress.c defines what is declared here.
 *
 * The files form a stack; each calls only those below it:
 *   progress.c  the base: the state's life, requests, and one progress round (each frame the
 *               transport hands over is matched, kept as unexpected, or taken as a failure
 *               notice or a withdrawal; pulls and detached sends advance). Creating the state
 *               registers that round as the communicator's idle work, so both live here.
 *   notice.c    collective bookkeeping: failure notices sent, peers' verdicts, finished calls.
 *   wait.c      completion: test, wait, cancel, why a wait must end, probe.
 *   post.c      posting: isend/irecv (a new receive matched against the unexpected queue),
 *               blocking send/recv, batches.
 *   lane.c and board.c use notice.c's verdict only (through p2p.h).
 * The state lookup every message makes is static inline here; a new request, landing a
 * message that came before its receive and the progress engine the waits drive are calls into
 * progress.c, which release builds inline at link time (HCOMM_LTO). */
#ifndef HCOMM_C_P2P_PROGRESS_H_
#define HCOMM_C_P2P_PROGRESS_H_

#include "p2p/p2p.h"

#include <stdlib.h>
#include <string.h>

typedef enum { REQ_POSTED, REQ_PULLING, REQ_RESCUED, REQ_DONE, REQ_GROUPED } req_state_t;

/* A message that arrived before its receive. */
typedef struct uxm {
    struct uxm *next;
    int src;
    hcomm__env_t env;
    void *data;     /* eager copy, or the rescue buffer of a pulled rendezvous message */
    bool rndv;      /* the payload is still at the sender (unless pulled) */
    bool pulled;    /* rescue: a pull into data was started */
    bool arrived;   /* rescue pull finished */
    size_t charged; /* bytes counted against the unexpected budget */
    hcomm__rndv_t rv;
    hcomm__treq_t rx;
} uxm_t;

struct hcomm__req {
    hcomm_comm_t *c;
    struct hcomm__req *next; /* posted queue, group list or free list */
    req_state_t state;
    bool is_recv, rndv;
    hcomm__recv_mode_t mode;
    int peer, channel, tag;
    void *buf;
    size_t cap;
    uxm_t *rescued; /* REQ_RESCUED: the unexpected message whose pull is still running */
    bool expect;    /* the sender's dtype and shape must equal expected's */
    bool abandoned; /* given up while the transport may still touch it: never reused */
    hcomm_result_t res;
    /* Not cleared per request (a latency-bound exchange pays for every byte it touches): */
    hcomm__env_t env; /* sent, or matched; set before use */
    hcomm__env_t expected;
    char msg[256]; /* valid when res != HCOMM_OK */
    hcomm__treq_t tr;
};

typedef struct peer_err {
    uint32_t seq;
    int src;
    hcomm_result_t why;
    char text[256];
} peer_err_t;

typedef struct p2p {
    hcomm__req_t *posted_head, *posted_tail;
    uxm_t *ux_head, *ux_tail;
    size_t ux_bytes;
    uxm_t *draining;         /* stale or refused rendezvous messages being pulled into scratch */
    hcomm__req_t *detached;  /* sends nobody waits for (peer-failure notices) */
    int32_t *next_id;        /* [size] number of the next message to each peer */
    unsigned long delivered; /* frames the transport handed over so far */
    bool abort_told;         /* peers were told of this rank's hcomm_comm_abort() */
    int aborted_by; /* 1 + the first peer whose abort notice came (0: none): it makes no more calls
                     */
    hcomm__req_t *free_reqs;
    int free_count;
    hcomm__req_t *group_head, *group_tail;
    bool in_group;
    int rescue;          /* > 0 while a blocking send waits */
    bool rescue_blocked; /* an unexpected rendezvous message did not fit the budget: */
    int rb_src, rb_tag, rb_channel;
    size_t rb_bytes;
    bool full; /* a message could not be kept: the budget is spent */
    int full_src, full_tag, full_channel;
    size_t full_bytes;
    bool coll_started;
    uint32_t coll_done; /* last finished collective seq on this rank */
    peer_err_t *errs;   /* one per failed call this rank has not finished yet */
    int nerrs, errs_cap;
} p2p_t;

/* "user", "collective", "control": the channels as messages name them. */
extern const char *const hcomm__p2p_channel_names[HCOMM__CH_COUNT];

/* Creates c's state (NULL: out of memory): p2p_of's first call. */
p2p_t *hcomm__p2p_create(hcomm_comm_t *c);
/* A request of c, zeroed up to its envelope (HCOMM_ERR_NOMEM recorded where none is left). */
hcomm_result_t hcomm__p2p_req_new(hcomm_comm_t *c, hcomm__req_t **out);
/* Completes r with res and the thread's last error (the transport's) as r's message. */
void hcomm__p2p_req_failed(hcomm__req_t *r, hcomm_result_t res);
/* Whether receive r takes a message of env (its dtype and shape where r stated them, its size,
 * the buffer of an HCOMM__RECV_ALLOC receive); otherwise r failed, naming why. */
bool hcomm__p2p_accepts(hcomm__req_t *r, const hcomm__env_t *env);
/* Gives a matched eager payload or rendezvous handle (rv) to receive r. */
void hcomm__p2p_land(hcomm_comm_t *c, hcomm__req_t *r, int src, const hcomm__env_t *env,
                     const void *payload, const hcomm__rndv_t *rv);
/* Pulls a rendezvous message nobody keeps (stale, or refused) into scratch and drops it. */
void hcomm__p2p_drain_rndv(hcomm_comm_t *c, int src, const hcomm__env_t *env,
                           const hcomm__rndv_t *rv);

/* c's state, created on first use (NULL: out of memory). */
static inline p2p_t *p2p_of(hcomm_comm_t *c) {
    p2p_t *p = c->layer[HCOMM__LAYER_P2P];
    if (p)
        return p;
    return hcomm__p2p_create(c);
}

/* Seq a is before b, modulo 2^32. */
static inline bool seq_before(uint32_t a, uint32_t b) {
    return (int32_t)(a - b) < 0;
}

/* A collective message of a call this rank already finished. */
static inline bool stale(const p2p_t *p, const hcomm__env_t *env) {
    return env->channel == HCOMM__CH_COLL && p->coll_started &&
           !seq_before(p->coll_done, (uint32_t)env->tag);
}

static inline bool key_matches(int peer, int channel, int tag, int src, const hcomm__env_t *env) {
    return peer == src && channel == env->channel && tag == env->tag;
}

/* The posted-receive and unexpected-message queues: linked through `next` from head to tail. */
#define QUEUE_APPEND(head, tail, x)                                                                \
    do {                                                                                           \
        if (tail)                                                                                  \
            (tail)->next = (x);                                                                    \
        else                                                                                       \
            (head) = (x);                                                                          \
        (tail) = (x);                                                                              \
    } while (0)

/* Unlinks x, which follows prev (NULL: x is the head). */
#define QUEUE_UNLINK(head, tail, prev, x)                                                          \
    do {                                                                                           \
        if (prev)                                                                                  \
            (prev)->next = (x)->next;                                                              \
        else                                                                                       \
            (head) = (x)->next;                                                                    \
        if ((tail) == (x))                                                                         \
            (tail) = (prev);                                                                       \
        (x)->next = NULL;                                                                          \
    } while (0)

static inline void posted_unlink(p2p_t *p, hcomm__req_t *prev, hcomm__req_t *r) {
    QUEUE_UNLINK(p->posted_head, p->posted_tail, prev, r);
}

static inline void ux_unlink(p2p_t *p, uxm_t *prev, uxm_t *u) {
    QUEUE_UNLINK(p->ux_head, p->ux_tail, prev, u);
}

/* Keeps a few requests for reuse, so steady traffic does not call malloc. */
static inline void req_release(hcomm__req_t *r) {
    p2p_t *p = p2p_of(r->c);
    if (p && p->free_count < 64) {
        r->next = p->free_reqs;
        p->free_reqs = r;
        p->free_count++;
        return;
    }
    free(r);
}

static inline void req_finish(hcomm__req_t *r, hcomm_result_t res) {
    r->state = REQ_DONE;
    if (r->res == HCOMM_OK)
        r->res = res;
}

/* Copies a rescued message once its pull finished; frees the unexpected entry. */
static inline void finish_rescued(hcomm__req_t *r) {
    uxm_t *u = r->rescued;
    p2p_t *p = p2p_of(r->c);
    if (r->res == HCOMM_OK && u->env.bytes)
        memcpy(r->buf, u->data, (size_t)u->env.bytes);
    p->ux_bytes -= u->charged;
    free(u->data);
    free(u);
    r->rescued = NULL;
    req_finish(r, HCOMM_OK);
}

/* Advances r without polling the transport; true once it is done. */
static inline bool advance(hcomm__req_t *r) {
    hcomm_comm_t *c = r->c;
    hcomm_result_t res = HCOMM_OK;
    switch (r->state) {
    case REQ_POSTED:
        if (!r->is_recv && c->tr->test_tx(c, &r->tr, &res))
            req_finish(r, res);
        break;
    case REQ_PULLING:
        if (c->tr->test_rx(c, &r->tr, &res))
            req_finish(r, res);
        break;
    case REQ_RESCUED:
        if (!r->rescued->arrived && c->tr->test_rx(c, &r->rescued->rx, &res))
            r->rescued->arrived = true;
        if (r->rescued->arrived)
            finish_rescued(r);
        break;
    default:
        break;
    }
    return r->state == REQ_DONE;
}

#endif /* HCOMM_C_P2P_PROGRESS_H_ */
