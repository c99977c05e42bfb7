#!/usr/bin/env bash
# End-to-end check of hcomm-train: with the same seed and global batch, every parallel layout
# must give the per-step losses of the 1-rank run of its --dtype (the thresholds of --help:
# f64 the same text in the CSV's 10 significant digits, f32 within 1e-5 relative, bf16 within
# 5e-2), the loss must fall, and bad input must fail with a clear message.
# Usage: test_train_parity.sh BUILD_DIR   (CTest sets MPIEXEC and HCOMM_WITH_MPI=ON/OFF)
set -u
BUILD=${1:?usage: test_train_parity.sh BUILD_DIR}
TRAIN="$BUILD/hcomm-train"
STEPS=100
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hcomm-train-parity.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# hcomm-train reads its default backend from HCOMM_BACKEND; the runs below choose it themselves.
unset HCOMM_BACKEND
. "$(dirname "$0")/train_common.sh"
if [ ! -x "$TRAIN" ]; then
    echo "FAIL: $TRAIN not found (build the hcomm-train target)" >&2
    exit 1
fi

# compare NAME [REF TOL]: checks $WORK/NAME.csv against the 1-rank reference $WORK/REF.csv
# (default ref), step by step: TOL 0 (the default, for f64) asks for the same text, else a
# relative difference of at most TOL.
compare() {
    local name=$1 refname=${2:-ref} tol=${3:-0}
    awk -F, -v name="$name" -v steps="$STEPS" -v tol="$tol" '
        FNR == 1 { next }                       # header
        NR == FNR { ref[$1] = $2; next }        # the reference file
        {
            seen++
            if (!($1 in ref)) { printf "%s: step %s is not in the reference\n", name, $1; bad++; next }
            a = ref[$1]; b = $2; d = a - b; if (d < 0) d = -d
            m = a < 0 ? -a : a; rel = m > 0 ? d / m : d
            if ((tol == 0 && a != b) || rel > tol || b != b) {
                printf "%s: step %s loss %s, 1-rank reference %s (relative difference %.3g > %g)\n",
                       name, $1, b, a, rel, tol
                bad++
            }
            if (rel > worst) worst = rel
        }
        END {
            if (seen != steps) { printf "%s: %d steps in the CSV, expected %d\n", name, seen, steps; bad++ }
            if (!bad) printf "ok   %-28s %d steps, largest relative difference %.3g (allowed %g)\n", name, seen, worst, tol
            exit bad ? 1 : 0
        }' "$WORK/$refname.csv" "$WORK/$name.csv"
}

# --- the 1-rank reference -------------------------------------------------------------------
# Optimized builds check the default model; Debug and sanitizer builds, 3-10x slower, a
# narrower one with shorter sequences (1/8 of the work), so the script stays within minutes.
COMMON=(--steps "$STEPS" --log-every 50)
if grep -Eq '^CMAKE_BUILD_TYPE:[A-Z]+=Debug$|^HCOMM_SANITIZE:[A-Z]+=.+$' "$BUILD/CMakeCache.txt" \
    2>/dev/null; then
    COMMON+=(--hidden 32 --seq 16)
    echo "Debug or sanitizer build: checking parity with ${COMMON[*]}"
fi
if ! run ref "$TRAIN" "${COMMON[@]}" --tp 1 --pp 1 --dp 1 --ep 1 --metrics "$WORK/ref.csv"; then
    echo "FAIL: the 1-rank reference run failed; nothing to compare" >&2
    exit 1
fi
head -n 1 "$WORK/ref.csv" | grep -q '^step,loss' || fail "metrics CSV header is not 'step,loss,...'"

# The loss falls clearly: from about ln(vocab) to at least 0.5 lower.
awk -F, 'NR == 2 { first = $2 } NR > 1 { last = $2 }
         END { printf "loss %s -> %s over the reference run\n", first, last; exit !(last < first - 0.5) }' \
    "$WORK/ref.csv" || fail "the loss did not fall by 0.5 over $STEPS steps"

