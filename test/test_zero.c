/* The shard plan (hcomm/zero.h) against a serial reference: ZeRO-1/2/3 over a mixed list
 * (f64, f32, bf16, i32, parameters of zero elements), buckets smaller than a parameter, of a
 * few parameters and of all, reduction in the parameter dtype and in a wider one, SUM and AVG,
 * blocking and nonblocking calls, HSDP (shard x replicate groups), no_sync accumulation,
 * caller-owned buffers, the plan's memory figures, and every bad input of the issue: lists that
 * differ (named with both shapes on every rank), bad bucket indices and buffer sizes on one
 * rank only (its peers fail instead of waiting), a release before the gather completed, a
 * narrower reduction dtype and a plan used after destroy. Values are small integers, so the
 * reference sums are exact in every dtype. HCOMM_TEST_MPI */
#include "harness.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { NP = 8 };

static const int64_t lens[NP] = {5, 0, 17, 9, 3, 33, 0, 6};

static double init_val(int i, int64_t j) {
    return (double)((3 * i + (int)j) % 9) - 4;
}

static double grad_val(int rank, int i, int64_t j, int step) {
    return (double)((rank + 5 * i + (int)j + step) % 7) - 3;
}

typedef struct params {
    hcomm_tensor_t t[NP];
    void *data[NP];
} params_t;

static void params_make(params_t *p, const hcomm_dtype_t *types) {
    for (int i = 0; i < NP; i++) {
        size_t es = 0;
        hcomm_dtype_size(types[i], &es);
        p->data[i] = calloc((size_t)lens[i] + 1, es);
        hcomm_tensor_init(&p->t[i], p->data[i], types[i], 1, &lens[i]);
        for (int64_t j = 0; j < lens[i]; j++)
            t_set_val(types[i], p->data[i], (size_t)j, init_val(i, j));
    }
}

static void params_free(params_t *p) {
    for (int i = 0; i < NP; i++)
        free(p->data[i]);
}

/* ---- the reference layout: list order, a new bucket at a dtype change or an overflow ---- */

typedef struct layout {
    int nb, bucket_of[NP];
    size_t offset[NP], numel[NP + 1];
} layout_t;

static layout_t ref_layout(const hcomm_dtype_t *types, size_t cap) {
    layout_t l = {0, {0}, {0}, {0}};
    hcomm_dtype_t cur = HCOMM_DTYPE_COUNT;
    for (int i = 0; i < NP; i++) {
        size_t es = 0, n = (size_t)lens[i];
        hcomm_dtype_size(types[i], &es);
        l.bucket_of[i] = -1;
        if (n == 0)
            continue;
        if (l.nb == 0 || cur != types[i] || (l.numel[l.nb - 1] + n) * es > cap)
            l.numel[l.nb++] = 0;
        cur = types[i];
        l.bucket_of[i] = l.nb - 1;
        l.offset[i] = l.numel[l.nb - 1];
        l.numel[l.nb - 1] += n;
    }
    return l;
}

/* What one run sets up: the groups, the config and the dtypes. */
typedef struct run {
    hcomm_comm_t *shard, *rep, *world;
    int S, R, W, rank; /* shard size, replicas, world, rank in world */
    hcomm_zero_config_t cfg;
    const hcomm_dtype_t *types;
    bool nonblocking;
} run_t;

static hcomm_dtype_t rd_of(const run_t *r, int i) {
    return r->cfg.reduce_dtype == HCOMM_ZERO_PARAM_DTYPE ? r->types[i]
                                                         : (hcomm_dtype_t)r->cfg.reduce_dtype;
}

/* Expected reduced gradient of params[i][j] after the given steps were accumulated. */
static double want_grad(const run_t *r, int i, int64_t j, int steps) {
    double sum = 0;
    for (int s = 0; s < r->W; s++)
        for (int k = 0; k < steps; k++)
            sum += grad_val(s, i, j, k);
    return r->cfg.op == HCOMM_AVG ? sum / r->W : sum;
}

