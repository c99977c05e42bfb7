#!/usr/bin/env bash
# Installs what hcomm needs, builds it and runs the whole test suite (local and mpi backends).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DHCOMM_REQUIRE_MPI=ON
cmake --build build -j "$(nproc)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir build --output-on-failure -j 2