# --- layouts on the local backend (name, flags) -----------------------------------------------
LAYOUTS=(
    "default-tp2-pp2-dp2-ep2|"
    "tp1-pp4-dp2-ep2-mb4|--tp 1 --pp 4 --dp 2 --ep 2 --micro-batches 4"
    "tp2-pp1-dp4-ep4|--tp 2 --pp 1 --dp 4 --ep 4"
    "tp1-pp2-dp4-ep2|--tp 1 --pp 2 --dp 4 --ep 2"
    "tp4-pp1-dp2-ep2|--tp 4 --pp 1 --dp 2 --ep 2"
    "tp2-pp3-dp1-ep1-mb8|--tp 2 --pp 3 --dp 1 --ep 1 --micro-batches 8"
    "tp1-pp4-dp2-ep2-mb4-1f1b|--tp 1 --pp 4 --dp 2 --ep 2 --micro-batches 4 --schedule 1f1b"
    "tp2-pp3-dp1-ep1-mb8-1f1b-noverlap|--tp 2 --pp 3 --dp 1 --ep 1 --micro-batches 8 --schedule 1f1b --dp-overlap 0"
    "zero1-tp2-pp2-dp2-ep2|--zero 1"
    "zero3-hsdp-tp2-pp1-dp4-shard2-ep2|--tp 2 --pp 1 --dp 4 --ep 2 --zero 3 --dp-shard 2"
)
# Layouts checked over the first SHORT steps only (a run's step k does not depend on --steps),
# to keep the script within minutes on 2 cores.
SHORT=30
SHORT_LAYOUTS=(
    "tp2-pp2-dp2-ep2-interleaved-v2|--schedule interleaved --virtual-stages 2"
    "tp1-pp2-dp2-ep2-mb4-interleaved-v2|--tp 1 --pp 2 --dp 2 --ep 2 --micro-batches 4 --schedule interleaved --virtual-stages 2"
    "zero2-tp1-pp4-dp2-ep2-mb4-1f1b|--tp 1 --pp 4 --dp 2 --ep 2 --micro-batches 4 --schedule 1f1b --zero 2"
    "zero3-tp1-pp2-dp4-ep4-interleaved-v2|--tp 1 --pp 2 --dp 4 --ep 4 --micro-batches 4 --schedule interleaved --virtual-stages 2 --zero 3"
    "zero3-hsdp-tp1-pp1-dp8-shard4-ep2|--tp 1 --pp 1 --dp 8 --dp-shard 4 --ep 2 --zero 3"
    "zero3-cp2-tp1-pp1-dp4-shard4|--tp 1 --cp 2 --pp 1 --dp 4 --ep 1 --zero 3"
)
for entry in "${LAYOUTS[@]}"; do
    name=${entry%%|*}
    read -r -a flags <<<"${entry#*|}"
    if run "$name" "$TRAIN" "${COMMON[@]}" "${flags[@]}" --metrics "$WORK/$name.csv"; then
        compare "$name" || fail "$name: losses differ from the 1-rank run"
        # hcomm-train ends by comparing every replicated weight across its group, bitwise.
        grep -q "replicas bitwise equal" "$WORK/$name.log" || fail "$name: no replica check"
    fi
done

# --- --dtype f32 and bf16: each against its own 1-rank run ------------------------------------
# f32 sums TP and expert-TP partial results in another order than one rank does (1 ulp per
# sum, ~6e-8 relative after 100 steps measured); bf16 rounds those partial sums to bf16 before
# the all-reduce adds them (~1.4e-2 measured). Both bounds leave room for longer chaos.
# check_variant NAME TOL FLAGS...: the 1-rank run with FLAGS, then two layouts (the default and
# pp 4 with 1f1b) against it within TOL (0: the same text).
check_variant() {
    local variant=$1 tol=$2
    shift 2
    run "ref-$variant" "$TRAIN" "${COMMON[@]}" --steps "$SHORT" "$@" --tp 1 --pp 1 --dp 1 --ep 1 \
        --metrics "$WORK/ref-$variant.csv" || return 1
    for entry in "${LAYOUTS[0]}" "${LAYOUTS[6]}"; do
        local name=$variant-${entry%%|*}
        read -r -a flags <<<"${entry#*|}"
        run "$name" "$TRAIN" "${COMMON[@]}" --steps "$SHORT" "${flags[@]}" "$@" \
            --metrics "$WORK/$name.csv" &&
            { STEPS=$SHORT compare "$name" "ref-$variant" "$tol" ||
                fail "$name: losses differ from the 1-rank run"; }
    done
}
check_variant f32 1e-5 --dtype f32
check_variant bf16 5e-2 --dtype bf16
# ZeRO-3 with HSDP in bf16 (f32 master shards and gradient reduction) within bf16's bound.
run bf16-zero3-hsdp "$TRAIN" "${COMMON[@]}" --steps "$SHORT" --dtype bf16 --tp 1 --pp 2 --dp 4 \
    --ep 2 --zero 3 --dp-shard 2 --metrics "$WORK/bf16-zero3-hsdp.csv" &&
    { STEPS=$SHORT compare bf16-zero3-hsdp ref-bf16 5e-2 ||
        fail "bf16-zero3-hsdp: losses differ from the 1-rank run"; }