static bool close_to(double got, double want, hcomm_dtype_t dt, hcomm_op_t op) {
    if (op == HCOMM_SUM && dt != HCOMM_BF16 && dt != HCOMM_I32)
        return got == want;
    double tol = dt == HCOMM_BF16 ? 1e-2 : dt == HCOMM_F32 ? 1e-6 : dt == HCOMM_I32 ? 1 : 1e-12;
    return fabs(got - want) <= tol * (1 + fabs(want));
}

/* Every full parameter as gathered: the initial values, or after one step of the gradients
 * of two accumulated micro-steps. */
static void check_params(const run_t *r, hcomm_zero_plan_t *plan, bool stepped) {
    long bad = 0;
    for (int i = 0; i < NP; i++) {
        void *d = NULL;
        T_OK(hcomm_zero_param(plan, i, &d));
        T_CHECK((d == NULL) == (lens[i] == 0), "params[%d] view %p with %lld elements", i, d,
                (long long)lens[i]);
        for (int64_t j = 0; d && j < lens[i]; j++) {
            double want = init_val(i, j) - (stepped ? want_grad(r, i, j, 2) : 0);
            bad += t_get_val(r->types[i], d, (size_t)j) != want;
        }
    }
    T_CHECK(bad == 0, "%ld wrong parameters%s (world %d, S %d, stage %d, cap %zu)", bad,
            stepped ? " after the step" : "", r->W, r->S, r->cfg.stage, r->cfg.bucket_bytes);
}

/* The shard's gradients against the reference, element by element, the pad included (zero). */
static void check_shards(const run_t *r, hcomm_zero_plan_t *plan, const layout_t *l, int steps) {
    long bad = 0;
    for (int k = 0; k < l->nb; k++) {
        hcomm_zero_shard_t sh;
        T_OK(hcomm_zero_shard(plan, k, &sh));
        size_t count = (l->numel[k] + (size_t)r->S - 1) / (size_t)r->S;
        size_t off = count * (size_t)(r->rank % r->S);
        T_CHECK(sh.count == count && sh.offset == off,
                "bucket %d: shard %zu at %zu, want %zu at %zu", k, sh.count, sh.offset, count, off);
        if (sh.count != count)
            continue;
        int first = 0;
        while (l->bucket_of[first] != k)
            first++;
        for (size_t e = 0; e < sh.count; e++) {
            double want = 0;
            for (int i = 0; i < NP; i++)
                if (l->bucket_of[i] == k && off + e >= l->offset[i] &&
                    off + e < l->offset[i] + (size_t)lens[i])
                    want = want_grad(r, i, (int64_t)(off + e - l->offset[i]), steps);
            bad += !close_to(t_get_val(sh.reduce_dtype, sh.grads, e), want, rd_of(r, first),
                             r->cfg.op);
        }
        size_t valid = l->numel[k] > off ? l->numel[k] - off : 0;
        T_EQ_INT(sh.valid, valid < count ? valid : count);
    }
    T_CHECK(bad == 0,
            "%ld wrong gradient shard elements (world %d, S %d, stage %d, cap %zu, op %d)", bad,
            r->W, r->S, r->cfg.stage, r->cfg.bucket_bytes, (int)r->cfg.op);
}

/* The optimizer's step on the shard: params -= grads. */
static void step_shards(hcomm_zero_plan_t *plan, int nb) {
    for (int k = 0; k < nb; k++) {
        hcomm_zero_shard_t sh;
        T_OK(hcomm_zero_shard(plan, k, &sh));
        for (size_t e = 0; e < sh.valid; e++)
            t_set_val(sh.param_dtype, sh.params, e,
                      t_get_val(sh.param_dtype, sh.params, e) -
                          t_get_val(sh.reduce_dtype, sh.grads, e));
    }
}

/* Adds micro-step k's gradients of this rank (zero before micro-step 0 of a window). */
static void accumulate(const run_t *r, hcomm_zero_plan_t *plan, int step) {
    long nonzero = 0;
    for (int i = 0; i < NP; i++) {
        void *g = NULL;
        T_OK(hcomm_zero_grad(plan, i, &g));
        T_CHECK((g == NULL) == (lens[i] == 0), "grads[%d] view %p", i, g);
        for (int64_t j = 0; g && j < lens[i]; j++) {
            double old = t_get_val(r->types[i], g, (size_t)j);
            nonzero += step == 0 && old != 0;
            t_set_val(r->types[i], g, (size_t)j, old + grad_val(r->rank, i, j, step));
        }
    }
    T_CHECK(nonzero == 0, "%ld gradients were not zero at the start of a window", nonzero);
}

