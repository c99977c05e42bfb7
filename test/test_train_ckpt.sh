#!/usr/bin/env bash
# End-to-end check of hcomm-train's checkpoints, validation loss, sampling and input checks:
# - save at step 20 of 40 and resume: losses 20..39 bitwise equal to the uninterrupted run
#   (local backend, and under mpirun -np 8 when HCOMM_WITH_MPI=ON);
# - a 2x2x2 checkpoint resumed as 1x1x1 and as 1x4x2 keeps the 1-rank parity (1e-3 relative);
# - truncated, flipped and other-model checkpoints fail naming the file and the field;
# - a bf16 checkpoint resumes bitwise; resuming with another --dtype fails naming 'dtype';
# - kill -9 while a checkpoint is written leaves the previous one loadable;
# - the sample is the same for a seed on every layout, and another seed changes it;
# - divergence, binary data and the val_loss column.
# Usage: test_train_ckpt.sh BUILD_DIR   (CTest sets MPIEXEC and HCOMM_WITH_MPI=ON/OFF)
set -u
BUILD=${1:?usage: test_train_ckpt.sh BUILD_DIR}
TRAIN="$BUILD/hcomm-train"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hcomm-train-ckpt.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset HCOMM_BACKEND
. "$(dirname "$0")/train_common.sh"
[ -x "$TRAIN" ] || { echo "FAIL: $TRAIN not found" >&2; exit 1; }
COMMON=(--sample 0 --log-every 10)
if grep -Eq '^CMAKE_BUILD_TYPE:[A-Z]+=Debug$|^HCOMM_SANITIZE:[A-Z]+=.+$' "$BUILD/CMakeCache.txt" \
    2>/dev/null; then
    COMMON+=(--hidden 32 --seq 16)
fi

# same_losses NAME A.csv B.csv FIRST LAST TOL: steps FIRST..LAST of both files agree (TOL 0:
# the same text, bitwise; else relative difference <= TOL) and both have every such step.
same_losses() {
    awk -F, -v name="$1" -v lo="$4" -v hi="$5" -v tol="$6" '
        FNR == 1 { next }
        NR == FNR { if ($1 >= lo && $1 <= hi) ref[$1] = $2; next }
        $1 >= lo && $1 <= hi {
            seen++
            if (!($1 in ref)) { printf "%s: step %s missing in the reference\n", name, $1; bad++; next }
            a = ref[$1]; b = $2; d = a - b; if (d < 0) d = -d; rel = d / (a < 0 ? -a : a)
            if ((tol == 0 && a != b) || (tol > 0 && (rel > tol || b != b))) {
                printf "%s: step %s loss %s, reference %s\n", name, $1, b, a; bad++
            }
            if (rel > worst) worst = rel
        }
        END {
            if (seen != hi - lo + 1) { printf "%s: %d of the steps %d..%d\n", name, seen, lo, hi; bad++ }
            if (!bad) printf "ok   %-34s steps %d..%d, largest relative difference %.3g\n", name, lo, hi, worst
            exit bad ? 1 : 0
        }' "$2" "$3"
}

# --- resume on the local backend -------------------------------------------------------------
run full "$TRAIN" "${COMMON[@]}" --steps 40 --metrics "$WORK/full.csv" || exit 1
run ref1 "$TRAIN" "${COMMON[@]}" --steps 40 --tp 1 --pp 1 --dp 1 --ep 1 --metrics "$WORK/ref1.csv" ||
    exit 1
run save20 "$TRAIN" "${COMMON[@]}" --steps 20 --save "$WORK/ck" || exit 1
[ "$(cat "$WORK/ck/latest")" = "ckpt-00000020.bin" ] ||
    fail "latest is '$(cat "$WORK/ck/latest")', expected ckpt-00000020.bin"
run resume "$TRAIN" "${COMMON[@]}" --steps 40 --resume "$WORK/ck" --metrics "$WORK/resume.csv" &&
    { same_losses resume-local-bitwise "$WORK/full.csv" "$WORK/resume.csv" 20 39 0 ||
        fail "resumed losses differ from the uninterrupted run"; }
