/* MoE dispatch / combine against a serial reference of the routing. HCOMM_TEST_MPI
 * Every rank can compute every rank's tokens and expert ids from (rank, token index), so each
 * rank builds the rows it must receive (expert-major, then source rank, then token order). */
#include "harness.h"

#include "core/internal.h"

#include <stdbool.h>

#define MAX_WORLD 8
#define MAX_TOKENS 16

enum { RANDOM, ONE_EXPERT, SKIP_FIRST };

typedef struct moe_case {
    int num_local, mode;
    hcomm_dtype_t dt;
    int64_t h;
} moe_case_t;

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

/* Tokens of rank: in RANDOM mode rank 1 has none. */
static int64_t n_tokens(int rank, int mode) {
    if (mode == RANDOM && rank == 1)
        return 0;
    return (rank * 3 + 5) % 9 + 1;
}

static int32_t expert_of(int rank, int64_t i, int num_experts, int mode) {
    uint32_t hsh = mix(0x5eedu + (uint32_t)rank * 1000u + (uint32_t)i);
    if (mode == ONE_EXPERT)
        return num_experts - 1;
    if (mode == SKIP_FIRST && num_experts > 1)
        return 1 + (int32_t)(hsh % (uint32_t)(num_experts - 1));
    return (int32_t)(hsh % (uint32_t)num_experts);
}

static double tok_val(int rank, int64_t i, int64_t col, hcomm_dtype_t dt) {
    int v = (int)((rank * 37 + i * 11 + col * 3) % 100) - 50;
    return dt == HCOMM_U8 ? v + 50 : v;
}

static hcomm_tensor_t make2(hcomm_dtype_t dt, int64_t rows, int64_t cols) {
    hcomm_tensor_t t;
    int64_t shape[2] = {rows, cols};
    hcomm_tensor_init(&t, calloc((size_t)(rows * cols) * 8 + 1, 1), dt, 2, shape);
    return t;
}

/* The rows a rank receives, in order: source rank and token index of each. */
typedef struct routing {
    int n;
    int src[MAX_WORLD * MAX_TOKENS];
    int64_t idx[MAX_WORLD * MAX_TOKENS];
    int64_t per_expert[64];
} routing_t;

static void ref_routing(int p, int rank, const moe_case_t *c, routing_t *rt) {
    int e_all = p * c->num_local;
    rt->n = 0;
    for (int l = 0; l < c->num_local; l++) {
        rt->per_expert[l] = 0;
        for (int s = 0; s < p; s++)
            for (int64_t i = 0; i < n_tokens(s, c->mode); i++)
                if (expert_of(s, i, e_all, c->mode) == rank * c->num_local + l) {
                    rt->src[rt->n] = s;
                    rt->idx[rt->n++] = i;
                    rt->per_expert[l]++;
                }
    }
}

/* Checks t [rows, cols] against want(row, col); one check per tensor, first difference. */
#define EXPECT_ROWS(t, rows, cols, want, what)                                                     \
    do {                                                                                           \
        int64_t bad_r_ = -1, bad_c_ = -1;                                                          \
        double got_ = 0, exp_ = 0;                                                                 \
        for (int64_t r = 0; r < (rows) && bad_r_ < 0; r++)                                         \
            for (int64_t col = 0; col < (cols) && bad_r_ < 0; col++) {                             \
                got_ = t_get_val((t)->dtype, (t)->data, (size_t)(r * (cols) + col));               \
                exp_ = (want);                                                                     \
                if (got_ != exp_) {                                                                \
                    bad_r_ = r;                                                                    \
                    bad_c_ = col;                                                                  \
                }                                                                                  \
            }                                                                                      \
        T_CHECK(bad_r_ < 0,                                                                        \
                "%s (L=%d mode=%d dt=%d H=%lld P=%d): [%lld, %lld] is %g, expected %g", what,      \
                c->num_local, c->mode, (int)c->dt, (long long)c->h, p, (long long)bad_r_,          \
                (long long)bad_c_, got_, exp_);                                                    \
    } while (0)