static hcomm_result_t sync_grads(const run_t *r, hcomm_zero_plan_t *plan, int nb) {
    if (!r->nonblocking)
        return hcomm_zero_reduce_scatter_grads(plan, HCOMM_ZERO_ALL);
    for (int k = nb - 1; k >= 0; k--) /* backward order */
        T_TRY(hcomm_zero_ireduce_scatter_grads(plan, k));
    double w = -1;
    T_TRY(hcomm_zero_wait(plan, HCOMM_ZERO_ALL, &w));
    T_CHECK(w >= 0, "no wait time");
    return HCOMM_OK;
}

static hcomm_result_t gather_all(const run_t *r, hcomm_zero_plan_t *plan, int nb) {
    if (!r->nonblocking)
        return hcomm_zero_all_gather_params(plan, HCOMM_ZERO_ALL, NULL, 0);
    for (int k = 0; k < nb; k++) { /* prefetch k + 1 while k is "used" */
        if (k + 1 < nb)
            T_TRY(hcomm_zero_iall_gather_params(plan, k + 1, NULL, 0));
        T_TRY(hcomm_zero_all_gather_params(plan, k, NULL, 0));
    }
    return HCOMM_OK;
}

static void check_layout(const run_t *r, hcomm_zero_plan_t *plan, const layout_t *l) {
    int nb = -1;
    T_OK(hcomm_zero_num_buckets(plan, &nb));
    T_EQ_INT(nb, l->nb);
    for (int i = 0; i < NP; i++) {
        int k = -2;
        size_t bytes = 1, es = 0;
        T_OK(hcomm_zero_locate(plan, i, &k, &bytes));
        T_EQ_INT(k, l->bucket_of[i]);
        hcomm_dtype_size(r->types[i], &es);
        size_t padded = k < 0 ? 0 : (l->numel[k] + (size_t)r->S - 1) / (size_t)r->S * (size_t)r->S;
        T_EQ_INT(bytes, padded * es);
    }
}

/* Shards, and in ZeRO-3 after a release at most the spare buffers the plan keeps for reuse
 * (cfg.spares, each one bucket's parameters or gradients, widened at most twice): the plan's
 * live bytes; none without spares. */
static void check_memory(const run_t *r, hcomm_zero_plan_t *plan, int nb) {
    size_t live = 0, peak = 0, want = 0, biggest = 0;
    T_OK(hcomm_zero_memory(plan, &live, &peak));
    for (int k = 0; k < nb; k++) {
        hcomm_zero_shard_t sh;
        T_OK(hcomm_zero_shard(plan, k, &sh));
        size_t a = 0, b = 0;
        hcomm_dtype_size(sh.param_dtype, &a);
        hcomm_dtype_size(sh.reduce_dtype, &b);
        want += sh.count * (a + b);
    }
    for (int i = 0; i < NP; i++) {
        size_t bytes = 0;
        T_OK(hcomm_zero_locate(plan, i, NULL, &bytes));
        biggest = bytes > biggest ? bytes : biggest;
    }
    T_CHECK(live >= want && live <= want + (size_t)r->cfg.spares * 2 * biggest && peak >= live,
            "ZeRO-3 after release holds %zu bytes (peak %zu); its shards %zu, a bucket %zu", live,
            peak, want, biggest);
}

/* One plan through two windows: a no_sync micro-step and a synced one, the step on the shard,
 * the gather of the stepped parameters, then one more window. */
