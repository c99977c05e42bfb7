#!/usr/bin/env bash
# End-to-end check of scripts/hcomm-restart.sh, the relauncher for jobs whose engine cannot
# recover in the job (issue 41 item 5):
# - under mpirun -np 4 (tp 2 x dp 2), rank 1 is SIGKILLed in step 7 (--inject-failure 1:7);
#   the rerun resumes from the checkpoint after step 5 with --dp 1 -np 2, no second injection,
#   exit 0, and its losses of steps 6..11 equal the uninterrupted 1-rank run's in every digit
#   of --metrics (f64, --deterministic 1: test_train_parity.sh's rule);
# - --max-restarts 0 returns the failure; a command without --save is refused;
# - local backend: a failure before the first checkpoint reruns from the start with --dp 1.
# Usage: test_restart.sh BUILD_DIR   (CTest sets MPIEXEC and HCOMM_WITH_MPI=ON/OFF)
set -u
BUILD=${1:?usage: test_restart.sh BUILD_DIR}
TRAIN="$BUILD/hcomm-train"
RESTART="$(cd "$(dirname "$0")/.." && pwd)/scripts/hcomm-restart.sh"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hcomm-restart.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset HCOMM_BACKEND
# A rank stopped for good keeps what it allocated: not a leak to report in a sanitizer build.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
[ -x "$TRAIN" ] || { echo "FAIL: $TRAIN not found (build the hcomm-train target)" >&2; exit 1; }
[ -x "$RESTART" ] || { echo "FAIL: $RESTART not found or not executable" >&2; exit 1; }
# Small and short: 12 steps of a 32-wide model, the same on every run.
COMMON=(--steps 12 --ep 1 --pp 1 --log-every 50 --sample 0 --hidden 32 --seq 16 --deterministic 1)

# restart NAME CMD...: hcomm-restart.sh under a timeout, output in $WORK/NAME.log; sets $rc.
restart() {
    local name=$1
    shift
    timeout 300 "$RESTART" "$@" >"$WORK/$name.log" 2>&1
    rc=$?
}

# has NAME TEXT: the log of NAME contains the fixed string TEXT.
has() { grep -qF -- "$2" "$WORK/$1.log"; }

# show NAME: the log, indented, on stderr (after a failure).
show() { sed 's/^/    /' "$WORK/$1.log" >&2; }

# same_losses NAME CSV FIRST [quiet]: CSV holds exactly the steps FIRST..11, each with the
# reference's step,loss text (the 10 significant digits of --metrics); status 1 where not.
same_losses() {
    local want got
    want=$(cut -d, -f1,2 "$WORK/ref.csv" | awk -F, -v lo="$3" 'NR > 1 && $1 >= lo')
    got=$(cut -d, -f1,2 "$2" | tail -n +2)
    if [ -n "$want" ] && [ "$want" = "$got" ]; then
        echo "ok   $1: steps $3..11 equal the 1-rank run in every digit"
        return 0
    fi
    [ -n "${4:-}" ] && return 1
    fail "$1: step,loss of $2 differ from the 1-rank run's:"
    diff <(echo "$want") <(echo "$got") | sed 's/^/    /' >&2
    return 1
}

timeout 120 "$TRAIN" --backend local "${COMMON[@]}" --tp 1 --dp 1 --metrics "$WORK/ref.csv" \
    >"$WORK/ref.log" 2>&1 || { fail "the 1-rank reference run failed:"; show ref; exit 1; }

# --- usage ---------------------------------------------------------------------------------------
restart nosave --max-restarts 1 -- "$TRAIN" --backend local "${COMMON[@]}"
if [ "$rc" -eq 2 ] && has nosave "no --save DIR" && ! has nosave "hcomm-train:"; then
    echo "ok   a command without --save is refused before it runs"
else
    fail "without --save: exit $rc, expected 2 and a refusal before the run:"
    show nosave
fi

# --- local backend: lost before the first checkpoint, so the rerun starts over ------------------
restart local --max-restarts 1 -- "$TRAIN" --backend local "${COMMON[@]}" --tp 2 --dp 2 \
    --save-every 4 --save "$WORK/ck-local" --metrics "$WORK/local.csv" --inject-failure=0:2