/* Global expert of received row k, from the per-expert counts. */
static int expert_of_row(const routing_t *rt, int rank, int num_local, int64_t k) {
    for (int l = 0; l < num_local; l++) {
        if (k < rt->per_expert[l])
            return rank * num_local + l;
        k -= rt->per_expert[l];
    }
    return -1;
}

static void check_received(const hcomm_moe_handle_t *hd, const moe_case_t *c, const routing_t *rt,
                           int p) {
    hcomm_tensor_t recv;
    int64_t tpe[64];
    T_OK(hcomm_moe_received(hd, &recv, tpe));
    T_EQ_INT(recv.ndim, 2);
    T_EQ_INT(recv.shape[0], rt->n);
    T_EQ_INT(recv.shape[1], c->h);
    T_EQ_INT(recv.dtype, c->dt);
    for (int l = 0; l < c->num_local; l++)
        T_EQ_INT(tpe[l], rt->per_expert[l]);
    if (recv.shape[0] == rt->n)
        EXPECT_ROWS(&recv, rt->n, c->h, tok_val(rt->src[r], rt->idx[r], col, c->dt), "received");
}

/* combine(dispatch(x)) == x, and combine of a per-row function of x lands at its token. */
static void check_combine(hcomm_moe_handle_t *hd, const moe_case_t *c, const routing_t *rt,
                          int rank, int p, const int32_t *ids) {
    int64_t n = n_tokens(rank, c->mode);
    hcomm_tensor_t recv, out = make2(c->dt, n, c->h);
    T_OK(hcomm_moe_received(hd, &recv, NULL));
    T_OK(hcomm_moe_combine(hd, &recv, &out));
    EXPECT_ROWS(&out, n, c->h, tok_val(rank, r, col, c->dt), "combine(dispatch(x))");
    /* f(row) = [sum of the row, global expert that holds it] as i64 [R, 2]. */
    hcomm_tensor_t fx = make2(HCOMM_I64, rt->n, 2), fout = make2(HCOMM_I64, n, 2);
    for (int64_t k = 0; k < rt->n; k++) {
        double sum = 0;
        for (int64_t col = 0; col < c->h; col++)
            sum += t_get_val(recv.dtype, recv.data, (size_t)(k * c->h + col));
        t_set_val(HCOMM_I64, fx.data, (size_t)(2 * k), sum);
        t_set_val(HCOMM_I64, fx.data, (size_t)(2 * k + 1),
                  expert_of_row(rt, rank, c->num_local, k));
    }
    T_OK(hcomm_moe_combine(hd, &fx, &fout));
    double sums[MAX_TOKENS] = {0};
    for (int64_t i = 0; i < n; i++)
        for (int64_t col = 0; col < c->h; col++)
            sums[i] += tok_val(rank, i, col, c->dt);
    EXPECT_ROWS(&fout, n, 2, col == 0 ? sums[r] : ids[r], "combine(f(dispatch(x)))");
    free(out.data);
    free(fx.data);
    free(fout.data);
}

static double grad_val(int rank, int64_t i, int64_t col) {
    return rank * 1000 + (double)i * 10 + (double)col;
}

/* combine_bwd routes [N, 3] like dispatch; dispatch_bwd brings [R, H] back like combine. */
static void check_backward(hcomm_moe_handle_t *hd, const moe_case_t *c, const routing_t *rt,
                           int rank, int p) {
    int64_t n = n_tokens(rank, c->mode);
    hcomm_tensor_t gout = make2(HCOMM_F64, n, 3), gexp = make2(HCOMM_F64, rt->n, 3);
    for (int64_t i = 0; i < n; i++)
        for (int64_t col = 0; col < 3; col++)
            t_set_val(HCOMM_F64, gout.data, (size_t)(i * 3 + col), grad_val(rank, i, col));
    T_OK(hcomm_moe_combine_bwd(hd, &gout, &gexp));
    EXPECT_ROWS(&gexp, rt->n, 3, grad_val(rt->src[r], rt->idx[r], col), "combine_bwd");

    hcomm_tensor_t grecv = make2(HCOMM_F64, rt->n, c->h), gtok = make2(HCOMM_F64, n, c->h);
    for (int64_t k = 0; k < rt->n; k++)
        for (int64_t col = 0; col < c->h; col++)
            t_set_val(HCOMM_F64, grecv.data, (size_t)(k * c->h + col),
                      2 * tok_val(rt->src[k], rt->idx[k], col, c->dt));
    T_OK(hcomm_moe_dispatch_bwd(hd, &grecv, &gtok));
    EXPECT_ROWS(&gtok, n, c->h, 2 * tok_val(rank, r, col, c->dt), "dispatch_bwd");
    free(gout.data);
    free(gexp.data);
    free(grecv.data);
    free(gtok.data);
}

