"""Lifecycles that cannot crash: calls on destroyed contexts, groups, handles and worlds raise
hcomm.StateError naming the object; a failed init leaves nothing behind; init again after
destroy; the brief's init_tensor_parallel_group on every rank."""
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import hcomm
from conftest import run
from hcomm import dp, moe, pp, tp

HERE = pathlib.Path(__file__).resolve().parent


def _env():
    return dict(os.environ, PYTHONPATH=str(HERE.parent), OMPI_ALLOW_RUN_AS_ROOT="1",
                OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HCOMM_TIMEOUT="60")


def test_destroyed_group_threads():
    p = subprocess.run([sys.executable, "-m", "hcomm.run", "--threads", "-n", "2",
                        str(HERE / "lifecycle_script.py")], env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("lifecycle ok 15") == 2, p.stdout + p.stderr


@pytest.mark.skipif("mpi" not in hcomm.BACKENDS, reason="this build has no mpi backend")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
def test_destroyed_group_processes():
    """The issue's SIGSEGV (rc 139), now a StateError, one process per rank."""
    p = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", sys.executable, "-m",
                        "hcomm.run", str(HERE / "lifecycle_script.py")], env=_env(),
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("lifecycle ok 15") == 2, p.stdout + p.stderr


def test_destroyed_handles():
    def body():
        ctx = hcomm.init_context(tp_size=1)
        w = ctx.dp
        x = np.arange(4, dtype=np.float64).reshape(2, 2)
        _, routing = moe.all_to_all(x, np.zeros(2, np.int32), num_experts=w.size, group=w)
        red = dp.reducer([np.zeros(3)], group=w)
        work = tp.all_reduce(x, group=w, async_op=True)
        peer = 1 - w.rank
        req = pp.isend(x, dst=peer, group=w)
        got = pp.recv(src=peer, shape=(2, 2), dtype=np.float64, group=w)
        ctx.destroy()  # completes work and req, frees routing and red
        out = [bool((work.wait() == x * w.size).all()), work.is_completed(), bool((got == x).all())]
        for fn in (lambda: moe.all_to_all(x, routing), lambda: red.mark_ready(0), red.wait,
                   req.wait):
            with pytest.raises(hcomm.StateError, match="was destroyed"):
                fn()
        return out

    assert run(body, 2) == [[True, True, True]] * 2


def test_world_after_launch():
    box = []
    run(lambda: box.append(hcomm.world()), 2)
    with pytest.raises(hcomm.StateError, match="group 'world' was destroyed.*hcomm.launch"):
        tp.all_reduce(np.ones(2), group=box[0])


def test_failed_init_leaves_nothing():
    def body():
        with pytest.raises(hcomm.HcommError):
            hcomm.init_context(tp_size=3)  # 4 ranks: not divisible
        assert hcomm.context.current() is None
        ctx = hcomm.init_context(tp_size=2)  # nothing was left to refuse this
        with pytest.raises(hcomm.StateError, match="already holds a context.*destroy"):
            hcomm.init_context(tp_size=1)
        assert hcomm.context.current() is ctx
        ctx.destroy()
        return hcomm.init_context(tp_size=4).tp.size

    assert run(body, 4) == [4] * 4


@pytest.mark.parametrize("literal", [True, False])
def test_init_tensor_parallel_group_as_written(literal):
    """The brief writes tp_rank=0 on every rank; the README tp_rank=get_rank() % 4."""
    def body():
        r = 0 if literal else hcomm.get_rank() % 4
        g = hcomm.init_tensor_parallel_group(tp_rank=r, tp_size=4)
        y = tp.all_reduce(np.ones(1), group=g)
        return g.rank, g.size, float(y[0])

    assert run(body, 8) == [(r % 4, 4, 4.0) for r in range(8)]
