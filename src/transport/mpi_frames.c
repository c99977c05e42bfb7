/* The mpi transport's frames and lane (mpi_base.h): every hcomm communicator owns a duplicate
 * MPI communicator, on which frames travel with FRAME_TAG into RECV_DEPTH receives posted
 * ahead (or, between members on one node, through the rings of mpi_ring.c), rendezvous
 * payloads on a data tag of their own once the receiver says it is ready, and lane messages on
 * a tag per call sequence number. */
#include "transport/mpi_base.h"

#include <stdlib.h>
#include <string.h>

/* On every hcomm communicator: frames use FRAME_TAG, rendezvous payloads DATA_TAG_MIN up to
 * lane_base - 1, lane messages lane_base up to the tag bound. */
#define FRAME_TAG 1
#define DATA_TAG_MIN 2
/* Tag 0 carries only hcomm__mpi_frames_drain's goodbyes. */
#define BYE_TAG 0

/* What precedes the p2p header on the wire. */
typedef struct wire {
    int32_t data_tag; /* rendezvous: the tag its payload travels with; 0 for eager */
    int32_t cts;      /* 1: a clear-to-send for data_tag (no p2p header follows) */
    uint64_t bytes;
} wire_t;

#define WIRE_HDR (sizeof(wire_t) + HCOMM__HDR_BYTES)

/* A send: its frame, and for a rendezvous the payload, which is posted only once the receiver
 * has posted its receive and said so (a clear-to-send frame): until then MPI holds no reference
 * to the sender's buffer, so a send that times out can be withdrawn safely. */
typedef struct mpi_tx {
    MPI_Request frame, data;
    void *heap;
    struct mpi_tx *next_wait; /* the comm's list of rendezvous sends awaiting clear-to-send */
    const void *payload;
    int bytes, peer, data_tag;
    bool awaiting;
    unsigned char stage[sizeof(hcomm__treq_t) - 2 * sizeof(MPI_Request) - 3 * sizeof(void *) -
                        4 * sizeof(int) - 8];
} mpi_tx_t;

_Static_assert(sizeof(mpi_tx_t) <= sizeof(hcomm__treq_t), "mpi_tx_t fits a request");

static hcomm_result_t post_frame_recv(hcomm_comm_t *c, int i) {
    mpi_impl_t *m = impl_of(c);
    int rc = MPI_Irecv(m->rbuf[i], (int)m->rbuf_bytes, MPI_BYTE, MPI_ANY_SOURCE, FRAME_TAG, m->comm,
                       &m->rreq[i]);
    return rc == MPI_SUCCESS ? HCOMM_OK : hcomm__mpi_fail(c->call_fn, "MPI_Irecv", rc);
}

hcomm_result_t hcomm__mpi_frames_init(const char *fn, hcomm_comm_t *c) {
    mpi_impl_t *m = impl_of(c);
    size_t eager = c->eager_limit > 256 ? c->eager_limit : 256; /* notices always go eager */
    m->rbuf_bytes = WIRE_HDR + eager;
    m->next_tag = calloc((size_t)c->size, sizeof *m->next_tag);
    void *ub = NULL;
    int flag = 0;
    MPI_Comm_get_attr(m->comm, MPI_TAG_UB, &ub, &flag);
    m->tag_ub = flag && ub ? *(int *)ub : 32767;
    m->lane_base = DATA_TAG_MIN + (m->tag_ub - DATA_TAG_MIN + 1) / 2;
    /* a mask, not a modulo: a lane step computes two tags, and a division costs more than the
     * rest of the tag's arithmetic */
    m->lane_mask = 1;
    while (m->lane_mask * 2 <= (uint32_t)(m->tag_ub - m->lane_base + 1))
        m->lane_mask *= 2;
    m->lane_mask -= 1;
    for (int i = 0; i < RECV_DEPTH; i++) {
        m->rreq[i] = MPI_REQUEST_NULL;
        m->rbuf[i] = malloc(m->rbuf_bytes);
    }
    for (int i = 0; i < STAGE_SLOTS; i++)
        m->sreq[i] = MPI_REQUEST_NULL;
    m->stage = malloc(sizeof *m->stage * STAGE_SLOTS); /* NULL: every frame uses its request */
    for (int i = 0; i < RECV_DEPTH; i++)
        if (!m->rbuf[i] || !m->next_tag)
            return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for receive buffers");
    for (int i = 0; i < RECV_DEPTH; i++)
        HCOMM__TRY(post_frame_recv(c, i));
    return HCOMM_OK;
}

