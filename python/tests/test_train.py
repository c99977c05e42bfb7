"""examples/python/train.py: every layout trains the 1-rank model. Per-step losses over 50 steps
equal the 1-rank run's within 1e-9 relative in f64 (1e-5 in f32), on the local backend (the
script's train() through hcomm.launch, in this process) and under mpirun -np 4 (the script as
a user runs it)."""
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import hcomm  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE.parents[1] / "examples" / "python" / "train.py"
STEPS = 50


def example():
    spec = importlib.util.spec_from_file_location("hcomm_train_example", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def local_losses(argv):
    """The losses of the last stage's ranks (the same on each of them)."""
    per_rank = [x for x in example().main(argv + ["--steps", str(STEPS)]) if x]
    assert per_rank and all(x == per_rank[0] for x in per_rank), per_rank
    assert len(per_rank[0]) == STEPS
    return per_rank[0]


def assert_parity(got, ref, rtol):
    worst = max(abs(g - r) / abs(r) for g, r in zip(got, ref))
    assert len(got) == len(ref) and worst <= rtol, (worst, got, ref)


@pytest.fixture(scope="module")
def ref64():
    losses = local_losses(["--ranks", "1"])
    assert losses[-1] < losses[0] - 1.0, losses  # it learns something
    return losses


@pytest.mark.parametrize("layout", [
    "--ranks 8 --tp 2 --pp 2 --dp 2 --ep 2",
    "--ranks 6 --tp 2 --pp 3 --dp-overlap 0",
    "--ranks 3 --dp 3 --experts 3 --ep 3 --batch 6",
])
def test_local_parity_f64(layout, ref64):
    argv = layout.split()
    if "--batch" in argv:  # another batch: its own 1-rank run
        ref = local_losses(["--ranks", "1", "--experts", "3", "--batch", "6"])
    else:
        ref = ref64
    assert_parity(local_losses(argv), ref, 1e-9)


def test_local_parity_f32():
    ref = local_losses(["--ranks", "1", "--dtype", "f32"])
    assert_parity(local_losses("--ranks 8 --tp 2 --pp 2 --dp 2 --ep 2 --dtype f32".split()),
                  ref, 1e-5)


@pytest.mark.skipif("mpi" not in hcomm.BACKENDS, reason="this build has no mpi backend")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
def test_mpirun_parity_f64(ref64):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               HCOMM_TIMEOUT="120", PYTHONPATH=str(HERE.parent))
    cmd = ["mpirun", "--oversubscribe", "-np", "4", sys.executable, str(SCRIPT), "--tp", "2",
           "--pp", "2", "--steps", str(STEPS)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=480)
    assert p.returncode == 0, p.stdout + p.stderr
    got = [float(m) for m in re.findall(r"^step \d+ loss (\S+)$", p.stdout, re.M)]
    assert_parity(got, ref64, 1e-9)
