/* The shard plan (ZeRO, FSDP, HSDP): the bucket layout from the parameter list, its agreement
 * across the shard and replicate groups before any data moves, the shards and the accessors.
 * Buckets follow DDP's rule in list order (cut at a dtype change or when the cap would
 * overflow) and are padded to a multiple of the shard group's size, as FSDP's flat
 * parameters are, so that every rank's shard has the same size. */
#include "prims/zero_internal.h"

#include <stdio.h>
#include <string.h>

/* ---- checks and agreement ---- */

static bool reduce_dtype_ok(hcomm_dtype_t dt, int rd) {
    if (rd == HCOMM_ZERO_PARAM_DTYPE || rd == (int)dt)
        return true;
    return hcomm__dtype_is_float(dt) && hcomm__dtype_valid((hcomm_dtype_t)rd) &&
           hcomm__dtype_is_float((hcomm_dtype_t)rd) &&
           hcomm__dtype_size((hcomm_dtype_t)rd) > hcomm__dtype_size(dt);
}

static hcomm_result_t check_config(const char *fn, const hcomm_zero_config_t *c) {
    if (c->stage < 1 || c->stage > 3)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "cfg->stage=%d is not 1, 2 or 3", c->stage);
    if (c->op != HCOMM_SUM && c->op != HCOMM_AVG)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "cfg->op=%d is not HCOMM_SUM or HCOMM_AVG",
                          (int)c->op);
    if (c->spares < 0 || c->spares > ZERO_SPARES)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "cfg->spares=%d is outside 0..%d", c->spares,
                          ZERO_SPARES);
    if (c->reduce_dtype != HCOMM_ZERO_PARAM_DTYPE && !hcomm__dtype_valid(c->reduce_dtype))
        return hcomm__err(HCOMM_ERR_DTYPE, fn,
                          "cfg->reduce_dtype=%d is neither a dtype nor HCOMM_ZERO_PARAM_DTYPE",
                          c->reduce_dtype);
    return HCOMM_OK;
}

static hcomm_result_t check_args(const char *fn, const hcomm_tensor_t *params, int n,
                                 const hcomm_zero_config_t *c) {
    if (!c)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'cfg' is NULL");
    HCOMM__TRY(check_config(fn, c));
    if (n < 0)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, fn, "n=%d is negative", n);
    if (n > 0 && !params)
        return hcomm__err(HCOMM_ERR_NULL, fn, "argument 'params' is NULL with n=%d", n);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "params[%d]", i);
        HCOMM__TRY(hcomm__tensor_check(fn, name, &params[i], NULL));
        if (!reduce_dtype_ok(params[i].dtype, c->reduce_dtype))
            return hcomm__err(HCOMM_ERR_DTYPE, fn,
                              "cfg->reduce_dtype=%s cannot reduce params[%d] of dtype %s (it "
                              "must be the same dtype or a wider float)",
                              hcomm__dtype_str((hcomm_dtype_t)c->reduce_dtype), i,
                              hcomm__dtype_str(params[i].dtype));
    }
    return HCOMM_OK;
}

/* One parameter as ranks exchange it when their lists differ. */
typedef struct pdesc {
    int64_t present, dtype, ndim, shape[HCOMM_MAX_DIMS];
} pdesc_t;

static pdesc_t describe(const hcomm_tensor_t *params, int n, int i) {
    pdesc_t d;
    memset(&d, 0, sizeof d);
    if (i >= n)
        return d;
    d.present = 1;
    d.dtype = params[i].dtype;
    d.ndim = params[i].ndim;
    for (int k = 0; k < params[i].ndim; k++)
        d.shape[k] = params[i].shape[k];
    return d;
}

static int64_t desc_hash(const pdesc_t *d) {
    uint64_t h = 1469598103934665603ull;
    const int64_t *w = &d->present;
    for (size_t k = 0; k < sizeof *d / sizeof(int64_t); k++)
        h = (h ^ (uint64_t)w[k]) * 1099511628211ull;
    return (int64_t)(h >> 2);
}

static void desc_str(const pdesc_t *d, char *buf, size_t cap) {
    if (!d->present) {
        snprintf(buf, cap, "absent");
        return;
    }
    int len = snprintf(buf, cap, "%s[", hcomm__dtype_str((hcomm_dtype_t)d->dtype));
    for (int k = 0; k < d->ndim && len > 0 && (size_t)len < cap; k++)
        len +=
            snprintf(buf + len, cap - (size_t)len, "%s%lld", k ? ", " : "", (long long)d->shape[k]);
    if (len > 0 && (size_t)len < cap)
        snprintf(buf + len, cap - (size_t)len, "]");
}