/* A staged send still in flight keeps its slot's memory alive: then the slots are leaked. */
static void stage_free(mpi_impl_t *m) {
    bool busy = false;
    for (int i = 0; i < STAGE_SLOTS; i++) {
        int done = 1;
        if (m->sreq[i] != MPI_REQUEST_NULL)
            MPI_Test(&m->sreq[i], &done, MPI_STATUS_IGNORE);
        if (!done) {
            MPI_Request_free(&m->sreq[i]);
            busy = true;
        }
    }
    if (!busy)
        free(m->stage);
    m->stage = NULL;
}

void hcomm__mpi_frames_free(mpi_impl_t *m) {
    stage_free(m);
    for (int i = 0; i < RECV_DEPTH; i++) {
        int done = 1;
        if (m->rreq[i] != MPI_REQUEST_NULL) { /* drain gave it up: it matched a lost process */
            MPI_Cancel(&m->rreq[i]);
            MPI_Test(&m->rreq[i], &done, MPI_STATUS_IGNORE);
        }
        if (done)
            free(m->rbuf[i]); /* else MPI may still write into it: left */
    }
    free(m->next_tag);
}

/* --- the goodbye before MPI_Comm_free --- */

/* Receives and drops one message waiting on the comm (any tag); *src is its sender when it
 * was a goodbye, else -1. False when none waits. */
static bool drop_one(mpi_impl_t *m, int *src) {
    int flag = 0, n = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, m->comm, &flag, &msg, &st) != MPI_SUCCESS || !flag)
        return false;
    MPI_Get_count(&st, MPI_BYTE, &n);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    /* without memory the receive truncates: the message is still taken off the comm */
    MPI_Mrecv(buf, buf ? n : 0, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
    free(buf);
    *src = st.MPI_TAG == BYE_TAG ? st.MPI_SOURCE : -1;
    return true;
}

/* Drops whatever arrives until every peer's goodbye has, or the limit passes. */
static int await_goodbyes(hcomm_comm_t *c, bool *got, double limit) {
    int missing = c->size - 1;
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    while (missing > 0) {
        int src = -1;
        if (drop_one(impl_of(c), &src)) {
            if (src >= 0 && src < c->size && !got[src])
                got[src] = true, missing--;
            continue;
        }
        if (hcomm__backoff(&b) > limit || ((b.iter & 63) == 0 && hcomm__mpi_peer_aborted()))
            break;
        for (int p = 0; (b.iter & 63) == 0 && p < c->size; p++)
            if (!got[p] && p != c->rank && hcomm__mpi_lost(c, p)) /* it never will */
                got[p] = true, missing--;
    }
    return missing;
}

/* Cancels a posted frame receive. One that matched a lost process's message may never end
 * (Open MPI's single-copy read of it failed): it is then left, and so is the comm. */
static bool cancel_receive(hcomm_comm_t *c, MPI_Request *req, double limit) {
    MPI_Cancel(req);
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    for (;;) {
        int done = 0;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done)
            return true;
        if (hcomm__backoff(&b) > limit ||
            ((b.iter & 63) == 0 && hcomm__lost_member(c) >= 0 && b.waited > 0.1))
            return false;
    }
}

