"""torch tensors: every dtype (bf16 and f16 included) zero-copy with results as torch tensors,
and autograd through the TP regions, the parallel linears and MoE against a serial model."""
import numpy as np
import pytest

import hcomm
from conftest import run
from hcomm import moe, tp

torch = pytest.importorskip("torch", reason="torch missing: scripts/deps.sh installs it")
import hcomm.torch as ht  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
          torch.uint8, torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(dtype):
    def body():
        r = hcomm.get_rank()
        x = torch.arange(6).reshape(2, 3).to(dtype) + r
        s, g = tp.all_reduce(x), tp.all_gather(x, dim=0)
        assert isinstance(s, torch.Tensor) and s.dtype == dtype and g.dtype == dtype
        return s, g

    base = torch.arange(6).reshape(2, 3)
    for s, g in run(body, 3):
        assert torch.equal(s, (3 * base + 3).to(dtype))
        assert torch.equal(g, torch.cat([base + r for r in range(3)]).to(dtype))


def test_noncontiguous_torch():
    """The contiguity rule: a non-contiguous input is copied (tp.all_reduce(x.t()) works, as
    tp.reduce_from(x.t()) does); an output written in place must be contiguous."""
    def body():
        x = torch.arange(16.0).reshape(4, 4)
        assert torch.equal(tp.all_reduce(x.t()), 2 * x.t())
        assert torch.equal(tp.reduce_from(x.t()), 2 * x.t())
        assert torch.equal(tp.all_gather(x[:, ::2], dim=0), torch.cat([x[:, ::2]] * 2))
        with pytest.raises(ValueError, match="not contiguous.*written in place"):
            tp.all_reduce(x, out=torch.zeros(4, 4).t())
        return True

    assert run(body, 2) == [True, True]


@pytest.mark.parametrize("pair", ["copy_reduce", "scatter_gather"])
@pytest.mark.parametrize("n", [2, 3])
def test_region_gradcheck(pair, n):
    """torch.autograd.gradcheck (f64) of the regions as a TP layer uses them: x is the same on
    every rank (gradcheck perturbs it the same way everywhere), each rank applies its own
    weight in between, and the output is again the same everywhere. A region alone is not a
    function of its rank's input only (copy_to's backward sums every rank's gradient)."""
    def body():
        x = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0),
                        requires_grad=True)
        w = torch.randn(6, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(1 + hcomm.get_rank()))

        def f(t):
            if pair == "copy_reduce":
                return tp.reduce_from(torch.tanh(tp.copy_to(t) * w))
            return tp.gather_from(torch.tanh(tp.scatter_to(t, -1) * w[:6 // n]), -1)

        return torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-7)

    assert run(body, n) == [True] * n


def serial_mlp(gen, d=4, f=8):
    w1 = torch.randn(f, d, dtype=torch.float64, generator=gen)
    b1 = torch.randn(f, dtype=torch.float64, generator=gen)
    w2 = torch.randn(d, f, dtype=torch.float64, generator=gen)
    b2 = torch.randn(d, dtype=torch.float64, generator=gen)
    x = torch.randn(3, d, dtype=torch.float64, generator=gen)
    return w1, b1, w2, b2, x


@pytest.mark.parametrize("n", [1, 2, 4])
def test_parallel_linears_match_serial(n):
    """Column -> gelu -> Row on n TP ranks: same output and gradients as one serial MLP."""
    w1, b1, w2, b2, x = serial_mlp(torch.Generator().manual_seed(0))
    params = [p.clone().requires_grad_() for p in (w1, b1, w2, b2)]
    xs = x.clone().requires_grad_()
    ref = torch.nn.functional.linear(torch.nn.functional.gelu(
        torch.nn.functional.linear(xs, params[0], params[1])), params[2], params[3])
    ref.square().sum().backward()

    def body():
        col = ht.ColumnParallelLinear(4, 8, dtype=torch.float64).load_full(w1, b1)
        row = ht.RowParallelLinear(8, 4, dtype=torch.float64).load_full(w2, b2)
        xi = x.clone().requires_grad_()
        y = row(torch.nn.functional.gelu(col(xi)))
        y.square().sum().backward()
        return y.detach(), xi.grad, col.weight.grad, row.weight.grad, row.bias.grad

    for r, (y, gx, gw1, gw2, gb2) in enumerate(run(body, n)):
        torch.testing.assert_close(y, ref.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gx, xs.grad, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gw1, params[0].grad.chunk(n, 0)[r], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gw2, params[2].grad.chunk(n, 1)[r], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gb2, params[3].grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("k", [1, 2])
def test_moe_autograd_matches_serial(k):
    """Dispatch -> per-expert scale -> combine: token gradients equal the serial model's, and
    gradcheck passes in f64."""
    E, n = 4, 2

    def tokens_of(r):
        g = torch.Generator().manual_seed(r)
        t = torch.randn(3, 2, dtype=torch.float64, generator=g)
        ids = torch.randint(0, E, (3, k), generator=g, dtype=torch.int32)
        return t, (ids[:, 0] if k == 1 else ids)

    def expert(rows, routing):  # rows of local expert e are scaled by (global e + 1)
        first = routing.group.rank * (E // n)
        scale = torch.repeat_interleave(
            torch.arange(first + 1, first + 1 + E // n, dtype=torch.float64),
            torch.from_numpy(routing.tokens_per_expert))
        return rows * scale[:, None]

    def body():
        t, ids = tokens_of(hcomm.get_rank())

        def layer(x):
            routed, routing = moe.all_to_all(x, ids, num_experts=E)
            return moe.all_to_all(expert(routed, routing), routing)

        x = t.clone().requires_grad_()
        layer(x).sum().backward()
        ok = torch.autograd.gradcheck(layer, (t.clone().requires_grad_(),), eps=1e-6)
        return x.grad, ok

    for r, (grad, ok) in enumerate(run(body, n)):
        t, ids = tokens_of(r)
        ids = ids.reshape(3, -1).long()
        assert ok
        torch.testing.assert_close(grad, (ids + 1).sum(1, dtype=torch.float64)[:, None]
                                   .expand_as(t), rtol=1e-12, atol=1e-12)
