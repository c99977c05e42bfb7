/* Call kinds: DP gradient reduction and its reducer (dp.h), MoE top-1 dispatch and combine
 * (moe.h), domain contexts (domain.h) and abort from another thread (core.h). */
#include "fuzz.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

enum { DP_MAX = 5 };

/* An agreed gradient list; rank wrank's mistake (if any) applied. */
typedef struct grads {
    int n;
    hcomm_dtype_t dt[DP_MAX];
    int64_t len[DP_MAX];
    hcomm_op_t op;
    size_t bucket;
    int null_list;
    fz_expect_t own;
} grads_t;

static grads_t grads_for(const fz_t *f, int wrank) {
    fz_rng_t g = fz_rank_rng(f, -1, 90);
    static const size_t buckets[] = {0, 1, 16, 64, 4096};
    grads_t d = {.n = (int)fz_below(&g, DP_MAX + 1), .bucket = buckets[fz_below(&g, 5)]};
    d.op = fz_chance(&g, 50) ? HCOMM_SUM : HCOMM_AVG;
    for (int i = 0; i < d.n; i++)
        d.dt[i] = fz_dtype(&g), d.len[i] = (int64_t)fz_below(&g, 40);
    unsigned takes = 1u << FZ_MUT_NULL | 1u << FZ_MUT_COUNT | 1u << FZ_MUT_OP | 1u << FZ_MUT_DTYPE |
                     1u << FZ_MUT_HUGE;
    fz_mut_t m = fz_mutation(f, wrank, takes);
    if (m == FZ_MUT_NULL && d.n)
        d.null_list = 1, d.own = FZ_EXPECT_ERR;
    else if (m == FZ_MUT_COUNT)
        d.n = -1 - (int)fz_below(&g, 3), d.own = FZ_EXPECT_ERR;
    else if (m == FZ_MUT_OP)
        d.op = fz_chance(&g, 50) ? HCOMM_MAX : (hcomm_op_t)fz_bad_enum(f, wrank, HCOMM_OP_COUNT),
        d.own = FZ_EXPECT_ERR;
    else if (m == FZ_MUT_DTYPE && d.n)
        d.dt[0] = (hcomm_dtype_t)fz_bad_enum(f, wrank, HCOMM_DTYPE_COUNT), d.own = FZ_EXPECT_ERR;
    else if (m == FZ_MUT_HUGE && d.n)
        d.len[0]++; /* another shape: the lists differ */
    return d;
}

static fz_expect_t grads_expect(const fz_t *f, grads_t *mine) {
    fz_expect_t e = FZ_EXPECT_OK;
    grads_t first = grads_for(f, f->members[0]);
    for (int r = 0; r < f->size; r++) {
        grads_t d = grads_for(f, f->members[r]);
        if (r == f->rank)
            *mine = d;
        e = fz_worst(e, d.own);
        if (d.n != first.n || d.op != first.op || memcmp(d.len, first.len, sizeof d.len) ||
            memcmp(d.dt, first.dt, sizeof d.dt))
            e = FZ_EXPECT_ERR;
    }
    return e;
}

static void grads_make(fz_t *f, const grads_t *d, hcomm_tensor_t *t) {
    for (int i = 0; i < d->n; i++) {
        size_t es = fz_dsize(d->dt[i]);
        void *data = fz_alloc(f, (size_t)d->len[i] * es, 0);
        hcomm_tensor_init(&t[i], data, HCOMM_U8, 1, &d->len[i]);
        t[i].dtype = d->dt[i]; /* tensor_init refuses a bad dtype: set it past the check */
        for (int64_t j = 0; j < d->len[i] && (unsigned)d->dt[i] < HCOMM_DTYPE_COUNT; j++)
            fz_put(d->dt[i], data, (size_t)j, fz_val(f, f->wrank, 90 + i, (size_t)j, 4));
    }
}

static long grads_wrong(const fz_t *f, const grads_t *d, const hcomm_tensor_t *t) {
    long wrong = 0;
    for (int i = 0; i < d->n; i++)
        for (int64_t j = 0; j < d->len[i]; j++) {
            double v[FZ_MAX_RANKS];
            for (int r = 0; r < f->size; r++)
                v[r] = fz_val(f, f->members[r], 90 + i, (size_t)j, 4);
            wrong +=
                fz_get(d->dt[i], t[i].data, (size_t)j) != fz_reduce(d->dt[i], d->op, v, f->size);
        }
    return wrong;
}