bool hcomm__mpi_frames_drain(hcomm_comm_t *c, double limit) {
    mpi_impl_t *m = impl_of(c);
    bool all = true;
    for (int i = 0; i < RECV_DEPTH; i++) /* from here on every frame is taken by drop_one */
        if (m->rreq[i] != MPI_REQUEST_NULL && !cancel_receive(c, &m->rreq[i], limit))
            all = false;
    if (!all)
        return false;
    if (c->size < 2)
        return true;
    bool *got = calloc((size_t)c->size, sizeof *got);
    MPI_Request *bye = calloc((size_t)c->size, sizeof *bye);
    int one = 1, missing = c->size;
    for (int p = 0; got && bye && p < c->size; p++)
        if (p == c->rank ||
            MPI_Isend(&one, 1, MPI_INT, p, BYE_TAG, m->comm, &bye[p]) != MPI_SUCCESS)
            bye[p] = MPI_REQUEST_NULL;
    if (got && bye)
        missing = await_goodbyes(c, got, limit);
    for (int p = 0; bye && p < c->size; p++) /* eager: each completes without its receiver */
        if (bye[p] != MPI_REQUEST_NULL)
            MPI_Request_free(&bye[p]);
    free(got);
    free(bye);
    return missing == 0;
}

static int next_data_tag(mpi_impl_t *m, int peer) {
    int span = m->lane_base - DATA_TAG_MIN;
    int t = DATA_TAG_MIN + m->next_tag[peer];
    m->next_tag[peer] = (m->next_tag[peer] + 1) % span;
    return t;
}

