"""torch.distributed's names: hcomm.broadcast, barrier, reduce, all_to_all_single,
get_rank/get_world_size(group), async_op work handles on every collective, and bool/int16
moved as raw bytes (reductions of them refused naming the dtype)."""
import numpy as np
import pytest

import hcomm
from conftest import run
from hcomm import tp

torch = pytest.importorskip("torch")
SIZES = [1, 2, 3, 5]


def val(r, shape, dtype=torch.float64):
    return (torch.arange(float(np.prod(shape))).reshape(shape) + 100 * r).to(dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.int16,
                                   torch.bfloat16])
@pytest.mark.parametrize("async_op", [False, True])
def test_broadcast(n, dtype, async_op):
    src = n - 1

    def body():
        r = hcomm.get_rank()
        x = val(r, (3, 2), dtype) if dtype != torch.bool else torch.tensor([[r % 2 == 0] * 2] * 3)
        res = hcomm.broadcast(x, src=src, async_op=async_op)
        if async_op:
            assert res.wait() is x and res.is_completed()
        else:
            assert res is None
        return x

    want = run(body, n)[src]
    for got in run(body, n):
        assert torch.equal(got, want) and got.dtype == dtype


@pytest.mark.parametrize("n", SIZES)
def test_reduce_barrier_rank_size(n):
    dst = n // 2

    def body():
        r = hcomm.get_rank()
        ctx = hcomm.init_context(tp_size=1)
        x = val(r, (4,))
        hcomm.reduce(x, dst=dst, op="sum")
        hcomm.barrier()
        h = hcomm.barrier(group=ctx.dp, async_op=True)
        h.wait()
        return x, hcomm.get_rank(ctx.dp), hcomm.get_world_size(ctx.dp), hcomm.get_world_size()

    res = run(body, n)
    for r, (x, gr, gs, ws) in enumerate(res):
        want = sum(val(q, (4,)) for q in range(n)) if r == dst else val(r, (4,))
        assert torch.equal(x, want) and (gr, gs, ws) == (r, n, n)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.int16, torch.bool])
def test_all_to_all_single(n, dtype):
    """Uneven splits: rank r sends q+r+1 rows... to rank q (0 rows allowed: r=0,q=0 gets 0)."""
    def rows(r, q):
        return (q + r) % 3

    def body():
        r = hcomm.get_rank()
        ins = [rows(r, q) for q in range(n)]
        outs = [rows(q, r) for q in range(n)]
        x = torch.cat([torch.full((rows(r, q), 2), r * 10 + q) for q in range(n)]).to(dtype)
        out = torch.empty(sum(outs), 2, dtype=dtype)
        hcomm.all_to_all_single(out, x, output_split_sizes=outs, input_split_sizes=ins)
        eq = torch.empty(2 * n, 3, dtype=dtype)
        h = hcomm.all_to_all_single(eq, val(r, (2 * n, 3), dtype), async_op=True)
        return out, h.wait()

    for r, (out, eq) in enumerate(run(body, n)):
        want = torch.cat([torch.full((rows(q, r), 2), q * 10 + r) for q in range(n)]).to(dtype)
        assert torch.equal(out, want)
        assert torch.equal(eq, torch.cat([val(q, (2 * n, 3), dtype)[2 * r:2 * r + 2]
                                          for q in range(n)]))


def test_all_to_all_single_shape_errors():
    def body():
        x = torch.zeros(4, 3)
        with pytest.raises(ValueError, match=r"output \(4, 2\).*input \(4, 3\)"):
            hcomm.all_to_all_single(torch.zeros(4, 2), x)
        with pytest.raises(ValueError, match=r"input_split_sizes=\[1, 1\].*\(4\)"):
            hcomm.all_to_all_single(torch.zeros(4, 3), x, input_split_sizes=[1, 1])
        with pytest.raises(ValueError, match="src=2 outside 0..1"):
            hcomm.broadcast(x, src=2)
        return True

    assert run(body, 2) == [True, True]


@pytest.mark.parametrize("n", [2, 3])
def test_async_handles_every_collective(n):
    """Several in flight at once, completed out of issue order; results as the blocking
    calls give them."""
    def body():
        r = hcomm.get_rank()
        w = hcomm.world()
        x = val(r, (2 * n, 4))
        hs = [tp.all_reduce(x, group=w, async_op=True),
              tp.all_gather(x, dim=1, group=w, async_op=True),
              tp.reduce_scatter(x, dim=0, group=w, async_op=True),
              w.all_reduce([x.clone()], async_op=True),
              hcomm.dp.all_reduce([x.clone()], op="avg", group=w, async_op=True)]
        got = [h.wait() for h in reversed(hs)][::-1]
        assert all(h.is_completed() for h in hs)
        want = [tp.all_reduce(x, group=w), tp.all_gather(x, dim=1, group=w),
                tp.reduce_scatter(x, dim=0, group=w), [tp.all_reduce(x, group=w)],
                [tp.all_reduce(x, op="avg", group=w)]]
        for g, wv in zip(got, want):
            g, wv = (g[0], wv[0]) if isinstance(g, list) else (g, wv)
            assert torch.allclose(g, wv, rtol=1e-15), (g, wv)
        h = tp.all_reduce(x, group=w, async_op=True)
        while not h.is_completed():
            pass
        return torch.equal(h.wait(), want[0]) and h.wait() is h.wait()

    assert run(body, n) == [True] * n


