#!/usr/bin/env bash
# Topology declared for the whole job, and the selection inputs every rank must share:
# - the tuning file is read (test_hier --tuning);
# - HCOMM_TOPO=nodes=2x2: on the local backend (its links simulated) and under mpirun -np 4,
#   hcomm_comm_node reports the declared nodes and hier runs (test_hier's HCOMM_TOPO mode);
# - a malformed HCOMM_TOPO, or one declaring other ranks than the world has, fails the launch
#   with a message naming the variable;
# - mpirun ranks with different HCOMM_ALGO, HCOMM_TOPO, tuning files, HCOMM_CHECK modes or
#   HCOMM_EAGER_LIMIT bytes fail at launch on every rank, naming the variable; HCOMM_TOPO and
#   HCOMM_ALGO by what they say, not their spelling.
set -euo pipefail
. "$(dirname "$0")/common.sh" # grep_all
build=$1
prog=$build/test/test_hier
fail() { echo "FAIL: $*"; exit 1; }
expect_fail() { # expect_fail MUST_SAY cmd...: the command fails and its output says MUST_SAY
    local say=$1
    shift
    set +e
    out=$(timeout 120 "$@" 2>&1)
    rc=$?
    set -e
    [ "$rc" -ne 0 ] || fail "$* succeeded; expected a failure saying: $say"
    echo "$out" | grep_all -F -- "$say" || { echo "$out" | tail -20; fail "$* did not say: $say"; }
}

"$prog" --tuning
HCOMM_BACKEND=local HCOMM_TOPO=nodes=2x2 timeout 300 "$prog"
expect_fail 'HCOMM_TOPO="torus": has an unknown field' env HCOMM_BACKEND=local HCOMM_TOPO=torus "$prog"
expect_fail 'HCOMM_TOPO="nodes=2x3" declares 6 ranks but the world has 4' \
    env HCOMM_BACKEND=local HCOMM_TOPO=nodes=2x3 "$prog"

if [ "${HCOMM_WITH_MPI:-ON}" = "OFF" ] || [ -z "${MPIEXEC:-}" ]; then
    echo "mpi parts skipped: hcomm built without MPI"
    exit 0
fi
mpi=("$MPIEXEC" --oversubscribe)
# Open MPI's own allocations at init are not freed by design: no leak checks under mpirun.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
HCOMM_BACKEND=mpi timeout 300 "${mpi[@]}" -np 4 -x HCOMM_TOPO=nodes=2x2 "$prog"
tuning=$(mktemp)
trap 'rm -f "$tuning"' EXIT
echo "inter.bw_GBps = 3" >"$tuning"
export HCOMM_BACKEND=mpi
expect_fail 'HCOMM_TOPO="nodes=2x2" declares 4 ranks but the world has 2' "${mpi[@]}" -np 2 \
    -x HCOMM_TOPO=nodes=2x2 "$prog"
expect_fail "HCOMM_ALGO differs between rank 0 and rank 1" "${mpi[@]}" \
    -np 1 env HCOMM_ALGO=allreduce:ring "$prog" : -np 1 env HCOMM_ALGO=allreduce:rhd "$prog"
# what HCOMM_ALGO allows, not its spelling
HCOMM_BACKEND=mpi timeout 300 "${mpi[@]}" -np 1 env HCOMM_ALGO="allreduce:ring" "$prog" : \
    -np 1 env HCOMM_ALGO=" all_reduce : ring ;" "$prog"
expect_fail "HCOMM_TOPO differs between rank 0 and rank 1" "${mpi[@]}" \
    -np 1 env HCOMM_TOPO=mesh "$prog" : -np 1 "$prog"
expect_fail "HCOMM_TUNING_FILE differs between rank 0 and rank 1 (the files' contents)" \
    "${mpi[@]}" -np 1 env HCOMM_TUNING_FILE="$tuning" "$prog" : -np 1 "$prog"
expect_fail "HCOMM_CHECK differs between rank 0 and rank 1" "${mpi[@]}" \
    -np 1 env HCOMM_CHECK=off "$prog" : -np 1 "$prog"
# eager messages larger than a peer's receive buffers would be cut short: the bytes must agree
expect_fail "HCOMM_EAGER_LIMIT differs between rank 0 and rank 1 (256 bytes on rank 0 but 8192 on rank 1)" "${mpi[@]}" \
    -np 1 env HCOMM_EAGER_LIMIT=256 "$prog" : -np 1 env HCOMM_EAGER_LIMIT=8K "$prog"
# the bytes, not the text: unset and 8192 are one setting
HCOMM_BACKEND=mpi timeout 300 "${mpi[@]}" -np 1 env HCOMM_EAGER_LIMIT=8192 "$prog" : -np 1 "$prog"
# the mode, not the text: unset and "always" are one setting
HCOMM_BACKEND=mpi timeout 300 "${mpi[@]}" -np 1 env HCOMM_CHECK=always "$prog" : -np 1 "$prog"
# what HCOMM_TOPO declares, not its text: two spellings of one machine agree, two machines do not
# (neither text starts with "nodes=2x2", which would make test_hier run its collectives)
HCOMM_BACKEND=mpi timeout 300 "${mpi[@]}" -np 2 env HCOMM_TOPO="nodes=2,2;inter=10us,1GB/s" \
    "$prog" : -np 2 env HCOMM_TOPO=" inter = 10us , 1GB/s ; nodes=2x2 ;" "$prog"
expect_fail "HCOMM_TOPO differs between rank 0 and rank 1" "${mpi[@]}" \
    -np 1 env HCOMM_TOPO="nodes=1,3" "$prog" : -np 3 env HCOMM_TOPO="nodes=2x2" "$prog"
echo "test_topo_env: passed"
