#!/usr/bin/env bash
# hcomm_launch without a backend and without HCOMM_BACKEND picks mpi when mpirun started the
# process (so `mpirun -np 8 ./app` is one world of 8, not 8 worlds), says so at
# HCOMM_LOG_LEVEL=info, refuses local inside a multi-process MPI job unless HCOMM_BACKEND=local,
# and refuses torchrun's variables with a message. Checked on the quickstart example,
# hcomm-bench and hcomm-train.
# Usage: test_launch_detect.sh BUILD_DIR   (CTest sets MPIEXEC and HCOMM_WITH_MPI=ON/OFF)
set -u
BUILD=${1:?usage: test_launch_detect.sh BUILD_DIR}
QS="$BUILD/test/quickstart"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hcomm-launch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset HCOMM_BACKEND RANK WORLD_SIZE LOCAL_RANK
failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
# check NAME WANT_RC PATTERN COUNT CMD...: exit status WANT_RC (0, or 1 for "fails") and
# exactly COUNT output lines matching PATTERN.
check() {
    local name=$1 want=$2 pattern=$3 count=$4
    shift 4
    timeout 120 "$@" >"$WORK/$name.log" 2>&1
    local rc=$? n
    n=$(grep -Ec -- "$pattern" "$WORK/$name.log")
    if [ "$rc" -ge 124 ] || { [ "$want" -eq 0 ] && [ "$rc" -ne 0 ]; } ||
        { [ "$want" -ne 0 ] && [ "$rc" -eq 0 ]; } || [ "$n" -ne "$count" ]; then
        fail "$name: exit $rc (want $( [ "$want" -eq 0 ] && echo 0 || echo non-zero)), '$pattern' $n times (want $count):"
        sed 's/^/    /' "$WORK/$name.log" >&2
    else
        echo "ok   $name (exit $rc): $(grep -Em1 -- "$pattern" "$WORK/$name.log")"
    fi
}

[ -x "$QS" ] || { echo "FAIL: $QS not built" >&2; exit 1; }
# Without a launcher: local, 8 threads.
check qs-local 0 "rank 0 gathered row 1: 10 11 12 13 14 15" 1 "$QS"
HCOMM_LOG_LEVEL=info check qs-local-log 0 "\[launch\] info: backend local: no MPI launcher" 1 "$QS"
# torchrun's variables: a clear error, no run.
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 check qs-torchrun 1 "started by torchrun .*Launch with mpirun -np 2" 1 "$QS"
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 check train-torchrun 1 "started by torchrun" 1 "$BUILD/hcomm-train" --steps 1
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 check bench-torchrun 1 "started by torchrun" 1 "$BUILD/hcomm-bench" -b 1K -e 1K
# An unknown backend from the environment is named as the variable.
HCOMM_BACKEND=nccl check qs-backend-env 1 'HCOMM_BACKEND="nccl" is unknown' 1 "$QS"
# ... unless the user names the local backend.
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 HCOMM_BACKEND=local check qs-torchrun-local 0 "gathered" 1 "$QS"

if [ "${HCOMM_WITH_MPI:-OFF}" = "ON" ]; then
    MPIRUN=${MPIEXEC:-mpirun}
    # One world of 8 processes: exactly one "rank 0 gathered" line, and each process says mpi.
    check qs-mpirun 0 "rank 0 gathered row 1: 10 11 12 13 14 15" 1 "$MPIRUN" --oversubscribe -np 8 "$QS"
    check qs-mpirun-log 0 "\[launch\] info: backend mpi: started by an MPI launcher \(OMPI_COMM_WORLD_SIZE=8\)" 8 \
        "$MPIRUN" --oversubscribe -np 8 env HCOMM_LOG_LEVEL=info "$QS"
    # Explicitly local inside mpirun: allowed with HCOMM_BACKEND=local (8 separate worlds).
    check qs-mpirun-local 0 "rank 0 gathered" 8 "$MPIRUN" --oversubscribe -np 8 env HCOMM_BACKEND=local "$QS"
    # mpirun -np 1: a 1-process job keeps the local default (8 threads).
    check qs-mpirun-np1 0 "rank 0 gathered" 1 "$MPIRUN" -np 1 "$QS"
    check bench-mpirun 0 "^# all_reduce, 3 ranks on mpi$" 1 \
        "$MPIRUN" --oversubscribe -np 3 "$BUILD/hcomm-bench" --op all_reduce -b 1K -e 4K
    check bench-mpirun-local 1 "local backend inside an MPI job of 2 processes" 2 \
        "$MPIRUN" -np 2 "$BUILD/hcomm-bench" --backend local -b 1K -e 1K
    check train-mpirun 0 "^hcomm-train: 2 ranks \(tp 1 x pp 1 x dp 2; ep 2, 4 experts\) on mpi$" 1 \
        "$MPIRUN" -np 2 "$BUILD/hcomm-train" --tp 1 --pp 1 --dp 2 --steps 3 --sample 0
else
    echo "skip the mpirun checks (HCOMM_WITH_MPI=${HCOMM_WITH_MPI:-OFF})"
fi

if [ "$failures" -ne 0 ]; then
    echo "test_launch_detect: $failures failure(s)" >&2
    exit 1
fi
echo "test_launch_detect: all checks passed"
