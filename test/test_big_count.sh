#!/usr/bin/env bash
# A count above INT_MAX (a u8 all_reduce of 2^31+5 elements, in place, 2 ranks) on the local
# backend and under mpirun -np 2 (progs/big_count.c). Needs 2 x 2 GiB of buffers: skipped where
# MemAvailable is under 12 GiB, and in sanitizer builds (their shadow memory doubles that).
# Usage: test_big_count.sh BUILD_DIR
set -euo pipefail
prog=$1/test/big_count
avail_kib=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo)
if [ "${avail_kib:-0}" -lt $((12 * 1024 * 1024)) ]; then
    echo "skipped: MemAvailable is $((avail_kib / 1024)) MiB, under 12 GiB"
    exit 77
fi
if [ -n "${HCOMM_SANITIZE:-}" ]; then
    echo "skipped: a sanitizer build (HCOMM_SANITIZE=$HCOMM_SANITIZE)"
    exit 77
fi
HCOMM_BACKEND=local timeout 600 "$prog"
if [ "${HCOMM_WITH_MPI:-OFF}" = ON ]; then
    HCOMM_BACKEND=mpi timeout 600 "${MPIEXEC:-mpirun}" --oversubscribe -np 2 "$prog"
fi
echo "test_big_count: passed"