static void one_run(const run_t *r) {
    params_t p;
    params_make(&p, r->types);
    hcomm_zero_plan_t *plan = NULL;
    hcomm_result_t res = hcomm_zero_create(r->shard, r->rep, p.t, NP, &r->cfg, &plan);
    T_CHECK(res == HCOMM_OK, "create (world %d, S %d, stage %d): %s", r->W, r->S, r->cfg.stage,
            hcomm_last_error());
    params_free(&p); /* the plan keeps its own copies */
    if (res != HCOMM_OK)
        return;
    layout_t l = ref_layout(r->types, r->cfg.bucket_bytes ? r->cfg.bucket_bytes : 25u << 20);
    check_layout(r, plan, &l);
    void *d = NULL;
    if (r->cfg.stage == 3) /* ZeRO-3 starts with shards only */
        T_ERR(hcomm_zero_param(plan, 0, &d), HCOMM_ERR_STATE);
    T_OK(gather_all(r, plan, l.nb));
    check_params(r, plan, false);
    T_OK(hcomm_zero_set_no_sync(plan, 1));
    accumulate(r, plan, 0);
    T_OK(sync_grads(r, plan, l.nb)); /* no_sync: nothing moves */
    T_OK(hcomm_zero_set_no_sync(plan, 0));
    accumulate(r, plan, 1);
    T_OK(sync_grads(r, plan, l.nb));
    check_shards(r, plan, &l, 2);
    if (r->cfg.stage == 3) {
        T_OK(hcomm_zero_release(plan, HCOMM_ZERO_ALL));
        T_ERR(hcomm_zero_param(plan, 0, &d), HCOMM_ERR_STATE);
        check_memory(r, plan, l.nb);
    }
    if (r->cfg.op == HCOMM_SUM) {
        step_shards(plan, l.nb);
        T_OK(gather_all(r, plan, l.nb));
        check_params(r, plan, true);
    }
    accumulate(r, plan, 0); /* a new window starts from zero */
    T_OK(sync_grads(r, plan, l.nb));
    if (r->cfg.accumulate) { /* a reduce_scatter per micro-step, added into the shard */
        T_OK(hcomm_zero_clear_grads(plan));
        hcomm_zero_shard_t sh;
        T_OK(hcomm_zero_shard(plan, 0, &sh));
        T_CHECK(sh.grads == NULL, "clear_grads kept a gradient shard");
        T_OK(sync_grads(r, plan, l.nb)); /* reduces zeros: adds nothing */
        accumulate(r, plan, 0);
        T_OK(sync_grads(r, plan, l.nb));
        accumulate(r, plan, 1);
        check_shards(r, plan, &l, 1); /* before a second reduce_scatter: still step 0 alone */
        T_OK(sync_grads(r, plan, l.nb));
        check_shards(r, plan, &l, 2);
    } else {
        check_shards(r, plan, &l, 1);
    }
    T_OK(hcomm_zero_destroy(&plan));
    T_CHECK(plan == NULL, "destroy left the handle set");
}

static const hcomm_dtype_t mixed[NP] = {HCOMM_F64,  HCOMM_F64, HCOMM_F32, HCOMM_BF16,
                                        HCOMM_BF16, HCOMM_F32, HCOMM_F32, HCOMM_I32};
static const hcomm_dtype_t floats[NP] = {HCOMM_F64,  HCOMM_F64, HCOMM_F32, HCOMM_BF16,
                                         HCOMM_BF16, HCOMM_F32, HCOMM_F32, HCOMM_BF16};
static const hcomm_dtype_t halves[NP] = {HCOMM_BF16, HCOMM_BF16, HCOMM_BF16, HCOMM_F16,
                                         HCOMM_F16,  HCOMM_BF16, HCOMM_BF16, HCOMM_BF16};

/* Every stage x bucket size x dtype plan x (SUM blocking, AVG nonblocking) on one split. */
static void sweep(run_t *r) {
    const size_t caps[] = {8, 64, 0}; /* smaller than a parameter; a few; everything */
    const struct {
        const hcomm_dtype_t *types;
        int rd;
    } plans[] = {{mixed, HCOMM_ZERO_PARAM_DTYPE}, {floats, HCOMM_F64}, {halves, HCOMM_F32}};
    for (int stage = 1; stage <= 3; stage++)
        for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++)
            for (size_t t = 0; t < sizeof plans / sizeof plans[0]; t++)
                for (int mode = 0; mode < 2; mode++) {
                    r->cfg = (hcomm_zero_config_t){stage,
                                                   caps[c],
                                                   mode ? HCOMM_AVG : HCOMM_SUM,
                                                   plans[t].rd,
                                                   (stage + (int)c + mode) % 2,
                                                   (int)t};
                    r->types = plans[t].types;
                    r->nonblocking = mode == 1;
                    one_run(r);
                }
}

