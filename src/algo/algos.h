/* hcomm's own collective algorithms, each written once over the p2p layer: every message goes
 * on HCOMM__CH_COLL with the call's sequence number as tag and the call's signature in its
 * envelope, and every receive compares the sender's signature with its own (a difference is
 * reported to every peer, so ranks that disagree fail with HCOMM_ERR_MISMATCH, not a hang).
 *
 * Blocks: a vector of count elements split over p ranks gives the first count % p ranks
 * ceil(count / p) elements and the rest floor(count / p) (hcomm__block); offsets are size_t.
 * Reductions take SUM, PROD, MAX or MIN (the caller turns AVG into SUM plus a division and
 * widens f16/bf16 to f32 first), but twoshot and direct reduce_scatter and reduce take f16/bf16
 * as they are, AVG included, and reduce them in f32 themselves (twoshot.c). Every algorithm
 * computes each output element on one rank and copies it to the others, so all ranks get
 * identical bits; the association of operands differs between algorithms (ops are
 * commutative):
 *   ring   reduce_scatter + all_gather around the ring (Patarasuk & Yuan 2009), chunked;
 *   rhd    recursive halving reduce_scatter + recursive doubling all_gather (Rabenseifner;
 *          Thakur, Rabenseifner & Gropp 2005), extra ranks of a non-power-of-two group folded
 *          into their neighbour first;
 *   naive  every rank sends to rank 0, which reduces in rank order (the serial reference),
 *          then a binomial broadcast;
 *   tree   binomial tree (broadcast, reduce);
 *   direct the root exchanges with every rank itself (gather, scatter);
 *   twoshot one node: each rank reads its block of every rank's input in rank order (the
 *          serial reduction's bits), then every other rank's reduced block, straight from the
 *          peers' buffers (transport.peer_read); only addresses and barriers are messages. */
#ifndef HCOMM_C_ALGO_ALGOS_H_
#define HCOMM_C_ALGO_ALGOS_H_

#include "p2p/p2p.h"

typedef struct hcomm__xfer hcomm__xfer_t;

/* One call's messaging context, filled by the algorithms layer (coll.c). */
struct hcomm__xfer {
    hcomm_comm_t *c;
    int tag;           /* the call's sequence number */
    hcomm__env_t desc; /* desc.sig: the call's signature */
    /* Compares a received envelope with the call; reports a difference to every peer. */
    hcomm_result_t (*check)(const hcomm__xfer_t *x, int peer, const hcomm__env_t *env);
    /* Meeting `step` of the call on the board (p2p.h), the payload written first at
     * hcomm__board_space; a checked call's meetings check every rank's signature. Only rank
     * `from`'s payload is read (-1: every rank's), and only by rank `to` (-1: by every rank).
     * On HCOMM_OK the caller reads and then leaves (hcomm__board_leave). */
    hcomm_result_t (*meet)(const hcomm__xfer_t *x, uint32_t step, int from, int to);
    void *call;
};

/* The communicator's scratch (hcomm__scratch) of at least bytes: one per communicator, so one
 * algorithm at a time may hold it. NULL: out of memory. */
void *hcomm__x_scratch(const hcomm__xfer_t *x, size_t bytes);
/* Two buffers in that scratch, of first_bytes and second_bytes, the second starting on a cache
 * line of its own; both NULL: out of memory. */
void hcomm__x_scratch_pair(const hcomm__xfer_t *x, size_t first_bytes, size_t second_bytes,
                           void **first, void **second);

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
/* A peer's buffer for direct reads (one node, transport.peer_read_ok): as the peer exported it
 * and where this rank loads it itself (at; NULL: copied with transport.peer_read). */
typedef struct hcomm__remote {
    hcomm__peer_buf_t buf;
    const char *at;
} hcomm__remote_t;
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
 * swaps; when it returns on one member, every member has entered it, so nobody reads a buffer
 * whose owner already returned. */