# bf16 really computes in bf16: its losses are not the f32 ones.
if STEPS=$SHORT compare ref-bf16 ref-f32 1e-4 >/dev/null; then
    fail "--dtype bf16 trains to the losses of f32 (within 1e-4): is it rounding?"
else
    echo "ok   bf16 and f32 losses differ (bf16 rounds)"
fi

# --- interleaved 1F1B on a deeper model: 4 stages x 2 chunks of --layers 3 -------------------------
run ref-l3 "$TRAIN" "${COMMON[@]}" --steps "$SHORT" --layers 3 --lr 0.1 --micro-batches 4 --tp 1 --pp 1 \
    --dp 1 --ep 1 --metrics "$WORK/ref-l3.csv" &&
    run l3-pp4-v2 "$TRAIN" "${COMMON[@]}" --steps "$SHORT" --layers 3 --lr 0.1 --micro-batches 4 --tp 1 \
        --pp 4 --dp 2 --ep 2 --schedule interleaved --virtual-stages 2 --metrics "$WORK/l3-pp4-v2.csv" && {
    STEPS=$SHORT compare l3-pp4-v2 ref-l3 0 || fail "l3-pp4-v2: losses differ from the 1-rank run"
    grep -q "stages: \[embed | MoE 1\] \[TP 0 | TP 2\] \[MoE 0 | MoE 2\] \[TP 1 | head\]" \
        "$WORK/l3-pp4-v2.log" || fail "l3-pp4-v2 chunks: $(grep stages "$WORK/l3-pp4-v2.log")"
}

# --- --topk 2, dropless: every layout gives the 1-rank losses, as top-1 does ----------------------
check_variant top2 0 --topk 2
run top2-ep4 "$TRAIN" "${COMMON[@]}" --steps "$SHORT" --topk 2 --tp 2 --pp 1 --dp 4 --ep 4 \
    --metrics "$WORK/top2-ep4.csv" &&
    { STEPS=$SHORT compare top2-ep4 ref-top2 0 || fail "top2-ep4: losses differ from the 1-rank run"; }
# A capacity factor drops slots: the run trains, and its losses are not the dropless ones.
run top2-cf "$TRAIN" "${COMMON[@]}" --steps "$SHORT" --topk 2 --capacity-factor 0.5 \
    --metrics "$WORK/top2-cf.csv" && {
    if STEPS=$SHORT compare top2-cf ref-top2 1e-3 >/dev/null; then
        fail "--capacity-factor 0.5 trained to the dropless losses: nothing was dropped?"
    else
        echo "ok   --capacity-factor 0.5 drops slots (its losses differ from dropless)"
    fi
}

for entry in "${SHORT_LAYOUTS[@]}"; do
    name=${entry%%|*}
    read -r -a flags <<<"${entry#*|}"
    run "$name" "$TRAIN" "${COMMON[@]}" --steps "$SHORT" "${flags[@]}" --metrics "$WORK/$name.csv" &&
        { STEPS=$SHORT compare "$name" || fail "$name: losses differ from the 1-rank run"; }
done

# Negative control: the comparison must notice another seed (so the checks above can fail).
if run other-seed "$TRAIN" "${COMMON[@]}" --seed 4321 --metrics "$WORK/other-seed.csv"; then
    if compare other-seed >"$WORK/other-seed.cmp"; then
        fail "the comparison did not notice a run with another seed"
    else
        echo "ok   a run with another seed is caught: $(head -n 1 "$WORK/other-seed.cmp")"
    fi
fi

