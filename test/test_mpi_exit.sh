#!/usr/bin/env bash
# A job in which hcomm handled a timeout must end cleanly under mpirun: rank 0 skips one
# all_reduce of three (HCOMM_TIMEOUT=2), every process's hcomm_launch returns the failure, the
# program exits 3 on every rank, and mpirun neither crashes nor hangs. Repeated REPS times. Then
# after_timeout: a communicator whose Open MPI collective timed out returns that error later.
# Usage: test_mpi_exit.sh BUILD_DIR   (CTest sets MPIEXEC and HCOMM_WITH_MPI)
set -u
BUILD=${1:?usage: test_mpi_exit.sh BUILD_DIR}
REPS=${REPS:-20}
if [ "${HCOMM_WITH_MPI:-OFF}" != "ON" ]; then
    echo "skipped: built without MPI"
    exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HCOMM_TIMEOUT=2
unset HCOMM_BACKEND
bad=0
for i in $(seq 1 "$REPS"); do
    start=$(date +%s%N)
    out=$(timeout -k 5 40 "$MPIEXEC" --oversubscribe -np 3 "$BUILD/test/skip_call" 2>&1)
    rc=$?
    took_ms=$((($(date +%s%N) - start) / 1000000))
    lines=$(printf '%s\n' "$out" | grep -c 'launch returned HCOMM_ERR_TIMEOUT\|launch returned HCOMM_ERR_ABORTED')
    if [ "$rc" -eq 124 ] || [ "$rc" -ge 128 ] || [ "$rc" -eq 0 ] || [ "$lines" -ne 3 ]; then
        echo "FAIL rep $i: mpirun exit $rc after ${took_ms} ms, $lines of 3 ranks reported the failure"
        printf '%s\n' "$out" | tail -20
        bad=$((bad + 1))
    elif [ "$took_ms" -gt 14000 ]; then
        echo "FAIL rep $i: took ${took_ms} ms (timeout 2 s: the job should end within ~12 s)"
        bad=$((bad + 1))
    fi
done
# After an Open MPI collective timed out (rank 0 skips a native broadcast), the peers' next call
# returns the communicator's error, and no process dies of a signal.
for i in 1 2; do
    out=$(HCOMM_CHECK=off timeout -k 5 30 "$MPIEXEC" --oversubscribe -np 3 "$BUILD/test/after_timeout" 2>&1)
    rc=$?
    peers=$(printf '%s\n' "$out" | grep -c 'rank [12] broadcast HCOMM_ERR_[A-Z]* all_reduce HCOMM_ERR_[A-Z]* (hcomm_all_reduce: communicator unusable')
    # (After the MPI_Abort that ends such a job, mpirun itself sometimes crashes in its teardown,
    # in PMIx_server_finalize, or hangs there: Open MPI 4.1's. So mpirun's own end does not
    # count; the peers' answers and a backtrace through this program or hcomm do.)
    if [ "$peers" -ne 2 ] ||
        printf '%s\n' "$out" | grep -q '\] \[ *[0-9]*\] .*\(after_timeout\|hcomm\)'; then
        echo "FAIL after_timeout run $i: mpirun exit $rc, $peers of 2 peers returned the communicator's error"
        printf '%s\n' "$out" | tail -20
        bad=$((bad + 1))
    fi
done
echo "$((REPS + 2 - bad)) passed, $bad failed"
[ "$bad" -eq 0 ]
