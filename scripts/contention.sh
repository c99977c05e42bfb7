#!/usr/bin/env bash
# The 8 B all_reduce of 2 ranks beside N busy processes (a loop each on the same cores), on
# both backends, one table: how far a wait degrades when the ranks share their cores with other
# work. Uses an existing build (default build/; BUILD=dir to change).
#   scripts/contention.sh [N...]        (default: 0 2 4 6)
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${BUILD:-build}/hcomm-bench
[ -x "$bench" ] || { echo "contention.sh: $bench not built (cmake --build ${BUILD:-build})" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
counts=("$@")
((${#counts[@]})) || counts=(0 2 4 6)
tmp=$(mktemp -d)
busy=()
stop_busy() { # a killed loop's wait status is nonzero: not a failure of this script
    if ((${#busy[@]})); then
        kill "${busy[@]}" 2>/dev/null || true
        wait "${busy[@]}" 2>/dev/null || true
    fi
    busy=()
}
trap 'stop_busy; rm -rf "$tmp"' EXIT

# The median time (us) of auto's 8 B all_reduce out of place, from the bench's --json.
time_of() {
    /usr/bin/python3 -c 'import json,sys
rows=[r for r in json.load(open(sys.argv[1])) if r.get("algo")=="auto" and not r["inplace"]]
print("%.2f" % rows[0]["time_us"] if rows else "n/a")' "$1"
}

run_local() { timeout 300 "$bench" all_reduce -t 2 -b 8 -e 8 -n 200 --json "$tmp/l.json" >/dev/null 2>&1 && time_of "$tmp/l.json" || echo failed; }
run_mpi() { timeout 300 mpirun --oversubscribe -np 2 "$bench" all_reduce -b 8 -e 8 -n 200 --json "$tmp/m.json" >/dev/null 2>&1 && time_of "$tmp/m.json" || echo failed; }

printf "# 8 B all_reduce, 2 ranks, median us (hcomm-bench auto), beside N busy processes on %s cores\n" "$(nproc)"
printf "%6s %12s %12s\n" busy local mpi
for n in "${counts[@]}"; do
    for _ in $(seq 1 "$n"); do
        (while :; do :; done) &
        busy+=($!)
    done
    printf "%6s %12s %12s\n" "$n" "$(run_local)" "$(run_mpi)"
    stop_busy
done