# --- layouts over MPI ----------------------------------------------------------------
if [ "${HCOMM_WITH_MPI:-OFF}" = "ON" ]; then
    MPIRUN=${MPIEXEC:-mpirun}
    # Open MPI itself leaks at exit; in sanitizer builds LeakSanitizer would fail these runs.
    # The local-backend runs above still check hcomm-train for leaks.
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    # The default layout, and one with pp 4 and one with ep 4, as 8 processes.
    for entry in "${LAYOUTS[@]:0:3}"; do
        name=mpi-${entry%%|*}
        read -r -a flags <<<"${entry#*|}"
        run "$name" "$MPIRUN" --oversubscribe -np 8 "$TRAIN" --backend mpi "${COMMON[@]}" \
            "${flags[@]}" --metrics "$WORK/$name.csv" &&
            { compare "$name" || fail "$name: losses differ from the 1-rank run"; }
    done
    # ZeRO-3 with HSDP (dp 4 = 2 shards x 2 replicas) and TP as 8 processes.
    entry=${LAYOUTS[9]}
    name=mpi-${entry%%|*}
    read -r -a flags <<<"${entry#*|}"
    run "$name" "$MPIRUN" --oversubscribe -np 8 "$TRAIN" --backend mpi "${COMMON[@]}" \
        "${flags[@]}" --metrics "$WORK/$name.csv" &&
        { compare "$name" || fail "$name: losses differ from the 1-rank run"; }
    # Interleaved 1F1B (2 stages x 2 chunks, 4 micro-batches) as 4 processes.
    entry=${SHORT_LAYOUTS[1]}
    name=mpi-${entry%%|*}
    read -r -a flags <<<"${entry#*|}"
    run "$name" "$MPIRUN" --oversubscribe -np 4 "$TRAIN" --backend mpi "${COMMON[@]}" \
        --steps "$SHORT" "${flags[@]}" --metrics "$WORK/$name.csv" &&
        { STEPS=$SHORT compare "$name" || fail "$name: losses differ from the 1-rank run"; }
    # A world size that is not the process count must fail, not hang.
    if timeout 120 "$MPIRUN" --oversubscribe -np 2 "$TRAIN" --backend mpi --steps 1 \
        >"$WORK/mpi-size.log" 2>&1; then
        fail "--backend mpi with 8 ranks under mpirun -np 2 succeeded"
    elif ! grep -q "must equal the number of processes" "$WORK/mpi-size.log"; then
        fail "--backend mpi under the wrong process count: no clear message:"
        sed 's/^/    /' "$WORK/mpi-size.log" >&2
    else
        echo "ok   mpi world-size mismatch fails with a message"
    fi
    # HCOMM_BACKEND picks the backend when --backend is not given.
    run env-backend env HCOMM_BACKEND=mpi "$TRAIN" --steps 2 --tp 1 --pp 1 --dp 1 &&
        { grep -q "1 rank .* on mpi$" "$WORK/env-backend.log" &&
            echo "ok   HCOMM_BACKEND=mpi is the default backend" ||
            fail "HCOMM_BACKEND=mpi: the run did not use the mpi backend"; }
    # mpirun -np 2 with the local backend would train twice over: refused, said once (by rank 0).
    timeout 120 "$MPIRUN" -np 2 "$TRAIN" --backend local --steps 2 >"$WORK/mpi-local.log" 2>&1
    rc=$?
    said=$(grep -c "started by mpirun with 2 processes but --backend local" "$WORK/mpi-local.log")
    if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ] || [ "$said" -ne 1 ]; then
        fail "mpirun -np 2 with --backend local: exit $rc, the reason said $said times (expected 1):"
        sed 's/^/    /' "$WORK/mpi-local.log" >&2
    else
        echo "ok   mpirun -np 2 with the local backend fails (exit $rc), said once"
    fi
else
    echo "skip the MPI layout (HCOMM_WITH_MPI=${HCOMM_WITH_MPI:-OFF})"
fi

# --- bad input fails clearly --------------------------------------------------------------------
# bad NAME PATTERN FLAGS...: hcomm-train must exit non-zero and print PATTERN (expect_fail:
# train_common.sh).
EXPECT_FAIL_TIMEOUT=60
bad() { expect_fail "$1" "$2" "$TRAIN" "${@:3}"; }
bad missing-data "cannot read --data" --data "$WORK/no-such-file.txt" --steps 1
: >"$WORK/empty.txt"
bad empty-data "cannot read --data" --data "$WORK/empty.txt" --steps 1
bad batch-not-divisible "not divisible" --batch 6 --dp 2 --micro-batches 2
bad experts-not-divisible "not divisible" --experts 3 --ep 2
bad pp-too-large "out of range" --pp 5
bad unknown-flag "unknown option --bogus" --bogus 1
bad zero-tp "--tp 0: out of range 1\.\." --tp 0
bad negative-batch "--batch -4: out of range 1\.\." --batch -4
bad unknown-backend "backend bogus: expected local or mpi" --backend bogus --steps 2
HCOMM_BACKEND=bogus bad unknown-env-backend "HCOMM_BACKEND=bogus" --steps 2
bad explicit-ep "ep 2 does not divide --dp 1" --tp 4 --pp 1 --dp 1 --ep 2 --steps 2
bad data-is-dir "Is a directory" --data "$WORK" --steps 1
bad steps-overflow "out of range 1\.\." --steps 99999999999
bad seed-overflow "out of range 0\.\." --seed 18446744073709551616
bad lr-overflow "out of range \\(0, 100\]" --lr 1e400
bad unknown-dtype "--dtype f16 is unknown \\(f64, f32 or bf16\\)" --dtype f16
bad virtual-without-interleaved "--virtual-stages 2 needs --schedule interleaved" \
    --virtual-stages 2