grep -q "resumed from $WORK/ck at step 20 of 40" "$WORK/resume.log" || fail "no 'resumed' line"
# The resumed file has steps 20..39 only (the first 20 are not retrained).
[ "$(sed -n 2p "$WORK/resume.csv" | cut -d, -f1)" = 20 ] || fail "the resumed run did not start at 20"

# --- resharding a 2x2x2 checkpoint -------------------------------------------------------------
run reshard-1x1x1 "$TRAIN" "${COMMON[@]}" --steps 40 --resume "$WORK/ck" --tp 1 --pp 1 --dp 1 \
    --ep 1 --metrics "$WORK/r111.csv" &&
    { same_losses reshard-2x2x2-to-1x1x1 "$WORK/ref1.csv" "$WORK/r111.csv" 20 39 1e-3 ||
        fail "resharded to 1x1x1: no parity"; }
run reshard-1x4x2 "$TRAIN" "${COMMON[@]}" --steps 40 --resume "$WORK/ck" --tp 1 --pp 4 --dp 2 \
    --ep 2 --micro-batches 4 --metrics "$WORK/r142.csv" &&
    { same_losses reshard-2x2x2-to-1x4x2 "$WORK/ref1.csv" "$WORK/r142.csv" 20 39 1e-3 ||
        fail "resharded to 1x4x2: no parity"; }
# Negative control: the comparison notices a run that did not resume (steps 0..19 trained again).
run noresume "$TRAIN" "${COMMON[@]}" --steps 40 --seed 99 --metrics "$WORK/noresume.csv" &&
    { if same_losses negative-control "$WORK/full.csv" "$WORK/noresume.csv" 20 39 1e-3 >/dev/null; then
        fail "the comparison did not notice another seed"
    else echo "ok   the comparison notices a different run"; fi; }

# --- --layers 2: parity of a 6-unit pipeline, and its checkpoint resharded to 1 rank ---------
run l2-ref "$TRAIN" "${COMMON[@]}" --layers 2 --steps 20 --tp 1 --pp 1 --dp 1 --ep 1 \
    --metrics "$WORK/l2-ref.csv" &&
    run l2-pp3 "$TRAIN" "${COMMON[@]}" --layers 2 --steps 20 --tp 2 --pp 3 --dp 1 --ep 1 \
        --micro-batches 4 --save-every 10 --save "$WORK/l2-ck" --metrics "$WORK/l2-pp3.csv" && {
    same_losses layers2-tp2-pp3-vs-1-rank "$WORK/l2-ref.csv" "$WORK/l2-pp3.csv" 0 19 1e-3 ||
        fail "--layers 2 on tp 2 x pp 3: no parity"
    grep -q "stages: \[embed, TP 0\] \[MoE 0, TP 1\] \[MoE 1, head\]" "$WORK/l2-pp3.log" ||
        fail "--layers 2 --pp 3 stages: $(grep stages "$WORK/l2-pp3.log")"
    printf 'ckpt-00000010.bin\n' >"$WORK/l2-ck/latest" # resume from the step-10 one
    run l2-resume "$TRAIN" "${COMMON[@]}" --layers 2 --steps 20 --resume "$WORK/l2-ck" --tp 1 \
        --pp 1 --dp 1 --ep 1 --metrics "$WORK/l2-resume.csv" &&
        { same_losses layers2-ckpt-resharded-to-1-rank "$WORK/l2-ref.csv" "$WORK/l2-resume.csv" 10 19 1e-3 ||
            fail "--layers 2 checkpoint on 1 rank: no parity"; }
    expect_fail other-layers "field 'layers' is 2, but --layers is 1" \
        "$TRAIN" "${COMMON[@]}" --steps 20 --resume "$WORK/l2-ck"
}

# --- broken checkpoints ----------------------------------------------------------------------
CK="$WORK/ck/ckpt-00000020.bin"
size=$(stat -c %s "$CK")
head -c $((size / 2)) "$CK" >"$WORK/truncated.bin"
expect_fail truncated "checkpoint $WORK/truncated.bin is truncated: field '" \
    "$TRAIN" "${COMMON[@]}" --steps 40 --resume "$WORK/truncated.bin"
