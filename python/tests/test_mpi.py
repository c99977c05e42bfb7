"""The package under mpirun -np 2: each process is a rank (backend mpi)."""
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
    run_brief([sys.executable, "-m", "hcomm.run", "-n", "8", BRIEF])


@pytest.mark.skipif("mpi" not in hcomm.BACKENDS, reason="this build has no mpi backend")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
def test_brief_snippets_mpirun():
    pytest.importorskip("torch")
    run_brief(["mpirun", "--oversubscribe", "-np", "8", sys.executable, "-m", "hcomm.run", BRIEF])
