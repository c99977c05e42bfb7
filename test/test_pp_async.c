/* Asynchronous PP: nonblocking requests, receive by envelope, groups, the pipeline helpers and
 * a 1F1B schedule with variable sequence lengths, two-stage exchanges that must not deadlock at
 * any size, and two pipelines exchanging at once whose messages never cross. HCOMM_TEST_MPI */
#include "harness.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Micro-batch m's sequence length: 128, 96, 160, 64, ... as the schedule test. */
static int64_t seq_len(int m) {
    static const int64_t lens[] = {128, 96, 160, 64, 32, 112, 80, 144};
    return lens[m % 8];
}

/* A [L, 1, H] f32 tensor filled with v, allocated with hcomm_mem_alloc. */
static hcomm_tensor_t act(int64_t L, int64_t H, float v) {
    int64_t shape[3] = {L, 1, H};
    hcomm_tensor_t t;
    void *data = NULL;
    hcomm_mem_alloc((size_t)(L * H) * sizeof(float), &data);
    hcomm_tensor_init(&t, data, HCOMM_F32, 3, shape);
    for (int64_t i = 0; i < L * H; i++)
        ((float *)data)[i] = v;
    return t;
}

/* t must be [L, 1, H] of v everywhere. */
static void expect_act(const hcomm_tensor_t *t, int64_t L, int64_t H, float v, const char *what,
                       int m) {
    T_CHECK(t->ndim == 3 && t->shape[0] == L && t->shape[1] == 1 && t->shape[2] == H,
            "%s micro-batch %d: shape [%lld, %lld, %lld], expected [%lld, 1, %lld]", what, m,
            (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2], (long long)L,
            (long long)H);
    if (t->ndim != 3 || t->shape[0] != L || t->shape[2] != H || !t->data)
        return;
    const float *d = t->data;
    int64_t bad = 0;
    for (int64_t i = 0; i < L * H; i++)
        bad += d[i] != v;
    T_CHECK(bad == 0, "%s micro-batch %d: %lld elements differ from %g (first %g)", what, m,
            (long long)bad, (double)v, (double)d[0]);
}

/* --- 1F1B: Megatron-LM's forward_backward_pipelining_without_interleaving --- */

typedef struct pipe {
    hcomm_comm_t *pp;
    int stage, stages, mbs, key; /* key separates concurrent pipelines */
    int64_t H;
    int fwd_seen, bwd_seen;
} pipe_t;

/* The activation stage s sends for micro-batch m, and the gradient it sends back. */
static float act_val(const pipe_t *p, int s, int m) {
    return (float)(p->key * 100000 + m * 100 + s);
}
static float grad_val(const pipe_t *p, int s, int m) {
    return -act_val(p, s, m);
}

/* Receives the next forward input (first stage: makes it). */
static hcomm_result_t next_input(pipe_t *p, hcomm_tensor_t *in) {
    int m = p->fwd_seen++;
    if (p->stage == 0) {
        *in = act(seq_len(m), p->H, 0.0f);
        return HCOMM_OK;
    }
    T_TRY(hcomm_pp_recv_forward(p->pp, in, HCOMM_PP_ANY_SHAPE));
    expect_act(in, seq_len(m), p->H, act_val(p, p->stage - 1, m), "forward input", m);
    return HCOMM_OK;
}

static hcomm_tensor_t forward(const pipe_t *p, const hcomm_tensor_t *in, int m) {
    hcomm_mem_free(in->data);
    return act(seq_len(m), p->H, act_val(p, p->stage, m));
}

/* Checks the gradient that came back (last stage: makes it) and frees it. */
static void check_grad(pipe_t *p, hcomm_tensor_t *g) {
    int m = p->bwd_seen++;
    if (p->stage == p->stages - 1)
        return;
    expect_act(g, seq_len(m), p->H, grad_val(p, p->stage + 1, m), "backward gradient", m);
    hcomm_mem_free(g->data);
}

static hcomm_tensor_t backward(const pipe_t *p, int m) {
    return act(seq_len(m), p->H, grad_val(p, p->stage, m));
}