if [ "$rc" -ne 0 ]; then
    fail "local: exit $rc after a restart from the start:"
    show local
else
    has local "hcomm-restart: run 1 failed (exit 1, no 'finished' line); restarting with no --resume (no checkpoint in $WORK/ck-local yet: from the start) --dp 1 (restart 1 of 1)" ||
        { fail "local: no or another restart line:"; show local; }
    [ "$(grep -c 'inject-failure: rank' "$WORK/local.log")" -eq 1 ] ||
        fail "local: the failure was injected $(grep -c 'inject-failure: rank' "$WORK/local.log") times"
    { has local "4 ranks (tp 2 x pp 1 x dp 2" && has local "2 ranks (tp 2 x pp 1 x dp 1"; } ||
        fail "local: the runs were not dp 2, then dp 1"
    same_losses local-rerun-from-start "$WORK/local.csv" 0
fi

if [ "${HCOMM_WITH_MPI:-OFF}" != "ON" ]; then
    [ "$failures" -eq 0 ] || { echo "test_restart: $failures failure(s)" >&2; exit 1; }
    echo "skip the MPI runs (HCOMM_WITH_MPI=${HCOMM_WITH_MPI:-OFF})"
    exit 77
fi
MPIRUN=${MPIEXEC:-mpirun}

# --- mpi: SIGKILL of rank 1 in step 7; the rerun resumes after step 5 on half the ranks -----------
# mpi_job DIR CSV: the 4-process job in JOB, checkpoints every 2 steps into DIR.
mpi_job() {
    JOB=("$MPIRUN" --oversubscribe -np 4 "$TRAIN" --backend mpi "${COMMON[@]}" --tp 2 --dp 2
        --save-every 2 --save "$1" --metrics "$2" --inject-failure 1:7)
}
mpi_job "$WORK/ck" "$WORK/mpi.csv"
t0=$SECONDS
restart mpi --max-restarts 1 -- "${JOB[@]}"
echo "     the mpi job and its restart took $((SECONDS - t0)) s"
if [ "$rc" -ne 0 ]; then
    fail "mpi: exit $rc, expected 0 after one restart:"
    show mpi
else
    has mpi "hcomm-restart: run 1 failed (exit " ||
        { fail "mpi: no line about the failed run:"; show mpi; }
    has mpi "restarting with --resume $WORK/ck --dp 1 -np 2 (restart 1 of 1)" ||
        { fail "mpi: the restart line differs:"; show mpi; }
    [ "$(grep -c 'inject-failure: rank' "$WORK/mpi.log")" -eq 1 ] ||
        fail "mpi: the failure was injected $(grep -c 'inject-failure: rank' "$WORK/mpi.log") times"
    has mpi "2 ranks (tp 2 x pp 1 x dp 1" || fail "mpi: the rerun did not run on 2 ranks, dp 1"
    has mpi "resumed from $WORK/ck at step 6 of 12" ||
        { fail "mpi: the rerun did not resume at step 6"; show mpi; }
    [ "$(grep -c '^finished 12 steps$' "$WORK/mpi.log")" -eq 1 ] || fail "mpi: no 'finished' line"
    # --metrics is rewritten by the rerun: steps 6..11 only.
    same_losses mpi-restart-after-kill "$WORK/mpi.csv" 6
fi

# --- --max-restarts 0: the failure is the result ---------------------------------------------------
mpi_job "$WORK/ck0" "$WORK/mpi0.csv"
restart none --max-restarts 0 -- "${JOB[@]}"
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && has none "no restarts left (--max-restarts 0)" &&
    ! has none "restarting"; then
    echo "ok   --max-restarts 0 returns the failed run's status ($rc)"
else
    fail "--max-restarts 0: exit $rc, expected the failure:"
    show none
fi
# Negative control: the comparison notices metrics that are not the resumed run's (steps 0..6).
if same_losses negative-control "$WORK/mpi0.csv" 6 quiet >/dev/null; then
    fail "the comparison did not notice the metrics of a run that was not restarted"
else
    echo "ok   the comparison notices the metrics of a run that was not restarted"
fi

if [ "$failures" -ne 0 ]; then
    echo "test_restart: $failures failure(s)" >&2
    exit 1
fi
echo "test_restart: all checks passed"
