"""Installs that import with no environment variable, from any directory:
- `python3 -m venv --system-site-packages v && v/bin/pip install --no-build-isolation ./python`
  offline (setuptools only): libhcomm-c.so is bundled into the package, found either through
  HCOMM_LIBRARY at build time or in the source tree's build/ next to python/;
- `cmake --install build` with the default prefix (/usr/local), then Debian's /usr/bin/python3,
  run in a private mount namespace with a fresh /usr/local (root and unshare needed) so the
  machine's own /usr/local is never touched.
Each installed package then runs a 2-rank all_reduce from outside the source tree."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import hcomm

SRC = pathlib.Path(__file__).resolve().parents[1]
LIB = pathlib.Path(hcomm._lib.lib._name).resolve()  # the library under test
CODE = ("import hcomm, numpy as np; print(hcomm.__file__, hcomm._lib.lib._name);"
        "print(hcomm.launch(lambda: float(hcomm.tp.all_reduce(np.ones(1))[0]), nranks=2))")


def have(module):
    return subprocess.run([sys.executable, "-c", f"import {module}"],
                          capture_output=True).returncode == 0


def clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HCOMM_LIBRARY")}


def pip_install(tmp_path, src, build_env):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    env = dict(build_env, PIP_NO_INDEX="1")  # offline: nothing may come from an index
    p = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                        "--disable-pip-version-check", str(src)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = subprocess.run([py, "-c", CODE], env=clean_env(), cwd=elsewhere, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    where, lib = p.stdout.split("\n")[0].split()
    assert "site-packages" in where and lib == str(pathlib.Path(where).parent /
                                                  "libhcomm-c.so"), p.stdout  # bundled
    assert p.stdout.split("\n")[1] == "[2.0, 2.0]", p.stdout


PIP = pytest.mark.skipif(not (have("pip") and have("venv") and have("setuptools")),
                         reason="pip, venv or setuptools missing (Debian: python3-pip, "
                                "python3-venv)")


@PIP
def test_pip_bundles_hcomm_library(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("tests", "__pycache__", "build",
                                                            "*.egg-info", "*.so"))
    pip_install(tmp_path, src, dict(clean_env(), HCOMM_LIBRARY=str(LIB)))


@PIP
def test_pip_bundles_source_tree_build(tmp_path):
    """As from a checkout: ./python next to build/, no variable at all."""
    tree = tmp_path / "tree"
    shutil.copytree(SRC, tree / "python", ignore=shutil.ignore_patterns(
        "tests", "__pycache__", "build", "*.egg-info", "*.so"))
    (tree / "build").mkdir()
    shutil.copyfile(LIB, tree / "build" / "libhcomm-c.so")
    pip_install(tmp_path, tree / "python", clean_env())


def _can_unshare():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m (a private /usr/local)")
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found")
def test_cmake_install_default_prefix(tmp_path):
    build = LIB.parent
    if not (build / "CMakeCache.txt").is_file():
        pytest.skip(f"{LIB} is not in a CMake build directory")
    script = (f"mount -t tmpfs none /usr/local && cmake --install {build} > /dev/null && "
              f"cd {tmp_path} && /usr/bin/python3 -c '{CODE}'")
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], env=clean_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    where, lib = p.stdout.split("\n")[0].split()
    assert where.startswith("/usr/local/lib/python3") and lib == "/usr/local/lib/libhcomm-c.so"
    assert p.stdout.split("\n")[1] == "[2.0, 2.0]", p.stdout
