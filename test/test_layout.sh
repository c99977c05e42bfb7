#!/usr/bin/env bash
# The layout rules of src/ (scripts/check_layout.py): files of at most 1,000 lines, functions of
# at most 60, no comment with more than one measured figure (their history is docs/tuning.md's).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
exec "$PY" "$here/scripts/check_layout.py" "$here/src"
