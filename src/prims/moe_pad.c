/* Pad-to-capacity dispatch: static shapes, no count exchange (a plan with pad_to_capacity).
 * Each rank sends each peer one block of fixed size: its meta row (checks and statistics ride
 * here), then capacity rows for each of the peer's experts, the kept slots in token order and
 * zeros after them. Pairs are those rows (pair e * capacity + c: expert e, position c; slot -1
 * for padding); received rows are [local expert][source][capacity]. */
#include "prims/moe_common.h"

#include <string.h>

/* Places this rank's kept slots into the pair rows of their expert; meta row 0 gets the
 * counts per expert. */
static hcomm_result_t pad_layout(const hcomm__moe_args_t *a, hcomm_moe_handle_t *h, int64_t *meta) {
    uint8_t *keep = malloc((size_t)(h->n * h->k) + 1);
    if (keep == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, a->fn, "out of memory for the layout");
    hcomm_result_t res = hcomm__moe_mark_kept(a, h, keep);
    for (int64_t s = 0; res == HCOMM_OK && s < h->n * h->k; s++) {
        h->slot_pair[s] = -1;
        if (!keep[s])
            continue;
        int64_t e = a->ids[s], q = e * h->capacity + meta[META_COUNTS + e]++;
        h->pair_slot[q] = s;
        h->slot_pair[s] = q;
    }
    free(keep);
    return res;
}

/* Sets the fixed layout both sides know without exchanging counts. */
static void pad_routes(hcomm_moe_handle_t *h) {
    int64_t block = h->num_local * h->capacity;
    for (int p = 0; p < h->size; p++) {
        h->pair_rows[p] = h->rpair_rows[p] = block;
        h->pair_off[p] = h->rpair_off[p] = p * block;
    }
    h->r = h->npair = h->size * block;
    for (int l = 0; l <= h->num_local; l++)
        h->expert_off[l] = (int64_t)l * h->size * h->capacity;
    for (int l = 0; l < h->num_local; l++)
        for (int s = 0; s < h->size; s++)
            for (int64_t c = 0; c < h->capacity; c++)
                h->out_pair[(l * h->size + s) * h->capacity + c] = s * block + l * h->capacity + c;
}

/* Packs each peer's block: meta row, then its pair rows (zeros for padding). */
static void pad_pack(const hcomm_moe_handle_t *h, const void *tokens, const int64_t *meta, int w,
                     size_t rb, size_t block_bytes, char *buf) {
    for (int p = 0; p < h->size; p++) {
        char *dst = buf + (size_t)p * block_bytes;
        memcpy(dst, meta + p * w, sizeof(int64_t) * (size_t)w);
        dst += sizeof(int64_t) * (size_t)w;
        for (int64_t i = 0; i < h->pair_rows[p]; i++) {
            int64_t s = h->pair_slot[h->pair_off[p] + i];
            if (s < 0)
                memset(dst + (size_t)i * rb, 0, rb);
            else
                memcpy(dst + (size_t)i * rb, (const char *)tokens + (size_t)(s / h->k) * rb, rb);
        }
    }
}

/* Reads every source's meta row from its block, then its rows into [expert][source][cap]. */
static hcomm_result_t pad_unpack(const char *fn, hcomm_moe_handle_t *h, const char *buf, int w,
                                 size_t rb, size_t block_bytes) {
    int64_t *meta = hcomm__moe_alloc_i64((size_t)(h->size * w));
    if (meta == NULL)
        return hcomm__err(HCOMM_ERR_NOMEM, fn, "out of memory for counts");
    for (int s = 0; s < h->size; s++)
        memcpy(meta + s * w, buf + (size_t)s * block_bytes, sizeof(int64_t) * (size_t)w);
    hcomm_result_t res = hcomm__moe_check_peers(fn, h, meta);
    for (int s = 0; res == HCOMM_OK && s < h->size; s++) {
        hcomm__moe_add_stats(h, meta + s * w);
        const char *rows = buf + (size_t)s * block_bytes + sizeof(int64_t) * (size_t)w;
        for (int l = 0; l < h->num_local; l++) /* one block copy per (expert, source) */
            memcpy((char *)h->recv + (size_t)((l * h->size + s) * h->capacity) * rb,
                   rows + (size_t)(l * h->capacity) * rb, (size_t)h->capacity * rb);
    }
    free(meta);
    return res;
}

/* The padded dispatch: one all_to_all of fixed blocks. */
hcomm_result_t hcomm__moe_dispatch_padded(const hcomm__moe_args_t *a, hcomm_moe_handle_t *h,
                                          hcomm_result_t local) {
    int w = hcomm__moe_meta_width(h);
    size_t rb = (size_t)h->plan->d.hidden * hcomm__dtype_size(h->plan->d.dtype),
           block_bytes = sizeof(int64_t) * (size_t)w + (size_t)(h->num_local * h->capacity) * rb;
    int64_t npair = h->size * h->num_local * h->capacity;
    int64_t *meta = hcomm__moe_alloc_i64((size_t)(h->size * w));
    char *sbuf = NULL, *rbuf = NULL;
    hcomm_result_t res = HCOMM_OK;
    h->pair_slot = hcomm__moe_alloc_i64((size_t)npair);
    h->out_pair = hcomm__moe_alloc_i64((size_t)npair);
    if (!meta || !h->pair_slot || !h->out_pair) {
        res = hcomm__err(HCOMM_ERR_NOMEM, a->fn, "out of memory for %lld padded rows",
                         (long long)npair);
        goto done;
    }
    HCOMM__TRY_GOTO(
        hcomm__moe_pool_get(h->pool, a->fn, block_bytes * (size_t)h->size, (void **)&sbuf), res,
        done);
    HCOMM__TRY_GOTO(
        hcomm__moe_pool_get(h->pool, a->fn, block_bytes * (size_t)h->size, (void **)&rbuf), res,
        done);
    memset(h->pair_slot, 0xff, sizeof(int64_t) * (size_t)npair); /* every pair padding */
    pad_routes(h);
    if (local == HCOMM_OK)
        local = pad_layout(a, h, meta);
    hcomm__moe_fill_meta(h, local, meta, w);
    for (int p = 0; p < h->size; p++)
        meta[p * w + META_ROWS] = h->pair_rows[p];
    pad_pack(h, local == HCOMM_OK ? a->tokens->data : NULL, meta, w, rb, block_bytes, sbuf);
    HCOMM__TRY_GOTO(hcomm__coll_all_to_all_checked(h->group, sbuf, rbuf, block_bytes), res, done);
    res = local != HCOMM_OK ? local : pad_unpack(a->fn, h, rbuf, w, rb, block_bytes);
done:
    free(meta);
    hcomm__moe_pool_put(h->pool, sbuf);
    hcomm__moe_pool_put(h->pool, rbuf);
    return res;
}