static hcomm_result_t one_f_one_b(pipe_t *p) {
    int warm = p->stages - p->stage - 1;
    if (warm > p->mbs)
        warm = p->mbs;
    int steady = p->mbs - warm;
    hcomm_tensor_t in = {0}, out, gout = {0}, gin;
    for (int i = 0; i < warm; i++) {
        T_TRY(next_input(p, &in));
        out = forward(p, &in, p->fwd_seen - 1);
        T_TRY(hcomm_pp_send_forward(p->pp, &out, 0));
        hcomm_mem_free(out.data);
    }
    if (steady > 0)
        T_TRY(next_input(p, &in));
    for (int i = 0; i < steady; i++) {
        out = forward(p, &in, p->fwd_seen - 1);
        gout = (hcomm_tensor_t){0};
        T_TRY(hcomm_pp_send_forward_recv_backward(p->pp, &out, &gout, HCOMM_PP_ANY_SHAPE));
        hcomm_mem_free(out.data);
        check_grad(p, &gout);
        gin = backward(p, p->bwd_seen - 1);
        if (i == steady - 1) {
            T_TRY(hcomm_pp_send_backward(p->pp, &gin, 0));
        } else {
            in = (hcomm_tensor_t){0};
            T_TRY(hcomm_pp_send_backward_recv_forward(p->pp, &gin, &in, HCOMM_PP_ANY_SHAPE));
            int m = p->fwd_seen++;
            if (p->stage == 0)
                in = act(seq_len(m), p->H, 0.0f);
            else
                expect_act(&in, seq_len(m), p->H, act_val(p, p->stage - 1, m), "forward input", m);
        }
        hcomm_mem_free(gin.data);
    }
    for (int i = 0; i < warm; i++) {
        gout = (hcomm_tensor_t){0};
        T_TRY(hcomm_pp_recv_backward(p->pp, &gout, HCOMM_PP_ANY_SHAPE));
        check_grad(p, &gout);
        gin = backward(p, p->bwd_seen - 1);
        T_TRY(hcomm_pp_send_backward(p->pp, &gin, 0));
        hcomm_mem_free(gin.data);
    }
    T_EQ_INT(p->fwd_seen, p->mbs);
    T_EQ_INT(p->bwd_seen, p->mbs);
    return HCOMM_OK;
}

static hcomm_result_t run_1f1b(hcomm_comm_t *pp, int key, int64_t H) {
    pipe_t p = {.pp = pp, .stages = t_size(pp), .stage = t_rank(pp), .mbs = 8, .key = key, .H = H};
    return one_f_one_b(&p);
}

/* --- two stages: forward and backward to the same peer, both sends before either receive --- */

static hcomm_result_t two_stage_step(hcomm_comm_t *g, int64_t H, int how) {
    int r = t_rank(g), peer = 1 - r;
    hcomm_tensor_t a = act(128, H, 1.0f), b = act(96, H, -2.0f), got = {0};
    if (r == 0) { /* stage 0 sends the activation, receives the gradient */
        if (how == 0) {
            T_TRY(hcomm_pp_send(g, &a, peer, HCOMM_PP_TAG_FORWARD));
            T_TRY(hcomm_pp_recv_any(g, peer, HCOMM_PP_TAG_BACKWARD, &got));
        } else if (how == 1) {
            got = act(96, H, 0.0f);
            T_TRY(hcomm_pp_send_recv(g, &a, peer, HCOMM_PP_TAG_FORWARD, &got, peer,
                                     HCOMM_PP_TAG_BACKWARD));
        } else {
            T_TRY(hcomm_pp_send_forward_recv_backward(g, &a, &got, HCOMM_PP_ANY_SHAPE));
        }
        expect_act(&got, 96, H, -2.0f, "gradient at stage 0", 0);
    } else {
        if (how == 0) {
            T_TRY(hcomm_pp_send(g, &b, peer, HCOMM_PP_TAG_BACKWARD));
            T_TRY(hcomm_pp_recv_any(g, peer, HCOMM_PP_TAG_FORWARD, &got));
        } else if (how == 1) {
            got = act(128, H, 0.0f);
            T_TRY(hcomm_pp_send_recv(g, &b, peer, HCOMM_PP_TAG_BACKWARD, &got, peer,
                                     HCOMM_PP_TAG_FORWARD));
        } else {
            T_TRY(hcomm_pp_send_backward_recv_forward(g, &b, &got, HCOMM_PP_ANY_SHAPE));
        }
        expect_act(&got, 128, H, 1.0f, "activation at stage 1", 0);
    }
    hcomm_mem_free(a.data);
    hcomm_mem_free(b.data);
    T_OK(hcomm_mem_free(got.data)); /* recv_any data is hcomm memory */
    return HCOMM_OK;
}

/* --- requests, probe, groups, tags --- */