cp "$CK" "$WORK/flipped.bin"
byte=$(od -An -tu1 -j $((size / 3)) -N1 "$WORK/flipped.bin" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 1)))" | dd of="$WORK/flipped.bin" bs=1 seek=$((size / 3)) \
    conv=notrunc 2>/dev/null
cmp -s "$CK" "$WORK/flipped.bin" && fail "the byte flip did not change the file"
expect_fail flipped "checkpoint $WORK/flipped.bin is corrupt: the checksum of tensor '" \
    "$TRAIN" "${COMMON[@]}" --steps 40 --resume "$WORK/flipped.bin"
cp "$CK" "$WORK/flipped-header.bin"
printf '\377' | dd of="$WORK/flipped-header.bin" bs=1 seek=20 conv=notrunc 2>/dev/null
expect_fail flipped-header "flipped-header.bin is corrupt: the checksum of the header" \
    "$TRAIN" "${COMMON[@]}" --steps 40 --resume "$WORK/flipped-header.bin"
run small-model "$TRAIN" --sample 0 --steps 2 --hidden 16 --seq 16 --save "$WORK/small"
expect_fail other-model "ckpt-00000002.bin does not fit this run: field 'hidden' is 16, but --hidden is" \
    "$TRAIN" "${COMMON[@]}" --steps 40 --resume "$WORK/small"
expect_fail nothing-left "is at step 20 and --steps is 20: nothing left" \
    "$TRAIN" "${COMMON[@]}" --steps 20 --resume "$WORK/ck"
expect_fail not-a-save-dir "cannot read $WORK/latest" "$TRAIN" "${COMMON[@]}" --resume "$WORK"

# --- --dtype: a bf16 checkpoint (f32 master weights) resumes bit for bit; another --dtype is
# refused, naming the field ----------------------------------------------------------------------
run bf16-full "$TRAIN" "${COMMON[@]}" --dtype bf16 --steps 10 --metrics "$WORK/bf16-full.csv" &&
    run bf16-save "$TRAIN" "${COMMON[@]}" --dtype bf16 --steps 5 --save "$WORK/ck-bf16" &&
    run bf16-resume "$TRAIN" "${COMMON[@]}" --dtype bf16 --steps 10 --resume "$WORK/ck-bf16" \
        --metrics "$WORK/bf16-resume.csv" &&
    { same_losses resume-bf16-bitwise "$WORK/bf16-full.csv" "$WORK/bf16-resume.csv" 5 9 0 ||
        fail "bf16: resumed losses differ from the uninterrupted run"; }
expect_fail other-dtype "field 'dtype' is bf16, but --dtype is f32; resume with --dtype bf16" \
    "$TRAIN" "${COMMON[@]}" --dtype f32 --steps 10 --resume "$WORK/ck-bf16"
expect_fail f64-into-f32 "field 'dtype' is f64, but --dtype is f32" \
    "$TRAIN" "${COMMON[@]}" --dtype f32 --steps 40 --resume "$WORK/ck"

# --- kill -9 while a checkpoint is being written ---------------------------------------------
cp -r "$WORK/ck" "$WORK/ck-kill"
HCOMM_TRAIN_TEST_SAVE_DELAY=30 timeout 120 "$TRAIN" "${COMMON[@]}" --steps 40 \
    --resume "$WORK/ck-kill" --save "$WORK/ck-kill" >"$WORK/kill.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
    [ -e "$WORK/ck-kill/.ckpt-00000040.bin.tmp" ] && break
    sleep 0.1
done
if [ ! -e "$WORK/ck-kill/.ckpt-00000040.bin.tmp" ]; then
    fail "the run never started writing its checkpoint"
fi
sleep 0.5
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
[ "$(cat "$WORK/ck-kill/latest")" = "ckpt-00000020.bin" ] ||
    fail "after kill -9 mid-write latest is '$(cat "$WORK/ck-kill/latest")'"
[ ! -e "$WORK/ck-kill/ckpt-00000040.bin" ] || fail "a half-written ckpt-00000040.bin exists"
run after-kill "$TRAIN" "${COMMON[@]}" --steps 40 --resume "$WORK/ck-kill" \
    --metrics "$WORK/after-kill.csv" &&
    { same_losses resume-after-kill-9 "$WORK/full.csv" "$WORK/after-kill.csv" 20 39 0 ||
        fail "resuming after kill -9 differs"; }