def test_async_error_from_wait():
    def body():
        r = hcomm.get_rank()
        h = tp.all_reduce(torch.zeros(3 + r), group=hcomm.world(), async_op=True)
        with pytest.raises(hcomm.MismatchError, match="count=3"):
            h.wait()
        with pytest.raises(hcomm.MismatchError):  # and again
            h.wait()
        return True

    assert run(body, 2) == [True, True]


@pytest.mark.parametrize("dtype", [torch.bool, torch.int16])
def test_bytes_only_dtypes(dtype):
    def body():
        r = hcomm.get_rank()
        w = hcomm.world()
        x = (val(r, (2, 3), dtype) if dtype == torch.int16 else
             torch.tensor([[r == 0, True, False]] * 2))
        g = tp.all_gather(x, dim=1, group=w)
        g0 = tp.all_gather(x, dim=0, group=w)
        for fn in (lambda: tp.all_reduce(x, group=w), lambda: hcomm.reduce(x, dst=0),
                   lambda: tp.reduce_scatter(x, dim=1, group=w)):
            with pytest.raises(hcomm.DtypeError, match=str(dtype).split(".")[1]):
                fn()
        return x, g, g0

    res = run(body, 2)
    xs = [x for x, _, _ in res]
    for _, g, g0 in res:
        assert torch.equal(g, torch.cat(xs, 1)) and torch.equal(g0, torch.cat(xs, 0))
        assert g.dtype == dtype


def test_numpy_bool_int16():
    def body():
        r = hcomm.get_rank()
        x = np.array([r, -r - 1], dtype=np.int16)
        b = np.array([r == 1, True])
        hcomm.broadcast(b, src=1)
        return tp.all_gather(x, dim=0), b

    for g, b in run(body, 2):
        np.testing.assert_array_equal(g, np.array([0, -1, 1, -2], np.int16))
        np.testing.assert_array_equal(b, [True, True])


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("async_op", [False, True])
def test_in_place_torch_distributed_calls(n, async_op):
    """all_reduce, all_gather_into_tensor, reduce_scatter_tensor and all_to_all (lists of
    uneven tensors) write into the tensors given, as torch.distributed's do."""
    def body():
        r = hcomm.get_rank()
        done = (lambda h: h.wait()) if async_op else (lambda h: h)
        x = val(r, (2 * n, 3))
        ar = x.clone()
        done(hcomm.all_reduce(ar, async_op=async_op))
        ag = torch.empty(2 * n * n, 3, dtype=x.dtype)
        done(hcomm.all_gather_into_tensor(ag, x, async_op=async_op))
        rs = torch.empty(2, 3, dtype=x.dtype)
        done(hcomm.reduce_scatter_tensor(rs, x, async_op=async_op))
        outs = [torch.empty(q + 1, 2) for q in range(n)]  # rank q sends me q+1 rows
        res = hcomm.all_to_all(outs, [torch.full((r + 1, 2), float(10 * r + q))
                                      for q in range(n)], async_op=async_op)
        if async_op:
            assert res.wait() is outs
        return ar, ag, rs, outs

    total = sum(val(q, (2 * n, 3)) for q in range(n))
    for r, (ar, ag, rs, outs) in enumerate(run(body, n)):
        assert torch.equal(ar, total)
        assert torch.equal(ag, torch.cat([val(q, (2 * n, 3)) for q in range(n)]))
        assert torch.equal(rs, total[2 * r:2 * r + 2])
        for q, t in enumerate(outs):
            assert torch.equal(t, torch.full((q + 1, 2), float(10 * q + r)))


def test_in_place_calls_refuse_grad_and_numpy_works():
    def body():
        w = torch.ones(3, requires_grad=True)
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            hcomm.all_reduce(w)
        a = np.ones(4)
        hcomm.all_reduce(a)
        out = np.empty(8)
        hcomm.all_gather_into_tensor(out, a)
        return a, out

    for a, out in run(body, 2):
        np.testing.assert_array_equal(a, np.full(4, 2.0))
        np.testing.assert_array_equal(out, np.full(8, 2.0))


@pytest.mark.parametrize("dtype", [torch.bool, torch.int16])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_bytes_only_split_and_gather_every_dim(dtype, dim):
    def body():
        w = hcomm.world()
        x = (val(0, (4, 6), torch.int64) * 997 % (2 if dtype == torch.bool else 60000)
             - (0 if dtype == torch.bool else 30000)).to(dtype)  # the same on every rank
        s = tp.split(x, dim=dim, group=w)
        return x, s, tp.all_gather(s, dim=dim, group=w)

    for r, (x, s, g) in enumerate(run(body, 2)):
        assert s.dtype == dtype and torch.equal(s, x.chunk(2, dim)[r])
        assert torch.equal(g, x)  # the ranks' slices gathered back
