/* hcomm's point-to-point layer, one implementation over every transport.
 *
 * Every message carries an envelope {channel, tag, bytes, call signature, dtype, shape}.
 * Channels keep user traffic (PP), collective-algorithm traffic (tag = the call's sequence
 * number) and control messages (peer-failure notices) apart, so they never match each other.
 * Matching follows MPI: a posted-receive queue and an unexpected-message queue per
 * communicator, keyed by (source, channel, tag) and searched in posting / arrival order, so
 * messages of one key are non-overtaking, receives match in the order posted, and a blocking
 * receive never takes a message an earlier irecv matches (it is an irecv plus a wait).
 * Messages up to c->eager_limit bytes go eager; larger ones rendezvous (the receiver pulls
 * the data once, straight from the sender's buffer into the posted receive buffer). Eager
 * messages that arrive before their receive are kept, up to c->unexpected_cap bytes per
 * communicator; past that the waiting call fails naming the peer and tag. While a rank waits
 * in a blocking send it also pulls unexpected rendezvous messages into that budget, so two
 * peers that both send and then receive always complete.
 * Requests carry their own result and message: whoever waits gets the error of that request.
 * Not thread-safe per communicator (one thread drives a comm), as the transport.
 * Files: post.c posts sends and receives (batches too), wait.c completes them, progress.c
 * matches what arrives (the layer's private state: progress.h), notice.c keeps the collective
 * bookkeeping, lane.c runs the lane, board.c the meetings. */
#ifndef HCOMM_C_P2P_H_
#define HCOMM_C_P2P_H_

#include "transport/transport.h"

typedef enum {
    HCOMM__CH_USER = 0,
    HCOMM__CH_COLL,
    HCOMM__CH_CTRL,
    HCOMM__CH_COUNT
} hcomm__channel_t;

/* The call a collective message belongs to; peers compare it field by field. */
typedef struct hcomm__sig {
    uint32_t call; /* the algorithms layer's call kind */
    int32_t dtype, op, root;
    uint64_t count; /* elements or bytes, as the call defines */
    uint64_t extra; /* a digest of what count cannot say (DP tensor lists, v-call counts) */
    int32_t algo;   /* the algorithm this rank chose (ranks must agree) */
} hcomm__sig_t;

enum { HCOMM__ENV_DATA = 1, HCOMM__ENV_ERROR = 2, HCOMM__ENV_WITHDRAW = 3 };

typedef struct hcomm__env {
    uint8_t kind;    /* HCOMM__ENV_* */
    uint8_t channel; /* hcomm__channel_t */
    uint8_t has_desc;
    uint8_t ndim;
    int32_t tag;
    int32_t dtype;
    int32_t result; /* ENV_ERROR: the failing rank's result; else the message's number from
                     * its sender to this receiver (ENV_WITHDRAW: the one withdrawn) */
    uint64_t bytes;
    hcomm__sig_t sig;
    int64_t shape[HCOMM_MAX_DIMS];
} hcomm__env_t;

_Static_assert(sizeof(hcomm__env_t) <= HCOMM__HDR_BYTES, "the envelope fits a frame header");

typedef struct hcomm__req hcomm__req_t;

/* How a receive treats the incoming size: exactly cap bytes (else HCOMM_ERR_MISMATCH, the
 * message consumed), up to cap, or any size into a buffer p2p allocates (freed by the caller
 * with hcomm_mem_free() after hcomm__wait returned it). */
typedef enum { HCOMM__RECV_EXACT, HCOMM__RECV_UPTO, HCOMM__RECV_ALLOC } hcomm__recv_mode_t;

/* Starts sending bytes from buf to peer with (channel, tag). desc (may be NULL) supplies the
 * envelope's sig, dtype and shape. buf must stay untouched until the request completes. */
hcomm_result_t hcomm__isend(hcomm_comm_t *c, int channel, int tag, int peer, const void *buf,
                            size_t bytes, const hcomm__env_t *desc, hcomm__req_t **req);
