/* The DP gradient reducer: DDP's overlap of gradient all_reduce with the backward pass (Li et
 * al. 2020, "PyTorch Distributed", section 3.2). Buckets are fixed at registration in reverse
 * order; marking a bucket's last gradient ready starts its nonblocking all_reduce, always in
 * bucket order, so every rank issues the same sequence whatever order its backward pass marks
 * gradients in; finish() waits for the buckets and copies packed results back. */
#include "hcomm/dp.h"
#include "prims/prims.h"

#include <stdio.h>
#include <string.h>

typedef struct rbucket {
    hcomm_dtype_t dt;
    int first, count; /* members: order[first .. first+count) */
    size_t bytes;
    int pending;  /* members not marked yet this step */
    void *packed; /* NULL: one member, reduced in place */
    hcomm_request_t *req;
} rbucket_t;

struct hcomm_dp_reducer {
    hcomm_comm_t *g;
    hcomm_op_t op;
    int n, nb, next_start;
    hcomm_tensor_t *grads;
    int *order;     /* bucket members, bucket by bucket */
    int *bucket_of; /* [n]; -1 for tensors without elements */
    bool *marked;   /* [n] this step */
    rbucket_t *b;
};

/* Closes the bucket being formed (if it has members) and opens the next. */
static void close_bucket(hcomm_dp_reducer_t *r, int *next_member) {
    rbucket_t *b = &r->b[r->nb];
    if (b->count == 0)
        return;
    b->pending = b->count;
    r->nb++;
    r->b[r->nb] = (rbucket_t){.first = *next_member};
}

/* DDP's layout: walk the list backwards, cut at a dtype change or when the cap would overflow. */
static void form_buckets(hcomm_dp_reducer_t *r, size_t cap) {
    int m = 0;
    r->b[0] = (rbucket_t){0};
    for (int i = r->n - 1; i >= 0; i--) {
        size_t tb = hcomm__tensor_bytes(&r->grads[i]);
        r->bucket_of[i] = -1;
        if (tb == 0)
            continue;
        rbucket_t *b = &r->b[r->nb];
        if (b->count > 0 && (b->dt != r->grads[i].dtype || b->bytes + tb > cap)) {
            close_bucket(r, &m);
            b = &r->b[r->nb];
        }
        b->dt = r->grads[i].dtype;
        b->bytes += tb;
        b->count++;
        r->order[m++] = i;
        r->bucket_of[i] = r->nb;
    }
    close_bucket(r, &m);
}

static hcomm_result_t alloc_packs(hcomm_dp_reducer_t *r) {
    for (int k = 0; k < r->nb; k++)
        if (r->b[k].count > 1)
            HCOMM__TRY(hcomm__alloc(r->g->call_fn, r->b[k].bytes, &r->b[k].packed));
    return HCOMM_OK;
}

/* The bucket's all_reduce, if one was started, completed (its request is gone after). */
static hcomm_result_t wait_bucket(rbucket_t *b) {
    hcomm_result_t w = b->req ? hcomm_wait(b->req) : HCOMM_OK;
    b->req = NULL;
    return w;
}

static void reducer_free(hcomm_dp_reducer_t *r) {
    for (int k = 0; r->b && k < r->nb; k++)
        free(r->b[k].packed);
    free(r->grads);
    free(r->order);
    free(r->bucket_of);
    free(r->marked);
    free(r->b);
    free(r);
}

static hcomm_result_t reducer_new(hcomm_comm_t *g, const hcomm_tensor_t *grads, int n,
                                  hcomm_op_t op, size_t cap, hcomm_dp_reducer_t **out) {
    hcomm_dp_reducer_t *r = calloc(1, sizeof *r);
    size_t nn = (size_t)(n > 0 ? n : 1);
    if (r) {
        *r = (hcomm_dp_reducer_t){.g = g, .op = op, .n = n};
        r->grads = malloc(sizeof *r->grads * nn);
        r->order = malloc(sizeof *r->order * nn);
        r->bucket_of = malloc(sizeof *r->bucket_of * nn);
        r->marked = calloc(nn, sizeof *r->marked);
        r->b = calloc(nn + 1, sizeof *r->b);
    }
    if (!r || !r->grads || !r->order || !r->bucket_of || !r->marked || !r->b) {
        if (r)
            reducer_free(r);
        return hcomm__err(HCOMM_ERR_NOMEM, g->call_fn, "out of memory for a reducer of %d", n);
    }
    if (n > 0)
        memcpy(r->grads, grads, sizeof *grads * (size_t)n);
    form_buckets(r, cap);
    hcomm_result_t res = alloc_packs(r);
    if (res != HCOMM_OK) {
        reducer_free(r);
        return res;
    }
    *out = r;
    return HCOMM_OK;
}

/* The one collective check of the list: a 0-element all_reduce whose signature carries its
 * digest, so a different list on any rank fails on every rank. */
static hcomm_result_t agree_on_list(hcomm_comm_t *g, const hcomm_tensor_t *grads, int n) {
    char desc[200];
    hcomm__coll_set_extra(g, hcomm__dp_list_digest(grads, n, desc, sizeof desc), desc);
    hcomm_result_t res = hcomm__coll_all_reduce(g, NULL, NULL, 0, HCOMM_U8, HCOMM_SUM);
    hcomm__coll_clear_extra(g);
    return res;
}

