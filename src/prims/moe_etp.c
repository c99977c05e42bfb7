/* Expert-TP with sequence-parallel tokens (Megatron-Core's MoEAlltoAllTokenDispatcher with
 * tp > 1 and sequence parallelism): each member of an expert-TP group holds a different shard
 * of the tokens and dispatches it over its own EP group; the rows each member receives are
 * then all-gathered across the expert-TP group, so every member sees every row routed to the
 * experts it shares with the others, and runs its slice of them. The way back is the dual:
 * the members' partial outputs are reduce-scattered (summed) across the group, each member
 * keeping the rows of its own EP exchange, before the reverse EP exchange.
 *
 *   dispatch:     EP exchange -> own rows [r]   -> all_gatherv  -> recv [r_all]
 *   combine:      expert_out [r_all] -> reduce_scatterv -> own [r] -> reverse EP exchange
 *   dispatch_bwd: as combine (the dual of the gather is the sum)
 *   combine_bwd:  EP exchange -> own [r] -> all_gatherv -> grad_expert_out [r_all]
 *   redispatch:   as dispatch, with the stored routing
 *
 * Gathered rows are ordered local expert, then source EP rank, then etp member, then token and
 * slot: exactly the rows a dispatch of the members' tokens concatenated (member order) would
 * give on an EP rank, so the result does not depend on how the tokens are sharded. The
 * dispatch adds one all_gather of a count row per member (which also carries each member's
 * status: a member whose EP exchange failed fails its etp peers instead of leaving them
 * waiting) and one all_gatherv of the rows. */
#include "prims/moe_common.h"

#include <string.h>

/* The count row each member contributes to the dispatch's gather (its place in its EP group
 * too: members must hold the same experts), then its EP group's statistics (sum_stats). */
enum { ETP_STATUS, ETP_H, ETP_DTYPE, ETP_EP_RANK, ETP_EP_SIZE, ETP_ROWS, ETP_COUNTS };

hcomm_result_t hcomm__moe_etp_fail(const char *fn, const hcomm_moe_handle_t *h,
                                   hcomm_result_t res) {
    if (h->etp == NULL || res == HCOMM_OK)
        return res;
    hcomm__enter(h->etp, fn);
    return hcomm__leave(h->etp, hcomm__coll_fail(h->etp, res));
}

/* A mismatch in a pass's step across etp_group names only that collective's count and the
 * ranks of etp_group: say which group and what the members must share. */
static hcomm_result_t etp_mismatch(const char *fn, hcomm_result_t res) {
    return hcomm__moe_mismatch(
        fn, res, " (ranks of etp_group: its members pass tensors of the same width and dtype)");
}

/* Member-major blocks of rb-byte rows, one block of etp_rows[i] rows per member. */
static size_t *block_sizes(const hcomm_moe_handle_t *h, size_t unit) {
    size_t *v = malloc(sizeof *v * (size_t)h->etp_size);
    for (int i = 0; v != NULL && i < h->etp_size; i++)
        v[i] = (size_t)h->etp_rows[i] * unit;
    return v;
}

/* The per-member block sizes (rows * unit) and a pooled buffer of every row (rb bytes each),
 * after hcomm__enter: a failure joins the expert-TP step (hcomm__coll_fail), so the members
 * waiting in it fail too. */
