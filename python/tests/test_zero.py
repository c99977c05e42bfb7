"""hcomm.zero.shard (FSDP2-style over the C shard plan): a torch MLP trained on 1, 2 and 3
ranks, ZeRO-1 and ZeRO-3, two micro-batches per step (the first under no_sync), gives the
single-process losses and weights within 1e-12 relative over 50 steps, also as processes under
mpirun; and its errors."""
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import hcomm
from conftest import run

torch = pytest.importorskip("torch")
from hcomm import zero  # noqa: E402

STEPS, BATCH, LR, MOM = 50, 12, 0.05, 0.9
HERE = pathlib.Path(__file__).resolve().parent


def _build():
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3)).double()


torch.manual_seed(0)  # once, here: rank threads share torch's global generator
INIT = {k: v.clone() for k, v in _build().state_dict().items()}


def make():
    model = _build()
    model.load_state_dict(INIT)
    return model


def data():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(STEPS, BATCH, 5, generator=g, dtype=torch.float64),
            torch.randn(STEPS, BATCH, 3, generator=g, dtype=torch.float64))


def loss_of(model, x, y):
    return ((model(x) - y) ** 2).sum() / BATCH


def reference():
    model, (xs, ys) = make(), data()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = loss_of(model, xs[s], ys[s])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("stage", [1, 3])
def test_shard_trains_like_one_process(n, stage):
    want, want_w = reference()

    def body():
        r, per = hcomm.get_rank(), BATCH // n
        model, (xs, ys) = make(), data()
        z = zero.shard(model, stage=stage, bucket_bytes=256)
        opt = torch.optim.SGD(z.parameters(), lr=LR, momentum=MOM)
        losses = []
        for s in range(STEPS):
            z.zero_grad()
            x, y = xs[s][r * per:(r + 1) * per], ys[s][r * per:(r + 1) * per]
            half = per // 2
            with z.no_sync():  # first micro-batch: gradients stay local
                a = loss_of(model, x[:half], y[:half])
                a.backward()
            b = loss_of(model, x[half:], y[half:])
            b.backward()
            opt.step()
            losses.append(a.item() + b.item())
        model(xs[0])  # gathers the final weights
        weights = [p.detach().clone() for p in model.parameters()]
        z.close()
        return losses, weights

    out = run(body, n)
    got = np.sum([o[0] for o in out], axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    for w, ref in zip(out[0][1], want_w):
        np.testing.assert_allclose(w.numpy(), ref.numpy(), rtol=1e-12, atol=1e-15)


def test_shard_rejects_bad_input():
    def body():
        model = make()
        with pytest.raises(ValueError, match="op must be"):
            zero.shard(model, op="max")
        with pytest.raises(hcomm.HcommError, match="stage=4"):
            zero.shard(model, stage=4)
        return True

    assert all(run(body, 2))


@pytest.mark.skipif("mpi" not in hcomm.BACKENDS, reason="this build has no mpi backend")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
@pytest.mark.parametrize("n", [2, 3])
def test_shard_mpirun(n):
    """zero_mpi_script.py: one process per rank, ZeRO-3, against each process's own run."""
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HCOMM_TIMEOUT="60")
    cmd = ["mpirun", "--oversubscribe", "-np", str(n), sys.executable, "-m", "hcomm.run",
           str(HERE / "zero_mpi_script.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(n):
        assert f"rank {r}: zero ok" in p.stdout, p.stdout + p.stderr
