#!/usr/bin/env bash
# Installs what hcomm needs, builds it and runs the main job, hcomm-train, with its defaults.
# Extra arguments go to hcomm-train; relative paths in them are taken from where you run this,
# e.g. bash scripts/train.sh --steps 100 --metrics loss.csv
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/deps.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$root/build" -j "$(nproc)" --target hcomm-train
exec "$root/build/hcomm-train" "$@"
