#!/usr/bin/env bash
# test_fault under mpirun --enable-recovery: one job per case, since a killed process is gone
# for the rest of its job. A rank is killed (SIGKILL) before, between and during each call kind
# (FAULT_CASE: the op numbers of test_fault.c), inside a shrink, two at once; a slow rank is
# never declared lost; 20 revoke+shrink cycles keep memory flat. mpirun exits 0 whatever its
# processes do under --enable-recovery, so every survivor's own totals line is counted.
# Usage: test_fault_mpi.sh BUILD_DIR   (CTest sets MPIEXEC and HCOMM_WITH_MPI=ON/OFF)
set -u
BUILD=${1:?usage: test_fault_mpi.sh BUILD_DIR}
BIN="$BUILD/test/test_fault"
[ "${HCOMM_WITH_MPI:-OFF}" = ON ] || { echo "skipped: built without MPI"; exit 77; }
[ -x "$BIN" ] || { echo "FAIL: $BIN not found" >&2; exit 1; }
MPIEXEC=${MPIEXEC:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HCOMM_BACKEND=mpi
export HCOMM_TIMEOUT=${HCOMM_TIMEOUT:-60}
# Open MPI's shared-memory transport copies a large message by reading the sender's memory
# (cross-memory attach); a receiver whose sender is killed mid-copy stayed inside Open MPI
# ("Read -1, expected 16384, errno = 3") and never reached the survivors' agree. Copies through
# the shared segment survive the sender (README: in-job recovery).
export OMPI_MCA_btl_vader_single_copy_mechanism=none
LOG=$(mktemp "${TMPDIR:-/tmp}/hcomm-fault.XXXXXX")
trap 'rm -f "$LOG"' EXIT
failures=0 runs=0

# one NP SURVIVORS CASE WHEN VICTIMS: a job whose survivors must each print "0 failed". A job
# that timed out (exit 124) runs once more, its log printed: a victim killed in the middle of
# one of Open MPI's own transfers can leave a survivor inside Open MPI, which hcomm cannot end
# (README: in-job recovery). A second timeout, or any other failure, fails the test.
one() {
    local np=$1 want=$2 try rc ok
    runs=$((runs + 1))
    for try in 1 2; do
        FAULT_CASE=$3 FAULT_WHEN=$4 FAULT_VICTIMS=$5 timeout 120 "$MPIEXEC" --oversubscribe \
            --enable-recovery -np "$np" "$BIN" >"$LOG" 2>&1
        rc=$?
        ok=$(grep -c ' 0 failed$' "$LOG")
        [ "$rc" -ne 0 ] || [ "$ok" -ne "$want" ] || return 0
        [ "$rc" -eq 124 ] && [ "$try" -eq 1 ] || break
        echo "note: np $np case $3 $4 victims $5 timed out ($ok of $want survivors passed); once more" >&2
        grep -v 'PMIX ERROR' "$LOG" | sed 's/^/    /' >&2
    done
    echo "FAIL: np $np case $3 $4 victims $5: exit $rc, $ok of $want survivors passed" >&2
    grep -v 'PMIX ERROR' "$LOG" | sed 's/^/    /' >&2
    failures=$((failures + 1))
}

for op in $(seq 0 13); do
    one 4 3 "$op" before $((1 + op % 3))
    one 4 3 "$op" between $((op % 4))
    one 4 3 "$op" during $((3 - op % 4))
done
one 3 2 0 before 0
one 5 4 1 shrink 2
one 6 4 1 before 1,4
one 6 5 rebuild before 3
one 4 2 rebuild before 1,2
one 3 3 slow before 1
one 4 4 cycles before 1
echo "test_fault_mpi: $runs jobs, $failures failed"
[ "$failures" -eq 0 ]
