/* What every precision of hcomm-train shares (see rt.h). */
#include "rt.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- timing and failures */

double train_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

hcomm_result_t train_comm_done(train_rt_t *rt, hcomm_result_t r) {
    rt->comm_s += train_now() - rt->mark;
    return r;
}

/* With --max-failures a lost rank's echoes are what recovery handles: the first is kept for
 * its report, none printed. */
static int recoverable(const train_rt_t *rt, hcomm_result_t r) {
    return rt->rec != NULL && (r == HCOMM_ERR_PEER_LOST || r == HCOMM_ERR_REVOKED ||
                               r == HCOMM_ERR_ABORTED || r == HCOMM_ERR_PEER);
}

hcomm_result_t train_fail(train_rt_t *rt, const char *what, hcomm_result_t r) {
    if (recoverable(rt, r)) {
        if (rt->step_error[0] == '\0') { /* its first clause: the call, the rank, the seq */
            snprintf(rt->step_error, sizeof rt->step_error, "%s", hcomm_last_error());
            rt->step_error[strcspn(rt->step_error, ";")] = '\0';
            rt->step_error_wait = train_now() - rt->mark;
        }
        return r;
    }
    if (r != HCOMM_ERR_ABORTED)
        fprintf(stderr, "hcomm-train: rank %d: %s failed: %s (%s)\n", rt->world_rank, what,
                hcomm_result_name(r), hcomm_last_error());
    return r;
}

hcomm_result_t train_fail_call(train_rt_t *rt, const char *call, hcomm_result_t r) {
    /* call is the C text, maybe wrapped: "TRAIN_COMM(rt, hcomm_pp_recv(rt->pp, ...))"; the
     * user needs only the name of the hcomm function. */
    char name[64] = "an hcomm call";
    const char *p = strstr(call, "hcomm_");
    if (p != NULL) {
        size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_");
        if (n < sizeof name)
            snprintf(name, sizeof name, "%.*s", (int)n, p);
    }
    return train_fail(rt, name, r);
}

hcomm_tensor_t train_view(void *data, hcomm_dtype_t dtype, int64_t rows, int64_t cols) {
    hcomm_tensor_t t = {0};
    t.data = data;
    t.dtype = dtype;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    return t;
}

/* ---------------------------------------------------------------- the full model's tensors */

int model_num_tensors(const train_opts_t *o) {
    return gi_layer(o->experts, o->layers) + 2;
}

int model_tensors(const train_opts_t *o, int vocab, model_tensor_t *out) {
    const int64_t C = o->hidden, F = 4 * C, Fe = 2 * C, V = vocab;
    const int E = o->experts;
    static const char *const lnames[] = {"tp.w1",   "tp.b1",   "tp.w2",   "tp.b2",   "router",
                                         "attn.wq", "attn.wk", "attn.wv", "attn.wo", "attn.bo"};
    const int64_t lshapes[][2] = {{C, F}, {1, F}, {F, C}, {1, C}, {C, E},
                                  {C, C}, {C, C}, {C, C}, {C, C}, {1, C}};
    const int64_t eshapes[][2] = {{C, Fe}, {1, Fe}, {Fe, C}, {1, C}};
    static const char *const enames[] = {"w1", "b1", "w2", "b2"};
    int n = 0;
    for (int i = 0; i < 2; i++, n++) {
        snprintf(out[n].name, sizeof out[n].name, "%s", i == 0 ? "emb_cur" : "emb_prev");
        out[n].rows = V;
        out[n].cols = C;
    }
    for (int l = 0; l < o->layers; l++) {
        for (int i = 0; i < GL_EXPERT0; i++, n++) {
            snprintf(out[n].name, sizeof out[n].name, "layer%d.%s", l, lnames[i]);
            out[n].rows = lshapes[i][0];
            out[n].cols = lshapes[i][1];
        }
        for (int e = 0; e < E; e++) {
            for (int k = 0; k < 4; k++, n++) {
                snprintf(out[n].name, sizeof out[n].name, "layer%d.expert%d.%s", l, e, enames[k]);
                out[n].rows = eshapes[k][0];
                out[n].cols = eshapes[k][1];
            }
        }
    }
    snprintf(out[n].name, sizeof out[n].name, "head.w");
    out[n].rows = C;
    out[n++].cols = V;
    snprintf(out[n].name, sizeof out[n].name, "head.b");
    out[n].rows = 1;
    out[n++].cols = V;
    return n;
}

int64_t model_full_size(const train_opts_t *o, int vocab) {
    int64_t C = o->hidden, F = 4 * C, Fe = 2 * C, V = vocab, E = o->experts;
    return 2 * V * C +
           o->layers *
               ((C * F + F + F * C + C) + C * E + E * (C * Fe + Fe + Fe * C + C) + 4 * C * C + C) +
           C * V + V;
}
