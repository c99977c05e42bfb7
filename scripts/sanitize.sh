#!/usr/bin/env bash
# Builds and runs the suite under AddressSanitizer + UndefinedBehaviorSanitizer (both
# backends), then under ThreadSanitizer (local backend). Open MPI leaks by design at init, so
# leak checking is off for the mpirun tests only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DHCOMM_SANITIZE=address,undefined
cmake --build build-asan -j "$(nproc)"
ASAN_OPTIONS=detect_stack_use_after_return=1 ctest --test-dir build-asan -E '_mpi_' --output-on-failure
ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-asan -R '_mpi_' --output-on-failure
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DHCOMM_SANITIZE=thread -DHCOMM_WITH_MPI=OFF
cmake --build build-tsan -j "$(nproc)"
TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure
