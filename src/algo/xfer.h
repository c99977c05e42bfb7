/* The toolkit every algorithm of this layer is written with: one call's messaging context
 * (hcomm__xfer_t) and the exchanges over it. Every message goes on HCOMM__CH_COLL with the
 * call's sequence number as tag and the call's signature in its envelope (or lane header), and
 * every receive hands the sender's signature to x->check, so ranks that disagree fail with
 * HCOMM_ERR_MISMATCH instead of waiting on each other. The one-node helpers read and write peers'
 * buffers where the transport allows it (transport.peer_read_ok). */
#ifndef HCOMM_C_ALGO_XFER_H_
#define HCOMM_C_ALGO_XFER_H_

#include "p2p/p2p.h"

typedef struct hcomm__xfer hcomm__xfer_t;

/* One call's messaging context, filled by the entry path (agree.c) before an algorithm runs. */
struct hcomm__xfer {
    hcomm_comm_t *c;
    int tag;                   /* the call's sequence number */
    hcomm__env_t desc;         /* desc.sig: the call's signature */
    hcomm__scratch_t *scratch; /* the communicator's scratch (hcomm__x_scratch) */
    /* Compares a received envelope with the call; reports a difference to every peer. */
    hcomm_result_t (*check)(const hcomm__xfer_t *x, int peer, const hcomm__env_t *env);
    /* Meeting `step` of the call on the board (p2p.h), the payload written first at
     * hcomm__board_space; a checked call's meetings check every rank's signature. Only rank
     * `from`'s payload is read (-1: every rank's), and only by rank `to` (-1: by every rank).
     * On HCOMM_OK the caller reads and then leaves (hcomm__board_leave). */
    hcomm_result_t (*meet)(const hcomm__xfer_t *x, uint32_t step, int from, int to);
    void *call; /* the entry path's own record of the call, for check and meet */
};

/* The communicator's scratch (hcomm__scratch) of at least bytes: one per communicator, so one
 * algorithm at a time may hold it. NULL: out of memory. */
void *hcomm__x_scratch(const hcomm__xfer_t *x, size_t bytes);
/* Two buffers in that scratch, of first_bytes and second_bytes, the second starting on a cache
 * line of its own; both NULL: out of memory. */
void hcomm__x_scratch_pair(const hcomm__xfer_t *x, size_t first_bytes, size_t second_bytes,
                           void **first, void **second);

/* offs[0..p]: offs[j] = the sum of sizes[(first + i) % p] for i < j (malloc'd; NULL without
 * memory): where each of p blocks starts, in the order from `first` on. */
size_t *hcomm__prefix_sums(const size_t *sizes, int p, int first);

hcomm_result_t hcomm__x_send(const hcomm__xfer_t *x, int peer, const void *buf, size_t bytes);
/* Receives exactly bytes from peer; a different signature wins over a different size. */
hcomm_result_t hcomm__x_recv(const hcomm__xfer_t *x, int peer, void *buf, size_t bytes);
/* A local failure (res) of a step whose peers wait for this rank next (in a barrier, say) is
 * told to them, so they fail with HCOMM_ERR_PEER instead of waiting; returns res. */
hcomm_result_t hcomm__x_tell_peers(const hcomm__xfer_t *x, hcomm_result_t res);
/* One step of the call on the transport's lane (hcomm__lane_step): n_out bytes of src to `to`
 * (-1: none), and the message from `from` (-1: none) into in, which holds HCOMM__LANE_MAX bytes
 * (a peer in another call may send more than this one expects); its signature is checked and
 * its payload, at in + HCOMM__LANE_HDR, must be n_in bytes. */
hcomm_result_t hcomm__x_lane(const hcomm__xfer_t *x, int to, const void *src, size_t n_out,
                             int from, unsigned char *in, size_t n_in);
/* Every rank can read every other's memory (transport.peer_read_ok). */
static inline bool hcomm__peer_reads(hcomm_comm_t *c) {
    return c->tr->peer_read_ok && c->tr->peer_read_ok(c);
}

/* A peer's buffer for direct reads (one node, transport.peer_read_ok): as the peer exported it
 * and where this rank loads it itself (at; NULL: copied with transport.peer_read). */
typedef struct hcomm__remote {
    hcomm__peer_buf_t buf;
    const char *at;
} hcomm__remote_t;

/* A buffer as the peers read it: the transport's description and its length in bytes. Four
 * 64-bit words, so it travels in int64 messages as it is. */
