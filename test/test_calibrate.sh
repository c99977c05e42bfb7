#!/usr/bin/env bash
# hcomm-bench --calibrate and the tuning file it writes:
# - on 2 local ranks (one node) it writes the intra class and the reduction rate, and no inter
#   latency or bandwidth; the file parses: a collective run with HCOMM_TUNING_FILE=FILE on a
#   declared mesh succeeds, and its debug log shows the cost model's estimates from it;
# - on the simulated HCOMM_TOPO=nodes=2x4 it also writes the inter class, and a run reading it
#   succeeds;
# - with a tuning file whose inter-node bandwidth is 10x below the intra one, auto picks hier
#   for all_reduce at 1 and 2 MiB on the simulated 2x4 machine (a choice, not a timing);
# - a malformed tuning file fails the run with a message naming its line (also values whose
#   time is not finite and nonzero, and a directory); a long comment line is fine; --calibrate
#   with an unwritable FILE exits 2 before running; FILE a symbolic link stays one;
# - under mpirun -np 2 every rank writes the same file and a run reading it succeeds; nodes
#   that HCOMM_TOPO declares on one host get no inter class (mpi does not simulate them).
set -euo pipefail
. "$(dirname "$0")/common.sh" # grep_all
bench=$1/hcomm-bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export HCOMM_BACKEND=local
has() { grep -Eq "^$2 = [0-9.e+-]+$" "$1" || { cat "$1"; fail "$1 has no line $2 = NUMBER"; }; }
hasnt() { ! grep -q "^$2 " "$1" || { cat "$1"; fail "$1 has a line $2"; }; }

# 1. Two local ranks: one node.
out=$(timeout 120 "$bench" --calibrate "$tmp/one.txt" -t 2) || fail "--calibrate -t 2: $out"
echo "$out"
for k in intra.alpha_us intra.bw_GBps intra.reduce_GBps inter.reduce_GBps; do has "$tmp/one.txt" "$k"; done
for k in inter.alpha_us inter.bw_GBps; do hasnt "$tmp/one.txt" "$k"; done
echo "$out" | grep_all "^# intra: alpha [0-9.]* us, beta .* GB/s" || fail "no intra fit printed"
echo "$out" | grep_all "^# wrote $tmp/one.txt:" || fail "no 'wrote' line"
log=$(HCOMM_TUNING_FILE="$tmp/one.txt" HCOMM_TOPO=mesh HCOMM_LOG_LEVEL=debug timeout 120 \
    "$bench" all_reduce -t 2 -b 64K -e 64K -n 2 -w 1 2>&1) || { echo "$log" | tail; fail "run with the calibrated file"; }
echo "$log" | grep_all "cost model for allreduce of about [0-9]* bytes on 2 ranks.*native=[0-9.e+]* us" ||
    { echo "$log" | tail; fail "the debug log shows no estimates"; }
echo "$log" | grep_all "(cost model, estimate [0-9.e+]* us)" || fail "no per-call estimate logged"

# 2. The simulated 2 nodes x 4 ranks: both classes.
out=$(HCOMM_TOPO=nodes=2x4 timeout 300 "$bench" --calibrate="$tmp/two.txt" -t 8) ||
    fail "--calibrate on nodes=2x4: $out"
echo "$out" | grep "^# inter: alpha"
for k in intra.alpha_us intra.bw_GBps inter.alpha_us inter.bw_GBps inter.reduce_GBps; do has "$tmp/two.txt" "$k"; done
HCOMM_TUNING_FILE="$tmp/two.txt" HCOMM_TOPO=nodes=2x4 timeout 300 "$bench" all_reduce -t 8 \
    -b 1K -e 1M -f 32 -n 2 -w 0 | grep_all "^# Avg bus bandwidth" || fail "run reading the 2x4 file"

# 3. Inter-node bandwidth 10x below intra: hier from 1 MiB (every rank checks its values).
printf 'intra.alpha_us = 2\nintra.bw_GBps = 10\ninter.alpha_us = 20\ninter.bw_GBps = 1\n' >"$tmp/slow.txt"
out=$(HCOMM_TUNING_FILE="$tmp/slow.txt" HCOMM_TOPO=nodes=2x4 timeout 300 "$bench" all_reduce \
    -t 8 -b 1M -e 2M -f 2 -n 1 -w 0)
n=$(echo "$out" | awk '!/^#/ && NF == 14 && $14 == "auto(hier)" && $9 == 0' | wc -l)
[ "$n" -eq 2 ] || { echo "$out"; fail "auto did not pick hier at 1 and 2 MiB"; }

