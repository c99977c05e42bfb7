"""Every call of the package, on this rank, against numpy references, for any world size: each
rank's data is a function of its rank, so every rank computes the whole reference itself. Run
by test_mpi.py under mpirun -np 2, 3 and 4 (one process per rank, backend mpi) through
python3 -m hcomm.run, and on the local backend; prints 'rank R: N checks ok on BACKEND'. numpy
only, so that startup stays short."""
import numpy as np

import hcomm
from hcomm import dp, moe, pp, tp

NP_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64]
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def data(rank, shape, dtype=np.float64):
    """Small integers, held exactly by every dtype (sums over <= 8 ranks fit int8)."""
    return np.random.default_rng(rank).integers(0, 5, size=shape).astype(dtype)


def same(got, want, what):
    assert type(got) is np.ndarray, (what, type(got))
    assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want), \
        (what, got.dtype, got.shape, np.shape(want))
    np.testing.assert_array_equal(got, want, err_msg=what)


@check
def all_reduce_ops_and_dtypes(r, n, w):
    x = data(r, (3, 5))
    allx = np.stack([data(q, (3, 5)) for q in range(n)])
    ref = {"sum": allx.sum(0), "prod": allx.prod(0), "max": allx.max(0), "min": allx.min(0),
           "avg": allx.sum(0) / n}
    for op, want in ref.items():
        np.testing.assert_allclose(tp.all_reduce(x, op=op, group=w), want, rtol=1e-15,
                                   err_msg=op)
    for dt in NP_DTYPES:
        same(tp.all_reduce(data(r, (7,), dt), group=w),
             sum(data(q, (7,), np.int64) for q in range(n)).astype(dt), f"sum {dt}")
    y = data(r, (4,))
    assert tp.all_reduce(y, group=w, out=y) is y  # in place
    same(y, sum(data(q, (4,)) for q in range(n)), "in place")


@check
def gather_scatter_split_regions(r, n, w):
    xs = [data(q, (2 * n, 3 * n), np.float32) for q in range(n)]
    total = np.sum(xs, axis=0)
    for dim in (0, 1, -1):
        gathered = np.concatenate(xs, axis=dim)
        mine = np.split(xs[r], n, axis=dim)[r]
        same(tp.all_gather(xs[r], dim=dim, group=w), gathered, f"all_gather {dim}")
        same(tp.reduce_scatter(xs[r], dim=dim, group=w), np.split(total, n, axis=dim)[r],
             f"reduce_scatter {dim}")
        same(tp.split(xs[r], dim=dim, group=w), mine, f"split {dim}")
        same(tp.scatter_to_fwd(xs[r], dim, group=w), mine, "scatter_to_fwd")
        same(tp.gather_from_fwd(xs[r], dim, group=w), gathered, "gather_from_fwd")
        parts = [np.ascontiguousarray(np.split(xs[q], n, axis=dim)[q]) for q in range(n)]
        same(tp.scatter_to_bwd(parts[r], dim, group=w), np.concatenate(parts, axis=dim),
             "scatter_to_bwd")
        same(tp.gather_from_bwd(xs[r], dim, group=w), mine, "gather_from_bwd")
    same(tp.copy_to_fwd(xs[r], group=w), xs[r], "copy_to_fwd")
    same(tp.copy_to_bwd(xs[r], group=w), total, "copy_to_bwd")
    same(tp.reduce_from_fwd(xs[r], group=w), total, "reduce_from_fwd")
    same(tp.reduce_from_bwd(xs[r], group=w), xs[r], "reduce_from_bwd")
    same(tp.all_gather(np.zeros((0, 3), np.float32), dim=0, group=w),
         np.zeros((0, 3), np.float32), "empty")
    same(tp.all_reduce(np.array(2.0), group=w), np.array(2.0 * n), "scalar")


def act(rank, step=0, shape=(2, 3)):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 100 * rank + step


