"""hcomm.tp against numpy references on 1..8 local ranks."""
import numpy as np
import pytest

import hcomm
from conftest import run
from hcomm import tp

NP_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64]


def data(rank, shape, dtype):
    """Rank-specific values that every dtype holds exactly (small integers)."""
    rng = np.random.default_rng(rank)
    return rng.integers(0, 5, size=shape).astype(dtype)


@pytest.mark.parametrize("n", range(1, 9))
def test_all_reduce_ops(n):
    shape = (3, 5)

    def body():
        x = data(hcomm.get_rank(), shape, np.float64)
        return {op: tp.all_reduce(x, op=op) for op in ("sum", "prod", "max", "min", "avg")}

    allx = np.stack([data(r, shape, np.float64) for r in range(n)])
    ref = {"sum": allx.sum(0), "prod": allx.prod(0), "max": allx.max(0), "min": allx.min(0),
           "avg": allx.sum(0) / n}
    for out in run(body, n):
        for op, v in out.items():
            np.testing.assert_allclose(v, ref[op], rtol=1e-12, err_msg=op)


@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_all_reduce_dtypes(dtype):
    n = 3

    def body():
        x = data(hcomm.get_rank(), (7,), dtype)
        y = tp.all_reduce(x)
        assert y.dtype == x.dtype and isinstance(y, np.ndarray)
        return y

    ref = sum(data(r, (7,), dtype).astype(np.int64) for r in range(n))
    for y in run(body, n):
        np.testing.assert_array_equal(y.astype(np.int64), ref)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather_scatter_split(n, dim):
    def body():
        r = hcomm.get_rank()
        x = data(r, (2 * n, 3 * n), np.float32)
        return (tp.all_gather(x, dim=dim), tp.reduce_scatter(x, dim=dim), tp.split(x, dim=dim),
                tp.gather_from_fwd(x, dim), tp.scatter_to_fwd(x, dim), tp.copy_to_fwd(x),
                tp.reduce_from_fwd(x), tp.copy_to_bwd(x), tp.reduce_from_bwd(x))

    xs = [data(r, (2 * n, 3 * n), np.float32) for r in range(n)]
    total = np.sum(xs, axis=0)
    gathered = np.concatenate(xs, axis=dim)
    for r, (ag, rs, sp, gf, st, ct, rf, cb, rb) in enumerate(run(body, n)):
        np.testing.assert_array_equal(ag, gathered)
        np.testing.assert_array_equal(gf, gathered)
        np.testing.assert_array_equal(rs, np.split(total, n, axis=dim)[r])
        np.testing.assert_array_equal(sp, np.split(xs[r], n, axis=dim)[r])
        np.testing.assert_array_equal(st, sp)
        np.testing.assert_array_equal(ct, xs[r])
        np.testing.assert_array_equal(rf, total)
        np.testing.assert_array_equal(cb, total)
        np.testing.assert_array_equal(rb, xs[r])


def test_region_backwards_and_tp_group():
    """Regions on the TP group of a context (tp=2 inside 8 ranks), backward calls included."""
    def body():
        ctx = hcomm.init_context(tp_size=2, pp_size=2, dp_size=2)
        x = data(hcomm.get_rank(), (4, 6), np.float64)
        return (ctx.tp.rank, ctx.tp.ranks, x, tp.all_reduce(x), tp.scatter_to_bwd(x, -1),
                tp.gather_from_bwd(x, 0))

    out = [o[1:] for o in run(body, 8)]
    for me, (ranks, x, s, sb, gb) in zip((o[0] for o in run(body, 8)), out):
        np.testing.assert_array_equal(s, sum(out[r][1] for r in ranks))
        np.testing.assert_array_equal(sb, np.concatenate([out[r][1] for r in ranks], -1))
        np.testing.assert_array_equal(gb, np.split(x, 2, 0)[me])


def test_empty_and_scalar():
    def body():
        e = tp.all_gather(np.zeros((0, 3), np.float32), dim=0)
        s = tp.all_reduce(np.array(2.0))
        return e.shape, s

    for shape, s in run(body, 4):
        assert shape == (0, 3) and s == 8.0 and s.shape == ()


def test_out_and_in_place():
    def body():
        x = np.full(4, hcomm.get_rank() + 1.0)
        out = np.empty(4)
        assert tp.all_reduce(x, out=out) is out
        y = tp.all_reduce(x, out=x)  # in place
        return out, y is x, x

    for out, same, x in run(body, 3):
        np.testing.assert_array_equal(out, np.full(4, 6.0))
        assert same
        np.testing.assert_array_equal(x, np.full(4, 6.0))
