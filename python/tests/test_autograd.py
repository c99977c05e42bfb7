"""Autograd on the plain calls (tp.all_reduce = reduce-from, all_gather = gather-from,
reduce_scatter its transpose, split = scatter-to), async handles with autograd, refused
in-place outputs, ctx.tp.all_reduce agreeing with tp.all_reduce, and a column/row-parallel MLP
with TP x DP matching a single-process model under hcomm.run (processes and threads)."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import hcomm  # noqa: E402
from conftest import run  # noqa: E402
from hcomm import tp  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
F64 = torch.float64


def per_rank(r, shape):
    return torch.arange(float(torch.Size(shape).numel()), dtype=F64).reshape(shape) + 10 * r


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_grads(n, async_op):
    """Each call's backward against the role's rule, with a weighted loss per rank."""
    def body():
        r = hcomm.get_rank()
        w = hcomm.world()
        out = {}
        for name, fn, shape in (
                ("all_reduce", lambda x: tp.all_reduce(x, group=w, async_op=async_op), (2, 3)),
                ("avg", lambda x: tp.all_reduce(x, op="avg", group=w, async_op=async_op), (2, 3)),
                ("all_gather", lambda x: tp.all_gather(x, dim=1, group=w, async_op=async_op),
                 (2, 3)),
                ("reduce_scatter", lambda x: tp.reduce_scatter(x, dim=0, group=w,
                                                               async_op=async_op), (2 * n, 3)),
                ("split", lambda x: tp.split(x, dim=0, group=w), (2 * n, 3))):
            x = per_rank(r, shape).requires_grad_()
            y = fn(x)
            if hasattr(y, "wait"):
                y = y.wait()
            assert y.grad_fn is not None, name
            up = per_rank(0, y.shape) + 100  # the same upstream gradient on every rank
            (y * up).sum().backward()
            out[name] = (x.grad, up)
        return out

    for r, res in enumerate(run(body, n)):
        g, up = res["all_reduce"]
        assert torch.equal(g, up)  # identity
        g, up = res["avg"]
        assert torch.allclose(g, up / n, rtol=1e-15)
        g, up = res["all_gather"]
        assert torch.equal(g, up.chunk(n, 1)[r])  # this rank's slice
        g, up = res["reduce_scatter"]
        assert torch.equal(g, torch.cat([up] * n, 0))  # all_gather of the (equal) grads
        g, up = res["split"]
        assert torch.equal(g, torch.cat([up] * n, 0))


def test_refusals_and_agreement():
    def body():
        w = hcomm.world()
        x = torch.ones(3, dtype=F64, requires_grad=True)
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            tp.all_reduce(torch.ones(3, dtype=F64), group=w, out=x)
        with pytest.raises(RuntimeError, match="out= is not allowed"):
            tp.all_reduce(x, group=w, out=torch.empty(3, dtype=F64))
        with pytest.raises(ValueError, match="op='max' has no gradient"):
            tp.all_reduce(x, op="max", group=w)
        with torch.no_grad():  # nothing recorded: no refusal
            assert tp.all_reduce(x, op="max", group=w).grad_fn is None
        v = torch.full((2,), float(hcomm.get_rank() + 1))
        assert torch.equal(w.all_reduce(v.clone()), tp.all_reduce(v, group=w))  # both sum
        return True

    assert run(body, 2) == [True, True]


def _mlp(cmd):
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HCOMM_TIMEOUT="60")
    p = subprocess.run(cmd + [str(HERE / "mlp_script.py")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("mlp worst") == 4, p.stdout + p.stderr


def test_mlp_parity_threads():
    _mlp([sys.executable, "-m", "hcomm.run", "--threads", "-n", "4"])


@pytest.mark.skipif("mpi" not in hcomm.BACKENDS, reason="this build has no mpi backend")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
def test_mlp_parity_processes():
    _mlp([sys.executable, "-m", "hcomm.run", "-n", "4"])


def test_pp_gradients_through_user_calls():
    """Two stages: the activation goes forward with pp.send, its gradient comes back with the
    user's pp.send(PP_TAG_BACKWARD) and out.backward(grad); the weights' gradients equal the
    one-process model's."""
    from hcomm import pp
    from hcomm.pp import PP_TAG_BACKWARD, PP_TAG_FORWARD

    x = torch.arange(6, dtype=F64).reshape(2, 3) / 7
    w0_init, w1_init = torch.full((3, 3), 0.5, dtype=F64), torch.arange(3.0, dtype=F64)

    def body():
        ctx = hcomm.init_context(pp_size=2)
        if ctx.pp.rank == 0:
            w0 = w0_init.clone().requires_grad_()
            out = torch.tanh(x @ w0)
            pp.send(out, dst=1, tag=PP_TAG_FORWARD)          # requires grad: its bytes go
            out.backward(pp.recv(src=1, tag=PP_TAG_BACKWARD))
            return w0.grad
        act = pp.recv(src=0, tag=PP_TAG_FORWARD).requires_grad_()
        w1 = w1_init.clone().requires_grad_()
        ((act * w1).sum() ** 2).backward()
        pp.send(act.grad, dst=0, tag=PP_TAG_BACKWARD)
        return w1.grad

    g0, g1 = run(body, 2)
    w0, w1 = w0_init.clone().requires_grad_(), w1_init.clone().requires_grad_()
    ((torch.tanh(x @ w0) * w1).sum() ** 2).backward()
    assert torch.allclose(g0, w0.grad, rtol=1e-15) and torch.allclose(g1, w1.grad, rtol=1e-15)
