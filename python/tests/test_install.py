"""`pip install --no-build-isolation python/` works offline: into a throwaway venv that sees
Debian's packages (numpy, setuptools, pip), from a copy of python/ so the source tree stays
clean; the installed package then runs a 2-rank all_reduce from outside the source tree."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import hcomm

SRC = pathlib.Path(__file__).resolve().parents[1]


def have(module):
    return subprocess.run([sys.executable, "-c", f"import {module}"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not (have("pip") and have("venv") and have("setuptools")),
                    reason="pip, venv or setuptools missing (Debian: python3-pip, python3-venv)")
def test_pip_install_offline(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("tests", "__pycache__", "build",
                                                            "*.egg-info"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_NO_INDEX"] = "1"  # offline: nothing may come from an index
    env["HCOMM_LIBRARY"] = str(pathlib.Path(hcomm._lib.lib._name).resolve())  # the one tested
    p = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                        "--disable-pip-version-check", str(src)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    code = ("import hcomm, numpy as np; assert 'site-packages' in hcomm.__file__, hcomm.__file__;"
            "print(hcomm.launch(lambda: float(hcomm.tp.all_reduce(np.ones(1))[0]), nranks=2))")
    p = subprocess.run([py, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[2.0, 2.0]", p.stdout + p.stderr
