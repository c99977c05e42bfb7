#!/usr/bin/env bash
# hcomm-train goes on after a lost rank (--max-failures, in-job recovery):
# - --inject-failure RANK:STEP on local (the rank's thread stops) and on mpi under
#   mpirun --enable-recovery (its process gets SIGKILL), on several layouts (TP, PP, CP, the
#   lost rank world rank 0 too; HSDP with --zero 1/2/3, whose shard groups are the replicas):
#   the survivors print what happened and "finished N steps",
#   and the per-step losses equal, in every digit of --metrics, the 1-rank run's and, from
#   STEP on, those of a run resumed with --dp <dp-1> from the checkpoint an uninterrupted run
#   saved after step STEP-1;
# - kill -9 of one process from outside, mid-run, under mpirun --enable-recovery;
# - --max-failures refused with --ep > 1 or --zero without HSDP, naming the flag; without --max-failures a
#   lost rank ends the run with HCOMM_ERR_PEER_LOST.
# Usage: test_train_recover.sh BUILD_DIR   (CTest sets MPIEXEC and HCOMM_WITH_MPI=ON/OFF)
set -u
BUILD=${1:?usage: test_train_recover.sh BUILD_DIR}
TRAIN="$BUILD/hcomm-train"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hcomm-train-recover.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset HCOMM_BACKEND
# A rank stopped for good keeps what it allocated: not a leak to report in a sanitizer build.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# Open MPI's single copy reads a killed sender's memory mid-copy (README: in-job recovery).
export OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIEXEC=${MPIEXEC:-mpirun}
. "$(dirname "$0")/train_common.sh"
[ -x "$TRAIN" ] || { echo "FAIL: $TRAIN not found" >&2; exit 1; }
COMMON=(--sample 0 --log-every 50 --hidden 32 --seq 16 --ep 1 --batch 12 --deterministic 1)
STEPS=16

# same NAME A.csv B.csv FIRST: steps FIRST.. of B equal A's (columns step,loss, as text).
same() {
    if cmp -s <(awk -F, -v lo="$4" 'NR > 1 && $1 >= lo' "$2" | cut -d, -f1,2) \
        <(awk -F, -v lo="$4" 'NR > 1 && $1 >= lo' "$3" | cut -d, -f1,2); then
        echo "ok   $1: steps $4..$((STEPS - 1)) equal"
    else
        fail "$1: losses differ from steps $4 on:"
        diff <(cut -d, -f1,2 "$2") <(cut -d, -f1,2 "$3") | head -6 | sed 's/^/    /' >&2
    fi
}

# survived NAME: the run said what was lost and finished every step.
survived() {
    local log="$WORK/$1.log"
    grep -q "lost at step .* continuing with dp=" "$log" || fail "$1: no recovery line"
    grep -q "^finished $STEPS steps" "$log" || fail "$1: no 'finished $STEPS steps' line"
}

# The 1-rank reference and its checkpoints (the parity rule makes it every layout's).
run ref "$TRAIN" --backend local --tp 1 --pp 1 --dp 1 --steps $STEPS "${COMMON[@]}" \
    --metrics "$WORK/ref.csv" || exit 1

# recover NAME BACKEND STEP VICTIM LAYOUT...: inject, survive, compare with the reference and
# with the resumed run of dp-1.
recover() {
    local name=$1 backend=$2 step=$3 victim=$4
    shift 4
    local launch=("$TRAIN" --backend "$backend")
    if [ "$backend" = mpi ]; then
        local np
        np=$(awk '{for (i = 1; i < NF; i++) if ($i == "--tp" || $i == "--pp" || $i == "--cp" ||
                 $i == "--dp") n = (n ? n : 1) * $(i + 1); print n}' <<<"$*")
        launch=("$MPIEXEC" --oversubscribe --enable-recovery -np "$np" "${launch[@]}")
    fi
    run "$name" "${launch[@]}" "$@" --steps $STEPS "${COMMON[@]}" --max-failures 1 \
        --inject-failure "$victim:$step" --metrics "$WORK/$name.csv" || return
    survived "$name"
    same "$name" "$WORK/ref.csv" "$WORK/$name.csv" 0
}