bad interleaved-mb "--micro-batches divisible by it" --schedule interleaved \
    --micro-batches 3 --batch 12
bad interleaved-chunks "--pp 2 x --virtual-stages 3 = 6 chunks, but the model has 4 units" \
    --schedule interleaved --virtual-stages 3
bad topk-too-large "--topk 5 is more than --experts 4" --topk 5
bad negative-capacity "--capacity-factor -1: out of range" --capacity-factor -1
bad metrics-path "$WORK/no-dir/x.csv" --metrics "$WORK/no-dir/x.csv" --steps 1
bad zero-dp-shard "--dp-shard 2 needs --zero 1, 2 or 3" --dp-shard 2
bad zero-shard-divides "--dp-shard 3 does not divide --dp 4" --tp 1 --pp 1 --dp 4 \
    --zero 1 --dp-shard 3
bad zero-stage "--zero 4: out of range" --zero 4
bad zero-save "not supported with --zero" --zero 1 --save "$WORK/ck"
bad zero-sp "--sequence-parallel is not supported with --zero" --tp 2 --pp 1 --dp 4 \
    --zero 1 --sequence-parallel
# The memory line of a sharded run names both figures.
grep -q "memory: peak live bytes .* with --zero 1 --dp-shard 2, [0-9]* unsharded" \
    "$WORK/zero1-tp2-pp2-dp2-ep2.log" || fail "zero1: no memory line"
# ZeRO-3 gathers a piece (attention, MLP, router, one expert) at a time, so on 4 shards its
# peak stays within the issue's 0.35 of the unsharded bytes (the three shards alone are 0.25;
# gathering whole units gave 0.42).
run zero3-memory "$TRAIN" "${COMMON[@]}" --steps 2 --tp 1 --pp 1 --ep 1 --dp 4 --dp-shard 4 \
    --zero 3 --layers 4 && {
    ratio=$(sed -n 's/^memory: .*unsharded (\([0-9.]*\) of it)$/\1/p' "$WORK/zero3-memory.log")
    if awk -v r="$ratio" 'BEGIN { exit !(r != "" && r + 0 > 0.25 && r + 0 <= 0.35) }'; then
        echo "ok   zero3 peak live bytes $ratio of unsharded on 4 shards"
    else
        fail "zero3-memory: peak live bytes '$ratio' of unsharded (want above 0.25, at most 0.35)"
    fi
}
"$TRAIN" --help | grep -q -- "default: \$HCOMM_BACKEND, else mpi under mpirun/srun, else local" ||
    fail "--help does not say the backend defaults to \$HCOMM_BACKEND"

# Without --ep, ep is 2 where 2 divides dp and --experts, else 1; an explicit one is kept.
ep_run() {
    local name=$1 want=$2
    shift 2
    run "$name" "$TRAIN" --steps 2 "$@" &&
        { grep -q "; ep $want," "$WORK/$name.log" && echo "ok   $name: ep $want" ||
            fail "$name: expected ep $want: $(head -n 1 "$WORK/$name.log")"; }
}
ep_run ep-default-dp1 1 --tp 4 --pp 1 --dp 1
ep_run ep-default-dp2 2 --tp 1 --pp 1 --dp 2
ep_run ep-default-experts3 1 --tp 1 --pp 1 --dp 2 --experts 3
ep_run ep-explicit 4 --tp 1 --pp 1 --dp 4 --ep 4
"$TRAIN" --help | grep -q -- "--micro-batches" || fail "--help does not list --micro-batches"

# Any text file works as --data.
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 40) >"$WORK/small.txt"
run small-data "$TRAIN" --data "$WORK/small.txt" --steps 3 --tp 1 --pp 1 --dp 1 --ep 1 \
    && echo "ok   --data with another text file"

if [ "$failures" -ne 0 ]; then
    echo "test_train_parity: $failures failure(s)" >&2
    exit 1
fi
echo "test_train_parity: all checks passed"
