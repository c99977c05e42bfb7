"""hcomm.dp.Reducer (the DDP-style C reducer): buckets reduced as gradients are marked ready,
against a serial reference, with numpy buffers and with torch parameters marked by backward
hooks; and its errors."""
import numpy as np
import pytest

import hcomm
from conftest import run
from hcomm import dp

SHAPES = [((3,), np.float64), ((2, 2), np.float32), ((0,), np.float64), ((5,), np.int32),
          ((4, 3), np.float64), ((1,), np.float32)]


def grads(rank, step):
    rng = np.random.default_rng(100 * step + rank)
    return [rng.integers(-4, 5, size=s).astype(t) for s, t in SHAPES]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_reducer_numpy_matches_serial(n, op):
    """Three steps over the same registered buffers; each rank marks in its own order; 24-byte
    buckets make several buckets, an empty tensor is skipped."""
    def body():
        r = hcomm.get_rank()
        g = grads(r, 0)
        red = dp.reducer(g, op=op, bucket_bytes=24, group=hcomm.world())
        assert len(red) == len(SHAPES)
        out = []
        for step in range(3):
            for buf, fresh in zip(g, grads(r, step)):
                buf[...] = fresh
            for i in np.random.default_rng(r + 10 * step).permutation(len(g)):
                red.mark_ready(int(i))
            assert red.wait() >= 0.0
            out.append([x.copy() for x in g])
        return out

    for got in run(body, n):
        for step, tensors in enumerate(got):
            for i, x in enumerate(tensors):
                total = sum(grads(q, step)[i].astype(np.int64) for q in range(n))
                if op == "avg":
                    want = (total / n).astype(x.dtype) if x.dtype.kind == "f" else \
                        np.trunc(total / n).astype(x.dtype)  # integer avg truncates
                else:
                    want = total.astype(x.dtype)
                np.testing.assert_allclose(x, want, rtol=1e-6, err_msg=f"step {step} grad {i}")


def test_reducer_torch_hooks_match_serial():
    """Two micro-batches per step, the first under no_sync(): backward's hooks mark each
    parameter once per step, and the reduced gradients equal the serial model's gradient of
    every rank's loss summed."""
    torch = pytest.importorskip("torch")
    n, steps = 3, 2

    def model():
        torch.manual_seed(0)  # only the main thread builds the reference weights
        return torch.nn.Sequential(torch.nn.Linear(4, 6, dtype=torch.float64), torch.nn.Tanh(),
                                   torch.nn.Linear(6, 2, dtype=torch.float64))

    ref_model = model()

    def inputs(rank, step, micro):
        g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
        return torch.randn(5, 4, dtype=torch.float64, generator=g)

    def body():
        m = model_copy()
        red = hcomm.world().reducer(list(m.parameters()), op="sum", bucket_bytes=64)
        red.hook_params()
        out = []
        for step in range(steps):
            with red.no_sync():
                m(inputs(hcomm.get_rank(), step, 0)).square().sum().backward()
            m(inputs(hcomm.get_rank(), step, 1)).square().sum().backward()
            red.wait()
            out.append([p.grad.clone() for p in m.parameters()])
            for p in m.parameters():
                p.grad.zero_()
        return out

    def model_copy():
        m = torch.nn.Sequential(torch.nn.Linear(4, 6, dtype=torch.float64), torch.nn.Tanh(),
                                torch.nn.Linear(6, 2, dtype=torch.float64))
        m.load_state_dict(ref_model.state_dict())
        return m

    got = run(body, n)
    for step in range(steps):
        ref_model.zero_grad()
        for r in range(n):
            for micro in range(2):
                ref_model(inputs(r, step, micro)).square().sum().backward()
        for rank_out in got:
            for g, p in zip(rank_out[step], ref_model.parameters()):
                torch.testing.assert_close(g, p.grad, rtol=1e-12, atol=1e-12)


def test_reducer_errors():
    def body():
        g = [np.zeros(3), np.zeros(2)]
        red = dp.reducer(g, group=hcomm.world())
        with pytest.raises(ValueError, match="index=2 outside 0..1"):
            red.mark_ready(2)
        red.mark_ready(0)
        with pytest.raises(hcomm.StateError, match="already marked"):
            red.mark_ready(0)
        with pytest.raises(hcomm.StateError, match=r"grads\[1\]"):
            red.wait()  # grads[1] never marked: reduced anyway, and reported
        red.mark_ready(0)  # the next step starts clean
        red.mark_ready(1)
        red.wait()
        with pytest.raises(ValueError, match="op must be"):
            dp.reducer(g, op="max", group=hcomm.world())
        with pytest.raises(ValueError, match="not contiguous"):
            dp.reducer([np.zeros((4, 4))[:, ::2]], group=hcomm.world())
        red.free()
        with pytest.raises(hcomm.StateError, match="this reducer was destroyed"):
            red.mark_ready(0)
        return True

    assert run(body, 2) == [True, True]


