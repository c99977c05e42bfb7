"""The package under mpirun -np 2..4 (each process a rank, backend mpi) and the same scripts on
the local backend."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import hcomm

HERE = pathlib.Path(__file__).resolve().parent


@pytest.mark.skipif("mpi" not in hcomm.BACKENDS, reason="this build has no mpi backend")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
def test_mpirun_np2():
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HCOMM_TIMEOUT="60")
    cmd = ["mpirun", "--oversubscribe", "-np", "2", sys.executable, "-m", "hcomm.run",
           str(HERE / "mpi_script.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 0: mpi ok" in p.stdout and "rank 1: mpi ok" in p.stdout, p.stdout


@pytest.mark.skipif("mpi" not in hcomm.BACKENDS, reason="this build has no mpi backend")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_call_mpirun(n):
    """mpi_calls.py: every call against numpy references, one process per rank."""
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HCOMM_TIMEOUT="60")
    cmd = ["mpirun", "--oversubscribe", "-np", str(n), sys.executable, "-m", "hcomm.run",
           str(HERE / "mpi_calls.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(n):
        assert f"rank {r}: 9 checks ok on mpi" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("n", [1, 5, 8])
def test_every_call_local(n):
    """The same script on the local backend (threads), at sizes mpirun does not run here."""
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), HCOMM_TIMEOUT="60")
    cmd = [sys.executable, "-m", "hcomm.run", "--threads", "-n", str(n),
           str(HERE / "mpi_calls.py")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(n):
        assert f"rank {r}: 9 checks ok on local" in p.stdout, p.stdout + p.stderr


def run_brief(cmd):
    env = dict(os.environ, PYTHONPATH=str(HERE.parent), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HCOMM_TIMEOUT="60")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("brief ok") == 8, p.stdout


BRIEF = str(HERE.parents[1] / "examples" / "python" / "brief.py")


def test_brief_snippets_local():
    """The README's snippets, through python3 -m hcomm.run -n 8."""
    pytest.importorskip("torch")
    run_brief([sys.executable, "-m", "hcomm.run", "--threads", "-n", "8", BRIEF])


@pytest.mark.skipif("mpi" not in hcomm.BACKENDS, reason="this build has no mpi backend")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
def test_brief_snippets_mpirun():
    pytest.importorskip("torch")
    run_brief(["mpirun", "--oversubscribe", "-np", "8", sys.executable, "-m", "hcomm.run", BRIEF])