static void run_case(hcomm_comm_t *g, const moe_case_t *c) {
    int p = t_size(g), rank = t_rank(g), e_all = p * c->num_local;
    int64_t n = n_tokens(rank, c->mode);
    hcomm_tensor_t tokens = make2(c->dt, n, c->h);
    int32_t ids[MAX_TOKENS];
    for (int64_t i = 0; i < n; i++) {
        ids[i] = expert_of(rank, i, e_all, c->mode);
        for (int64_t col = 0; col < c->h; col++)
            t_set_val(c->dt, tokens.data, (size_t)(i * c->h + col), tok_val(rank, i, col, c->dt));
    }
    routing_t rt;
    ref_routing(p, rank, c, &rt);
    hcomm_moe_handle_t *hd = NULL;
    T_OK(hcomm_moe_dispatch(g, &tokens, n ? ids : NULL, e_all, &hd));
    if (hd != NULL) {
        check_received(hd, c, &rt, p);
        check_combine(hd, c, &rt, rank, p, ids);
        check_backward(hd, c, &rt, rank, p);
    }
    T_OK(hcomm_moe_handle_free(hd));
    free(tokens.data);
}

static void test_routing(hcomm_comm_t *g) {
    for (int l = 1; l <= 3; l++)
        for (int mode = RANDOM; mode <= SKIP_FIRST; mode++)
            for (int dt = 0; dt < HCOMM_DTYPE_COUNT; dt++) {
                moe_case_t c = {l, mode, (hcomm_dtype_t)dt, (dt + l) % 3 + 1};
                run_case(g, &c);
            }
    moe_case_t empty_rows = {2, RANDOM, HCOMM_F32, 0};
    run_case(g, &empty_rows);
}

static void expect_error_text(const char *want) {
    T_CHECK(strstr(hcomm_last_error(), want) != NULL, "last error '%s' lacks '%s'",
            hcomm_last_error(), want);
}