def test_reducer_replaced_grad_is_an_error():
    torch = pytest.importorskip("torch")

    def body():
        p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
        red = dp.reducer([p], group=hcomm.world()).hook_params()
        (p * 2).sum().backward()
        p.grad = torch.zeros(3, dtype=torch.float64)  # after its hook: the reduction is lost
        with pytest.raises(RuntimeError, match="no longer the registered tensor"):
            red.wait()
        return True

    assert run(body, 2) == [True, True]


def test_reducer_set_to_none_matches_serial():
    """optimizer.zero_grad(set_to_none=True) between steps: each step's gradient, made anew
    by backward, is reduced (avg of the ranks' gradients) over 3 steps."""
    torch = pytest.importorskip("torch")

    def body():
        r = hcomm.get_rank()
        p = torch.nn.Parameter(torch.arange(4, dtype=torch.float64))
        opt = torch.optim.SGD([p], lr=0.5)
        red = dp.reducer([p], group=hcomm.world()).hook_params()
        for step in range(3):
            opt.zero_grad(set_to_none=True)
            (p * p * (r + 1 + step)).sum().backward()
            red.wait()
            opt.step()
        return p.detach()

    n = 3
    p = torch.arange(4, dtype=torch.float64)
    for step in range(3):  # grad of sum(p^2 c_r) = 2 c_r p, averaged
        p = p - 0.5 * 2 * p * sum(r + 1 + step for r in range(n)) / n
    for got in run(body, n):
        assert torch.equal(got, p), (got, p)


@pytest.mark.parametrize("find_unused", [False, True])
def test_reducer_unused_parameter(find_unused):
    """A parameter unused on rank 1 only: named (index and shape) without
    find_unused_parameters, reduced with zeros from that rank with it; no rank hangs."""
    torch = pytest.importorskip("torch")

    def body():
        r = hcomm.get_rank()
        a = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
        b = torch.nn.Parameter(torch.ones(3, 2, dtype=torch.float64))
        red = dp.reducer([a, b], op="sum", group=hcomm.world(),
                         find_unused_parameters=find_unused).hook_params()
        loss = (a * 2).sum() + ((b * 3).sum() if r == 0 else 0)
        loss.backward()
        try:
            red.wait()
        except hcomm.StateError as e:
            return str(e), a.grad.clone(), b.grad.clone()
        return None, a.grad.clone(), b.grad.clone()

    (e0, a0, b0), (e1, a1, b1) = run(body, 2)
    assert e0 is None
    if find_unused:
        assert e1 is None
    else:
        assert "parameter 1 (shape [3, 2])" in e1 and "find_unused_parameters" in e1, e1
    for a, b in ((a0, b0), (a1, b1)):
        assert torch.equal(a, torch.full((2,), 4.0, dtype=torch.float64))
        assert torch.equal(b, torch.full((3, 2), 3.0, dtype=torch.float64))


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("find_unused", [False, True])
def test_all_reduce_params_unused_on_one_rank(find_unused, async_op):
    """dp.all_reduce(model.parameters()) with a parameter unused on rank 1: no
    'count=3 on rank 0 but count=8 on rank 1'; zeros stand in, and the parameter is named."""
    torch = pytest.importorskip("torch")

    def body():
        r = hcomm.get_rank()
        a = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
        b = torch.nn.Parameter(torch.ones(2, 4, dtype=torch.float64))
        ((a * 2).sum() + ((b * 4).sum() if r == 0 else 0)).backward()
        try:
            res = dp.all_reduce([a, b], op="sum", group=hcomm.world(),
                                find_unused_parameters=find_unused, async_op=async_op)
            if async_op:
                res.wait()
            err = None
        except hcomm.StateError as e:
            err = str(e)
        return err, a.grad, b.grad

    (e0, a0, b0), (e1, a1, b1) = run(body, 2)
    assert e0 is None and torch.equal(a0, torch.full((3,), 4.0, dtype=torch.float64))
    assert torch.equal(b0, torch.full((2, 4), 4.0, dtype=torch.float64))
    if find_unused:
        assert e1 is None and torch.equal(b1, b0)
    else:
        assert "parameter 1 (shape [2, 4]) has no gradient on rank 1" in e1, e1
        assert b1 is None