# 4. A malformed file names its line; an unwritable FILE stops before the run.
printf 'intra.alpha_us = 2\n# fine\nintra.bw_GBps = fast\n' >"$tmp/bad.txt"
set +e
out=$(HCOMM_TUNING_FILE="$tmp/bad.txt" timeout 60 "$bench" all_reduce -t 2 -b 8 -e 8 -n 1 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "a malformed tuning file was accepted"
echo "$out" | grep_all "HCOMM_TUNING_FILE=\"$tmp/bad.txt\" line 3 is not" || { echo "$out"; fail "no line number"; }
# Values with no finite, nonzero seconds (per byte), and a directory, are refused too (they
# were taken: the model's estimates went infinite, or the defaults ran, without a word); a
# comment line longer than any buffer is one line (it was split, the rest refused as line 2).
refused() { # FILE WHAT
    set +e
    out=$(HCOMM_TUNING_FILE="$1" timeout 60 "$bench" all_reduce -t 2 -b 8 -e 8 -n 1 2>&1)
    rc=$?
    set -e
    [ "$rc" -ne 0 ] && echo "$out" | grep_all "HCOMM_TUNING_FILE=\"$1\" $2" ||
        { echo "$out"; fail "HCOMM_TUNING_FILE=$1: rc $rc, expected a refusal '$2'"; }
}
printf 'intra.alpha_us = 2\ninter.bw_GBps = 1e-320\n' >"$tmp/tiny.txt"
refused "$tmp/tiny.txt" "line 2 is not"
printf 'intra.reduce_GBps = 1e300\n' >"$tmp/huge.txt"
refused "$tmp/huge.txt" "line 1 is not"
# A key set twice (the later one won), a latency over 1 s (every simulated message waited on
# it until HCOMM_TIMEOUT) and a file that sets nothing are refused too.
printf 'intra.alpha_us = 2\nintra.alpha_us = 3\n' >"$tmp/twice.txt"
refused "$tmp/twice.txt" "line 2 is not"
printf 'inter.alpha_us = 1e300\n' >"$tmp/slowlink.txt"
refused "$tmp/slowlink.txt" "line 1 is not"
printf '# only a comment\n' >"$tmp/empty.txt"
refused "$tmp/empty.txt" "sets nothing"
mkdir "$tmp/adir"
refused "$tmp/adir" "cannot be read: Is a directory"
{ printf '# '; printf 'x%.0s' $(seq 700); printf '\nintra.alpha_us = 2\n'; } >"$tmp/long.txt"
HCOMM_TUNING_FILE="$tmp/long.txt" timeout 60 "$bench" all_reduce -t 2 -b 8 -e 8 -n 1 >/dev/null ||
    fail "a 700-character comment line was refused"
set +e
out=$(timeout 60 "$bench" --calibrate "$tmp/no/such/dir/f.txt" -t 2 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] && echo "$out" | grep_all "cannot write the file" || { echo "$out"; fail "unwritable FILE: rc $rc"; }

# A symbolic link as FILE stays a link and its target gets the text (the rename replaced the
# link by a regular file; it would have replaced /dev/null alike).
echo old >"$tmp/target.txt"
ln -s "$tmp/target.txt" "$tmp/link.txt"
timeout 120 "$bench" --calibrate "$tmp/link.txt" -t 2 >/dev/null || fail "--calibrate to a link"
[ -L "$tmp/link.txt" ] || fail "--calibrate replaced the symbolic link FILE by a file"
has "$tmp/target.txt" intra.bw_GBps

if [ "${HCOMM_WITH_MPI:-ON}" = "OFF" ] || [ -z "${MPIEXEC:-}" ]; then
    echo "mpi parts skipped: hcomm built without MPI"
    echo "test_calibrate: passed"
    exit 0
fi
# 5. mpirun -np 2: the file from the job, then a job reading it (hcomm_launch compares the
#    file's contents across ranks, so a file differing between ranks would fail here).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
mpi=("$MPIEXEC" --oversubscribe -np 2 -x HCOMM_BACKEND=mpi)
out=$(timeout 120 "${mpi[@]}" "$bench" --calibrate "$tmp/mpi.txt") || fail "mpi --calibrate: $out"
echo "$out" | grep "^# intra: alpha"
has "$tmp/mpi.txt" intra.bw_GBps
HCOMM_TUNING_FILE="$tmp/mpi.txt" timeout 120 "${mpi[@]}" -x HCOMM_TUNING_FILE "$bench" all_reduce \
    -b 8 -e 1M -f 64 -n 2 -w 1 | grep_all "^# Avg bus bandwidth" || fail "mpi run reading the file"
# 6. Nodes declared by HCOMM_TOPO on one host: mpi does not simulate their links, so no inter
#    class is written (it wrote the shared-memory link's figures as inter-node ones).
out=$(HCOMM_TOPO=nodes=1,1 timeout 120 "${mpi[@]}" -x HCOMM_TOPO "$bench" --calibrate "$tmp/decl.txt") ||
    fail "mpi --calibrate with declared nodes: $out"
echo "$out" | grep "^# inter: not measured (the ranks HCOMM_TOPO puts on other nodes share" ||
    { echo "$out"; fail "no note that the declared nodes share a host"; }
for k in inter.alpha_us inter.bw_GBps; do hasnt "$tmp/decl.txt" "$k"; done
echo "test_calibrate: passed"
