#!/usr/bin/env bash
# test_a2a with HCOMM_CHECK=off: no agreement runs before a forced all_to_allv algorithm, so
# a count mismatch is found only by the counts that travel with the data (a2a.c): it must
# still fail on both ranks of the pair, naming both values and ranks, leave that block
# unwritten, and never hang. Local backend (1..9 ranks), and mpirun np 2 and 3 when built with MPI.
# Usage: test_a2a_nocheck.sh BUILD_DIR
set -u
BUILD=${1:?usage: test_a2a_nocheck.sh BUILD_DIR}
export HCOMM_CHECK=off HCOMM_TIMEOUT=${HCOMM_TIMEOUT:-60}
bad=0
HCOMM_BACKEND=local timeout 300 "$BUILD/test/test_a2a" || bad=$((bad + 1))
HCOMM_BACKEND=local HCOMM_EAGER_LIMIT=0 timeout 300 "$BUILD/test/test_a2a" || bad=$((bad + 1))
if [ "${HCOMM_WITH_MPI:-OFF}" = "ON" ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # Open MPI's init allocations read as leaks under LeakSanitizer, as in the other mpirun tests
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    for np in 2 3; do # 2: the one-message pair path (a2a_pair), which also runs unchecked
        HCOMM_BACKEND=mpi timeout 300 "${MPIEXEC:-mpirun}" --oversubscribe -np $np \
            "$BUILD/test/test_a2a" || bad=$((bad + 1))
    done
fi
echo "test_a2a_nocheck: $bad runs failed"
[ "$bad" -eq 0 ]