typedef struct hcomm__exported {
    hcomm__peer_buf_t buf;
    uint64_t bytes;
} hcomm__exported_t;

/* Describes [p, p + bytes) of this rank's memory for its peers (the address alone where the
 * transport has no buf_export); the primitives' one-copy reads (window.h) and hcomm__x_export
 * and hcomm__x_remote below, for a call's context, use these two. */
hcomm__exported_t hcomm__coll_export(hcomm_comm_t *c, const void *p, size_t bytes);
/* peer's exported buffer as this rank reads it (at: its own mapping, NULL where it has none). */
hcomm__remote_t hcomm__coll_remote(hcomm_comm_t *c, int peer, const hcomm__exported_t *e);
/* Describes [p, p + bytes) of this rank's memory for its peers' direct reads. */
void hcomm__x_export(const hcomm__xfer_t *x, const void *p, size_t bytes, hcomm__peer_buf_t *b);
/* Peer's exported buffer, of which this rank will read up to bytes, with its view. */
hcomm__remote_t hcomm__x_remote(const hcomm__xfer_t *x, int peer, const hcomm__peer_buf_t *b,
                                size_t bytes);
/* Copies bytes at byte offset off of peer's buffer r into dst (which may be r's own place when
 * peer is this rank). */
hcomm_result_t hcomm__x_peer_copy(const hcomm__xfer_t *x, int peer, const hcomm__remote_t *r,
                                  size_t off, void *dst, size_t bytes);
/* bytes at byte offset off of peer's buffer r, where this rank can load them: in place through
 * its view, else copied into tmp. */
hcomm_result_t hcomm__x_peer_load(const hcomm__xfer_t *x, int peer, const hcomm__remote_t *r,
                                  size_t off, void *tmp, size_t bytes, const void **at);
/* Sends to one peer and receives from another (or the same) at once. */
hcomm_result_t hcomm__x_sendrecv(const hcomm__xfer_t *x, int to, const void *sbuf, size_t sbytes,
                                 int from, void *rbuf, size_t rbytes);
/* One message of bytes to `to` and one from `from` (sbuf / rbuf NULL: none), on the
 * transport's lane where it has one (each with the signature: no agreement needed first),
 * else as p2p frames. */
hcomm_result_t hcomm__x_swap(const hcomm__xfer_t *x, int to, const void *sbuf, int from, void *rbuf,
                             size_t bytes);

/* n comm ranks in a fixed order, this rank at index me; ranks NULL: the whole comm in rank
 * order. */
typedef struct hcomm__group {
    const int *ranks;
    int n, me;
} hcomm__group_t;
hcomm__group_t hcomm__x_everyone(const hcomm__xfer_t *x);
/* Dissemination barrier over g (Hensgen, Finkel & Manber 1988): ceil(log2 n) rounds of empty
 * swaps; when it returns on one member, every member has entered it, not that each is still
 * there: a member that fails in it (an abort) may have returned already. */
hcomm_result_t hcomm__x_barrier(const hcomm__xfer_t *x, const hcomm__group_t *g);
/* hcomm__x_barrier over the whole communicator. */
hcomm_result_t hcomm__x_barrier_all(const hcomm__xfer_t *x);
/* The end of a call whose ranks read each other's buffers: returns OK only once every rank has
 * finished its reads while every owner was still in the call, so nobody reports data read from
 * a buffer whose owner had returned (after an abort) and freed or reused it. */
hcomm_result_t hcomm__x_release_all(const hcomm__xfer_t *x);
/* A member's two buffers, as the others read them. */
typedef struct hcomm__buf_pair {
    hcomm__remote_t send, recv;
} hcomm__buf_pair_t;
/* Every member's send (send_bytes) and recv (recv_bytes) buffers into all[0..g->n), exchanged
 * with each member directly: every member hears from every other, so with the signature in
 * each message a disagreement shows before any read. */
hcomm_result_t hcomm__x_addrs(const hcomm__xfer_t *x, const hcomm__group_t *g, const void *send,
                              size_t send_bytes, void *recv, size_t recv_bytes,
                              hcomm__buf_pair_t *all);
/* hcomm__x_addrs over the whole communicator (all[0..p)). */
hcomm_result_t hcomm__x_addrs_all(const hcomm__xfer_t *x, const void *send, size_t send_bytes,
                                  void *recv, size_t recv_bytes, hcomm__buf_pair_t *all);

#endif /* HCOMM_C_ALGO_XFER_H_ */