/* Shard groups of S consecutive ranks; replicate groups of the ranks with equal rank % S. */
static hcomm_result_t split(hcomm_comm_t *w, int S, run_t *r) {
    *r = (run_t){.world = w, .W = t_size(w), .rank = t_rank(w), .S = S};
    r->R = r->W / S;
    T_TRY(hcomm_comm_split(w, r->rank / S, r->rank, &r->shard));
    if (r->R > 1)
        T_TRY(hcomm_comm_split(w, r->rank % S, r->rank, &r->rep));
    return HCOMM_OK;
}

static void unsplit(run_t *r) {
    T_OK(hcomm_comm_destroy(r->rep));
    T_OK(hcomm_comm_destroy(r->shard));
}

static hcomm_result_t sweep_rank(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int W = t_size(w);
    const int sizes[3] = {W, W > 1 ? 1 : 0, W > 2 && W % 2 == 0 ? W / 2 : 0};
    for (int s = 0; s < 3; s++) {
        if (sizes[s] == 0)
            continue;
        run_t r;
        T_TRY(split(w, sizes[s], &r));
        sweep(&r);
        unsplit(&r);
    }
    return HCOMM_OK;
}

/* ---- bad input ---- */

static hcomm_zero_config_t cfg3(int stage) {
    return (hcomm_zero_config_t){stage, 64, HCOMM_SUM, HCOMM_ZERO_PARAM_DTYPE, 0, 0};
}

static void expect_msg(const char *a, const char *b) {
    T_CHECK(strstr(hcomm_last_error(), a) && strstr(hcomm_last_error(), b),
            "expected '%s' and '%s' in '%s'", a, b, hcomm_last_error());
}

/* Lists that differ on the last rank: every rank fails, naming the index and both shapes. */
static void bad_lists(hcomm_comm_t *w, int W, int rank) {
    params_t p;
    params_make(&p, mixed);
    hcomm_zero_config_t c = cfg3(3);
    hcomm_zero_plan_t *plan = NULL;
    const int64_t wide[2] = {1, 17};
    if (W == 1) { /* nothing to differ from: only the local checks */
        c.reduce_dtype = HCOMM_BF16;
        T_ERR(hcomm_zero_create(w, NULL, p.t, NP, &c, &plan), HCOMM_ERR_DTYPE);
        params_free(&p);
        return;
    }
    if (rank == W - 1)
        hcomm_tensor_init(&p.t[2], p.data[2], HCOMM_F32, 2, wide);
    T_ERR(hcomm_zero_create(w, NULL, p.t, NP, &c, &plan), HCOMM_ERR_MISMATCH);
    expect_msg("params[2] is f32[17] on rank 0", "but f32[1, 17] on rank");
    T_CHECK(plan == NULL, "a failed create left a plan");
    hcomm_tensor_init(&p.t[2], p.data[2], HCOMM_F32, 1, &lens[2]);
    T_ERR(hcomm_zero_create(w, NULL, p.t, rank == W - 1 ? NP - 1 : NP, &c, &plan),
          HCOMM_ERR_MISMATCH);
    expect_msg("params[7] is i32[6] on rank 0", "absent on rank");
    c.spares = HCOMM_ZERO_SPARES_MAX + 1;
    T_ERR(hcomm_zero_create(w, NULL, p.t, NP, &c, &plan), HCOMM_ERR_INVALID_ARG);
    c.spares = 0;
    c.stage = rank == W - 1 ? 4 : 3; /* one rank's check fails: it gets its error, peers PEER */
    T_ERR(hcomm_zero_create(w, NULL, p.t, NP, &c, &plan),
          rank == W - 1 ? HCOMM_ERR_INVALID_ARG : HCOMM_ERR_PEER);
    if (rank == W - 1)
        expect_msg("cfg->stage=4", "1, 2 or 3");
    c = cfg3(2);
    c.bucket_bytes = rank == 0 ? 64 : 128;
    T_ERR(hcomm_zero_create(w, NULL, p.t, NP, &c, &plan), HCOMM_ERR_MISMATCH);
    expect_msg("cfg->bucket_bytes", "differs");
    c = cfg3(1);
    c.reduce_dtype = HCOMM_BF16; /* narrower than f32 / f64, and an i32 parameter */
    T_ERR(hcomm_zero_create(w, NULL, p.t, NP, &c, &plan), HCOMM_ERR_DTYPE);
    expect_msg("cfg->reduce_dtype=bf16", "params[0] of dtype f64");
    c.reduce_dtype = HCOMM_F32;
    T_ERR(hcomm_zero_create(w, NULL, p.t, NP, &c, &plan), HCOMM_ERR_DTYPE);
    T_ERR(hcomm_zero_create(w, NULL, p.t, NP, NULL, &plan), HCOMM_ERR_NULL);
    T_ERR(hcomm_zero_create(w, NULL, p.t, NP, &c, NULL), HCOMM_ERR_NULL);
    params_free(&p);
}

