#!/usr/bin/env bash
# Real nodes on one machine (scripts/multinode.sh: network namespaces with their own host
# names, TCP between them): topology detection finds 2 nodes of 2 ranks from the host names,
# the cost model picks hier for a large all_reduce, hier and auto collectives are right across
# the nodes (test_hier --detect), and hcomm-train on 2 nodes x 4 ranks gives the per-step
# losses of the 1-rank run. Skipped (exit 77, with the reason) where namespaces cannot be made
# (not root, no CAP_SYS_ADMIN / CAP_NET_ADMIN) or hcomm was built without MPI.
set -uo pipefail
build=$1
src=$(cd "$(dirname "$0")/.." && pwd)
multinode=$src/scripts/multinode.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's init allocations read as leaks under LeakSanitizer, as in the other mpirun tests
# (multinode.sh forwards ASAN_OPTIONS to every rank).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset HCOMM_BACKEND
if [ "${HCOMM_WITH_MPI:-ON}" = "OFF" ]; then
    echo "test_multinode skipped: hcomm was built without MPI"
    exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

timeout 300 "$multinode" -n 2 -s 2 -- env HCOMM_BACKEND=mpi "$build/test/test_hier" --detect 2 2 \
    >"$work/detect.log" 2>&1
rc=$?
if [ "$rc" -eq 77 ]; then
    echo "test_multinode skipped: $(tail -n 1 "$work/detect.log")"
    exit 77
fi
cat "$work/detect.log"
[ "$rc" -eq 0 ] || { echo "FAIL: test_hier --detect on 2 nodes x 2 ranks exited $rc"; exit 1; }
grep -q "test_hier --detect: .* 0 failed" "$work/detect.log" || { echo "FAIL: no result line"; exit 1; }

steps=30
timeout 300 "$build/hcomm-train" --backend local --tp 1 --pp 1 --dp 1 --ep 1 --steps $steps \
    --log-every 50 --metrics "$work/ref.csv" >"$work/ref.log" 2>&1 ||
    { cat "$work/ref.log"; echo "FAIL: the 1-rank reference run failed"; exit 1; }
timeout 600 "$multinode" -n 2 -s 4 -- "$build/hcomm-train" --backend mpi --steps $steps \
    --log-every 50 --metrics "$work/2x4.csv" >"$work/2x4.log" 2>&1 ||
    { cat "$work/2x4.log"; echo "FAIL: hcomm-train on 2 nodes x 4 ranks failed"; exit 1; }
awk -F, -v steps=$steps '
    FNR == 1 { next }
    NR == FNR { ref[$1] = $2; next }
    {
        seen++; a = ref[$1]; d = a - $2; if (d < 0) d = -d; m = a < 0 ? -a : a
        rel = m > 0 ? d / m : d
        if (!($1 in ref) || rel > 1e-3 || $2 != $2) { printf "step %s: loss %s, 1-rank %s\n", $1, $2, a; bad++ }
        if (rel > worst) worst = rel
    }
    END {
        if (seen != steps) { printf "%d steps, expected %d\n", seen, steps; bad++ }
        if (!bad) printf "ok   hcomm-train 2 nodes x 4 ranks: %d steps, largest relative difference %.3g\n", seen, worst
        exit bad ? 1 : 0
    }' "$work/ref.csv" "$work/2x4.csv" || { echo "FAIL: 2x4 losses differ from the 1-rank run"; exit 1; }
echo "test_multinode: passed"