static void k_dp_grads(fz_t *f) {
    grads_t d;
    fz_expect_t e = grads_expect(f, &d);
    hcomm_tensor_t t[DP_MAX];
    grads_make(f, &d, t);
    fz_describe(f, "hcomm_dp_all_reduce_grads(n=%d, op %d, bucket %zu, null %d)", d.n, d.op,
                d.bucket, d.null_list);
    hcomm_result_t r =
        hcomm_dp_all_reduce_grads(f->comm, d.null_list ? NULL : t, d.n, d.op, d.bucket);
    if (fz_check_coll(f, "hcomm_dp_all_reduce_grads", r, e) && e != FZ_EXPECT_ERR)
        fz_check_data(f, "hcomm_dp_all_reduce_grads", grads_wrong(f, &d, t), "against the sum");
}

/* Marks every gradient in a per-rank order; a rank's step may end without finish, destroying
 * the reducer while buckets are in flight (it must wait for them or fail, never free them). */
static void reducer_step(fz_t *f, hcomm_dp_reducer_t *red, const grads_t *d, int destroy_early) {
    fz_rng_t mine = fz_rank_rng(f, f->wrank, 91);
    int start = (int)fz_below(&mine, (uint64_t)d->n + 1);
    for (int k = 0; k < d->n; k++)
        fz_check(f, "hcomm_dp_reducer_mark_ready",
                 hcomm_dp_reducer_mark_ready(red, (start + k) % d->n), FZ_EXPECT_OK);
    if (destroy_early)
        return;
    fz_check_coll(f, "hcomm_dp_reducer_finish", hcomm_dp_reducer_finish(red, NULL), FZ_EXPECT_OK);
    fz_check(f, "hcomm_dp_reducer_mark_ready", hcomm_dp_reducer_mark_ready(red, d->n),
             FZ_EXPECT_ERR);
}

static void dp_reducer(fz_t *f, int destroy_early) {
    grads_t d;
    fz_expect_t e = grads_expect(f, &d);
    destroy_early &= e == FZ_EXPECT_OK;
    hcomm_tensor_t t[DP_MAX];
    grads_make(f, &d, t);
    fz_describe(f, "hcomm_dp_reducer(n=%d, op %d, bucket %zu, null %d, destroy in flight %d)", d.n,
                d.op, d.bucket, d.null_list, destroy_early);
    hcomm_dp_reducer_t *red = NULL;
    hcomm_result_t r =
        hcomm_dp_reducer_create(f->comm, d.null_list ? NULL : t, d.n, d.op, d.bucket, &red);
    if (!fz_check_coll(f, "hcomm_dp_reducer_create", r, e) || e == FZ_EXPECT_ERR) {
        hcomm_dp_reducer_destroy(red);
        return;
    }
    reducer_step(f, red, &d, destroy_early);
    if (!destroy_early)
        fz_check_data(f, "hcomm_dp_reducer_finish", grads_wrong(f, &d, t), "against the sum");
    fz_check(f, "hcomm_dp_reducer_destroy", hcomm_dp_reducer_destroy(red), FZ_EXPECT_ANY);
}

static void k_dp_reducer(fz_t *f) {
    dp_reducer(f, 0);
}

static void k_dp_destroy_inflight(fz_t *f) {
    dp_reducer(f, 1);
}

enum { MOE_MAX_N = 12 };

/* Rank wrank's tokens: count, ids (a mistake may put one out of range) and values. */
static int moe_ids(const fz_t *f, int wrank, int E, int32_t *ids, fz_expect_t *own) {
    fz_rng_t r = fz_rank_rng(f, wrank, 100);
    int n = (int)fz_below(&r, MOE_MAX_N + 1);
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)fz_below(&r, (uint64_t)E);
    *own = FZ_EXPECT_OK;
    if (n && fz_mutation(f, wrank, 1u << FZ_MUT_ROOT) == FZ_MUT_ROOT) {
        ids[fz_below(&r, (uint64_t)n)] = fz_chance(&r, 50) ? -1 : E;
        *own = FZ_EXPECT_ERR;
    }
    return n;
}

static double tok(const fz_t *f, int wrank, int i, int h, int H) {
    return fz_val(f, wrank, 101, (size_t)(i * H + h), 50);
}