/* A plan of no parameters: no buckets, and every call on it is a no-op. */
static void empty_plan(hcomm_comm_t *w) {
    hcomm_zero_config_t c = cfg3(3);
    hcomm_zero_plan_t *plan = NULL;
    T_OK(hcomm_zero_create(w, NULL, NULL, 0, &c, &plan));
    int nb = -1;
    T_OK(hcomm_zero_num_buckets(plan, &nb));
    T_EQ_INT(nb, 0);
    T_OK(hcomm_zero_all_gather_params(plan, HCOMM_ZERO_ALL, NULL, 0));
    T_OK(hcomm_zero_reduce_scatter_grads(plan, HCOMM_ZERO_ALL));
    hcomm_zero_shard_t sh;
    T_ERR(hcomm_zero_shard(plan, 0, &sh), HCOMM_ERR_INVALID_ARG);
    T_OK(hcomm_zero_destroy(&plan));
}

/* Bad bucket indices and buffer sizes on rank 0 only; release before the gather completed;
 * caller buffers; use after destroy. */
static void bad_calls(hcomm_comm_t *w, int W, int rank) {
    params_t p;
    params_make(&p, mixed);
    hcomm_zero_config_t c = cfg3(3);
    hcomm_zero_plan_t *plan = NULL;
    T_OK(hcomm_zero_create(w, NULL, p.t, NP, &c, &plan));
    if (!plan) {
        params_free(&p);
        return;
    }
    hcomm_result_t peer = W > 1 ? HCOMM_ERR_PEER : HCOMM_OK;
    int nb = 0;
    T_OK(hcomm_zero_num_buckets(plan, &nb));
    T_ERR(hcomm_zero_all_gather_params(plan, rank == 0 ? nb : 0, NULL, 0),
          rank == 0 ? HCOMM_ERR_INVALID_ARG : peer);
    if (rank == 0)
        expect_msg("bucket=", "outside");
    T_ERR(hcomm_zero_iall_gather_params(plan, rank == 0 ? -7 : 0, NULL, 0),
          rank == 0 ? HCOMM_ERR_INVALID_ARG : HCOMM_OK);
    T_ERR(hcomm_zero_wait(plan, 0, NULL), rank == 0 ? HCOMM_OK : peer);
    T_ERR(hcomm_zero_reduce_scatter_grads(plan, rank == 0 ? 99 : 1),
          rank == 0 ? HCOMM_ERR_INVALID_ARG : peer);
    /* a caller's buffer of the wrong size on rank 0, then the right one everywhere */
    size_t bytes = 0;
    int k = 0;
    T_OK(hcomm_zero_locate(plan, 2, &k, &bytes));
    char *buf = calloc(bytes + 16, 1);
    memset(buf + bytes, 0x5a, 16);
    T_ERR(hcomm_zero_all_gather_params(plan, k, buf, rank == 0 ? bytes - 1 : bytes),
          rank == 0 ? HCOMM_ERR_INVALID_ARG : peer);
    if (rank == 0)
        expect_msg("buf_bytes=", "pad included");
    T_OK(hcomm_zero_all_gather_params(plan, k, buf, bytes));
    void *d = NULL;
    T_OK(hcomm_zero_param(plan, 2, &d));
    T_CHECK((char *)d >= buf && (char *)d < buf + bytes, "params[2] is not in the caller's buffer");
    for (int64_t j = 0; d && j < lens[2]; j++)
        T_CHECK(t_get_val(HCOMM_F32, d, (size_t)j) == init_val(2, j), "params[2][%lld]",
                (long long)j);
    for (int i = 0; i < 16; i++)
        T_CHECK(buf[bytes + (size_t)i] == 0x5a, "written past the caller's buffer");
    T_OK(hcomm_zero_release(plan, k));
    T_ERR(hcomm_zero_param(plan, 2, &d), HCOMM_ERR_STATE);
    /* release before the gather completed: refused, nothing freed; after the wait it works */
    T_OK(hcomm_zero_iall_gather_params(plan, 0, NULL, 0));
    T_ERR(hcomm_zero_release(plan, HCOMM_ZERO_ALL), HCOMM_ERR_STATE);
    expect_msg("bucket 0", "has not completed");
    T_OK(hcomm_zero_wait(plan, 0, NULL));
    T_OK(hcomm_zero_param(plan, 0, &d));
    T_OK(hcomm_zero_release(plan, HCOMM_ZERO_ALL));
    T_ERR(hcomm_zero_grad(plan, NP, &d), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_zero_param(plan, -1, &d), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_zero_release(plan, nb), HCOMM_ERR_INVALID_ARG);
    T_OK(hcomm_zero_destroy(&plan));
    T_CHECK(plan == NULL, "destroy left the handle set");
    /* a plan used after destroy: its handle is NULL */
    T_ERR(hcomm_zero_all_gather_params(plan, 0, NULL, 0), HCOMM_ERR_NULL);
    T_ERR(hcomm_zero_num_buckets(plan, &nb), HCOMM_ERR_NULL);
    T_OK(hcomm_zero_destroy(&plan));
    T_OK(hcomm_zero_destroy(NULL));
    /* ZeRO-1/2 keep their own gathered parameters: a caller's buffer is refused everywhere */
    c = cfg3(1);
    T_OK(hcomm_zero_create(w, NULL, p.t, NP, &c, &plan));
    T_ERR(hcomm_zero_all_gather_params(plan, k, buf, bytes), HCOMM_ERR_INVALID_ARG);
    T_OK(hcomm_zero_release(plan, HCOMM_ZERO_ALL)); /* a no-op for ZeRO-1/2 */
    T_OK(hcomm_zero_param(plan, 2, &d));
    T_OK(hcomm_zero_destroy(&plan));
    free(buf);
    params_free(&p);
}

