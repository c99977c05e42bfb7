/* Pipeline-parallel point-to-point. A tensor travels as two backend messages from one peer:
 * a fixed-size header (dtype and shape) on tag + PP_HEADER_TAG, then the data on tag itself
 * (no data message when the tensor has no bytes). The header comes first, so a receiver whose
 * descriptor does not match still knows how many bytes to drain and can say what was sent. */
#include "hcomm/pp.h"
#include "prims/prims.h"

#include <string.h>

#define PP_MAGIC 0x48505031u /* "HPP1" */
#define PP_HEADER_TAG (HCOMM_PP_TAG_MAX + 1)

typedef struct pp_header {
    uint32_t magic;
    int32_t dtype;
    int32_t ndim;
    int32_t reserved;
    int64_t shape[HCOMM_MAX_DIMS];
} pp_header_t;

static pp_header_t header_of(const hcomm_tensor_t *t) {
    pp_header_t h = {.magic = PP_MAGIC, .dtype = (int32_t)t->dtype, .ndim = t->ndim};
    for (int i = 0; i < t->ndim; i++)
        h.shape[i] = t->shape[i];
    return h;
}

/* The descriptor a well-formed header stands for; false if the header is not one of ours. */
static bool header_tensor(const pp_header_t *h, hcomm_tensor_t *t) {
    if (h->magic != PP_MAGIC || !hcomm__dtype_valid((hcomm_dtype_t)h->dtype) || h->ndim < 0 ||
        h->ndim > HCOMM_MAX_DIMS)
        return false;
    *t = (hcomm_tensor_t){.dtype = (hcomm_dtype_t)h->dtype, .ndim = h->ndim};
    for (int i = 0; i < h->ndim; i++) {
        if (h->shape[i] < 0)
            return false;
        t->shape[i] = h->shape[i];
    }
    return true;
}

static bool same_descriptor(const hcomm_tensor_t *a, const hcomm_tensor_t *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

static hcomm_result_t check_peer(const char *fn, const char *name, const hcomm_comm_t *g,
                                 int peer) {
    if (peer < 0 || peer >= g->size)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s=%d outside 0..%d", name, peer,
                          g->size - 1);
    if (peer == g->rank)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "%s=%d is this rank (no send to self)", name,
                          peer);
    return HCOMM_OK;
}

static hcomm_result_t check_tag(const char *fn, int tag) {
    if (tag < 0 || tag > HCOMM_PP_TAG_MAX)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "tag=%d outside 0..%d", tag, HCOMM_PP_TAG_MAX);
    return HCOMM_OK;
}

static hcomm_result_t check_side(const char *fn, const char *tname, const hcomm_tensor_t *t,
                                 const char *pname, const hcomm_comm_t *g, int peer) {
    HCOMM__TRY(hcomm__tensor_check(fn, tname, t, NULL));
    return check_peer(fn, pname, g, peer);
}

/* Consumes a data message of bytes that does not fit the caller's tensor. */
static hcomm_result_t drain(const char *fn, hcomm_comm_t *g, size_t bytes, int peer, int tag) {
    if (bytes == 0)
        return HCOMM_OK;
    void *junk = NULL;
    HCOMM__TRY(hcomm__alloc(fn, bytes, &junk));
    hcomm_result_t res = g->ops->recv(g, junk, bytes, peer, tag);
    free(junk);
    return res;
}

/* Receives one tensor message into t; on a descriptor mismatch drains it and fails. */
static hcomm_result_t recv_tensor(const char *fn, hcomm_comm_t *g, hcomm_tensor_t *t, int peer,
                                  int tag) {
    pp_header_t h;
    HCOMM__TRY(g->ops->recv(g, &h, sizeof h, peer, tag + PP_HEADER_TAG));
    hcomm_tensor_t sent;
    if (!header_tensor(&h, &sent))
        return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                          "peer %d sent a header that is not an hcomm_pp tensor header (tag %d)",
                          peer, tag);
    size_t bytes = hcomm__tensor_bytes(&sent);
    if (same_descriptor(&sent, t))
        return bytes ? g->ops->recv(g, t->data, bytes, peer, tag) : HCOMM_OK;
    HCOMM__TRY(drain(fn, g, bytes, peer, tag));
    char ss[160], es[160];
    return hcomm__err(HCOMM_ERR_MISMATCH, fn, "peer %d sent %s %s, expected %s %s", peer,
                      hcomm__dtype_str(sent.dtype), hcomm__shape_str(&sent, ss, sizeof ss),
                      hcomm__dtype_str(t->dtype), hcomm__shape_str(t, es, sizeof es));
}