@check
def pp_point_to_point(r, n, w):
    if n == 1:  # no sends to self
        return
    nxt, prv = (r + 1) % n, (r - 1) % n
    s = pp.isend(act(r), dst=nxt, tag=3, group=w)
    a = pp.irecv(src=prv, tag=3, shape=(2, 3), dtype=np.float32, group=w)
    b = pp.irecv(src=prv, tag=4, kind="numpy", group=w)  # any shape (receive by envelope)
    pp.send(act(r, 1, (r + 1,)).astype(np.int64), dst=nxt, tag=4, group=w)
    s.wait()
    same(a.wait(), act(prv), "irecv")
    same(b.wait(), act(prv, 1, (prv + 1,)).astype(np.int64), "irecv any")
    c = pp.send_recv(act(r, 2), dst=nxt, src=prv, send_tag=5, recv_tag=5, shape=(2, 3),
                     dtype=np.float32, group=w)
    same(c, act(prv, 2), "send_recv")
    d = pp.send_recv(act(r, 3, (r + 2,)), dst=nxt, src=prv, send_tag=6, recv_tag=6,
                     kind="numpy", group=w)
    same(d, act(prv, 3, (prv + 2,)), "send_recv any")
    if r % 2 == 0 and r + 1 < n:  # blocking pairs: even ranks send first
        pp.send(act(r, 4), dst=r + 1, tag=pp.PP_TAG_FORWARD, group=w)
        same(pp.recv(src=r + 1, tag=pp.PP_TAG_BACKWARD, kind="numpy", group=w),
             act(r, 4) * 2, "recv backward")
    elif r % 2 == 1:
        got = pp.recv(src=r - 1, tag=pp.PP_TAG_FORWARD, shape=(2, 3), dtype=np.float32,
                      group=w)
        same(got, act(r - 1, 4), "recv forward")
        pp.send(got * 2, dst=r - 1, tag=pp.PP_TAG_BACKWARD, group=w)


@check
def pipeline_helpers(r, n, w):
    """One forward and backward through n stages, and a ring pass."""
    ctx = hcomm.init_context(tp_size=1, pp_size=n, dp_size=1)
    try:
        s = ctx.pp.rank
        x = pp.recv_forward(kind="numpy")
        x = act(0) if x is None else x + 1
        g = pp.send_forward_recv_backward(x, shape=(2, 3), dtype=np.float32)
        g = np.ones((2, 3), np.float32) if g is None else g * 2
        pp.send_backward(g)
        ring = pp.send_forward_recv_forward(x, ring=True, kind="numpy")
        same(x, act(0) + s, "forward")
        same(g, np.full((2, 3), 2.0 ** (n - 1 - s), np.float32), "backward")
        if n > 1:
            same(ring, act(0) + (s - 1) % n, "ring")
        else:
            assert ring is None, ring
    finally:
        ctx.destroy()