# --- validation loss column ---------------------------------------------------------------------
head -n 1 "$WORK/full.csv" | grep -q ',val_loss$' || fail "no val_loss column: $(head -n 1 "$WORK/full.csv")"
awk -F, 'NR == 2 && $8 == "" { print "step 0 has no val_loss"; bad = 1 }
         NR == 3 && $8 != "" { print "step 1 has a val_loss"; bad = 1 }
         NR > 1 && $1 == 39 && !($8 > 0.5 && $8 < 10) { print "step 39 val_loss " $8; bad = 1 }
         END { exit bad }' "$WORK/full.csv" || fail "val_loss column is wrong"
grep -Eq '^done: .*\| val loss [0-9]+\.[0-9]+ \|' "$WORK/full.log" || fail "no val loss in the done line"
grep -Eq '^step +0 \| loss [0-9.]+ \| val [0-9.]+ .*s, ETA +[0-9.]+ s$' "$WORK/full.log" ||
    fail "the progress line has no val loss, elapsed or ETA: $(grep -m1 '^step' "$WORK/full.log")"

# --- sampling ------------------------------------------------------------------------------------
sample_of() { sed -n '/^sample (/,$p' "$WORK/$1.log"; }
S=(--steps 30 --sample 120 --prompt "The ")
run s-default "$TRAIN" "${S[@]}" && run s-again "$TRAIN" "${S[@]}" &&
    run s-1rank "$TRAIN" "${S[@]}" --tp 1 --pp 1 --dp 1 --ep 1 &&
    run s-pp4 "$TRAIN" "${S[@]}" --tp 1 --pp 4 --dp 2 --ep 2 &&
    run s-greedy "$TRAIN" "${S[@]}" --temperature 0 &&
    run s-seed "$TRAIN" "${S[@]}" --seed 7 && {
    [ "$(sample_of s-default | wc -c)" -gt 120 ] || fail "no sample: $(sample_of s-default)"
    [ "$(sample_of s-default)" = "$(sample_of s-again)" ] || fail "sampling is not deterministic"
    [ "$(sample_of s-default)" = "$(sample_of s-1rank)" ] || fail "2x2x2 and 1-rank samples differ"
    [ "$(sample_of s-default)" = "$(sample_of s-pp4)" ] || fail "2x2x2 and 1x4x2 samples differ"
    [ "$(sample_of s-default | tail -n +2)" != "$(sample_of s-seed | tail -n +2)" ] ||
        fail "another seed gave the same sample"
    [ "$(sample_of s-default | tail -n +2)" != "$(sample_of s-greedy | tail -n +2)" ] ||
        fail "--temperature 0 gave the same sample as 0.8"
    echo "ok   the sample is the same for a seed on 2x2x2, 1x1x1 and 1x4x2; seed and temperature change it"
}
run default-sample "$TRAIN" --steps 5 && { sample_of default-sample | grep -q '^The ' ||
    fail "the default run prints no sample"; }
expect_fail bad-prompt "--prompt: the character '~'" "$TRAIN" --steps 2 --prompt "a~"

# --- divergence and input checks ------------------------------------------------------------------
expect_fail diverge "training diverged; lower the learning rate \(--lr 100 now" \
    "$TRAIN" --lr 100 --steps 100 --sample 0
head -c 4000 /dev/urandom >"$WORK/random.bin"
expect_fail binary-data "random.bin is not text: .*pass --binary" "$TRAIN" --data "$WORK/random.bin" --steps 2
# No NUL, but 1 control byte in 20: more than 1% not printable.
awk 'BEGIN { for (i = 0; i < 200; i++) printf "some words\001 more words\n" }' >"$WORK/control.txt"
expect_fail control-bytes "control.txt is not text: 200 of 4600 bytes \(4\.3%, more than 1%\) are not printable UTF-8" \
    "$TRAIN" --data "$WORK/control.txt" --steps 2