static hcomm_result_t create(hcomm_comm_t *g, const hcomm_tensor_t *grads, int n, hcomm_op_t op,
                             size_t bucket_bytes, hcomm_dp_reducer_t **out) {
    hcomm_result_t chk = hcomm__dp_check_grads(g->call_fn, grads, n, op);
    if (chk != HCOMM_OK)
        return hcomm__coll_fail(g, chk);
    HCOMM__TRY(agree_on_list(g, grads, n));
    return reducer_new(g, grads, n, op, bucket_bytes ? bucket_bytes : HCOMM_DP_BUCKET_BYTES_DEFAULT,
                       out);
}

hcomm_result_t hcomm_dp_reducer_create(hcomm_comm_t *dp_group, const hcomm_tensor_t *grads, int n,
                                       hcomm_op_t op, size_t bucket_bytes,
                                       hcomm_dp_reducer_t **out) {
    HCOMM__CHECK_NULL(dp_group);
    HCOMM__CHECK_NULL(out);
    *out = NULL;
    hcomm__enter(dp_group, __func__);
    return hcomm__leave(dp_group, create(dp_group, grads, n, op, bucket_bytes, out));
}

/* Packs bucket k (if it has several members) and issues its all_reduce. */
static hcomm_result_t start_bucket(hcomm_dp_reducer_t *r, rbucket_t *b) {
    size_t es = hcomm__dtype_size(b->dt);
    void *buf = b->packed;
    if (!buf) {
        buf = r->grads[r->order[b->first]].data;
    } else {
        size_t off = 0;
        for (int j = 0; j < b->count; j++) {
            const hcomm_tensor_t *t = &r->grads[r->order[b->first + j]];
            memcpy((char *)buf + off, t->data, hcomm__tensor_bytes(t));
            off += hcomm__tensor_bytes(t);
        }
    }
    return hcomm_iall_reduce(r->g, buf, buf, b->bytes / es, b->dt, r->op, &b->req);
}

/* Starts every bucket that is complete and whose predecessors have started. */
static hcomm_result_t start_ready(hcomm_dp_reducer_t *r) {
    while (r->next_start < r->nb && r->b[r->next_start].pending == 0)
        HCOMM__TRY(start_bucket(r, &r->b[r->next_start++]));
    return HCOMM_OK;
}

static hcomm_result_t mark(hcomm_dp_reducer_t *r, int index) {
    const char *fn = r->g->call_fn;
    if (index < 0 || index >= r->n)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "index=%d outside 0..%d", index, r->n - 1);
    if (r->marked[index])
        return hcomm__err(HCOMM_ERR_STATE, fn, "grads[%d] was already marked ready this step",
                          index);
    r->marked[index] = true;
    if (r->bucket_of[index] >= 0)
        r->b[r->bucket_of[index]].pending--;
    return start_ready(r);
}

hcomm_result_t hcomm_dp_reducer_mark_ready(hcomm_dp_reducer_t *r, int index) {
    HCOMM__CHECK_NULL(r);
    hcomm__enter(r->g, __func__);
    return hcomm__leave(r->g, mark(r, index));
}

static void unpack(hcomm_dp_reducer_t *r, const rbucket_t *b) {
    size_t off = 0;
    for (int j = 0; b->packed && j < b->count; j++) {
        const hcomm_tensor_t *t = &r->grads[r->order[b->first + j]];
        memcpy(t->data, (const char *)b->packed + off, hcomm__tensor_bytes(t));
        off += hcomm__tensor_bytes(t);
    }
}

/* Starts what is left (in bucket order, as every rank does), then waits for each bucket. */
static hcomm_result_t finish(hcomm_dp_reducer_t *r, double *wait_s) {
    int unmarked = -1;
    for (int i = 0; i < r->n; i++) /* tensors without elements are in no bucket: not named */
        if (!r->marked[i] && r->bucket_of[i] >= 0 && unmarked < 0)
            unmarked = i;
    for (int k = 0; k < r->nb; k++)
        r->b[k].pending = 0;
    hcomm_result_t res = start_ready(r);
    double t0 = hcomm__now();
    for (int k = 0; k < r->nb; k++) {
        hcomm_result_t w = wait_bucket(&r->b[k]);
        if (w == HCOMM_OK)
            unpack(r, &r->b[k]);
        else if (res == HCOMM_OK)
            res = w;
        r->b[k].pending = r->b[k].count;
    }
    if (wait_s)
        *wait_s = hcomm__now() - t0;
    r->next_start = 0;
    memset(r->marked, 0, sizeof *r->marked * (size_t)(r->n > 0 ? r->n : 1));
    if (res == HCOMM_OK && unmarked >= 0)
        res = hcomm__err(HCOMM_ERR_STATE, r->g->call_fn,
                         "grads[%d] was never marked ready; it was reduced as it was", unmarked);
    return res;
}

hcomm_result_t hcomm_dp_reducer_finish(hcomm_dp_reducer_t *r, double *wait_s) {
    HCOMM__CHECK_NULL(r);
    hcomm__enter(r->g, __func__);
    return hcomm__leave(r->g, finish(r, wait_s));
}

/* A bucket still being reduced belongs to the communicator's worker until its request
 * completes: waited for before anything is freed. */
hcomm_result_t hcomm_dp_reducer_destroy(hcomm_dp_reducer_t *r) {
    if (!r)
        return HCOMM_OK;
    hcomm_result_t res = HCOMM_OK;
    for (int k = 0; k < r->nb; k++) {
        hcomm_result_t w = wait_bucket(&r->b[k]);
        if (res == HCOMM_OK)
            res = w;
    }
    reducer_free(r);
    return res;
}