hcomm_result_t hcomm__x_barrier(const hcomm__xfer_t *x, const hcomm__group_t *g);
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

/* all_reduce in place on buf[0..count) (the caller copied sendbuf there). */
hcomm_result_t hcomm__ar_ring(const hcomm__xfer_t *x, void *buf, size_t count, hcomm_dtype_t dt,
                              hcomm_op_t op);
hcomm_result_t hcomm__ar_rhd(const hcomm__xfer_t *x, void *buf, size_t count, hcomm_dtype_t dt,
                             hcomm_op_t op);
hcomm_result_t hcomm__ar_naive(const hcomm__xfer_t *x, void *buf, size_t count, hcomm_dtype_t dt,
                               hcomm_op_t op);
/* all_reduce of send into recv (may alias) by direct reads; needs transport.peer_read_ok. */
hcomm_result_t hcomm__ar_twoshot(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op);
/* twoshot's and direct's messages (addresses, barriers) take the transport's lane where it has
 * one, each with the signature, and every rank exchanges addresses with every other before it
 * reads: on a lane they need no agreement first.
 * twoshot's halves as collectives of their own (one node, transport.peer_read_ok):
 * reduce_scatter of count elements per rank (recv may alias send), each rank reducing its
 * block of every input in rank order; all_gather of bytes per rank (send may be recv's own
 * block), each rank reading every other block from its owner's send buffer. */
hcomm_result_t hcomm__rs_direct(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__ag_direct(const hcomm__xfer_t *x, const void *send, void *recv, size_t bytes);
/* reduce_scatterv's: counts[r] elements to rank r, blocks back to back in rank order; in
 * place the result lands at the start of the buffer. */
hcomm_result_t hcomm__rsv_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                 const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
/* all_gatherv's: bytes[r] from rank r, blocks back to back in rank order. */
hcomm_result_t hcomm__agv_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                 const size_t *bytes);
/* shm (shm.c): through the board (hcomm__board_on), in meetings of up to HCOMM__BOARD_ROOM
 * bytes per rank that check the call themselves; every rank reduces every input in rank order
 * (the serial reduction's bits; any op, AVG and f16/bf16 included, in one pass). At most
 * hcomm__shm_fits ranks. */
hcomm_result_t hcomm__ar_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                             hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__rs_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                             hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__ag_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t bytes);
/* The v forms (counts / bytes: one entry per rank, the same on every rank). */
hcomm_result_t hcomm__rsv_shm(const hcomm__xfer_t *x, const void *send, void *recv,
                              const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__agv_shm(const hcomm__xfer_t *x, const void *send, void *recv,
                              const size_t *bytes);
hcomm_result_t hcomm__bc_shm(const hcomm__xfer_t *x, void *buf, size_t bytes, int root);
/* broadcast's direct on a board (peers can read each other's memory): one copy through the
 * views where the root's buffer comes from hcomm_mem_alloc, else shm's two; meetings instead of
 * the lane's address exchange and barrier, checking the call. */
hcomm_result_t hcomm__bc_board_direct(const hcomm__xfer_t *x, void *buf, size_t bytes, int root);
hcomm_result_t hcomm__reduce_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root);
/* gather and scatter leave the root's own block to the caller */
hcomm_result_t hcomm__gather_shm(const hcomm__xfer_t *x, const void *send, void *recv, size_t bytes,
                                 int root);
hcomm_result_t hcomm__scatter_shm(const hcomm__xfer_t *x, const void *send, void *recv,
                                  size_t bytes, int root);
/* gather's and scatter's direct on a board (peers can read each other's memory): the readers
 * (the root; every other rank) copy each block once, through the views where the buffer read
 * comes from hcomm_mem_alloc, else with cross-memory attach (a scatter's private root buffer
 * among more than two ranks: shm's pieces); two meetings, checking the call. */
