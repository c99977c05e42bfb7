#!/usr/bin/env bash
# hcomm-bench: every op on 3 ranks (a non-power of two) reports rows with zero wrong elements,
# busbw = algbw * the nccl-tests factor, and bad flags exit 2 with a message.
set -euo pipefail
bench=$1/hcomm-bench
fail() { echo "FAIL: $*"; exit 1; }

out=$(HCOMM_BACKEND=local timeout 120 "$bench" -n 3 -b 1K -e 64K -f 8 --iters 3)
echo "$out"
rows=$(echo "$out" | awk '!/^#/ && NF == 8' | wc -l)
[ "$rows" -eq 15 ] || fail "expected 15 rows (5 ops x 3 sizes), got $rows"
echo "$out" | awk '!/^#/ && NF == 8 && $8 != 0 {bad = 1} END {exit bad}' || fail "wrong elements reported"
# busbw / algbw per op with n = 3: all_reduce 4/3, broadcast 1, the others 2/3.
# Columns are printed to 3 decimals, hence the absolute slack of half a unit (plus 1%).
echo "$out" | awk '!/^#/ && NF == 8 {
    f = ($4 == "all_reduce") ? 4/3 : ($4 == "broadcast") ? 1 : 2/3
    d = $7 - f * $6; if (d < 0) d = -d
    if (d > 0.0015 + 0.01 * f * $6) { print "busbw " $7 " vs algbw " $6 " for " $4; bad = 1 }
} END {exit bad}' || fail "busbw is not algbw times the nccl-tests factor"

for args in "-e -1" "-b 8M -e 1K" "-f 2x" "--op gather" "--iters 0"; do
    set +e
    msg=$("$bench" $args 2>&1 >/dev/null)
    rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "hcomm-bench $args exited $rc, expected 2"
    [ -n "$msg" ] || fail "hcomm-bench $args printed no message"
done
# The message names the real problem.
expect_msg() {
    local want=$1
    shift
    set +e
    msg=$(timeout 30 "$bench" "$@" 2>&1 >/dev/null)
    rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "hcomm-bench $* exited $rc, expected 2"
    echo "$msg" | grep -qF -- "$want" || fail "hcomm-bench $*: '$msg' does not say '$want'"
}
expect_msg "unknown option --bogus" --bogus
expect_msg "unknown option --bogus" -n 2 --bogus 3
expect_msg "-n 0: out of range 1..1048576" -n 0
expect_msg "-n -3: out of range 1..1048576" -n -3
expect_msg "--iters 99999999999999: out of range 1..1048576" --iters 99999999999999
expect_msg "-n needs a value" -n
v=$("$bench" --version)
echo "$v" | grep -Eq '^hcomm-bench [0-9]+\.[0-9]+\.[0-9]+ \(hcomm library [0-9.]+; backends: local( mpi)?\)$' ||
    fail "--version: '$v'"
echo "bench test passed"