/* HSDP: a bad bucket on rank 0 fails its shard peers and, through the replicate all_reduce,
 * every replica: nobody waits. */
static void bad_hsdp(hcomm_comm_t *w, int W, int rank) {
    if (W < 4 || W % 2 != 0)
        return;
    run_t r;
    if (split(w, W / 2, &r) != HCOMM_OK)
        return;
    params_t p;
    params_make(&p, mixed);
    hcomm_zero_config_t c = cfg3(2);
    hcomm_zero_plan_t *plan = NULL;
    T_OK(hcomm_zero_create(r.shard, r.rep, p.t, NP, &c, &plan));
    T_CHECK(hcomm_zero_reduce_scatter_grads(plan, rank == 0 ? 99 : HCOMM_ZERO_ALL) != HCOMM_OK,
            "rank %d: a bad bucket on rank 0 did not fail every rank", rank);
    T_OK(hcomm_zero_reduce_scatter_grads(plan, HCOMM_ZERO_ALL)); /* usable again */
    T_OK(hcomm_zero_destroy(&plan));
    params_free(&p);
    unsplit(&r);
}

static hcomm_result_t bad_rank(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int W = t_size(w), rank = t_rank(w);
    bad_lists(w, W, rank);
    empty_plan(w);
    bad_calls(w, W, rank);
    bad_hsdp(w, W, rank);
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(sweep_rank, NULL, 8);
    t_for_each_world(bad_rank, NULL, 8);
    return t_finish("test_zero");
}
