/* Sequence parallelism of hcomm-train (sp.h): the TP block's entry and exit. */
#include "sp.h"

/* The sequence-parallel mapping of an edge and its twin without --sequence-parallel. */
typedef hcomm_result_t (*sp_call_t)(hcomm_comm_t *, const hcomm_tensor_t *, hcomm_tensor_t *, int);
typedef hcomm_result_t (*tp_call_t)(hcomm_comm_t *, const hcomm_tensor_t *, hcomm_tensor_t *);
typedef struct sp_edge {
    sp_call_t sp;
    const char *sp_name;
    tp_call_t tp;
    const char *tp_name;
} sp_edge_t;
#define SP_EDGE(sp, tp) ((sp_edge_t){sp, #sp, tp, #tp})

/* out [out_rows, C] from in [in_rows, C] over the TP group, by e's call for c.on. */
static hcomm_result_t sp_map(train_rt_t *rt, sp_rows_t c, sp_edge_t e, real_t *in, int64_t in_rows,
                             real_t *out, int64_t out_rows, int64_t C) {
    hcomm_tensor_t in_t = comm_in(rt, in, in_rows, C), out_t = comm_out(rt, out, out_rows, C);
    hcomm_result_t r =
        TRAIN_COMM(rt, c.on ? e.sp(rt->tp, &in_t, &out_t, 0) : e.tp(rt->tp, &in_t, &out_t));
    if (r != HCOMM_OK)
        return train_fail(rt, c.on ? e.sp_name : e.tp_name, r);
    comm_out_done(&out_t, out);
    return HCOMM_OK;
}

static hcomm_result_t sp_enter_fwd(train_rt_t *rt, sp_rows_t c, real_t *h, real_t *x, int64_t C) {
    sp_edge_t e = SP_EDGE(hcomm_tp_gather_from_sp_fwd, hcomm_tp_copy_to_fwd);
    return sp_map(rt, c, e, h, c.n, x, c.rows, C);
}

static hcomm_result_t sp_exit_fwd(train_rt_t *rt, sp_rows_t c, real_t *y, real_t *s, int64_t C) {
    sp_edge_t e = SP_EDGE(hcomm_tp_reduce_scatter_to_sp_fwd, hcomm_tp_reduce_from_fwd);
    return sp_map(rt, c, e, y, c.rows, s, c.n, C);
}

static hcomm_result_t sp_exit_bwd(train_rt_t *rt, sp_rows_t c, real_t *dh, real_t *dy, int64_t C) {
    sp_edge_t e = SP_EDGE(hcomm_tp_reduce_scatter_to_sp_bwd, hcomm_tp_reduce_from_bwd);
    return sp_map(rt, c, e, dh, c.n, dy, c.rows, C);
}

static hcomm_result_t sp_enter_bwd(train_rt_t *rt, sp_rows_t c, real_t *dxp, real_t *dx,
                                   int64_t C) {
    sp_edge_t e = SP_EDGE(hcomm_tp_gather_from_sp_bwd, hcomm_tp_copy_to_bwd);
    return sp_map(rt, c, e, dxp, c.rows, dx, c.n, C);
}