@check
def moe_top1_and_topk(r, n, w):
    E, H = 2 * n, 3

    def batch(q):
        rng = np.random.default_rng(10 + q)
        m = 4 + q  # N differs by rank
        return (rng.standard_normal((m, H)).astype(np.float32),
                rng.integers(0, E, size=m).astype(np.int32))

    tokens, ids = batch(r)
    tpe = np.zeros(E // n, np.int64)
    routed, routing = moe.all_to_all(tokens, ids, num_experts=E, tokens_per_expert=tpe, group=w)
    mine = range(r * E // n, (r + 1) * E // n)
    rows = [batch(q)[0][batch(q)[1] == e] for e in mine for q in range(n)]
    same(routed, np.concatenate(rows), "routed")
    same(tpe, np.array([sum((batch(q)[1] == e).sum() for q in range(n)) for e in mine]), "tpe")
    same(moe.all_to_all(routed * 2, routing), tokens * 2, "reverse")
    same(moe.combine_bwd(tokens, routing), routed, "combine_bwd")
    same(moe.dispatch_bwd(routed, routing), tokens, "dispatch_bwd")
    routing.free()
    ids2 = np.stack([ids, (ids + 1) % E], axis=1)
    ids2[0, 1] = -1  # an empty slot
    wts = np.full(ids2.shape, 0.25, np.float32)
    wts[:, 0] = 0.5
    routed, routing = moe.dispatch(tokens, ids2, E, weights=wts, group=w)
    ref = tokens * 0.75
    ref[0] = tokens[0] * 0.5
    np.testing.assert_allclose(moe.combine(routed, routing), ref, rtol=1e-6)
    ref = tokens * 2
    ref[0] = tokens[0]
    np.testing.assert_allclose(moe.dispatch_bwd(routed, routing), ref, rtol=1e-6)
    routing.free()


@check
def dp_all_reduce_and_reducer(r, n, w):
    def grads(q, step=0):
        return [data(q + step, (3,)), data(q + 7 + step, (2, 2), np.float32),
                data(q + 9 + step, (5,), np.int32)]

    for op in ("avg", "sum"):
        g = grads(r)
        assert dp.all_reduce(g, op=op, bucket_bytes=16, group=w) is g
        for i, got in enumerate(g):
            want = sum(grads(q)[i].astype(np.float64) for q in range(n))
            want = (want / n if op == "avg" else want).astype(got.dtype)  # ints truncate
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"dp {op} {i}")
    g = grads(r)
    red = w.reducer(g, op="sum", bucket_bytes=16)
    for step in range(2):  # the same registered buffers, refilled each step
        for i, t in enumerate(grads(r, step)):
            g[i][...] = t
        for i in np.random.default_rng(r + step).permutation(len(g)):  # any order per rank
            red.mark_ready(int(i))
        red.wait()
        for i, got in enumerate(g):
            same(got, sum(grads(q, step)[i] for q in range(n)), f"reducer step {step} {i}")
    red.free()


@check
def context_matches_plan(r, n, w):
    tp_size = 2 if n % 2 == 0 else 1
    layout = hcomm.plan(n, tp=tp_size, pp=1)
    ctx = hcomm.init_context(tp_size=tp_size, pp_size=1)
    try:
        for kind in ("tp", "pp", "dp", "ep"):
            g = getattr(ctx, kind)
            assert g.ranks in layout[kind] and g.ranks[g.rank] == r, (kind, g.ranks, layout)
        grads = [np.full(3, float(r))]
        ctx.dp.all_reduce(grads, op="avg")
        same(grads[0], np.full(3, sum(ctx.dp.ranks) / ctx.dp.size), "ctx.dp.all_reduce")
    finally:
        ctx.destroy()


@check
def errors_carry_c_message(r, n, w):
    if n == 1:  # nobody to disagree with
        return
    try:
        tp.all_reduce(np.zeros(4 + r, np.float32), group=w)
    except hcomm.MismatchError as e:
        assert str(e).startswith("hcomm_") and "count=" in str(e), str(e)
    else:
        raise AssertionError("a count mismatch went unnoticed")


@check
def torch_distributed_names_and_async(r, n, w):
    """broadcast, reduce, barrier, all_to_all_single (uneven), async handles on every
    collective, get_rank/get_world_size(group), bool and int16 as bytes."""
    x = data(r, (4, 3))
    for src in range(n):
        b = x.copy()
        hcomm.broadcast(b, src=src, group=w)
        same(b, data(src, (4, 3)), f"broadcast from {src}")
    red = x.copy()
    h = hcomm.reduce(red, dst=n - 1, group=w, async_op=True)
    assert h.wait() is red and h.is_completed()
    same(red, sum(data(q, (4, 3)) for q in range(n)) if r == n - 1 else x, "reduce")
    hcomm.barrier(group=w)
    hcomm.barrier(group=w, async_op=True).wait()
    ins = [(r + q) % 3 for q in range(n)]
    outs = [(q + r) % 3 for q in range(n)]
    src_rows = np.concatenate([np.full((k, 2), 10 * r + q) for q, k in enumerate(ins)])
    out = np.empty((sum(outs), 2), src_rows.dtype)
    hcomm.all_to_all_single(out, src_rows, outs, ins, group=w, async_op=True).wait()
    same(out, np.concatenate([np.full((k, 2), 10 * q + r) for q, k in enumerate(outs)])
         .astype(src_rows.dtype), "all_to_all_single")
    hs = [tp.all_reduce(x, group=w, async_op=True),
          tp.all_gather(x, dim=1, group=w, async_op=True),
          dp.all_reduce([x.copy()], op="sum", group=w, async_op=True)]
    total = sum(data(q, (4, 3)) for q in range(n))
    same(hs[2].wait()[0], total, "async dp")
    same(hs[1].wait(), np.concatenate([data(q, (4, 3)) for q in range(n)], 1), "async gather")
    same(hs[0].wait(), total, "async all_reduce")
    assert (hcomm.get_rank(w), hcomm.get_world_size(w)) == (r, n)
    for v in (np.array([r % 2 == 0, True]), np.array([r, -r - 300], np.int16)):
        same(tp.all_gather(v, dim=0, group=w),
             np.concatenate([np.array([q % 2 == 0, True]) if v.dtype == bool else
                             np.array([q, -q - 300], np.int16) for q in range(n)]), "bytes")
        try:
            tp.all_reduce(v, group=w)
        except hcomm.DtypeError as e:
            assert str(v.dtype) in str(e), str(e)
        else:
            raise AssertionError(f"a reduction of {v.dtype} was not refused")


w = hcomm.world()
for fn in CHECKS:
    fn(w.rank, w.size, w)
    w.barrier()
print(f"rank {w.rank}: {len(CHECKS)} checks ok on {w.backend}", flush=True)
