#!/usr/bin/env bash
# examples/python/train.py trains the 1-rank model in any layout: its per-step losses over 50
# steps equal the 1-rank run's within 1e-9 relative in f64 (1e-5 in f32) on the local backend
# and under mpirun -np 4 (python/tests/test_train.py; apart from python_tests, which skips that
# file, so that ctest -j overlaps the two and each stays within its timeout). Uses Debian's
# /usr/bin/python3 (or $HCOMM_PYTHON); skipped (77), saying why, without numpy, torch or pytest
# and in a sanitizer build.
# Usage: test_py_train.sh BUILD_DIR
set -u
BUILD="${1:?usage: test_py_train.sh BUILD_DIR}"
PY="${HCOMM_PYTHON:-/usr/bin/python3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
if [ -n "${HCOMM_SANITIZE:-}" ]; then # as python_tests (test/CMakeLists.txt)
    echo "test_py_train skipped: a sanitizer build's libhcomm cannot be loaded into Python"
    exit 77
fi
if ! "$PY" -c 'import numpy, torch, pytest' 2>/dev/null; then
    echo "test_py_train skipped: numpy, torch or pytest missing for $PY (run scripts/deps.sh)"
    exit 77
fi
export HCOMM_LIBRARY="$BUILD/libhcomm-c.so"
exec timeout 840 "$PY" -m pytest -q -p no:cacheprovider "$HERE/../python/tests/test_train.py"
