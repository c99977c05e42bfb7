/* Block arithmetic and the p2p exchanges every algorithm uses. */
#include "algo/algos.h"

#include <stdio.h>
#include <string.h>

void hcomm__block(size_t count, int p, int r, size_t *off, size_t *len) {
    size_t base = count / (size_t)p, rem = count % (size_t)p, rr = (size_t)r;
    *off = rr * base + (rr < rem ? rr : rem);
    *len = base + (rr < rem ? 1 : 0);
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
    hcomm__notify_error(x->c, (uint32_t)x->tag, HCOMM_ERR_PEER, text);
    return hcomm__err_text(res, keep);
}
