#!/usr/bin/env bash
# Installs what hcomm needs, builds it and runs the main job, hcomm-train, with its defaults
# (extra arguments are passed on, e.g. scripts/train.sh --steps 50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$(nproc)" --target hcomm-train
exec ./build/hcomm-train "$@"
