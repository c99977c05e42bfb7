/* The exchanges every algorithm uses (xfer.h). */
#include "algo/xfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *hcomm__x_scratch(const hcomm__xfer_t *x, size_t bytes) {
    return hcomm__scratch(x->scratch, bytes);
}

void hcomm__x_scratch_pair(const hcomm__xfer_t *x, size_t first_bytes, size_t second_bytes,
                           void **first, void **second) {
    *first = hcomm__scratch_two(x->scratch, first_bytes, second_bytes, second);
}

size_t *hcomm__prefix_sums(const size_t *sizes, int p, int first) {
    size_t *offs = malloc(sizeof(size_t) * ((size_t)p + 1));
    if (!offs)
        return NULL;
    offs[0] = 0;
    for (int j = 0; j < p; j++)
        offs[j + 1] = offs[j] + sizes[(first + j) % p];
    return offs;
}

hcomm_result_t hcomm__x_send(const hcomm__xfer_t *x, int peer, const void *buf, size_t bytes) {
    return hcomm__send(x->c, HCOMM__CH_COLL, x->tag, peer, buf, bytes, &x->desc);
}

hcomm_result_t hcomm__x_recv(const hcomm__xfer_t *x, int peer, void *buf, size_t bytes) {
    hcomm__env_t env = {0};
    hcomm_result_t res =
        hcomm__recv(x->c, HCOMM__CH_COLL, x->tag, peer, buf, bytes, HCOMM__RECV_EXACT, &env);
    /* A peer in another call usually sends another size too: name the call, not the size. */
    if (env.kind == HCOMM__ENV_DATA && (res == HCOMM_OK || res == HCOMM_ERR_MISMATCH)) {
        hcomm_result_t sig = x->check(x, peer, &env);
        if (sig != HCOMM_OK)
            return sig;
    }
    return res;
}

hcomm_result_t hcomm__x_sendrecv(const hcomm__xfer_t *x, int to, const void *sbuf, size_t sbytes,
                                 int from, void *rbuf, size_t rbytes) {
    hcomm__req_t *s = NULL;
    HCOMM__TRY(hcomm__isend(x->c, HCOMM__CH_COLL, x->tag, to, sbuf, sbytes, &x->desc, &s));
    hcomm_result_t res = hcomm__x_recv(x, from, rbuf, rbytes);
    hcomm_result_t sres = hcomm__wait(s, NULL, NULL);
    return res != HCOMM_OK ? res : sres;
}

hcomm_result_t hcomm__x_lane(const hcomm__xfer_t *x, int to, const void *src, size_t n_out,
                             int from, unsigned char *in, size_t n_in) {
    _Alignas(16) unsigned char out[HCOMM__LANE_MAX];
    if (n_out)
        memcpy(out + HCOMM__LANE_HDR, src, n_out);
    hcomm__env_t env = {.kind = HCOMM__ENV_DATA};
    size_t got = 0;
    HCOMM__TRY(hcomm__lane_step(x->c, (uint32_t)x->tag, &x->desc.sig, to, out, n_out, from, in,
                                HCOMM__LANE_MAX - HCOMM__LANE_HDR, &env.sig, &got));
    if (from < 0)
        return HCOMM_OK;
    HCOMM__TRY(x->check(x, from, &env));
    if (got != n_in) /* equal signatures agree on the sizes: a peer that broke the protocol */
        return hcomm__err(HCOMM_ERR_MISMATCH, x->c->call_fn,
                          "rank %d sent %zu bytes where rank %d expected %zu", from, got,
                          x->c->rank, n_in);
    return HCOMM_OK;
}

hcomm_result_t hcomm__x_tell_peers(const hcomm__xfer_t *x, hcomm_result_t res) {
    if (res == HCOMM_OK)
        return res;
    char text[256], keep[512];
    snprintf(keep, sizeof keep, "%s", hcomm_last_error());
    /* The peers' message names the call once. */
    snprintf(text, sizeof text, "rank %d failed: %s", x->c->rank, hcomm__err_detail(x->c->call_fn));
    hcomm__notify_error(x->c, (uint32_t)x->tag,
                        res == HCOMM_ERR_PEER_LOST ? HCOMM_ERR_PEER_LOST : HCOMM_ERR_PEER, text);
    return hcomm__err_text(res, keep);
}

hcomm__exported_t hcomm__coll_export(hcomm_comm_t *c, const void *p, size_t bytes) {
    hcomm__exported_t e = {.buf = {.addr = (uint64_t)(uintptr_t)p}, .bytes = bytes};
    if (c->tr->buf_export)
        c->tr->buf_export(c, p, bytes, &e.buf);
    return e;
}

hcomm__remote_t hcomm__coll_remote(hcomm_comm_t *c, int peer, const hcomm__exported_t *e) {
    hcomm__remote_t r = {e->buf, NULL};
    if (peer == c->rank)
        r.at = (const char *)(uintptr_t)e->buf.addr;
    else if (c->tr->buf_view && e->bytes > 0)
        r.at = c->tr->buf_view(c, peer, &e->buf, (size_t)e->bytes);
    return r;
}

void hcomm__x_export(const hcomm__xfer_t *x, const void *p, size_t bytes, hcomm__peer_buf_t *b) {
    *b = hcomm__coll_export(x->c, p, bytes).buf;
}

hcomm__remote_t hcomm__x_remote(const hcomm__xfer_t *x, int peer, const hcomm__peer_buf_t *b,
                                size_t bytes) {
    hcomm__exported_t e = {*b, bytes};
    return hcomm__coll_remote(x->c, peer, &e);
}

/* How long a failed read of a peer's buffer waits for the reason to arrive. */
#define READ_FAILED_WAIT_S 1.0

