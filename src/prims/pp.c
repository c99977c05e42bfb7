/* Pipeline-parallel point-to-point over hcomm's p2p layer: one message per tensor on the
 * user channel, whose envelope carries the dtype and shape, so the receiver checks them before
 * any data lands (and can say what was sent), and user tags never meet algorithm traffic. */
#include "hcomm/pp.h"
#include "prims/prims.h"

#include <stdio.h>
#include <string.h>

static hcomm__env_t desc_of(const hcomm_tensor_t *t) {
    hcomm__env_t d = {.has_desc = 1, .dtype = (int32_t)t->dtype, .ndim = (uint8_t)t->ndim};
    for (int i = 0; i < t->ndim; i++)
        d.shape[i] = t->shape[i];
    return d;
}

/* The descriptor an envelope stands for; false if it carries none. */
static bool env_tensor(const hcomm__env_t *e, hcomm_tensor_t *t) {
    if (!e->has_desc || !hcomm__dtype_valid((hcomm_dtype_t)e->dtype) || e->ndim > HCOMM_MAX_DIMS)
        return false;
    *t = (hcomm_tensor_t){.dtype = (hcomm_dtype_t)e->dtype, .ndim = e->ndim};
    for (int i = 0; i < e->ndim; i++)
        t->shape[i] = e->shape[i];
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

/* Receives one tensor into t: its envelope must carry t's dtype and shape. */
static hcomm_result_t recv_tensor(const char *fn, hcomm_comm_t *g, hcomm_tensor_t *t, int peer,
                                  int tag) {
    hcomm__env_t env;
    HCOMM__TRY(hcomm__probe(g, HCOMM__CH_USER, tag, peer, &env));
    hcomm_tensor_t sent;
    if (!env_tensor(&env, &sent))
        return hcomm__err(HCOMM_ERR_MISMATCH, fn, "rank %d sent a message that is not a tensor (tag %d)",
                          peer, tag);
    if (same_descriptor(&sent, t))
        return hcomm__recv(g, HCOMM__CH_USER, tag, peer, t->data, hcomm__tensor_bytes(t),
                           HCOMM__RECV_EXACT, NULL);
    hcomm__req_t *r = NULL; /* consume it, so the next message of this tag can be received */
    void *junk = NULL;
    HCOMM__TRY(hcomm__irecv(g, HCOMM__CH_USER, tag, peer, NULL, 0, HCOMM__RECV_ALLOC, &r));
    HCOMM__TRY(hcomm__wait(r, NULL, &junk));
    free(junk);
    char ss[160], es[160];
    return hcomm__err(HCOMM_ERR_MISMATCH, fn, "peer %d sent %s %s, expected %s %s", peer,
                      hcomm__dtype_str(sent.dtype), hcomm__shape_str(&sent, ss, sizeof ss),
                      hcomm__dtype_str(t->dtype), hcomm__shape_str(t, es, sizeof es));
}

static hcomm_result_t send_tensor(hcomm_comm_t *g, const hcomm_tensor_t *t, int peer, int tag,
                                  hcomm__req_t **req) {
    hcomm__env_t d = desc_of(t);
    return hcomm__isend(g, HCOMM__CH_USER, tag, peer, t->data, hcomm__tensor_bytes(t), &d, req);
}

static hcomm_result_t pp_send(hcomm_comm_t *group, const hcomm_tensor_t *t, int peer, int tag) {
    HCOMM__TRY(check_side(group->call_fn, "t", t, "peer", group, peer));
    HCOMM__TRY(check_tag(group->call_fn, tag));
    hcomm__req_t *r = NULL;
    HCOMM__TRY(send_tensor(group, t, peer, tag, &r));
    return hcomm__wait(r, NULL, NULL);
}

hcomm_result_t hcomm_pp_send(hcomm_comm_t *group, const hcomm_tensor_t *t, int peer, int tag) {
    HCOMM__CHECK_NULL(group);
    hcomm__enter(group, __func__);
    return hcomm__leave(group, pp_send(group, t, peer, tag));
}

static hcomm_result_t pp_recv(hcomm_comm_t *group, hcomm_tensor_t *t, int peer, int tag) {
    HCOMM__TRY(check_side(group->call_fn, "t", t, "peer", group, peer));
    HCOMM__TRY(check_tag(group->call_fn, tag));
    return recv_tensor(group->call_fn, group, t, peer, tag);
}

hcomm_result_t hcomm_pp_recv(hcomm_comm_t *group, hcomm_tensor_t *t, int peer, int tag) {
    HCOMM__CHECK_NULL(group);
    hcomm__enter(group, __func__);
    return hcomm__leave(group, pp_recv(group, t, peer, tag));
}

static hcomm_result_t pp_send_recv(hcomm_comm_t *group, const hcomm_tensor_t *send, int send_peer,
                                   hcomm_tensor_t *recv, int recv_peer, int tag) {
    const char *fn = group->call_fn;
    bool do_send = send != NULL && send_peer != -1, do_recv = recv != NULL && recv_peer != -1;
    if (do_send)
        HCOMM__TRY(check_side(fn, "send", send, "send_peer", group, send_peer));
    if (do_recv)
        HCOMM__TRY(check_side(fn, "recv", recv, "recv_peer", group, recv_peer));
    HCOMM__TRY(check_tag(fn, tag));
    /* Post the send before blocking in the receive: both peers can then call in any order. */
    hcomm__req_t *r = NULL;
    hcomm_result_t res = do_send ? send_tensor(group, send, send_peer, tag, &r) : HCOMM_OK;
    if (res == HCOMM_OK && do_recv)
        res = recv_tensor(fn, group, recv, recv_peer, tag);
    if (r) {
        char keep[512];
        snprintf(keep, sizeof keep, "%s", hcomm_last_error());
        hcomm_result_t sres = hcomm__wait(r, NULL, NULL);
        if (res != HCOMM_OK) /* the first failure's message wins */
            hcomm__err_text(res, keep);
        else
            res = sres;
    }
    return res;
}

hcomm_result_t hcomm_pp_send_recv(hcomm_comm_t *group, const hcomm_tensor_t *send, int send_peer,
                                  hcomm_tensor_t *recv, int recv_peer, int tag) {
    HCOMM__CHECK_NULL(group);
    hcomm__enter(group, __func__);
    return hcomm__leave(group, pp_send_recv(group, send, send_peer, recv, recv_peer, tag));
}