static hcomm_result_t etp_scratch(const char *fn, const hcomm_moe_handle_t *h, size_t unit,
                                  size_t rb, size_t **sizes, char **blocks) {
    *blocks = NULL;
    *sizes = block_sizes(h, unit);
    if (*sizes == NULL)
        return hcomm__coll_fail(h->etp,
                                hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for counts"));
    hcomm_result_t res = hcomm__moe_pool_get(h->pool, fn, (size_t)h->r_all * rb, (void **)blocks);
    return res == HCOMM_OK ? res : hcomm__coll_fail(h->etp, res);
}

static hcomm_result_t etp_done(const hcomm_moe_handle_t *h, size_t *sizes, char *blocks,
                               hcomm_result_t res) {
    free(sizes);
    hcomm__moe_pool_put(h->pool, blocks);
    return hcomm__leave(h->etp, res);
}

hcomm_result_t hcomm__moe_etp_gather(const char *fn, const hcomm_moe_handle_t *h, const void *own,
                                     void *out, size_t rb) {
    size_t *bytes;
    char *blocks;
    hcomm__enter(h->etp, fn);
    hcomm_result_t res = etp_scratch(fn, h, rb, rb, &bytes, &blocks);
    if (res == HCOMM_OK)
        res = etp_mismatch(fn, hcomm__coll_all_gatherv(h->etp, own, blocks, bytes));
    if (res == HCOMM_OK)
        hcomm__moe_gather_rows(out, blocks, h->etp_perm, h->r_all, rb);
    return etp_done(h, bytes, blocks, res);
}

hcomm_result_t hcomm__moe_etp_reduce(const char *fn, const hcomm_moe_handle_t *h, const void *in,
                                     hcomm_dtype_t dt, int64_t cols, void *own) {
    size_t rb = (size_t)cols * hcomm__dtype_size(dt), *counts;
    char *blocks;
    hcomm__enter(h->etp, fn);
    hcomm_result_t res = etp_scratch(fn, h, (size_t)cols, rb, &counts, &blocks);
    if (res == HCOMM_OK) {
        hcomm__moe_scatter_rows(blocks, in, h->etp_perm, h->r_all, rb);
        res = etp_mismatch(fn,
                           hcomm__coll_reduce_scatterv(h->etp, blocks, own, counts, dt, HCOMM_SUM));
    }
    return etp_done(h, counts, blocks, res);
}

/* Fails unless every member's EP exchange succeeded with the same row layout, on the same
 * experts (the same rank of an EP group of the same size: else the gathered rows would be
 * filed under experts that are not theirs). Each member is compared with member 0, so every
 * member reports the same pair. */
static hcomm_result_t check_members(const char *fn, const hcomm_moe_handle_t *h, const int64_t *all,
                                    int w) {
    for (int i = 0; i < h->etp_size; i++)
        if (all[i * w + ETP_STATUS] != HCOMM_OK)
            return hcomm__err(HCOMM_ERR_PEER, fn,
                              "rank %d of etp_group failed this dispatch with %s", i,
                              hcomm_result_name((hcomm_result_t)all[i * w + ETP_STATUS]));
    for (int i = 1; i < h->etp_size; i++) {
        const int64_t *m = all + i * w;
        if (m[ETP_EP_RANK] != all[ETP_EP_RANK] || m[ETP_EP_SIZE] != all[ETP_EP_SIZE])
            return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                              "options->etp_group is not orthogonal to ep_group: rank 0 of "
                              "etp_group is rank %lld of an ep_group of %lld but rank %d of "
                              "etp_group is rank %lld of an ep_group of %lld (expert-TP members "
                              "must hold the same experts)",
                              (long long)all[ETP_EP_RANK], (long long)all[ETP_EP_SIZE], i,
                              (long long)m[ETP_EP_RANK], (long long)m[ETP_EP_SIZE]);
    }
    for (int i = 1; i < h->etp_size; i++) {
        const int64_t *m = all + i * w;
        if (m[ETP_H] != all[ETP_H] || m[ETP_DTYPE] != all[ETP_DTYPE])
            return hcomm__err(HCOMM_ERR_MISMATCH, fn,
                              "tokens %s [*, %lld] on rank 0 of etp_group but %s [*, %lld] on "
                              "rank %d",
                              hcomm__dtype_str((hcomm_dtype_t)all[ETP_DTYPE]),
                              (long long)all[ETP_H], hcomm__dtype_str((hcomm_dtype_t)m[ETP_DTYPE]),
                              (long long)m[ETP_H], i);
    }
    return HCOMM_OK;
}

/* etp_perm and the gathered expert offsets from every member's counts per (expert, source):
 * local expert, then source EP rank, then member. */
static hcomm_result_t gathered_layout(const char *fn, hcomm_moe_handle_t *h, const int64_t *all,
                                      int w) {
    int n = h->etp_size, ls = h->num_local * h->size;
    int64_t *cur = calloc((size_t)(n > 0 ? n : 1), sizeof *cur);
    h->r_all = 0;
    for (int i = 0; i < n; i++) {
        h->etp_rows[i] = all[i * w + ETP_ROWS];
        h->r_all += h->etp_rows[i];
    }
    h->etp_perm = malloc(sizeof(int64_t) * (size_t)(h->r_all ? h->r_all : 1));
    if (cur == NULL || h->etp_perm == NULL) {
        free(cur);
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for %lld gathered rows",
                          (long long)h->r_all);
    }
    for (int i = 1; i < n; i++)
        cur[i] = cur[i - 1] + h->etp_rows[i - 1];
    int64_t pos = 0;
    for (int ls_i = 0; ls_i < ls; ls_i++) { /* (local expert, source) in order */
        if (ls_i % h->size == 0)
            h->expert_off[ls_i / h->size] = pos;
        for (int i = 0; i < n; i++)
            for (int64_t c = all[i * w + ETP_COUNTS + ls_i]; c > 0; c--)
                h->etp_perm[pos++] = cur[i]++;
    }
    h->expert_off[h->num_local] = pos;
    int64_t end = 0;
    for (int i = 0; i < n; i++) { /* each member's counts add up to its rows */
        end += h->etp_rows[i];
        if (cur[i] != end) {
            free(cur);
            return hcomm__err(HCOMM_ERR_INTERNAL, fn,
                              "rank %d of etp_group sent counts that disagree with its rows", i);
        }
    }
    free(cur);
    return HCOMM_OK;
}

