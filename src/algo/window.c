/* One-copy reads of peers' buffers on one node (window.h). */
#include "algo/window.h"

#include "algo/agree.h"
#include "algo/coll.h"
#include "topo/topo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool hcomm__coll_reads_ok(hcomm_comm_t *c) {
    hcomm__topo_t *t;
    if (!hcomm__peer_reads(c) || c->tr->buf_export == NULL)
        return false;
    return hcomm__topo_one_node(c) || (hcomm__topo_get(c, &t) == HCOMM_OK && t->nnodes < 2);
}

hcomm_result_t hcomm__coll_load(hcomm_comm_t *c, const char *fn, int peer, const hcomm__remote_t *r,
                                size_t off, void *tmp, size_t bytes, const void **at) {
    *at = r->at ? r->at + off : tmp;
    if (r->at || bytes == 0)
        return HCOMM_OK;
    hcomm_result_t res =
        c->tr->peer_read(c, peer, (const char *)(uintptr_t)r->buf.addr + off, tmp, bytes);
    if (res == HCOMM_OK)
        return HCOMM_OK;
    char why[256]; /* the transport's message, before this one overwrites it */
    snprintf(why, sizeof why, "%s", hcomm_last_error());
    return hcomm__err(res, fn, "reading %zu bytes of rank %d's buffer failed: %s", bytes, peer,
                      why);
}

bool hcomm__coll_wants_shared(hcomm_comm_t *c) {
    return hcomm__coll_reads_ok(c) && !hcomm__posted_transport(c);
}

hcomm_result_t hcomm__coll_exports(hcomm_comm_t *c, const void *p, size_t bytes,
                                   hcomm__remote_t *all) {
    hcomm__exported_t mine = hcomm__coll_export(c, p, bytes);
    hcomm__exported_t *got = malloc(sizeof *got * (size_t)c->size);
    if (got == NULL)
        return hcomm__coll_fail(
            c, hcomm__err(HCOMM_ERR_NOMEM, c->call_fn, "out of memory for %d exports", c->size));
    hcomm_result_t res = hcomm__coll_all_gather(c, &mine, got, sizeof mine);
    for (int q = 0; q < c->size && res == HCOMM_OK; q++)
        all[q] = hcomm__coll_remote(c, q, &got[q]);
    free(got);
    return res;
}

hcomm_result_t hcomm__coll_reads_done(hcomm_comm_t *c, const char *fn, hcomm_result_t mine) {
    /* the lowest failed rank and the lowest peer found lost, so every member names the same */
    bool lost = mine == HCOMM_ERR_PEER_LOST && c->wait_peer >= 0 && c->wait_peer < c->size;
    int64_t v[2] = {mine == HCOMM_OK ? INT64_MAX : c->rank, lost ? c->wait_peer : INT64_MAX},
            first[2] = {INT64_MAX, INT64_MAX};
    char keep[512];
    snprintf(keep, sizeof keep, "%s", mine != HCOMM_OK ? hcomm_last_error() : "");
    hcomm_result_t res = hcomm__coll_all_reduce(c, v, first, 2, HCOMM_I64, HCOMM_MIN);
    if (mine != HCOMM_OK && res == HCOMM_ERR_PEER_LOST)
        return res; /* a lost peer explains a failed read of its memory */
    if (mine != HCOMM_OK)
        return hcomm__err_text(mine, keep);
    if (res != HCOMM_OK || first[0] == INT64_MAX)
        return res;
    if (first[1] != INT64_MAX)
        return hcomm__lost_error(c, (int)first[1]);
    return hcomm__err(HCOMM_ERR_PEER, fn,
                      "rank %lld of the group failed while the ranks read each other's rows (its "
                      "own error says why); this call's results are not valid",
                      (long long)first[0]);
}
