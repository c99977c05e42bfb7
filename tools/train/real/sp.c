/* Sequence parallelism of hcomm-train (sp.h): the TP block's entry and exit. */
#include "sp.h"

static hcomm_result_t sp_enter_fwd(train_rt_t *rt, sp_rows_t c, real_t *h, real_t *x, int64_t C) {
    hcomm_tensor_t h_t = comm_in(rt, h, c.n, C), x_t = comm_out(rt, x, c.rows, C);
    if (c.on)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_gather_from_sp_fwd(rt->tp, &h_t, &x_t, 0)));
    else
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_copy_to_fwd(rt->tp, &h_t, &x_t)));
    comm_out_done(&x_t, x);
    return HCOMM_OK;
}

static hcomm_result_t sp_exit_fwd(train_rt_t *rt, sp_rows_t c, real_t *y, real_t *s, int64_t C) {
    hcomm_tensor_t y_t = comm_in(rt, y, c.rows, C), s_t = comm_out(rt, s, c.n, C);
    if (c.on)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_scatter_to_sp_fwd(rt->tp, &y_t, &s_t, 0)));
    else
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_from_fwd(rt->tp, &y_t, &s_t)));
    comm_out_done(&s_t, s);
    return HCOMM_OK;
}

static hcomm_result_t sp_exit_bwd(train_rt_t *rt, sp_rows_t c, real_t *dh, real_t *dy, int64_t C) {
    hcomm_tensor_t dh_t = comm_in(rt, dh, c.n, C), dy_t = comm_out(rt, dy, c.rows, C);
    if (c.on)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_scatter_to_sp_bwd(rt->tp, &dh_t, &dy_t, 0)));
    else
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_reduce_from_bwd(rt->tp, &dh_t, &dy_t)));
    comm_out_done(&dy_t, dy);
    return HCOMM_OK;
}

static hcomm_result_t sp_enter_bwd(train_rt_t *rt, sp_rows_t c, real_t *dxp, real_t *dx,
                                   int64_t C) {
    hcomm_tensor_t p_t = comm_in(rt, dxp, c.rows, C), d_t = comm_out(rt, dx, c.n, C);
    if (c.on)
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_gather_from_sp_bwd(rt->tp, &p_t, &d_t, 0)));
    else
        TRAIN_TRY(rt, TRAIN_COMM(rt, hcomm_tp_copy_to_bwd(rt->tp, &p_t, &d_t)));
    comm_out_done(&d_t, dx);
    return HCOMM_OK;
}