/* A peer's buffer that cannot be read has mostly gone with its owner, which told its peers why
 * (an abort) before it returned: that notice is the error, once it is here. */
static hcomm_result_t read_failed(const hcomm__xfer_t *x, hcomm_result_t res) {
    char keep[512];
    snprintf(keep, sizeof keep, "%s", hcomm_last_error());
    hcomm__backoff_t b;
    hcomm__backoff_init(&b);
    for (double waited = 0; waited < READ_FAILED_WAIT_S; waited = hcomm__backoff(&b)) {
        hcomm_result_t why = hcomm__coll_wait_verdict(x->c, (uint32_t)x->tag, "a notice", 0);
        if (why != HCOMM_OK)
            return why;
    }
    return hcomm__err_text(res, keep);
}

hcomm_result_t hcomm__x_peer_copy(const hcomm__xfer_t *x, int peer, const hcomm__remote_t *r,
                                  size_t off, void *dst, size_t bytes) {
    if (bytes == 0)
        return HCOMM_OK;
    if (r->at) {
        const char *src = r->at + off;
        if (!hcomm__overlaps(src, bytes, dst, bytes))
            hcomm__copy_pieces(dst, src, bytes);
        else if (src != dst)
            memmove(dst, src, bytes);
        return HCOMM_OK;
    }
    hcomm_result_t res =
        x->c->tr->peer_read(x->c, peer, (const char *)(uintptr_t)r->buf.addr + off, dst, bytes);
    return res == HCOMM_OK ? res : read_failed(x, res);
}

hcomm_result_t hcomm__x_peer_load(const hcomm__xfer_t *x, int peer, const hcomm__remote_t *r,
                                  size_t off, void *tmp, size_t bytes, const void **at) {
    *at = r->at ? r->at + off : tmp;
    return r->at ? HCOMM_OK : hcomm__x_peer_copy(x, peer, r, off, tmp, bytes);
}

hcomm_result_t hcomm__x_swap(const hcomm__xfer_t *x, int to, const void *sbuf, int from, void *rbuf,
                             size_t bytes) {
    size_t n_out = sbuf ? bytes : 0, n_in = rbuf ? bytes : 0;
    if (hcomm__lane_payload(x->c) == 0)
        return hcomm__x_sendrecv(x, to, sbuf, n_out, from, rbuf, n_in);
    _Alignas(16) unsigned char in[HCOMM__LANE_MAX];
    HCOMM__TRY(hcomm__x_lane(x, to, sbuf, n_out, from, in, n_in));
    if (n_in)
        memcpy(rbuf, in + HCOMM__LANE_HDR, n_in);
    return HCOMM_OK;
}

hcomm__group_t hcomm__x_everyone(const hcomm__xfer_t *x) {
    return (hcomm__group_t){NULL, x->c->size, x->c->rank};
}

/* The comm rank of member me + d (d may be negative). */
static int member(const hcomm__group_t *g, int d) {
    int i = ((g->me + d) % g->n + g->n) % g->n;
    return g->ranks ? g->ranks[i] : i;
}

hcomm_result_t hcomm__x_barrier(const hcomm__xfer_t *x, const hcomm__group_t *g) {
    for (int d = 1; d < g->n; d *= 2)
        HCOMM__TRY(hcomm__x_swap(x, member(g, d), NULL, member(g, -d), NULL, 0));
    return HCOMM_OK;
}

/* What one member tells each other about its buffers. */
typedef struct exported {
    hcomm__peer_buf_t send, recv;
} exported_t;

hcomm_result_t hcomm__x_addrs(const hcomm__xfer_t *x, const hcomm__group_t *g, const void *send,
                              size_t send_bytes, void *recv, size_t recv_bytes,
                              hcomm__buf_pair_t *all) {
    exported_t mine, theirs;
    hcomm__x_export(x, send, send_bytes, &mine.send);
    hcomm__x_export(x, recv, recv_bytes, &mine.recv);
    _Static_assert(sizeof mine <= HCOMM__LANE_MAX - HCOMM__LANE_HDR, "fits the lane swap's room");
    all[g->me] = (hcomm__buf_pair_t){hcomm__x_remote(x, x->c->rank, &mine.send, send_bytes),
                                     hcomm__x_remote(x, x->c->rank, &mine.recv, recv_bytes)};
    for (int d = 1; d < g->n; d++) {
        int from = member(g, -d), i = ((g->me - d) % g->n + g->n) % g->n;
        HCOMM__TRY(hcomm__x_swap(x, member(g, d), &mine, from, &theirs, sizeof theirs));
        all[i] = (hcomm__buf_pair_t){hcomm__x_remote(x, from, &theirs.send, send_bytes),
                                     hcomm__x_remote(x, from, &theirs.recv, recv_bytes)};
    }
    return HCOMM_OK;
}

hcomm_result_t hcomm__x_barrier_all(const hcomm__xfer_t *x) {
    hcomm__group_t g = hcomm__x_everyone(x);
    return hcomm__x_barrier(x, &g);
}

/* Two barriers: one that a member leaves early (an abort) still lets the others through on
 * its entry alone, but then it never enters the second, so they fail rather than return data
 * they may have read after it left. */
hcomm_result_t hcomm__x_release_all(const hcomm__xfer_t *x) {
    HCOMM__TRY(hcomm__x_barrier_all(x));
    return hcomm__x_barrier_all(x);
}

hcomm_result_t hcomm__x_addrs_all(const hcomm__xfer_t *x, const void *send, size_t send_bytes,
                                  void *recv, size_t recv_bytes, hcomm__buf_pair_t *all) {
    hcomm__group_t g = hcomm__x_everyone(x);
    return hcomm__x_addrs(x, &g, send, send_bytes, recv, recv_bytes, all);
}
