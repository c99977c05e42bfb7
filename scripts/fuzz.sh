#!/usr/bin/env bash
# Runs the fuzzer (test/fuzz, docs/fuzz.md) for as long as asked, seed after seed, on an
# ASan+UBSan build it configures in build-fuzz/ (or a TSan build in build-fuzz-tsan/, local
# backend), and prints the total call count and every finding at the end. Corpus files of the
# findings land in build-fuzz/found/; copy the ones worth keeping to test/fuzz/corpus/.
#   scripts/fuzz.sh [--minutes M] [--backend local|mpi] [--np N] [--tsan] [--avoid LIST]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=15 backend=local np=3 tsan=0 avoid=""
while (($#)); do
    case $1 in
    --minutes) minutes=$2 && shift 2 ;;
    --backend) backend=$2 && shift 2 ;;
    --np) np=$2 && shift 2 ;;
    --tsan) tsan=1 && shift ;;
    --avoid) avoid=$2 && shift 2 ;;
    *) echo "fuzz.sh: unknown option $1 (see the top of scripts/fuzz.sh)" >&2 && exit 2 ;;
    esac
done
if ((tsan)); then
    dir=build-fuzz-tsan exe=hcomm_fuzz
    cmake -S . -B $dir -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHCOMM_SANITIZE=thread -DHCOMM_WITH_MPI=OFF >/dev/null
    export TSAN_OPTIONS=halt_on_error=1:abort_on_error=1
    backend=local
else
    dir=build-fuzz exe=hcomm_fuzz
    cmake -S . -B $dir -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHCOMM_SANITIZE=address,undefined >/dev/null
    export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:abort_on_error=1
fi
cmake --build $dir --target $exe -j "$(nproc)" >/dev/null
export HCOMM_TIMEOUT=${HCOMM_TIMEOUT:-20} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
found=$dir/found && mkdir -p $found
stamp=$(mktemp)
num() { # the figure named $1 in the totals line $2 (0 when the run died before it)
    local v
    v=$(sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$2")
    echo "${v:-0}"
}
end=$((SECONDS + minutes * 60)) calls=0 errors=0 checked=0 runs=0 failed=0
while ((SECONDS < end)); do
    left=$((end - SECONDS)) && ((left > 120)) && left=120
    log=$(mktemp)
    args=(--backend "$backend" --np "$np" --seconds "$left" --corpus-dir "$found")
    [ -n "$avoid" ] && args+=(--avoid "$avoid")
    if ! timeout -k 10 $((left + 200)) test/fuzz/run.sh "$dir/test/fuzz/$exe" "${args[@]}" >"$log" 2>&1; then
        failed=$((failed + 1))
        grep -E "^fuzz: (seed=|FAILED|FINDING)" "$log" | head -5
    fi
    line=$(grep -E "^fuzz: seed=[0-9]+ calls=" "$log" | tail -1 || true)
    calls=$((calls + $(num calls "$line"))) errors=$((errors + $(num errors "$line")))
    checked=$((checked + $(num ok_checked "$line")))
    runs=$((runs + 1))
    rm -f "$log"
done
echo "fuzz.sh: $backend$( ((tsan)) && echo " (TSan)"), $runs runs, $failed with findings: calls=$calls errors=$errors ok_checked=$checked"
for c in "$found"/*.txt; do # this run's findings only: earlier runs' files stay for reading
    [ "$c" -nt "$stamp" ] && echo "  $c: $(sed -n 's/^found=//p' "$c")"
done
rm -f "$stamp"
exit $((failed > 0))