/* Received rows: local expert, then source rank, then token order (moe.h). */
static long moe_recv_wrong(const fz_t *f, const hcomm_tensor_t *recv, int E, int H) {
    int per = E / f->size;
    long wrong = 0, row = 0;
    int32_t ids[MOE_MAX_N];
    fz_expect_t own;
    for (int e = f->rank * per; e < (f->rank + 1) * per; e++)
        for (int p = 0; p < f->size; p++) {
            int n = moe_ids(f, f->members[p], E, ids, &own);
            for (int i = 0; i < n; i++) {
                for (int h = 0; h < H && ids[i] == e; h++)
                    wrong += row >= recv->shape[0] ||
                             fz_get(recv->dtype, recv->data, (size_t)(row * H + h)) !=
                                 tok(f, f->members[p], i, h, H);
                row += ids[i] == e;
            }
        }
    return wrong + (row != recv->shape[0]);
}

static fz_expect_t moe_expect(const fz_t *f, int E) {
    fz_expect_t e = FZ_EXPECT_OK, own;
    int32_t ids[MOE_MAX_N];
    for (int p = 0; p < f->size; p++) {
        moe_ids(f, f->members[p], E, ids, &own);
        e = fz_worst(e, own);
    }
    return e;
}

/* Dispatch, check the received rows, combine them back unchanged: out must equal tokens. */
static void k_moe(fz_t *f) {
    int E = f->size * (1 + (int)fz_below(&f->ag, 3)), H = 1 + (int)fz_below(&f->ag, 6);
    hcomm_dtype_t dt = fz_dtype(&f->ag);
    int32_t ids[MOE_MAX_N];
    fz_expect_t own, e = moe_expect(f, E);
    int n = moe_ids(f, f->wrank, E, ids, &own);
    char *buf = fz_alloc(f, (size_t)(n * H) * fz_dsize(dt), 0);
    char *back = fz_alloc(f, (size_t)(n * H) * fz_dsize(dt), 0);
    for (int i = 0; i < n * H; i++)
        fz_put(dt, buf, (size_t)i, tok(f, f->wrank, i / H, i % H, H));
    hcomm_tensor_t in, out, recv;
    hcomm_tensor_init(&in, buf, dt, 2, (int64_t[]){n, H});
    hcomm_tensor_init(&out, back, dt, 2, (int64_t[]){n, H});
    fz_describe(f, "hcomm_moe_dispatch(E=%d, H=%d, dtype %d, N=%d)", E, H, dt, n);
    hcomm_moe_handle_t *hd = NULL;
    hcomm_result_t r = hcomm_moe_dispatch(f->comm, &in, ids, E, &hd);
    if (!fz_check_coll(f, "hcomm_moe_dispatch", r, e) || e == FZ_EXPECT_ERR)
        return;
    fz_check(f, "hcomm_moe_received", hcomm_moe_received(hd, &recv, NULL), FZ_EXPECT_OK);
    fz_check_data(f, "hcomm_moe_dispatch", moe_recv_wrong(f, &recv, E, H), "received rows");
    r = hcomm_moe_combine(hd, &recv, &out);
    long wrong = 0;
    for (int i = 0; i < n * H; i++)
        wrong += fz_get(dt, back, (size_t)i) != fz_get(dt, buf, (size_t)i);
    if (fz_check_coll(f, "hcomm_moe_combine", r, FZ_EXPECT_OK))
        fz_check_data(f, "hcomm_moe_combine", wrong, "combine of the received rows = tokens");
    hcomm_moe_handle_free(hd);
}

/* A context with agreed sizes (or one rank's invalid tp), its TP group used, then destroyed. */
static void k_ctx(fz_t *f) {
    int tp = 1, pp = 1;
    for (int d = f->size; d >= 1; d--) /* tp, then pp, among the divisors */
        if (f->size % d == 0 && fz_chance(&f->ag, 40)) {
            tp = d;
            break;
        }
    if ((f->size / tp) % 2 == 0 && fz_chance(&f->ag, 40))
        pp = 2;
    fz_expect_t e = FZ_EXPECT_OK;
    int bad_me = 0;
    for (int r = 0; r < f->size; r++) {
        int bad = fz_mutation(f, f->members[r], 1u << FZ_MUT_COUNT) == FZ_MUT_COUNT;
        e = bad ? FZ_EXPECT_ERR : e;
        bad_me |= bad && r == f->rank;
    }
    hcomm_parallel_config_t cfg = {.tp = bad_me ? -tp : tp, .pp = pp};
    fz_describe(f, "hcomm_ctx_create(tp %d, pp %d)", cfg.tp, pp);
    hcomm_ctx_t *ctx = NULL;
    hcomm_result_t r = hcomm_ctx_create(f->comm, &cfg, &ctx);
    if (!fz_check_coll(f, "hcomm_ctx_create", r, e) || e == FZ_EXPECT_ERR)
        return;
    int trank = -1, tsize = 0;
    hcomm_comm_t *g = NULL;
    fz_check(f, "hcomm_ctx_rank", hcomm_ctx_rank(ctx, HCOMM_GROUP_TP, &trank, &tsize),
             FZ_EXPECT_OK);
    fz_check_data(f, "hcomm_ctx_rank", tsize != tp, "the TP group's size");
    fz_check(f, "hcomm_ctx_group", hcomm_ctx_group(ctx, HCOMM_GROUP_TP, &g), FZ_EXPECT_OK);
    fz_check_coll(f, "hcomm_barrier", hcomm_barrier(g), FZ_EXPECT_OK);
    hcomm_ctx_t *second = NULL; /* one live context per communicator */
    fz_check(f, "hcomm_ctx_create", hcomm_ctx_create(f->comm, &cfg, &second), FZ_EXPECT_ERR);
    fz_check(f, "hcomm_ctx_destroy", hcomm_ctx_destroy(ctx), FZ_EXPECT_OK);
}