hcomm_result_t hcomm__gather_board_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                          size_t bytes, int root);
hcomm_result_t hcomm__scatter_board_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                           size_t bytes, int root);
bool hcomm__shm_fits(const hcomm_comm_t *c);
/* broadcast of bytes from root, every other rank reading the root's buffer (one node,
 * transport.peer_read_ok). */
hcomm_result_t hcomm__bc_direct(const hcomm__xfer_t *x, void *buf, size_t bytes, int root);
/* all_gatherv around the ring: bytes[r] from rank r land at the sum of bytes[0..r) in buf,
 * where this rank's own block already is. */
hcomm_result_t hcomm__agv_ring(const hcomm__xfer_t *x, void *buf, const size_t *bytes);
/* reduce_scatterv around the ring: send holds sum(counts) elements; rank r gets block r
 * (counts[r] elements at the sum of counts[0..r)) reduced, in recv (which may alias send). */
hcomm_result_t hcomm__rsv_ring(const hcomm__xfer_t *x, const void *send, void *recv,
                               const size_t *counts, hcomm_dtype_t dt, hcomm_op_t op);
/* broadcast of buf from root down a binomial tree. */
hcomm_result_t hcomm__bc_tree(const hcomm__xfer_t *x, void *buf, size_t bytes, int root);
/* reduce to root up a binomial tree, in place on buf (significant on root after the call);
 * tmp holds count elements received from a child. */
hcomm_result_t hcomm__reduce_tree(const hcomm__xfer_t *x, void *buf, void *tmp, size_t count,
                                  hcomm_dtype_t dt, hcomm_op_t op, int root);
/* reduce to root by Rabenseifner's reduce_scatter + gather, and by direct reads of every input
 * in rank order (one node, transport.peer_read_ok: the root reads all of it, or from
 * hcomm__reduce_split_bytes(p), and for f16/bf16 sums at every size, each rank reduces its
 * block and writes it into the root's output); recv is significant on root only and may alias
 * send there. */
hcomm_result_t hcomm__reduce_rhd(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                                 hcomm_dtype_t dt, hcomm_op_t op, int root);
hcomm_result_t hcomm__reduce_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                    size_t count, hcomm_dtype_t dt, hcomm_op_t op, int root);
/* Bytes from which direct reduce among p ranks splits its work (the cost model prices it;
 * f16/bf16 sums split at every size, which the model, blind to the dtype, does not see). */
size_t hcomm__reduce_split_bytes(int p);
/* gather / scatter of bytes per rank down (up) a binomial tree; the root's own block is
 * copied by the caller, or by these. */
hcomm_result_t hcomm__gather_tree(const hcomm__xfer_t *x, const void *send, void *recv,
                                  size_t bytes, int root);
hcomm_result_t hcomm__scatter_tree(const hcomm__xfer_t *x, const void *send, void *recv,
                                   size_t bytes, int root);
/* gather / scatter of bytes per rank, the root exchanging with each rank directly; the root's
 * own block is copied by the caller. */
hcomm_result_t hcomm__gather_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                    size_t bytes, int root);
hcomm_result_t hcomm__scatter_direct(const hcomm__xfer_t *x, const void *send, void *recv,
                                     size_t bytes, int root);

/* Hierarchical two-level algorithms over the topology's nodes (hier.c): all_reduce of send
 * into recv (may alias); reduce_scatter of m elements per rank (recv may alias send);
 * all_gather of m bytes per rank in place on buf (this rank's block already at rank * m). */
hcomm_result_t hcomm__ar_hier(const hcomm__xfer_t *x, const void *send, void *recv, size_t count,
                              hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__rs_hier(const hcomm__xfer_t *x, const void *send, void *recv, size_t m,
                              hcomm_dtype_t dt, hcomm_op_t op);
hcomm_result_t hcomm__ag_hier(const hcomm__xfer_t *x, void *buf, size_t m);

#endif /* HCOMM_C_ALGO_ALGOS_H_ */