/* Names the first rank whose params[i] differs from rank 0's, with both shapes: every rank
 * gathers every rank's description, so every rank prints the same message. */
static hcomm_result_t name_difference(hcomm_comm_t *g, const hcomm_tensor_t *params, int n, int i,
                                      const char *gname) {
    int S = 0;
    HCOMM__TRY(hcomm_comm_size(g, &S));
    pdesc_t mine = describe(params, n, i), *all = calloc((size_t)S, sizeof *all);
    if (!all)
        return hcomm__err(HCOMM_ERR_NOMEM, g->call_fn, "out of memory");
    hcomm_result_t r = hcomm__coll_all_gather(g, &mine, all, sizeof mine);
    int q = 1;
    while (r == HCOMM_OK && q < S - 1 && memcmp(&all[q], &all[0], sizeof mine) == 0)
        q++;
    char a[160], b[160];
    desc_str(&all[0], a, sizeof a);
    desc_str(&all[q < S ? q : 0], b, sizeof b);
    free(all);
    HCOMM__TRY(r);
    return hcomm__err(HCOMM_ERR_MISMATCH, g->call_fn,
                      "params[%d] is %s on rank 0 but %s on rank %d of the %s group; every rank "
                      "must pass the same parameter list",
                      i, a, b, q, gname);
}

enum { H_VALID, H_N, H_STAGE, H_BUCKET, H_OP, H_RD, H_ACC, H_COUNT };

/* The header: validity and config; then a hash per parameter up to the longest list. One
 * MAX all_reduce of (v, -v) gives each entry's max and min; entries that differ name the
 * mismatch. Every rank joins it, its own checks failed or not. */
static hcomm_result_t agree(hcomm_comm_t *g, const char *gname, bool valid,
                            const hcomm_tensor_t *params, int n, const hcomm_zero_config_t *c) {
    const int64_t h[H_COUNT] = {valid,
                                valid ? n : 0,
                                valid ? c->stage : 0,
                                valid ? (int64_t)c->bucket_bytes : 0,
                                valid ? c->op : 0,
                                valid ? c->reduce_dtype : 0,
                                valid ? c->accumulate != 0 : 0};
    int64_t buf[2 * H_COUNT];
    for (int k = 0; k < H_COUNT; k++) {
        buf[k] = h[k];
        buf[H_COUNT + k] = -h[k];
    }
    HCOMM__TRY(hcomm__coll_all_reduce(g, buf, buf, 2 * H_COUNT, HCOMM_I64, HCOMM_MAX));
    if (-buf[H_COUNT + H_VALID] == 0)
        return valid ? hcomm__err(HCOMM_ERR_PEER, g->call_fn,
                                  "another rank of the %s group failed its argument checks", gname)
                     : HCOMM_ERR_INVALID_ARG; /* the caller re-records its own message */
    int nmax = (int)buf[H_N];
    int64_t *hs = calloc((size_t)(2 * nmax + 1), sizeof *hs);
    if (!hs)
        return hcomm__err(HCOMM_ERR_NOMEM, g->call_fn, "out of memory");
    for (int i = 0; i < nmax; i++) {
        pdesc_t d = describe(params, n, i);
        hs[i] = desc_hash(&d);
        hs[nmax + i] = -hs[i];
    }
    hcomm_result_t r = hcomm__coll_all_reduce(g, hs, hs, (size_t)(2 * nmax), HCOMM_I64, HCOMM_MAX);
    int first = -1;
    for (int i = 0; r == HCOMM_OK && i < nmax && first < 0; i++)
        if (hs[i] != -hs[nmax + i])
            first = i;
    free(hs);
    HCOMM__TRY(r);
    if (first >= 0)
        return name_difference(g, params, n, first, gname);
    static const char *const names[H_COUNT] = {"",
                                               "n",
                                               "cfg->stage",
                                               "cfg->bucket_bytes",
                                               "cfg->op",
                                               "cfg->reduce_dtype",
                                               "cfg->accumulate"};
    for (int k = H_STAGE; k < H_COUNT; k++)
        if (buf[k] != -buf[H_COUNT + k])
            return hcomm__err(HCOMM_ERR_MISMATCH, g->call_fn,
                              "%s differs across the %s group (this rank: %lld)", names[k], gname,
                              (long long)h[k]);
    return HCOMM_OK;
}

/* ---- layout and buffers ---- */

