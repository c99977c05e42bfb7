/* Sequence parallelism of hcomm-train (sp.h): the TP block's entry and exit, and the TP sum
 * of the whole weights' gradients. */
#include "sp.h"

static hcomm_result_t sp_enter_fwd(train_rt_t *rt, const mb_cache_t *c, real_t *h, real_t *x,
                                   int64_t C) {
    hcomm_tensor_t h_t = comm_in(rt, h, c->n, C), x_t = comm_out(rt, x, mb_rows(c), C);
    if (c->sp)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_gather_from_sp_fwd(rt->tp, &h_t, &x_t, 0)));
    else
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_copy_to_fwd(rt->tp, &h_t, &x_t)));
    comm_out_done(&x_t, x);
    return HCOMM_OK;
}

static hcomm_result_t sp_exit_fwd(train_rt_t *rt, const mb_cache_t *c, real_t *y, real_t *s,
                                  int64_t C) {
    hcomm_tensor_t y_t = comm_in(rt, y, mb_rows(c), C), s_t = comm_out(rt, s, c->n, C);
    if (c->sp)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_scatter_to_sp_fwd(rt->tp, &y_t, &s_t, 0)));
    else
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_from_fwd(rt->tp, &y_t, &s_t)));
    comm_out_done(&s_t, s);
    return HCOMM_OK;
}

static hcomm_result_t sp_exit_bwd(train_rt_t *rt, const mb_cache_t *c, real_t *dh, real_t *dy,
                                  int64_t C) {
    hcomm_tensor_t dh_t = comm_in(rt, dh, c->n, C), dy_t = comm_out(rt, dy, mb_rows(c), C);
    if (c->sp)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_scatter_to_sp_bwd(rt->tp, &dh_t, &dy_t, 0)));
    else
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_from_bwd(rt->tp, &dh_t, &dy_t)));
    comm_out_done(&dy_t, dy);
    return HCOMM_OK;
}

static hcomm_result_t sp_enter_bwd(train_rt_t *rt, const mb_cache_t *c, real_t *dxp, real_t *dx,
                                   int64_t C) {
    hcomm_tensor_t p_t = comm_in(rt, dxp, mb_rows(c), C), d_t = comm_out(rt, dx, c->n, C);
    if (c->sp)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_gather_from_sp_bwd(rt->tp, &p_t, &d_t, 0)));
    else
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_copy_to_bwd(rt->tp, &p_t, &d_t)));
    comm_out_done(&d_t, dx);
    return HCOMM_OK;
}

static hcomm_result_t sp_reduce_grads(const model_t *m, train_rt_t *rt) {
    if (!rt->sp || rt->tp_size == 1)
        return HCOMM_OK;
    hcomm_tensor_t *g = arena_alloc(&rt->arena, (size_t)(m->nparams + 1) * sizeof *g);
    int n = 0;
    for (int i = 0; i < m->nparams; i++) {
        const param_t *p = m->params[i];
        if (!p->sharded && !p->expert)
            g[n++] = train_view2(p->g, p->rows, p->cols);
    }
    TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_dp_all_reduce_grads(rt->tp, g, n, HCOMM_SUM, 0)));
    return HCOMM_OK;
}
