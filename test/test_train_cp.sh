#!/usr/bin/env bash
# hcomm-train's attention under context and sequence parallelism, in test_train_parity.sh's
# style: with the same seed and global batch every layout must give the per-step losses of the
# 1-rank run in all 10 significant digits of --metrics (f64, --deterministic 1), on every
# --cp-algo (ring, allgather, ulysses, a2a+p2p on 2 simulated nodes and with --cp-a2a), with
# --sequence-parallel, with TP, PP, DP and EP on, on the local backend and under mpirun; the
# attention key blocks must not depend on the layout (another --attn-block changes the losses,
# so the comparison can fail); bad CP and head flags fail with a message naming the numbers.
# Usage: test_train_cp.sh BUILD_DIR   (CTest sets MPIEXEC and HCOMM_WITH_MPI=ON/OFF)
set -u
BUILD=${1:?usage: test_train_cp.sh BUILD_DIR}
TRAIN="$BUILD/hcomm-train"
STEPS=60
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hcomm-train-cp.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset HCOMM_BACKEND HCOMM_TOPO
. "$(dirname "$0")/train_common.sh"
[ -x "$TRAIN" ] || { echo "FAIL: $TRAIN not found (build the hcomm-train target)" >&2; exit 1; }

# compare NAME [REF]: the same loss text at every step as the reference CSV.
compare() {
    local name=$1 refname=${2:-ref}
    awk -F, -v name="$name" -v steps="$STEPS" '
        FNR == 1 { next }
        NR == FNR { ref[$1] = $2; next }
        { seen++; if (ref[$1] != $2) { printf "%s: step %s loss %s, 1-rank reference %s\n", name, $1, $2, ref[$1]; bad++ } }
        END {
            if (seen != steps) { printf "%s: %d steps in the CSV, expected %d\n", name, seen, steps; bad++ }
            if (!bad) printf "ok   %-36s %d steps, every loss as the 1-rank run\n", name, seen
            exit bad ? 1 : 0
        }' "$WORK/$refname.csv" "$WORK/$name.csv"
}

COMMON=(--steps "$STEPS" --log-every 50 --sample 0)
if grep -Eq '^CMAKE_BUILD_TYPE:[A-Z]+=Debug$|^HCOMM_SANITIZE:[A-Z]+=.+$' "$BUILD/CMakeCache.txt" \
    2>/dev/null; then
    STEPS=20
    COMMON=(--steps "$STEPS" --log-every 50 --sample 0 --hidden 32 --seq 16)
fi
run ref "$TRAIN" "${COMMON[@]}" --tp 1 --pp 1 --dp 1 --ep 1 --metrics "$WORK/ref.csv" ||
    { echo "FAIL: the 1-rank reference run failed" >&2; exit 1; }
grep -q "attention: 8 heads over tp 1, key blocks of" "$WORK/ref.log" || fail "ref: no attention line"

# name|environment|flags (8 ranks or fewer)
LAYOUTS=(
    "ring-cp2|-|--tp 1 --pp 1 --dp 1 --ep 1 --cp 2"
    "ring-tp2-cp2-pp2|-|--tp 2 --cp 2 --pp 2 --dp 1 --ep 1"
    "ring-cp2-pp2-dp2-ep2-1f1b|-|--tp 1 --cp 2 --pp 2 --dp 2 --ep 2 --schedule 1f1b --micro-batches 4"
    "ring-cp4-dp2-ep2|-|--tp 1 --cp 4 --pp 1 --dp 2 --ep 2"
    "allgather-tp2-cp2-dp2-ep2|-|--tp 2 --cp 2 --pp 1 --dp 2 --ep 2 --cp-algo allgather"
    "allgather-cp4-pp2|-|--tp 1 --cp 4 --pp 2 --dp 1 --ep 1 --cp-algo allgather"
    "ulysses-tp2-cp2-pp2|-|--tp 2 --cp 2 --pp 2 --dp 1 --ep 1 --cp-algo ulysses"
    "ulysses-cp4-dp2-ep2|-|--tp 1 --cp 4 --pp 1 --dp 2 --ep 2 --cp-algo ulysses"
    "a2a+p2p-2nodes-tp2-cp4|HCOMM_TOPO=nodes=2x4|--tp 2 --cp 4 --pp 1 --dp 1 --ep 1 --cp-algo a2a+p2p"
    "a2a+p2p-a2a2-cp4-pp2|-|--tp 1 --cp 4 --pp 2 --dp 1 --ep 1 --cp-algo a2a+p2p --cp-a2a 2"
    "sp-tp2-pp2-dp2-ep2|-|--sequence-parallel"
    "sp-ring-tp2-cp2-pp2|-|--tp 2 --cp 2 --pp 2 --dp 1 --ep 1 --sequence-parallel"
    "sp-ulysses-tp2-cp2-dp2-ep2|-|--tp 2 --cp 2 --pp 1 --dp 2 --ep 2 --cp-algo ulysses --sequence-parallel"
)
for entry in "${LAYOUTS[@]}"; do
    IFS='|' read -r name envs flagtext <<<"$entry"
    read -r -a flags <<<"$flagtext"
    [ "$envs" = "-" ] && envs=HCOMM_CP_TEST=1
    run "$name" env "$envs" "$TRAIN" "${COMMON[@]}" "${flags[@]}" --metrics "$WORK/$name.csv" &&
        { compare "$name" || fail "$name: losses differ from the 1-rank run"; }