static void form_buckets(hcomm_zero_plan_t *p, const hcomm_tensor_t *params) {
    size_t cap = p->cfg.bucket_bytes ? p->cfg.bucket_bytes : HCOMM_ZERO_BUCKET_BYTES_DEFAULT;
    zbucket_t *b = NULL;
    for (int i = 0; i < p->n; i++) {
        hcomm_dtype_t dt = params[i].dtype;
        size_t es = hcomm__dtype_size(dt), ne = hcomm__tensor_bytes(&params[i]) / es;
        p->numel[i] = ne;
        p->bucket_of[i] = -1;
        if (ne == 0)
            continue;
        if (!b || b->dt != dt || (b->numel + ne) * es > cap) {
            b = &p->b[p->nb++];
            int rd = p->cfg.reduce_dtype;
            *b = (zbucket_t){
                .dt = dt, .rd = rd == HCOMM_ZERO_PARAM_DTYPE ? dt : (hcomm_dtype_t)rd, .first = i};
        }
        p->offset[i] = b->numel;
        p->bucket_of[i] = p->nb - 1;
        b->numel += ne;
        b->end = i + 1;
    }
    for (int k = 0; k < p->nb; k++) {
        zbucket_t *z = &p->b[k];
        z->shard = (z->numel + (size_t)p->S - 1) / (size_t)p->S;
        z->padded = z->shard * (size_t)p->S;
    }
}

/* Copies the part of params[i] that falls in this rank's shard of its bucket. */
static void copy_into_shard(hcomm_zero_plan_t *p, const hcomm_tensor_t *params, int i) {
    const zbucket_t *b = &p->b[p->bucket_of[i]];
    size_t es = hcomm__dtype_size(b->dt), lo = (size_t)p->rank * b->shard, hi = lo + b->shard;
    size_t a = p->offset[i], e = a + p->numel[i];
    size_t from = a > lo ? a : lo, to = e < hi ? e : hi;
    if (from < to)
        memcpy((char *)b->pshard + (from - lo) * es, (const char *)params[i].data + (from - a) * es,
               (to - from) * es);
}

static hcomm_result_t alloc_shards(hcomm_zero_plan_t *p, const hcomm_tensor_t *params) {
    for (int k = 0; k < p->nb; k++) {
        zbucket_t *b = &p->b[k];
        size_t es = hcomm__dtype_size(b->dt);
        if (p->cfg.stage == 3) {
            HCOMM__TRY(hcomm__zero_alloc(p, b->shard * es, &b->pshard));
            continue;
        }
        /* ZeRO-1/2 keep the gathered parameters: the shard is this rank's block of them. */
        HCOMM__TRY(hcomm__zero_alloc(p, b->padded * es, &b->full));
        b->full_owned = true;
        b->pshard = (char *)b->full + (size_t)p->rank * b->shard * es;
    }
    for (int i = 0; i < p->n; i++)
        if (p->bucket_of[i] >= 0)
            copy_into_shard(p, params, i);
    return HCOMM_OK;
}

static void plan_free(hcomm_zero_plan_t *p) {
    for (int k = 0; p->b && k < p->nb; k++) {
        zbucket_t *b = &p->b[k];
        size_t es = hcomm__dtype_size(b->dt), rs = hcomm__dtype_size(b->rd);
        if (p->cfg.stage == 3)
            hcomm__zero_free(p, &b->pshard, b->shard * es);
        hcomm__zero_free(p, &b->gshard, b->shard * rs);
        hcomm__zero_free(p, &b->gfull, b->padded * es);
        hcomm__zero_free(p, &b->gwide, b->padded * rs);
        hcomm__zero_free(p, &b->gnew, b->shard * rs);
        if (b->full_owned)
            hcomm__zero_free(p, &b->full, b->padded * es);
    }
    for (int i = 0; i < ZERO_SPARES; i++)
        hcomm__zero_free(p, &p->spare[i], p->spare_bytes[i]);
    free(p->offset);
    free(p->numel);
    free(p->bucket_of);
    free(p->b);
    free(p);
}