static hcomm_result_t requests(hcomm_comm_t *g) {
    int r = t_rank(g), peer = 1 - r;
    /* Out-of-order tags and same-tag order: 3 messages of tag 7, 1 of tag 8. */
    hcomm_tensor_t s[4], in[4];
    hcomm_pp_req_t *q[4];
    for (int i = 0; i < 4; i++) {
        s[i] = act(2 + i, 3, (float)(10 * r + i));
        in[i] = act(2 + i, 3, -1.0f);
    }
    int tag[4] = {7, 7, 8, 7};
    for (int i = 0; i < 4; i++)
        T_TRY(hcomm_pp_isend(g, &s[i], peer, tag[i], &q[i]));
    hcomm_pp_req_t *rq[4];
    int order[4] = {2, 0, 1, 3}; /* tag 8 first, then tag 7 in order */
    for (int k = 0; k < 4; k++)
        T_TRY(hcomm_pp_irecv(g, &in[order[k]], peer, tag[order[k]], &rq[k]));
    int done = 0;
    T_TRY(hcomm_pp_test(rq[3], &done)); /* may or may not be done; wait_all handles both */
    if (done)
        rq[3] = NULL;
    T_TRY(hcomm_pp_wait_all(rq, 4));
    T_TRY(hcomm_pp_wait_all(q, 4));
    for (int i = 0; i < 4; i++)
        expect_act(&in[i], 2 + i, 3, (float)(10 * peer + i), "tagged message", i);
    /* Probe, then receive into a buffer of the probed shape. */
    if (r == 0)
        T_TRY(hcomm_pp_send(g, &s[3], peer, 9));
    else {
        hcomm_tensor_t d;
        T_TRY(hcomm_pp_probe(g, peer, 9, &d));
        T_CHECK(d.ndim == 3 && d.shape[0] == 5 && d.dtype == HCOMM_F32, "probe gave ndim %d",
                d.ndim);
        hcomm_tensor_t x = act(d.shape[0], d.shape[2], 0.0f);
        T_TRY(hcomm_pp_recv(g, &x, peer, 9));
        expect_act(&x, 5, 3, 3.0f, "probed message", 0);
        hcomm_mem_free(x.data);
    }
    for (int i = 0; i < 4; i++) {
        hcomm_mem_free(s[i].data);
        hcomm_mem_free(in[i].data);
    }
    return HCOMM_OK;
}

/* send_recv and a pipeline helper that receives any shape, inside one group: nothing moves
 * before group_end, which completes both and fills the any-shape tensor. */
static hcomm_result_t group_pairs(hcomm_comm_t *g, const hcomm_tensor_t *s) {
    int r = t_rank(g), peer = 1 - r;
    hcomm_tensor_t in = act(64, 64, -1.0f), any = {0};
    T_TRY(hcomm_pp_group_start(g));
    T_TRY(hcomm_pp_send_recv(g, s, peer, 6, &in, peer, 6));
    if (r == 0)
        T_TRY(hcomm_pp_send_forward_recv_backward(g, s, &any, HCOMM_PP_ANY_SHAPE));
    else
        T_TRY(hcomm_pp_send_backward_recv_forward(g, s, &any, HCOMM_PP_ANY_SHAPE));
    T_TRY(hcomm_pp_group_end(g));
    expect_act(&in, 64, 64, (float)peer, "send_recv in a group", 0);
    T_CHECK(any.data != NULL, "the group left the any-shape receive empty");
    if (any.data)
        expect_act(&any, 64, 64, (float)peer, "any-shape helper in a group", 0);
    T_OK(hcomm_mem_free(any.data));
    hcomm_mem_free(in.data);
    return HCOMM_OK;
}

/* In a group, rank 0 posts a send and a receive in the "wrong" order, rank 1 posts its
 * matching pair reversed; then a group where rank 1 posts nothing at all. */
static hcomm_result_t groups(hcomm_comm_t *g) {
    int r = t_rank(g), peer = 1 - r;
    hcomm_tensor_t s = act(64, 64, (float)r), in = act(64, 64, -1.0f);
    hcomm_pp_req_t *q = NULL;
    T_TRY(hcomm_pp_group_start(g));
    if (r == 0) {
        T_TRY(hcomm_pp_isend(g, &s, peer, 3, &q));
        T_TRY(hcomm_pp_irecv(g, &in, peer, 4, &q));
    } else {
        T_TRY(hcomm_pp_irecv(g, &in, peer, 3, &q));
        T_TRY(hcomm_pp_isend(g, &s, peer, 4, &q));
    }
    T_CHECK(q == NULL, "a request posted inside a group must be NULL");
    T_TRY(hcomm_pp_group_end(g));
    expect_act(&in, 64, 64, (float)peer, "group exchange", 0);
    T_TRY(hcomm_pp_group_start(g));
    if (r == 0)
        T_TRY(hcomm_pp_isend(g, &s, peer, 5, &q));
    T_TRY(hcomm_pp_group_end(g));
    if (r == 1) {
        T_TRY(hcomm_pp_recv(g, &in, peer, 5));
        expect_act(&in, 64, 64, 0.0f, "after an empty group", 0);
    }
    T_ERR(hcomm_pp_group_end(g), HCOMM_ERR_STATE);
    T_TRY(group_pairs(g, &s));
    hcomm_tensor_t stale = {.data = &stale}; /* recv_any clears out->data on every failure */
    T_ERR(hcomm_pp_recv_any(g, 99, 5, &stale), HCOMM_ERR_INVALID_ARG);
    T_CHECK(stale.data == NULL, "recv_any with a bad peer left out->data=%p", stale.data);
    hcomm_mem_free(s.data);
    hcomm_mem_free(in.data);
    return HCOMM_OK;
}