done
grep -q "cp 4 (a2a+p2p: a2a 2 x p2p 2)" "$WORK/a2a+p2p-2nodes-tp2-cp4.log" ||
    fail "a2a+p2p on 2 simulated nodes: $(grep attention "$WORK/a2a+p2p-2nodes-tp2-cp4.log")"
grep -q "sequence parallel" "$WORK/sp-tp2-pp2-dp2-ep2.log" || fail "sp: not said"

# The blocks are what makes the layouts agree: another block size is another sum order.
run block1 "$TRAIN" "${COMMON[@]}" --tp 1 --pp 1 --dp 1 --ep 1 --attn-block 1 \
    --metrics "$WORK/block1.csv" && {
    if compare block1 >/dev/null; then
        echo "ok   --attn-block 1 gives the same losses as the default blocks (exact merge)"
    else
        echo "ok   --attn-block 1 merges in another order: $(compare block1 | head -n 1)"
    fi
}
# Negative control: the comparison notices another seed.
run other-seed "$TRAIN" "${COMMON[@]}" --tp 1 --cp 2 --pp 1 --dp 1 --ep 1 --seed 99 \
    --metrics "$WORK/other-seed.csv" && {
    compare other-seed >/dev/null && fail "the comparison did not notice another seed" ||
        echo "ok   a run with another seed is caught"
}

if [ "${HCOMM_WITH_MPI:-OFF}" = "ON" ]; then
    MPIRUN=${MPIEXEC:-mpirun}
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    run mpi-ring-tp2-cp2-pp2 "$MPIRUN" --oversubscribe -np 8 "$TRAIN" --backend mpi "${COMMON[@]}" \
        --tp 2 --cp 2 --pp 2 --dp 1 --ep 1 --metrics "$WORK/mpi-ring-tp2-cp2-pp2.csv" &&
        { compare mpi-ring-tp2-cp2-pp2 || fail "mpi ring: losses differ"; }
    run mpi-ulysses-sp "$MPIRUN" --oversubscribe -np 4 "$TRAIN" --backend mpi "${COMMON[@]}" \
        --tp 2 --cp 2 --pp 1 --dp 1 --ep 1 --cp-algo ulysses --sequence-parallel \
        --metrics "$WORK/mpi-ulysses-sp.csv" && { compare mpi-ulysses-sp || fail "mpi ulysses: losses differ"; }
    run mpi-a2a+p2p-2nodes "$MPIRUN" --oversubscribe -np 4 -x HCOMM_TOPO=nodes=2x2 "$TRAIN" \
        --backend mpi "${COMMON[@]}" --tp 1 --cp 4 --pp 1 --dp 1 --ep 1 --cp-algo a2a+p2p \
        --metrics "$WORK/mpi-a2a+p2p-2nodes.csv" &&
        { compare mpi-a2a+p2p-2nodes || fail "mpi a2a+p2p: losses differ"; }
    grep -q "cp 4 (a2a+p2p: a2a 2 x p2p 2)" "$WORK/mpi-a2a+p2p-2nodes.log" ||
        fail "mpi a2a+p2p on 2 simulated nodes: $(grep attention "$WORK/mpi-a2a+p2p-2nodes.log")"
    run mpi-allgather "$MPIRUN" --oversubscribe -np 4 "$TRAIN" --backend mpi "${COMMON[@]}" \
        --tp 1 --cp 2 --pp 1 --dp 2 --ep 2 --cp-algo allgather --metrics "$WORK/mpi-allgather.csv" &&
        { compare mpi-allgather || fail "mpi allgather: losses differ"; }
else
    echo "skip the MPI layouts (HCOMM_WITH_MPI=${HCOMM_WITH_MPI:-OFF})"
fi

# Bad input fails with a message naming the numbers (expect_fail: train_common.sh).
EXPECT_FAIL_TIMEOUT=60
bad() { expect_fail "$1" "$2" "$TRAIN" --steps 1 "${@:3}"; }
bad heads-tp "--heads 6 must be divisible by --tp 4" --heads 6 --tp 4 --pp 1 --dp 1
bad heads-hidden "divide --hidden 64" --heads 5 --tp 1 --pp 1 --dp 1
bad seq-ring "--seq 30 is not divisible by 2\*cp = 8" --seq 30 --cp 4 --tp 1 --pp 1 --dp 1
bad seq-ulysses "--seq 30 is not divisible by cp = 4" --seq 30 --cp 4 --cp-algo ulysses \
    --tp 1 --pp 1 --dp 1
bad ulysses-heads "the 2 heads per TP rank \\(--heads 8 / --tp 4\\) are not divisible by the 4" \
    --cp 4 --tp 4 --cp-algo ulysses --pp 1 --dp 1
bad cp-algo "--cp-algo bogus is unknown" --cp-algo bogus
bad attn-block "--attn-block 3 does not divide the 4 positions of a CP chunk" \
    --attn-block 3 --cp 4 --tp 1 --pp 1 --dp 1
bad cp-a2a "--cp-a2a 3 must divide --cp 4" --cp 4 --cp-algo a2a+p2p --cp-a2a 3 --tp 1 \
    --pp 1 --dp 1
bad sp-rows "--sequence-parallel: the 15 tokens of a micro-batch" --sequence-parallel \
    --seq 15 --batch 1 --micro-batches 1 --dp 1 --pp 1 --tp 2 --cp-algo ulysses

if [ "$failures" -ne 0 ]; then
    echo "test_train_cp: $failures failure(s)" >&2
    exit 1
fi
echo "test_train_cp: all checks passed"