static hcomm_result_t plan_new(hcomm_comm_t *g, hcomm_comm_t *rep, const hcomm_tensor_t *params,
                               int n, const hcomm_zero_config_t *cfg, hcomm_zero_plan_t **out) {
    hcomm_zero_plan_t *p = calloc(1, sizeof *p);
    size_t nn = (size_t)(n > 0 ? n : 1);
    if (p) {
        *p = (hcomm_zero_plan_t){.g = g, .rep = rep, .cfg = *cfg, .n = n};
        p->offset = calloc(nn, sizeof *p->offset);
        p->numel = calloc(nn, sizeof *p->numel);
        p->bucket_of = calloc(nn, sizeof *p->bucket_of);
        p->b = calloc(nn, sizeof *p->b);
    }
    if (!p || !p->offset || !p->numel || !p->bucket_of || !p->b) {
        if (p)
            plan_free(p);
        return hcomm__err(HCOMM_ERR_NOMEM, g->call_fn, "out of memory for a plan of %d", n);
    }
    hcomm_result_t r = hcomm_comm_size(g, &p->S);
    if (r == HCOMM_OK)
        r = hcomm_comm_rank(g, &p->rank);
    if (r == HCOMM_OK)
        form_buckets(p, params);
    if (r == HCOMM_OK)
        r = alloc_shards(p, params);
    if (r == HCOMM_OK && cfg->stage < 3)
        r = hcomm__zero_gather_all(p);
    if (r != HCOMM_OK) {
        plan_free(p);
        return r;
    }
    *out = p;
    return HCOMM_OK;
}

static hcomm_result_t create(hcomm_comm_t *g, hcomm_comm_t *rep, const hcomm_tensor_t *params,
                             int n, const hcomm_zero_config_t *cfg, hcomm_zero_plan_t **out) {
    const char *fn = g->call_fn;
    hcomm_result_t chk = check_args(fn, params, n, cfg);
    hcomm_result_t r = agree(g, "shard", chk == HCOMM_OK, params, n, cfg);
    if (rep) { /* always joined: replicas in other shard groups wait for this rank */
        hcomm__enter(rep, fn);
        hcomm_result_t rr =
            agree(rep, "replicate", chk == HCOMM_OK && r == HCOMM_OK, params, n, cfg);
        hcomm__leave(rep, rr);
        r = r == HCOMM_OK ? rr : r;
    }
    if (chk != HCOMM_OK) /* re-records this rank's own message */
        return check_args(fn, params, n, cfg);
    HCOMM__TRY(r);
    return plan_new(g, rep, params, n, cfg, out);
}

hcomm_result_t hcomm_zero_create(hcomm_comm_t *shard_group, hcomm_comm_t *replicate_group,
                                 const hcomm_tensor_t *params, int n,
                                 const hcomm_zero_config_t *cfg, hcomm_zero_plan_t **out) {
    HCOMM__CHECK_NULL(shard_group);
    HCOMM__CHECK_NULL(out);
    *out = NULL;
    hcomm__enter(shard_group, __func__);
    return hcomm__leave(shard_group, create(shard_group, replicate_group, params, n, cfg, out));
}

hcomm_result_t hcomm_zero_destroy(hcomm_zero_plan_t **plan) {
    if (!plan || !*plan)
        return HCOMM_OK;
    hcomm_zero_plan_t *p = *plan;
    hcomm_result_t res = HCOMM_OK;
    for (int k = 0; k < p->nb; k++) {
        hcomm_result_t w = hcomm__zero_wait_bucket(p, &p->b[k]);
        res = res == HCOMM_OK ? w : res;
    }
    plan_free(p);
    *plan = NULL;
    return res;
}

/* ---- accessors ---- */

hcomm_result_t hcomm_zero_num_buckets(const hcomm_zero_plan_t *plan, int *nb) {
    HCOMM__CHECK_NULL(plan);
    HCOMM__CHECK_NULL(nb);
    *nb = plan->nb;
    return HCOMM_OK;
}

static hcomm_result_t check_index(const char *fn, const hcomm_zero_plan_t *p, int index) {
    if (index >= 0 && index < p->n)
        return HCOMM_OK;
    return hcomm__err(HCOMM_ERR_INVALID_ARG, fn,
                      "index=%d is outside 0..%d (the plan has %d "
                      "parameters)",
                      index, p->n - 1, p->n);
}

hcomm_result_t hcomm_zero_locate(const hcomm_zero_plan_t *plan, int index, int *bucket,
                                 size_t *gather_bytes) {
    HCOMM__CHECK_NULL(plan);
    HCOMM__TRY(check_index(__func__, plan, index));
    int k = plan->bucket_of[index];
    if (bucket)
        *bucket = k;
    if (gather_bytes)
        *gather_bytes = k < 0 ? 0 : plan->b[k].padded * hcomm__dtype_size(plan->b[k].dt);
    return HCOMM_OK;
}