/* Errors that every rank sees alike. */
static void test_errors_everywhere(hcomm_comm_t *g) {
    int p = t_size(g);
    hcomm_tensor_t tokens = make2(HCOMM_F32, 3, 2);
    int32_t ids[3] = {0, 1 % (2 * p), 2 * p};
    hcomm_moe_handle_t *hd = (hcomm_moe_handle_t *)&tokens; /* must come back NULL */
    char want[96];
    T_ERR(hcomm_moe_dispatch(g, &tokens, ids, 2 * p, &hd), HCOMM_ERR_INVALID_ARG);
    snprintf(want, sizeof want, "hcomm_moe_dispatch: expert_ids[2]=%d outside 0..%d", 2 * p,
             2 * p - 1);
    T_CHECK(strcmp(hcomm_last_error(), want) == 0, "got '%s', expected '%s'", hcomm_last_error(),
            want);
    T_CHECK(hd == NULL, "handle not cleared on failure");
    ids[2] = 0;
    if (p > 1) {
        T_ERR(hcomm_moe_dispatch(g, &tokens, ids, 2 * p + 1, &hd), HCOMM_ERR_INVALID_ARG);
        expect_error_text("num_experts=");
    }
    T_ERR(hcomm_moe_dispatch(g, &tokens, ids, 0, &hd), HCOMM_ERR_INVALID_ARG);
    T_ERR(hcomm_moe_dispatch(g, &tokens, NULL, 2 * p, &hd), HCOMM_ERR_NULL);
    expect_error_text("'expert_ids' is NULL with N=3");
    hcomm_tensor_t flat = tokens;
    flat.ndim = 1;
    T_ERR(hcomm_moe_dispatch(g, &flat, ids, 2 * p, &hd), HCOMM_ERR_SHAPE);
    expect_error_text("tokens->ndim=1, expected 2");
    T_ERR(hcomm_moe_dispatch(NULL, &tokens, ids, 2 * p, &hd), HCOMM_ERR_NULL);
    T_ERR(hcomm_moe_dispatch(g, &tokens, ids, 2 * p, NULL), HCOMM_ERR_NULL);
    T_ERR(hcomm_moe_received(NULL, &tokens, NULL), HCOMM_ERR_NULL);
    T_OK(hcomm_moe_handle_free(NULL));

    /* Shape and dtype errors of the later passes fail before any communication. */
    T_OK(hcomm_moe_dispatch(g, &tokens, ids, 2 * p, &hd));
    hcomm_tensor_t recv, bad_rows, out = make2(HCOMM_F32, 3, 2), out_i = make2(HCOMM_I32, 3, 2);
    T_OK(hcomm_moe_received(hd, &recv, NULL));
    bad_rows = make2(HCOMM_F32, recv.shape[0] + 1, 2);
    T_ERR(hcomm_moe_combine(hd, &bad_rows, &out), HCOMM_ERR_SHAPE);
    expect_error_text("hcomm_moe_combine: expert_out shape");
    T_ERR(hcomm_moe_combine(hd, &recv, &out_i), HCOMM_ERR_DTYPE);
    expect_error_text("expert_out->dtype=f32 differs from out->dtype=i32");
    T_ERR(hcomm_moe_dispatch_bwd(hd, &recv, &bad_rows), HCOMM_ERR_SHAPE);
    expect_error_text("hcomm_moe_dispatch_bwd: grad_tokens shape");
    T_ERR(hcomm_moe_combine_bwd(NULL, &out, &recv), HCOMM_ERR_NULL);
    T_OK(hcomm_moe_handle_free(hd));
    free(tokens.data);
    free(bad_rows.data);
    free(out.data);
    free(out_i.data);
}

/* A bad expert id on one rank only: that rank reports it, the others are told, none waits. */
static void test_error_on_one_rank(hcomm_comm_t *g) {
    int p = t_size(g), rank = t_rank(g);
    if (p < 2)
        return;
    hcomm_tensor_t tokens = make2(HCOMM_F32, 2, 2);
    int32_t ids[2] = {0, rank == 0 ? -3 : 1};
    hcomm_moe_handle_t *hd = NULL;
    if (rank == 0) {
        T_ERR(hcomm_moe_dispatch(g, &tokens, ids, p, &hd), HCOMM_ERR_INVALID_ARG);
        expect_error_text("expert_ids[1]=-3 outside 0..");
    } else {
        T_ERR(hcomm_moe_dispatch(g, &tokens, ids, p, &hd), HCOMM_ERR_PEER);
        expect_error_text("rank 0 of ep_group failed its argument checks");
    }
    /* Rows of different widths on different ranks: every rank reports the disagreement. */
    hcomm_tensor_t other = make2(HCOMM_F32, 2, rank == 0 ? 3 : 2);
    ids[1] = 0;
    T_ERR(hcomm_moe_dispatch(g, &other, ids, p, &hd), HCOMM_ERR_MISMATCH);
    expect_error_text("hcomm_moe_dispatch: rank ");
    T_CHECK(hd == NULL, "handle set after a failed dispatch");
    /* The group still works afterwards. */
    T_OK(hcomm_moe_dispatch(g, &tokens, ids, p, &hd));
    T_OK(hcomm_moe_handle_free(hd));
    free(tokens.data);
    free(other.data);
}

static hcomm_result_t moe_world(hcomm_comm_t *world, void *arg) {
    (void)arg;
    test_routing(world);
    test_errors_everywhere(world);
    test_error_on_one_rank(world);
    return HCOMM_OK;
}

int main(void) {
    t_for_each_world(moe_world, NULL, MAX_WORLD);
    return t_finish("test_moe");
}
