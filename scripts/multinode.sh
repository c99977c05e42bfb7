#!/usr/bin/env bash
# Runs a command under mpirun across N simulated nodes on this machine: one Linux network
# namespace per node, each with its own host name (so Open MPI and hcomm see N hosts: TCP
# between nodes, shared memory within), joined by a bridge that lives in a namespace of its own
# (nothing is added to the host's network). Everything is torn down on every exit path.
#
#   scripts/multinode.sh [-n NODES] [-s SLOTS] [--rate RATE] [--mpirun-arg ARG]... -- CMD [ARGS]
#
#   -n NODES       nodes (default 2)          -s SLOTS   ranks per node (default 4)
#   --rate RATE    cap each node's link with tc tbf, e.g. 1gbit (this kernel has no netem
#                  delay, so latency cannot be added)
#   --mpirun-arg A passed to mpirun as it is (repeatable), e.g. --mpirun-arg=--mca
# Environment variables named HCOMM_* are forwarded to every rank (mpirun -x), as are PATH,
# LD_LIBRARY_PATH and the sanitizers' ASAN_OPTIONS, LSAN_OPTIONS, TSAN_OPTIONS and
# UBSAN_OPTIONS. Needs root (namespaces, host names, veth/bridge). Exit status: the command's;
# 77 when namespaces cannot be made here (the message says why).
# Notes and figures: docs/architecture.md (topo) and the pitfalls in this script's comments.
set -euo pipefail

nodes=2
slots=4
rate=""
extra=()
while [ $# -gt 0 ]; do
    case $1 in
    -n) nodes=$2; shift 2 ;;
    -s) slots=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --rate=*) rate=${1#*=}; shift ;;
    --mpirun-arg) extra+=("$2"); shift 2 ;;
    --mpirun-arg=*) extra+=("${1#*=}"); shift ;;
    --) shift; break ;;
    *) echo "multinode.sh: unknown option '$1' (see the usage at the top of $0)" >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "multinode.sh: no command given: multinode.sh [options] -- CMD" >&2; exit 2; }
case $nodes$slots in *[!0-9]*) echo "multinode.sh: -n and -s take positive integers" >&2; exit 2 ;; esac
[ "$nodes" -ge 1 ] && [ "$nodes" -le 64 ] && [ "$slots" -ge 1 ] ||
    { echo "multinode.sh: -n must be 1..64 and -s at least 1" >&2; exit 2; }

mpirun=$(command -v mpirun || true)
[ -n "$mpirun" ] || { echo "multinode.sh: mpirun not found (scripts/deps.sh installs Open MPI)" >&2; exit 77; }
if [ "$(id -u)" -ne 0 ]; then
    echo "multinode.sh: needs root for network namespaces and host names" >&2
    exit 77
fi

# Names unique to this run, so concurrent runs on one machine do not collide.
tag="hcmn$$"
net="10.$((($$ >> 8) % 200 + 20)).$(($$ % 250)).0"
prefix=${net%.0}
node_name() { echo "${tag}n$1"; }
work=$(mktemp -d)

# Teardown on every path: processes left in the namespaces (by PID), the namespaces (their
# veths go with them), and Open MPI's leftovers named after each node's host name.
teardown() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk -v t="$tag" 'index($1, t) == 1 {print $1}'); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -9 "$pid" 2>/dev/null || true
        done
        ip netns del "$ns" 2>/dev/null || true
    done
    for ((i = 0; i < nodes; i++)); do
        rm -rf /dev/shm/vader_segment."$(node_name "$i")".* /tmp/ompi."$(node_name "$i")".* 2>/dev/null || true
    done
    rm -rf "$work"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! ip netns add "${tag}br" 2>"$work/err"; then
    echo "multinode.sh: cannot create a network namespace here: $(cat "$work/err")" >&2
    exit 77
fi
if ! ip netns exec "${tag}br" unshare --uts true 2>"$work/err"; then
    echo "multinode.sh: cannot give a namespace its own host name: $(cat "$work/err")" >&2
    exit 77
fi
ip -n "${tag}br" link add br0 type bridge
ip -n "${tag}br" link set br0 up
for ((i = 0; i < nodes; i++)); do
    ns=$(node_name "$i")
    ip netns add "$ns"
    # The veth pair is made inside the namespaces: nothing appears in the host's.
    ip -n "$ns" link add eth0 type veth peer name "v$i" netns "${tag}br"
    ip -n "${tag}br" link set "v$i" master br0 up
    ip -n "$ns" addr add "$prefix.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    if [ -n "$rate" ]; then
        tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
    fi
    echo "$ns slots=$slots" >>"$work/hostfile"
done

# Open MPI starts remote daemons through this stand-in for ssh: "agent [opts] HOST CMD...".
# Environment variables do not travel that way (as with real ssh): mpirun -x carries them.
cat >"$work/agent" <<EOF
#!/usr/bin/env bash
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
exec ip netns exec "\$host" unshare --uts -- env -i PATH="$PATH" HOME="\${HOME:-/root}" \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" bash -c "hostname \$host && \$*"
EOF
chmod +x "$work/agent"

fwd=(-x PATH -x LD_LIBRARY_PATH -x OMPI_ALLOW_RUN_AS_ROOT=1 -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
for v in $(env | awk -F= '/^(HCOMM_|(A|L|T|UB)SAN_OPTIONS=)/ {print $1}'); do
    fwd+=(-x "$v")
done
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
# Pitfalls (measured here): without distinct host names Open MPI uses shared memory across the
# "nodes" and crashes; mpi_yield_when_idle keeps oversubscribed ranks from spinning (a 2x4
# training run took 122 s instead of 6 s without it); btl_tcp_progress_thread stalls.
args=(--hostfile "$work/hostfile" -np $((nodes * slots)) --oversubscribe --bind-to none
      --mca plm_rsh_agent "$work/agent" --mca plm_rsh_no_tree_spawn 1 --leave-session-attached
      --mca pml ob1 --mca btl self,vader,tcp --mca btl_tcp_if_include "$net/24"
      --mca oob_tcp_if_include "$net/24" --mca mpi_yield_when_idle 1 "${fwd[@]}")
first=$(node_name 0)
set +e
ip netns exec "$first" unshare --uts -- bash -c 'hostname "$0" && exec "$@"' "$first" \
    "$mpirun" "${args[@]}" ${extra[@]+"${extra[@]}"} "$@"
rc=$?
set -e
exit $rc