typedef struct aborter {
    hcomm_comm_t *comm;
    long delay_us;
} aborter_t;

static void *abort_later(void *arg) {
    aborter_t *a = arg;
    struct timespec ts = {0, a->delay_us * 1000};
    nanosleep(&ts, NULL);
    hcomm_comm_abort(a->comm);
    return NULL;
}

/* Every rank's watchdog thread aborts the communicator while nonblocking all_reduces run:
 * each completes with the right sum, or fails with ABORTED (or PEER naming the abort). */
static void k_abort(fz_t *f) {
    enum { N = 4, COUNT = 4096 };
    fz_rng_t mine = fz_rank_rng(f, f->wrank, 110);
    aborter_t ab = {f->comm, (long)fz_below(&mine, 3000)};
    fz_describe(f, "hcomm_comm_abort after %ld us, during %d hcomm_iall_reduce", ab.delay_us, N);
    float *buf[N];
    hcomm_request_t *req[N] = {0};
    hcomm_result_t r[N];
    pthread_t th;
    pthread_create(&th, NULL, abort_later, &ab);
    for (int k = 0; k < N; k++) {
        buf[k] = fz_alloc(f, COUNT * sizeof(float), 0);
        for (int i = 0; i < COUNT; i++)
            buf[k][i] = (float)(k + 1);
        r[k] = hcomm_iall_reduce(f->comm, buf[k], buf[k], COUNT, HCOMM_F32, HCOMM_SUM, &req[k]);
    }
    for (int k = 0; k < N; k++) {
        if (r[k] == HCOMM_OK)
            r[k] = hcomm_wait(req[k]);
        fz_check(f, "hcomm_iall_reduce|hcomm_all_reduce", r[k], FZ_EXPECT_ANY);
        if (r[k] != HCOMM_OK && r[k] != HCOMM_ERR_ABORTED && r[k] != HCOMM_ERR_PEER)
            fz_finding(f, "hcomm_iall_reduce: aborted communicator gave %s, not ABORTED: '%s'",
                       hcomm_result_name(r[k]), hcomm_last_error());
        long wrong = 0;
        for (int i = 0; i < COUNT && r[k] == HCOMM_OK; i++)
            wrong += buf[k][i] != (float)((k + 1) * f->size);
        if (r[k] == HCOMM_OK)
            fz_check_data(f, "hcomm_iall_reduce", wrong, "a sum completed before the abort");
    }
    pthread_join(th, NULL);
    hcomm_result_t after = hcomm_barrier(f->comm);
    if (fz_check(f, "hcomm_barrier", after, FZ_EXPECT_ERR) || after != HCOMM_ERR_ABORTED)
        fz_finding(f, "hcomm_barrier after hcomm_comm_abort returned %s: '%s'",
                   hcomm_result_name(after), hcomm_last_error());
}

const fz_kind_t fz_prim_kinds[] = {
    {"dp_grads", 4, k_dp_grads},
    {"dp_reducer", 3, k_dp_reducer},
    {"dp_destroy_inflight", 1, k_dp_destroy_inflight},
    {"moe", 4, k_moe},
    {"ctx", 2, k_ctx},
    {"abort", 1, k_abort, 1},
};
const int fz_prim_nkinds = (int)(sizeof fz_prim_kinds / sizeof fz_prim_kinds[0]);