hcomm_result_t hcomm__irecv(hcomm_comm_t *c, int channel, int tag, int peer, void *buf, size_t cap,
                            hcomm__recv_mode_t mode, hcomm__req_t **req);
/* As hcomm__irecv (exactly cap bytes into buf), and the sender's envelope must carry the
 * dtype and shape of expected (has_desc set): otherwise HCOMM_ERR_MISMATCH naming both, checked
 * before any byte lands (the message is consumed). */
hcomm_result_t hcomm__irecv_tensor(hcomm_comm_t *c, int channel, int tag, int peer, void *buf,
                                   size_t cap, const hcomm__env_t *expected, hcomm__req_t **req);
/* Makes progress; *done tells whether req completed (then wait returns at once). */
hcomm_result_t hcomm__test(hcomm__req_t *req, bool *done);
/* Completes and frees req. env (may be NULL) gets the matched envelope of a receive; *data
 * (may be NULL) the buffer of an HCOMM__RECV_ALLOC receive. On a timeout or abort the
 * request is cancelled. */
hcomm_result_t hcomm__wait(hcomm__req_t *req, hcomm__env_t *env, void **data);
/* Completes and frees every request (NULL entries skipped); the first failure is returned. */
hcomm_result_t hcomm__wait_all(hcomm__req_t **reqs, int n);
hcomm_result_t hcomm__send(hcomm_comm_t *c, int channel, int tag, int peer, const void *buf,
                           size_t bytes, const hcomm__env_t *desc);
hcomm_result_t hcomm__recv(hcomm_comm_t *c, int channel, int tag, int peer, void *buf, size_t cap,
                           hcomm__recv_mode_t mode, hcomm__env_t *env);
/* Waits until a message of (channel, tag) from peer is available that no posted receive
 * took, and fills env with its envelope without receiving it; the next receive of that key
 * gets it. */
hcomm_result_t hcomm__probe(hcomm_comm_t *c, int channel, int tag, int peer, hcomm__env_t *env);

/* A batch: between group_start and group_end, isend/irecv only record; group_end posts the
 * receives, then the sends, and completes them all, whatever order peers posted theirs in.
 * The requests the batch handed out are completed and freed by group_end. */
hcomm_result_t hcomm__group_start(hcomm_comm_t *c);
hcomm_result_t hcomm__group_end(hcomm_comm_t *c);
/* As group_end but returns once everything is posted: the requests stay their creators' to
 * wait on. */
hcomm_result_t hcomm__group_post(hcomm_comm_t *c);
bool hcomm__group_open(hcomm_comm_t *c);

/* The lane (transport.lane_post, where the transport has one): the small messages of
 * latency-bound collectives without frames or matching. A lane message is HCOMM__LANE_HDR
 * bytes of header (the call's sequence number and signature, written here) and then the
 * payload; callers leave that room at the front of their send and receive buffers. */
#define HCOMM__LANE_HDR 64
/* The most payload bytes one lane message of c carries; 0: c has no lane. A caller that uses
 * the lane for some messages of a call must use it for all of them on every rank (what the
 * ranks send may differ when their calls do), so it cuts its data into pieces of this size. */
size_t hcomm__lane_payload(const hcomm_comm_t *c);
/* One step of call seq: sends sbytes of payload (at sbuf + HCOMM__LANE_HDR) with sig to rank
 * `to` (-1: nothing to send) and receives up to rcap payload bytes from rank `from` (-1:
 * nothing) into rbuf + HCOMM__LANE_HDR; *got_sig and *got tell the sender's signature and
 * payload bytes. Waits as hcomm__wait does: a peer's failure notice for seq, an abort or
 * HCOMM_TIMEOUT ends it. */
hcomm_result_t hcomm__lane_step(hcomm_comm_t *c, uint32_t seq, const hcomm__sig_t *sig, int to,
                                void *sbuf, size_t sbytes, int from, void *rbuf, size_t rcap,
                                hcomm__sig_t *got_sig, size_t *got);

/* Collective-call bookkeeping. A rank whose own checks failed in call seq tells every peer
 * (one control message each, text included); peers waiting on that call's messages fail with
 * the notice (see hcomm__peer_error). coll_done marks seq finished on this rank: later
 * messages of it (and older calls) are dropped on arrival instead of kept. */
