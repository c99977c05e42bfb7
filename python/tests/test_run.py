"""python3 -m hcomm.run: processes through mpirun by default (this interpreter, one process
per rank, backend mpi), --threads for ranks as threads, and a message naming --threads where
mpirun is missing."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import hcomm
from hcomm import run as hrun

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = ("import os, sys, hcomm\n"
          "w = hcomm.world()\n"
          "line = f'rank {w.rank} of {w.size} {w.backend} {os.getpid()} {sys.executable} "
          "{sys.argv[1:]}\\n'\n"
          "os.write(1, line.encode())  # one write: the ranks share the pipe\n")


def _run(tmp_path, args, env=None):
    script = tmp_path / "who.py"
    script.write_text(SCRIPT)
    env = dict(os.environ if env is None else env, PYTHONPATH=str(HERE.parent))
    return subprocess.run([sys.executable, "-m", "hcomm.run"] + args + [str(script), "--x", "1"],
                          env=env, capture_output=True, text=True, timeout=180)


def test_mpirun_command():
    cmd = hrun.mpirun_command(3, "s.py", ["a"], "/usr/bin/mpirun")
    assert cmd[:2] == ["/usr/bin/mpirun", "--oversubscribe"]
    assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)
    assert cmd[-7:] == ["-np", "3", sys.executable, "-m", "hcomm.run", "s.py", "a"]


@pytest.mark.skipif("mpi" not in hcomm.BACKENDS, reason="this build has no mpi backend")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found")
def test_processes_by_default(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW")}
    p = _run(tmp_path, ["-n", "3"], env)  # as root too: --allow-run-as-root is passed
    assert p.returncode == 0, p.stdout + p.stderr
    lines = sorted(ln.split() for ln in p.stdout.splitlines() if ln.startswith("rank"))
    assert [ln[1] for ln in lines] == ["0", "1", "2"], p.stdout
    assert all(ln[3:5] == ["3", "mpi"] for ln in lines), p.stdout
    assert len({ln[5] for ln in lines}) == 3  # three processes
    assert all(ln[6] == sys.executable and ln[7:] == ["['--x',", "'1']"] for ln in lines)


def test_threads(tmp_path):
    p = _run(tmp_path, ["--threads", "-n", "2"])
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("rank")]
    assert sorted(ln[1] for ln in lines) == ["0", "1"]
    assert all(ln[4] == "local" for ln in lines) and len({ln[5] for ln in lines}) == 1


def test_without_mpirun_names_threads(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # no mpirun on PATH
    p = _run(tmp_path, ["-n", "2"], env)
    assert p.returncode == 2 and "--threads" in p.stderr, p.stdout + p.stderr
    assert "rank" not in p.stdout