recover local_tp2_dp3 local 5 3 --tp 2 --pp 1 --dp 3
recover local_rank0 local 4 0 --tp 1 --pp 1 --dp 3
recover local_pp2 local 6 3 --tp 1 --pp 2 --dp 3 --schedule 1f1b
recover local_cp2 local 2 5 --tp 1 --pp 1 --cp 2 --dp 3
recover local_sp local 9 1 --tp 2 --pp 1 --dp 2 --sequence-parallel
recover local_hsdp_z3 local 5 3 --tp 1 --pp 1 --dp 4 --dp-shard 2 --zero 3 --micro-batches 1
recover local_hsdp_z1_rank0 local 4 0 --tp 2 --pp 1 --dp 6 --dp-shard 2 --zero 1 \
    --micro-batches 1

# The continuation equals a run resumed with --dp 2 from the checkpoint saved after step 4.
run uninterrupted "$TRAIN" --backend local --tp 2 --pp 1 --dp 3 --steps $STEPS "${COMMON[@]}" \
    --save "$WORK/ck" --save-every 5 --metrics "$WORK/uninterrupted.csv" &&
    run resumed "$TRAIN" --backend local --tp 2 --pp 1 --dp 2 --steps $STEPS "${COMMON[@]}" \
        --resume "$WORK/ck/ckpt-00000005.bin" --metrics "$WORK/resumed.csv" &&
    same recovered_vs_resumed "$WORK/resumed.csv" "$WORK/local_tp2_dp3.csv" 5

# Refusals, and no --max-failures: the run ends.
expect_fail refuse_ep 'max-failures 1 conflicts with --ep' "$TRAIN" --backend local --dp 2 \
    --ep 2 --max-failures 1
expect_fail refuse_zero 'conflicts with --zero without HSDP' "$TRAIN" --backend local --dp 2 --ep 1 --zero 1 \
    --max-failures 1
expect_fail no_recovery 'HCOMM_ERR_PEER_LOST' "$TRAIN" --backend local --tp 1 --pp 1 --dp 2 \
    --steps $STEPS "${COMMON[@]}" --inject-failure 1:3

if [ "${HCOMM_WITH_MPI:-OFF}" = ON ]; then
    recover mpi_tp2_dp3 mpi 5 3 --tp 2 --pp 1 --dp 3
    recover mpi_rank0_pp2 mpi 3 0 --tp 1 --pp 2 --dp 2
    recover mpi_hsdp_z2 mpi 4 1 --tp 1 --pp 1 --dp 4 --dp-shard 2 --zero 2 --micro-batches 1
    # kill -9 from outside, while the run is in its steps.
    LONG=600
    "$MPIEXEC" --oversubscribe --enable-recovery -np 4 "$TRAIN" --backend mpi --tp 2 --pp 1 \
        --dp 2 --steps $LONG "${COMMON[@]}" --log-every 1 --max-failures 1 \
        --metrics "$WORK/kill.csv" >"$WORK/kill.log" 2>&1 &
    job=$!
    for _ in $(seq 1 600); do
        grep -q '^step   100 ' "$WORK/kill.log" 2>/dev/null && break
        sleep 0.1
    done
    victim=""
    for p in $(pgrep -f "$TRAIN --backend mpi"); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=3; then
            victim=$p
        fi
    done
    [ -n "$victim" ] && kill -9 "$victim"
    wait "$job"
    if [ -z "$victim" ]; then
        fail "kill: rank 3's process was not found"
    elif ! grep -q "^finished $LONG steps" "$WORK/kill.log" ||
        ! grep -q "rank 3 lost at step" "$WORK/kill.log"; then
        fail "kill -9: the survivors did not finish:"
        grep -v 'PMIX ERROR' "$WORK/kill.log" | tail -20 | sed 's/^/    /' >&2
    else
        echo "ok   kill -9: $(grep -m1 'lost at step' "$WORK/kill.log" | cut -c1-160)"
    fi
fi
echo "test_train_recover: $failures failed"
[ "$failures" -eq 0 ]