/* Starts sending t; *h must stay alive until the requests complete. Fills reqs[0..*nreq-1]. */
static hcomm_result_t post_send(hcomm_comm_t *g, const hcomm_tensor_t *t, pp_header_t *h, int peer,
                                int tag, hcomm__req_t *reqs[2], int *nreq) {
    *h = header_of(t);
    *nreq = 0;
    HCOMM__TRY(g->ops->isend(g, h, sizeof *h, peer, tag + PP_HEADER_TAG, &reqs[0]));
    *nreq = 1;
    size_t bytes = hcomm__tensor_bytes(t);
    if (bytes == 0)
        return HCOMM_OK;
    HCOMM__TRY(g->ops->isend(g, t->data, bytes, peer, tag, &reqs[1]));
    *nreq = 2;
    return HCOMM_OK;
}

/* Completes every posted request; the first failure wins over a later one. */
static hcomm_result_t wait_all(hcomm_comm_t *g, hcomm__req_t *reqs[2], int nreq,
                               hcomm_result_t res) {
    for (int i = 0; i < nreq; i++) {
        hcomm_result_t r = g->ops->wait(g, reqs[i]);
        if (res == HCOMM_OK)
            res = r;
    }
    return res;
}

hcomm_result_t hcomm_pp_send(hcomm_comm_t *group, const hcomm_tensor_t *t, int peer, int tag) {
    HCOMM__CHECK_NULL(group);
    HCOMM__TRY(check_side(__func__, "t", t, "peer", group, peer));
    HCOMM__TRY(check_tag(__func__, tag));
    pp_header_t h = header_of(t);
    HCOMM__TRY(group->ops->send(group, &h, sizeof h, peer, tag + PP_HEADER_TAG));
    size_t bytes = hcomm__tensor_bytes(t);
    return bytes ? group->ops->send(group, t->data, bytes, peer, tag) : HCOMM_OK;
}

hcomm_result_t hcomm_pp_recv(hcomm_comm_t *group, hcomm_tensor_t *t, int peer, int tag) {
    HCOMM__CHECK_NULL(group);
    HCOMM__TRY(check_side(__func__, "t", t, "peer", group, peer));
    HCOMM__TRY(check_tag(__func__, tag));
    return recv_tensor(__func__, group, t, peer, tag);
}

hcomm_result_t hcomm_pp_send_recv(hcomm_comm_t *group, const hcomm_tensor_t *send, int send_peer,
                                  hcomm_tensor_t *recv, int recv_peer, int tag) {
    HCOMM__CHECK_NULL(group);
    bool do_send = send != NULL && send_peer != -1, do_recv = recv != NULL && recv_peer != -1;
    if (do_send)
        HCOMM__TRY(check_side(__func__, "send", send, "send_peer", group, send_peer));
    if (do_recv)
        HCOMM__TRY(check_side(__func__, "recv", recv, "recv_peer", group, recv_peer));
    HCOMM__TRY(check_tag(__func__, tag));
    /* Post the send before blocking in the receive: both peers can then call in any order. */
    pp_header_t h;
    hcomm__req_t *reqs[2] = {NULL, NULL};
    int nreq = 0;
    hcomm_result_t res = HCOMM_OK;
    if (do_send)
        res = post_send(group, send, &h, send_peer, tag, reqs, &nreq);
    if (res == HCOMM_OK && do_recv)
        res = recv_tensor(__func__, group, recv, recv_peer, tag);
    return wait_all(group, reqs, nreq, res);
}
