"""Shared setup: the package from this source tree, a short hcomm timeout so a broken test
fails instead of hanging, and `run(fn, n)` = hcomm.launch."""
import os
import pathlib
import sys

import pytest

pytest.importorskip("numpy", reason="numpy missing: scripts/deps.sh installs python3-numpy")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("HCOMM_TIMEOUT", "30")

import hcomm  # noqa: E402


def run(fn, n, *args):
    return hcomm.launch(fn, nranks=n, args=args, backend="local")