hcomm_result_t hcomm__notify_error(hcomm_comm_t *c, uint32_t seq, hcomm_result_t why,
                                   const char *text);
/* True when a peer's notice for seq arrived: *src, *why and text (cap bytes) tell it. */
bool hcomm__peer_error(hcomm_comm_t *c, uint32_t seq, int *src, hcomm_result_t *why, char *text,
                       size_t cap);
void hcomm__coll_done(hcomm_comm_t *c, uint32_t seq);
/* Why a wait inside collective call seq must end now (HCOMM_OK: keep waiting), for waits
 * outside p2p requests (the lane, the board): a peer's failure notice for seq, a failed world,
 * hcomm_comm_abort (its peers are told), or waited > HCOMM_TIMEOUT; what names the awaited
 * event in the message ("a message from rank 1 (collective channel, tag 5)"). Polls. */
hcomm_result_t hcomm__coll_wait_verdict(hcomm_comm_t *c, uint32_t seq, const char *what,
                                        double waited);
/* After hcomm_comm_abort() on c, where this rank first finds it (a wait, a call's start):
 * tells the peers once, so that every wait of theirs on c ends with HCOMM_ERR_PEER naming the
 * abort from then on instead of at their timeout; returns HCOMM_ERR_ABORTED. */
hcomm_result_t hcomm__comm_aborted(hcomm_comm_t *c);
/* The telling alone, for a call that failed below this layer (an abandoned MPI operation). */
void hcomm__abort_tell(hcomm_comm_t *c);
/* One progress round (poll the transport, advance pulls): for waits outside p2p requests. */
hcomm_result_t hcomm__progress(hcomm_comm_t *c);
/* Unexpected-message bytes held now (for tests and the leak check). */
size_t hcomm__unexpected_bytes(hcomm_comm_t *c);

/* Meetings on the transport's board (transport.board: one node; board.c). In a meeting every
 * member posts a signature (and a payload of up to HCOMM__BOARD_ROOM bytes) in its own region,
 * waits until every member posted the same meeting, reads what it needs of theirs and leaves.
 * A region has two halves used in turn, so a rank may post its next meeting while peers still
 * read its last; before it reuses a half it waits until no peer can still read it. Meetings
 * are numbered by the call's sequence number seq and a step within the call, which every rank
 * takes in the same increasing order; a rank may post without waiting (a rank whose own
 * checks failed) and need not join calls its peers do not meet in. Waits end as hcomm__wait's
 * do: a peer's failure notice for seq, an abort, or HCOMM_TIMEOUT. */
bool hcomm__board_on(hcomm_comm_t *c);
/* Where this rank writes the payload of its next meeting (before hcomm__board_meet): room for
 * `bytes`, at most HCOMM__BOARD_ROOM; up to 8 bytes travel in the post's own cache line. */
hcomm_result_t hcomm__board_space(hcomm_comm_t *c, uint32_t seq, size_t bytes, void **data);
/* Whose posts hcomm__board_meet waits for: every member's, none, or (a rank >= 0) that one's. */
enum { HCOMM__MEET_ALL = -1, HCOMM__MEET_NONE = -2 };
/* Posts sig (failed and failed_text too) for meeting (seq, step); waits for the posts of
 * wait_for (above) and fails with HCOMM_ERR_MISMATCH naming a rank that went past it. The
 * meeting is left already on return unless it waited for a post and returns HCOMM_OK. */
hcomm_result_t hcomm__board_meet(hcomm_comm_t *c, uint32_t seq, uint32_t step,
                                 const hcomm__posted_sig_t *sig, int wait_for);
/* After a meeting: rank r's signature and payload (either may be NULL), valid until leave. */
void hcomm__board_peer(hcomm_comm_t *c, int r, hcomm__posted_sig_t *sig, const void **data);
void hcomm__board_leave(hcomm_comm_t *c);

#endif /* HCOMM_C_P2P_H_ */