hcomm_result_t hcomm_zero_shard(const hcomm_zero_plan_t *plan, int bucket,
                                hcomm_zero_shard_t *out) {
    HCOMM__CHECK_NULL(plan);
    HCOMM__CHECK_NULL(out);
    if (bucket < 0 || bucket >= plan->nb)
        return hcomm__err(HCOMM_ERR_INVALID_ARG, __func__, "bucket=%d is outside 0..%d", bucket,
                          plan->nb - 1);
    const zbucket_t *b = &plan->b[bucket];
    size_t off = (size_t)plan->rank * b->shard;
    size_t valid = b->numel > off ? b->numel - off : 0;
    *out = (hcomm_zero_shard_t){b->pshard, b->gshard, b->shard, valid < b->shard ? valid : b->shard,
                                off,       b->dt,     b->rd};
    return HCOMM_OK;
}

hcomm_result_t hcomm_zero_param(hcomm_zero_plan_t *plan, int index, void **data) {
    HCOMM__CHECK_NULL(plan);
    HCOMM__CHECK_NULL(data);
    *data = NULL;
    HCOMM__TRY(check_index(__func__, plan, index));
    int k = plan->bucket_of[index];
    if (k < 0)
        return HCOMM_OK;
    zbucket_t *b = &plan->b[k];
    if (b->ag) {
        hcomm_result_t w = hcomm_wait(b->ag);
        b->ag = NULL;
        b->gathered = w == HCOMM_OK;
        HCOMM__TRY(w);
    }
    if (!b->gathered)
        return hcomm__err(HCOMM_ERR_STATE, __func__,
                          "params[%d] (bucket %d) is not gathered: call "
                          "hcomm_zero_all_gather_params first",
                          index, k);
    *data = (char *)b->full + plan->offset[index] * hcomm__dtype_size(b->dt);
    return HCOMM_OK;
}

hcomm_result_t hcomm_zero_grad(hcomm_zero_plan_t *plan, int index, void **data) {
    HCOMM__CHECK_NULL(plan);
    HCOMM__CHECK_NULL(data);
    *data = NULL;
    HCOMM__TRY(check_index(__func__, plan, index));
    int k = plan->bucket_of[index];
    if (k < 0)
        return HCOMM_OK;
    zbucket_t *b = &plan->b[k];
    if (b->rs)
        return hcomm__err(HCOMM_ERR_STATE, __func__,
                          "params[%d]'s bucket %d has a reduce_scatter in flight: wait for it "
                          "(hcomm_zero_wait) first",
                          index, k);
    size_t es = hcomm__dtype_size(b->dt);
    if (!b->gfull) {
        hcomm__enter(plan->g, __func__);
        hcomm_result_t r = hcomm__zero_alloc(plan, b->padded * es, &b->gfull);
        HCOMM__TRY(hcomm__leave(plan->g, r));
    }
    hcomm__zero_fresh_grads(b);
    *data = (char *)b->gfull + plan->offset[index] * es;
    return HCOMM_OK;
}

/* HCOMM_ERR_STATE naming the first bucket with a reduce_scatter in flight. */
static hcomm_result_t none_in_flight(const char *fn, const hcomm_zero_plan_t *p) {
    for (int k = 0; k < p->nb; k++)
        if (p->b[k].rs)
            return hcomm__err(HCOMM_ERR_STATE, fn,
                              "bucket %d has a reduce_scatter in flight: wait for it first", k);
    return HCOMM_OK;
}

hcomm_result_t hcomm_zero_clear_grads(hcomm_zero_plan_t *plan) {
    HCOMM__CHECK_NULL(plan);
    HCOMM__TRY(none_in_flight(__func__, plan));
    for (int k = 0; k < plan->nb; k++)
        hcomm__zero_free(plan, &plan->b[k].gshard,
                         plan->b[k].shard * hcomm__dtype_size(plan->b[k].rd));
    return HCOMM_OK;
}

hcomm_result_t hcomm_zero_set_no_sync(hcomm_zero_plan_t *plan, int on) {
    HCOMM__CHECK_NULL(plan);
    HCOMM__TRY(none_in_flight(__func__, plan));
    plan->no_sync = on != 0;
    return HCOMM_OK;
}

hcomm_result_t hcomm_zero_memory(const hcomm_zero_plan_t *plan, size_t *live, size_t *peak) {
    HCOMM__CHECK_NULL(plan);
    if (live)
        *live = plan->live;
    if (peak)
        *peak = plan->peak;
    return HCOMM_OK;
}