# UTF-8 text (multi-byte characters) is text.
awk 'BEGIN { for (i = 0; i < 300; i++) printf "grüße, ça va? — ok\n" }' >"$WORK/utf8.txt"
run utf8-ok "$TRAIN" --data "$WORK/utf8.txt" --steps 2 --sample 0 --seq 16 --tp 1 --pp 1 --dp 1 \
    --ep 1 && echo "ok   UTF-8 text with multi-byte characters trains"
run binary-ok "$TRAIN" --data "$WORK/random.bin" --binary --steps 2 --sample 0 --seq 16 --tp 1 \
    --pp 1 --dp 1 --ep 1 && echo "ok   --binary trains on a binary file"
printf 'some text %.0s' $(seq 300) >"$WORK/train.txt"
printf 'other words %.0s' $(seq 30) >"$WORK/val.txt"
run val-data "$TRAIN" --data "$WORK/train.txt" --val-data "$WORK/val.txt" --steps 3 --sample 0 \
    --tp 1 --pp 1 --dp 1 --ep 1 &&
    { grep -q "3000 train, 360 held out from --val-data" "$WORK/val-data.log" &&
        echo "ok   --val-data is the held-out text" || fail "--val-data: $(sed -n 2p "$WORK/val-data.log")"; }

# --- under mpirun --------------------------------------------------------------------------------
if [ "${HCOMM_WITH_MPI:-OFF}" = "ON" ]; then
    MPIRUN=${MPIEXEC:-mpirun}
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    M=("$MPIRUN" --oversubscribe -np 8 "$TRAIN" --backend mpi "${COMMON[@]}")
    run mpi-full "${M[@]}" --steps 40 --metrics "$WORK/mpi-full.csv" &&
        run mpi-save "${M[@]}" --steps 20 --save "$WORK/mpi-ck" &&
        run mpi-resume "${M[@]}" --steps 40 --resume "$WORK/mpi-ck" --metrics "$WORK/mpi-res.csv" &&
        { same_losses resume-mpi-bitwise "$WORK/mpi-full.csv" "$WORK/mpi-res.csv" 20 39 0 ||
            fail "mpi: resumed losses differ"; }
    run mpi-reshard "$MPIRUN" --oversubscribe -np 8 "$TRAIN" --backend mpi "${COMMON[@]}" \
        --steps 40 --resume "$WORK/mpi-ck" --tp 1 --pp 4 --dp 2 --ep 2 --micro-batches 4 \
        --metrics "$WORK/mpi-r142.csv" &&
        { same_losses mpi-reshard-2x2x2-to-1x4x2 "$WORK/ref1.csv" "$WORK/mpi-r142.csv" 20 39 1e-3 ||
            fail "mpi: resharded to 1x4x2: no parity"; }
    run mpi-to-local "$TRAIN" "${COMMON[@]}" --steps 40 --resume "$WORK/mpi-ck" --tp 1 --pp 1 \
        --dp 1 --ep 1 --metrics "$WORK/mpi-local.csv" &&
        { same_losses mpi-ckpt-on-local-1x1x1 "$WORK/ref1.csv" "$WORK/mpi-local.csv" 20 39 1e-3 ||
            fail "an mpi checkpoint resumed on 1 local rank: no parity"; }
    # A broken checkpoint under mpirun: every process refuses it, the reason is said once.
    timeout 120 "${M[@]}" --steps 40 --resume "$WORK/flipped.bin" >"$WORK/mpi-flipped.log" 2>&1
    rc=$?
    said=$(grep -c "flipped.bin is corrupt: the checksum of tensor" "$WORK/mpi-flipped.log")
    if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ] || [ "$said" -ne 1 ]; then
        fail "mpirun with a flipped checkpoint: exit $rc, the reason said $said times (expected 1)"
        sed 's/^/    /' "$WORK/mpi-flipped.log" >&2
    else
        echo "ok   mpirun with a flipped checkpoint fails (exit $rc), said once"
    fi
else
    echo "skip the MPI runs (HCOMM_WITH_MPI=${HCOMM_WITH_MPI:-OFF})"
fi

if [ "$failures" -ne 0 ]; then
    echo "test_train_ckpt: $failures failure(s)" >&2
    exit 1
fi
echo "test_train_ckpt: all checks passed"