/* Replaces this rank's own received rows by every member's, gathered. */
static hcomm_result_t gather_recv(const char *fn, hcomm_moe_handle_t *h) {
    size_t rb = (size_t)h->h * hcomm__dtype_size(h->dtype);
    void *all = NULL;
    hcomm_result_t res = hcomm__moe_pool_get(h->pool, fn, (size_t)h->r_all * rb, &all);
    if (res != HCOMM_OK)
        return hcomm__coll_fail(h->etp, res);
    res = hcomm__moe_etp_gather(fn, h, h->recv, all, rb);
    hcomm__moe_pool_put(h->pool, res == HCOMM_OK ? h->recv : all);
    if (res == HCOMM_OK)
        h->recv = all;
    return res;
}

/* The statistics over every member's tokens: the EP exchange gave those of this member's EP
 * group (its shards); the count rows carry them after the counts (E kept slots per expert,
 * then the dropped slots), summed here in member order. */
static void sum_stats(hcomm_moe_handle_t *h, const int64_t *all, int w) {
    int ls = h->num_local * h->size;
    memset(h->global_count, 0, sizeof(int64_t) * (size_t)ls);
    h->global_dropped = 0;
    for (int i = 0; i < h->etp_size; i++) {
        const int64_t *st = all + i * w + ETP_COUNTS + ls;
        for (int e = 0; e < ls; e++)
            h->global_count[e] += st[e];
        h->global_dropped += st[ls];
    }
}

hcomm_result_t hcomm__moe_etp_dispatch(const char *fn, hcomm_moe_handle_t *h, hcomm_result_t prev,
                                       const int64_t *own_counts) {
    int ls = h->num_local * h->size, w = ETP_COUNTS + 2 * ls + 1;
    int64_t *mine = calloc((size_t)w, sizeof *mine),
            *all = calloc((size_t)(w * h->etp_size), sizeof *all);
    h->etp_rows = calloc((size_t)h->etp_size, sizeof *h->etp_rows);
    hcomm_result_t res;
    hcomm__enter(h->etp, fn);
    if (!mine || !all || !h->etp_rows) {
        res = hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for counts");
        res = hcomm__coll_fail(h->etp, prev != HCOMM_OK ? prev : res);
        goto done;
    }
    mine[ETP_STATUS] = prev;
    mine[ETP_H] = h->h;
    mine[ETP_DTYPE] = h->dtype;
    mine[ETP_EP_RANK] = h->group->rank;
    mine[ETP_EP_SIZE] = h->size;
    mine[ETP_ROWS] = prev == HCOMM_OK ? h->r : 0;
    if (prev == HCOMM_OK) {
        memcpy(mine + ETP_COUNTS, own_counts, sizeof(int64_t) * (size_t)ls);
        memcpy(mine + ETP_COUNTS + ls, h->global_count, sizeof(int64_t) * (size_t)ls);
        mine[ETP_COUNTS + 2 * ls] = h->global_dropped;
    }
    res = hcomm__coll_all_gather(h->etp, mine, all, sizeof(int64_t) * (size_t)w);
    if (res == HCOMM_OK && prev != HCOMM_OK) /* this rank's own message is still the last */
        res = prev;
    if (res == HCOMM_OK)
        res = check_members(fn, h, all, w);
    if (res == HCOMM_OK) { /* every member goes on to the rows' gather: a local failure joins it */
        sum_stats(h, all, w);
        res = gathered_layout(fn, h, all, w);
        res = res == HCOMM_OK ? gather_recv(fn, h) : hcomm__coll_fail(h->etp, res);
    }
done:
    free(mine);
    free(all);
    return hcomm__leave(h->etp, res);
}