/* A receive that states another shape or dtype fails naming both; the stream goes on. */
static hcomm_result_t mismatches(hcomm_comm_t *g) {
    int r = t_rank(g), peer = 1 - r;
    hcomm_tensor_t s = act(4, 8, 5.0f), small = act(4, 7, 0.0f), ok = act(4, 8, 0.0f);
    if (r == 0) {
        T_TRY(hcomm_pp_send(g, &s, peer, 11));
        T_TRY(hcomm_pp_send(g, &s, peer, 11));
    } else {
        T_ERR(hcomm_pp_recv(g, &small, peer, 11), HCOMM_ERR_MISMATCH);
        T_CHECK(strstr(hcomm_last_error(), "sent f32 [4, 1, 8], expected f32 [4, 1, 7]") != NULL,
                "mismatch message: '%s'", hcomm_last_error());
        T_TRY(hcomm_pp_recv(g, &ok, peer, 11));
        expect_act(&ok, 4, 8, 5.0f, "message after a mismatch", 0);
    }
    hcomm_mem_free(s.data);
    hcomm_mem_free(small.data);
    hcomm_mem_free(ok.data);
    return HCOMM_OK;
}

static hcomm_result_t pairs(hcomm_comm_t *w, void *arg) {
    (void)arg;
    int n = t_size(w), r = t_rank(w);
    hcomm_comm_t *g = NULL;
    /* Ranks (0,1) form a pair; the others sit out (color -1). */
    T_TRY(hcomm_comm_split(w, r < 2 ? 0 : -1, r, &g));
    if (g && n >= 2) {
        T_TRY(requests(g));
        T_TRY(groups(g));
        T_TRY(mismatches(g));
        for (int how = 0; how < 3; how++) {
            T_TRY(two_stage_step(g, 16, how));
            T_TRY(two_stage_step(g, 65536, how));
        }
    }
    if (g)
        T_TRY(hcomm_comm_destroy(g));
    T_TRY(hcomm_barrier(w));
    /* 1F1B over the whole world as one pipeline, at a small and a large hidden size. */
    T_TRY(run_1f1b(w, 0, 4));
    T_TRY(run_1f1b(w, 0, 1024));
    return hcomm_barrier(w);
}

/* World 8 as tp 2 x pp 4: two pipelines run 1F1B at once; contents carry the pipeline's key. */
static hcomm_result_t two_pipelines(hcomm_comm_t *w, void *arg) {
    (void)arg;
    if (t_size(w) != 8)
        return HCOMM_OK;
    hcomm_parallel_config_t cfg = {.tp = 2, .pp = 4, .dp = 1};
    hcomm_ctx_t *ctx = NULL;
    T_TRY(hcomm_ctx_create(w, &cfg, &ctx));
    hcomm_comm_t *pp = NULL, *tp = NULL;
    T_TRY(hcomm_ctx_group(ctx, HCOMM_GROUP_PP, &pp));
    T_TRY(hcomm_ctx_group(ctx, HCOMM_GROUP_TP, &tp));
    T_TRY(run_1f1b(pp, 1 + t_rank(tp), 32));
    return hcomm_ctx_destroy(ctx);
}

int main(void) {
    if (strcmp(t_backend(), "mpi") == 0) {
        T_OK(hcomm_launch("mpi", 0, pairs, NULL));
        T_OK(hcomm_launch("mpi", 0, two_pipelines, NULL));
    } else {
        for (int n = 1; n <= 4; n++)
            T_OK(hcomm_launch("local", n, pairs, NULL));
        T_OK(hcomm_launch("local", 8, two_pipelines, NULL));
    }
    return t_finish("test_pp_async");
}