/* A free staging slot (its earlier send completed), or NULL. */
static unsigned char *stage_slot(mpi_impl_t *m, MPI_Request **req) {
    int i = m->snext, done = 1;
    if (!m->stage)
        return NULL;
    if (m->sreq[i] != MPI_REQUEST_NULL &&
        MPI_Test(&m->sreq[i], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return NULL;
    if (!done)
        return NULL;
    m->snext = (i + 1) % STAGE_SLOTS;
    *req = &m->sreq[i];
    return m->stage[i];
}

static hcomm_result_t send_staged(hcomm_comm_t *c, int peer, const void *hdr, const void *payload,
                                  size_t bytes, bool *sent) {
    mpi_impl_t *m = impl_of(c);
    MPI_Request *req = NULL;
    unsigned char *buf = stage_slot(m, &req);
    *sent = buf != NULL;
    if (!buf)
        return HCOMM_OK;
    wire_t w = {.bytes = bytes};
    memcpy(buf, &w, sizeof w);
    memcpy(buf + sizeof w, hdr, HCOMM__HDR_BYTES);
    if (bytes)
        memcpy(buf + WIRE_HDR, payload, bytes);
    int rc = MPI_Isend(buf, (int)(WIRE_HDR + bytes), MPI_BYTE, peer, FRAME_TAG, m->comm, req);
    return rc == MPI_SUCCESS ? HCOMM_OK : hcomm__mpi_fail(c->call_fn, "MPI_Isend", rc);
}

/* A rendezvous send's payload goes once the receiver's clear-to-send arrives (offer). */
static void await_cts(mpi_impl_t *m, mpi_tx_t *tx, int peer, const void *payload, size_t bytes,
                      int data_tag) {
    tx->payload = payload;
    tx->bytes = (int)bytes;
    tx->peer = peer;
    tx->data_tag = data_tag;
    tx->awaiting = true;
    tx->next_wait = m->waiting;
    m->waiting = tx;
}

/* A frame (w, then the header, then an eager payload) through the peer's ring, if it takes
 * it: an eager one is then complete. */
static bool ring_frame(mpi_impl_t *m, mpi_tx_t *tx, int peer, const wire_t *w, const void *hdr,
                       const void *payload) {
    const void *part[3] = {w, hdr, payload};
    size_t len[3] = {sizeof *w, HCOMM__HDR_BYTES, w->data_tag ? 0 : (size_t)w->bytes};
    if (!hcomm__mpi_ring_put(m, peer, part, len, 3))
        return false;
    if (w->data_tag)
        await_cts(m, tx, peer, payload, (size_t)w->bytes, w->data_tag);
    return true;
}

hcomm_result_t hcomm__mpi_send_frame(hcomm_comm_t *c, int peer, const void *hdr,
                                     const void *payload, size_t bytes, bool rndv,
                                     hcomm__treq_t *treq) {
    mpi_impl_t *m = impl_of(c);
    mpi_tx_t *tx = (mpi_tx_t *)treq;
    int n = 0;
    tx->frame = tx->data = MPI_REQUEST_NULL; /* empty before any early return, as lane_post */
    tx->heap = NULL;
    tx->awaiting = false;
    /* An aborted or revoked comm sends only the notice that tells its peers, an eager frame
     * that nothing pending inside MPI can be confused with. */
    if (!atomic_load(&c->aborted))
        HCOMM__TRY(check_usable(c->call_fn, c));
    HCOMM__TRY(to_int(c->call_fn, "message bytes", bytes + WIRE_HDR, &n));
    wire_t w = {.data_tag = rndv ? next_data_tag(m, peer) : 0, .bytes = bytes};
    if (ring_frame(m, tx, peer, &w, hdr, payload))
        return HCOMM_OK;
    hcomm__mpi_ring_spill(m, peer);
    size_t wire_bytes = WIRE_HDR + (rndv ? 0 : bytes);
    if (!rndv && wire_bytes <= STAGE_BYTES) {
        bool sent = false;
        HCOMM__TRY(send_staged(c, peer, hdr, payload, bytes, &sent));
        if (sent)
            return HCOMM_OK; /* tx has no request left: complete */
    }
    unsigned char *buf = tx->stage;
    if (wire_bytes > sizeof tx->stage && (buf = tx->heap = malloc(wire_bytes)) == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory staging %zu bytes",
                          wire_bytes);
    memcpy(buf, &w, sizeof w);
    memcpy(buf + sizeof w, hdr, HCOMM__HDR_BYTES);
    if (!rndv && bytes)
        memcpy(buf + WIRE_HDR, payload, bytes);
    tx->awaiting = false;
    int rc = MPI_Isend(buf, (int)wire_bytes, MPI_BYTE, peer, FRAME_TAG, m->comm, &tx->frame);
    if (rc != MPI_SUCCESS) {
        free(tx->heap);
        tx->heap = NULL;
        return hcomm__mpi_fail(c->call_fn, "MPI_Isend", rc);
    }
    if (rndv)
        await_cts(m, tx, peer, payload, bytes, w.data_tag);
    return HCOMM_OK;
}

bool hcomm__mpi_test_tx(hcomm_comm_t *c, hcomm__treq_t *treq, hcomm_result_t *res) {
    mpi_tx_t *tx = (mpi_tx_t *)treq;
    int done = 0, rc = MPI_SUCCESS;
    *res = HCOMM_OK;
    if (tx->awaiting)
        return false;
    if (tx->frame != MPI_REQUEST_NULL && tx->data != MPI_REQUEST_NULL) {
        MPI_Request both[2] = {tx->frame, tx->data};
        rc = MPI_Testall(2, both, &done, MPI_STATUSES_IGNORE);
        tx->frame = both[0];
        tx->data = both[1];
    } else if (tx->frame != MPI_REQUEST_NULL || tx->data != MPI_REQUEST_NULL) {
        MPI_Request *one = tx->frame != MPI_REQUEST_NULL ? &tx->frame : &tx->data;
        rc = MPI_Test(one, &done, MPI_STATUS_IGNORE);
    } else {
        done = 1;
    }
    *res = rc == MPI_SUCCESS ? HCOMM_OK : hcomm__mpi_fail(c->call_fn, "MPI_Testall (send)", rc);
    if (done || rc != MPI_SUCCESS) {
        free(tx->heap);
        tx->heap = NULL;
        return true;
    }
    return false;
}

/* The receiver posted its receive for data_tag: post the payload it waits for. */
static void clear_to_send(hcomm_comm_t *c, int src, int data_tag) {
    mpi_impl_t *m = impl_of(c);
    for (mpi_tx_t **pt = &m->waiting; *pt; pt = &(*pt)->next_wait) {
        mpi_tx_t *tx = *pt;
        if (tx->peer != src || tx->data_tag != data_tag)
            continue;
        *pt = tx->next_wait;
        tx->awaiting = false;
        if (MPI_Isend(tx->payload, tx->bytes, MPI_BYTE, src, data_tag, m->comm, &tx->data) !=
            MPI_SUCCESS)
            mark_broken(c, HCOMM_ERR_BACKEND, false);
        return;
    }
    /* No such send: it was withdrawn; the receiver's receive then ends by its timeout. */
}

/* Offers the frame in buf from src; false when the p2p layer left it for later. */
static bool offer(hcomm_comm_t *c, hcomm__deliver_fn_t deliver, const unsigned char *buf, int src) {
    wire_t w;
    memcpy(&w, buf, sizeof w);
    if (w.cts) {
        clear_to_send(c, src, w.data_tag);
        return true;
    }
    hcomm__rndv_t rv = {(uint64_t)w.data_tag, 0};
    const void *payload = w.data_tag ? NULL : buf + WIRE_HDR;
    return deliver(c, src, buf + sizeof w, payload, (size_t)w.bytes, w.data_tag ? &rv : NULL);
}

/* Delivers at most one frame per call: each MPI_Test runs Open MPI's whole progress engine,
 * so testing for a second frame right after the first costs a latency-bound exchange about a
 * tenth of its time; the waiter calls again anyway. Rings come first. */
hcomm_result_t hcomm__mpi_poll(hcomm_comm_t *c, hcomm__deliver_fn_t deliver) {
    mpi_impl_t *m = impl_of(c);
    int src = 0;
    size_t len = 0;
    const unsigned char *frame = hcomm__mpi_ring_peek(m, &src, &len);
    if (frame) {
        if (offer(c, deliver, frame, src))
            hcomm__mpi_ring_consume(m, src, len);
        return HCOMM_OK;
    }
    if (!m->held && hcomm__mpi_ring_skip_mpi(m))
        return HCOMM_OK;
    MPI_Status st;
    if (m->held) {
        st = m->held_st;
    } else {
        int done = 0;
        int rc = MPI_Test(&m->rreq[m->rhead], &done, &st);
        if (rc != MPI_SUCCESS)
            return hcomm__mpi_fail(c->call_fn, "MPI_Test (frame receive)", rc);
        if (!done)
            return HCOMM_OK;
    }
    /* the sender's frames still in its ring came first; a refused frame waits here */
    if (hcomm__mpi_ring_holds(m, st.MPI_SOURCE) ||
        !offer(c, deliver, m->rbuf[m->rhead], st.MPI_SOURCE)) {
        m->held = true;
        m->held_st = st;
        return HCOMM_OK;
    }
    hcomm__mpi_ring_took(m, st.MPI_SOURCE);
    m->held = false;
    HCOMM__TRY(post_frame_recv(c, m->rhead));
    m->rhead = (m->rhead + 1) % RECV_DEPTH;
    return HCOMM_OK;
}

/* Tells src that the receive for data_tag is posted; from a staging slot, or a small heap
 * buffer that is left to MPI (freed only if the send completes here) when all slots are busy. */
static hcomm_result_t send_cts(hcomm_comm_t *c, int src, int data_tag) {
    mpi_impl_t *m = impl_of(c);
    wire_t w = {.data_tag = data_tag, .cts = 1};
    if (hcomm__mpi_ring_put(m, src, (const void *[]){&w}, (size_t[]){sizeof w}, 1))
        return HCOMM_OK;
    hcomm__mpi_ring_spill(m, src);
    MPI_Request *req = NULL, spare = MPI_REQUEST_NULL;
    unsigned char *buf = stage_slot(m, &req);
    void *heap = NULL;
    if (!buf) {
        buf = heap = malloc(sizeof w);
        req = &spare;
        if (!heap)
            return hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for a clear-to-send");
    }
    memcpy(buf, &w, sizeof w);
    int rc = MPI_Isend(buf, (int)sizeof w, MPI_BYTE, src, FRAME_TAG, m->comm, req);
    if (rc != MPI_SUCCESS)
        return hcomm__mpi_fail(c->call_fn, "MPI_Isend (clear-to-send)", rc);
    if (heap) {
        int done = 0;
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done)
            free(heap);
        else
            MPI_Request_free(req); /* heap stays MPI's: a few bytes, only when slots run out */
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm__mpi_pull(hcomm_comm_t *c, int src, const hcomm__rndv_t *rv, void *dst,
                               size_t bytes, hcomm__treq_t *treq) {
    mpi_tx_t *rx = (mpi_tx_t *)treq;
    int n = 0;
    HCOMM__TRY(to_int(c->call_fn, "message bytes", bytes, &n));
    rx->frame = rx->data = MPI_REQUEST_NULL;
    rx->heap = NULL;
    rx->awaiting = false;
    int rc = MPI_Irecv(dst, n, MPI_BYTE, src, (int)rv->a, impl_of(c)->comm, &rx->data);
    if (rc != MPI_SUCCESS)
        return hcomm__mpi_fail(c->call_fn, "MPI_Irecv", rc);
    return send_cts(c, src, (int)rv->a);
}

/* A receive can be cancelled; a started synchronous send cannot be, reliably. */
bool hcomm__mpi_cancel(hcomm_comm_t *c, hcomm__treq_t *treq, bool is_tx) {
    mpi_tx_t *r = (mpi_tx_t *)treq;
    if (is_tx) {
        hcomm_result_t res;
        mpi_tx_t *tx = (mpi_tx_t *)treq;
        if (tx->awaiting) { /* MPI never saw the payload: withdrawn, nothing pending */
            mpi_impl_t *m = impl_of(c);
            for (mpi_tx_t **pt = &m->waiting; *pt; pt = &(*pt)->next_wait)
                if (*pt == tx) {
                    *pt = tx->next_wait;
                    break;
                }
            tx->awaiting = false;
            return true;
        }
        if (hcomm__mpi_test_tx(c, treq, &res))
            return true;
        mark_broken(c, HCOMM_ERR_TIMEOUT, true);
        return false;
    }
    if (r->data != MPI_REQUEST_NULL) {
        MPI_Cancel(&r->data);
        MPI_Wait(&r->data, MPI_STATUS_IGNORE);
    }
    return true;
}

/* --- the lane: one MPI message per lane send, on a tag of its own per sequence number --- */

static int lane_tag(const mpi_impl_t *m, uint32_t key) {
    return m->lane_base + (int)(key & m->lane_mask);
}

hcomm_result_t hcomm__mpi_lane_post(hcomm_comm_t *c, int peer, uint32_t key, void *buf,
                                    size_t bytes, bool is_send, hcomm__treq_t *treq) {
    mpi_impl_t *m = impl_of(c);
    mpi_tx_t *r = (mpi_tx_t *)treq;
    /* an empty request before any early return: the caller's cleanup cancels and tests it */
    r->frame = r->data = MPI_REQUEST_NULL;
    r->heap = NULL;
    r->awaiting = false;
    HCOMM__TRY(check_usable(c->call_fn, c));
    int rc = is_send
                 ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, lane_tag(m, key), m->comm, &r->frame)
                 : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, lane_tag(m, key), m->comm, &r->data);
    return rc == MPI_SUCCESS
               ? HCOMM_OK
               : hcomm__mpi_fail(c->call_fn, is_send ? "MPI_Isend (lane)" : "MPI_Irecv (lane)", rc);
}

bool hcomm__mpi_lane_test(hcomm_comm_t *c, hcomm__treq_t *treq, hcomm_result_t *res, size_t *got) {
    mpi_tx_t *r = (mpi_tx_t *)treq;
    bool is_recv = r->data != MPI_REQUEST_NULL;
    MPI_Request *req = is_recv ? &r->data : &r->frame;
    MPI_Status st;
    int done = 1, rc = MPI_SUCCESS, n = 0;
    *res = HCOMM_OK;
    *got = 0;
    if (*req != MPI_REQUEST_NULL)
        rc = MPI_Test(req, &done, &st);
    if (rc != MPI_SUCCESS) {
        *res = hcomm__mpi_error(c->call_fn, "MPI_Test (lane)", rc);
        return true;
    }
    if (done && is_recv && MPI_Get_count(&st, MPI_BYTE, &n) == MPI_SUCCESS)
        *got = (size_t)n;
    return done;
}
