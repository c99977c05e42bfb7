#!/usr/bin/env bash
# hcomm-bench cp_ring and cp_a2a: rows on 1 and 3 ranks (a non-power of two) with #wrong 0
# and busbw = algbw * the op's factor (ring 1, a2a (p-1)/p), the out-of-place column only, and
# each size's overlap line (exchange alone, the simulated compute, the exposed share). Columns
# in nccl-tests' order: size count type redop root, time algbw busbw #wrong out of place and in
# place, algo last.
set -euo pipefail
bench=$1/hcomm-bench
fail() { echo "FAIL: $*"; exit 1; }
export HCOMM_BACKEND=local

check() { # op p factor
    awk -v op="$1" -v f="$3" '
    !/^#/ && NF == 14 {
        n++
        if ($9 != "0") { print op ": #wrong " $9; bad = 1 }
        if ($10 != "N/A") { print op ": in-place measured"; bad = 1 }
        d = $8 - f * $7; if (d < 0) d = -d
        if (d > 0.0015 + 0.01 * f * $7) { print op ": busbw " $8 " vs algbw " $7; bad = 1 }
    }
    /overlap: exchange [0-9.]+ us alone; started, then a compute of [0-9.]+ us .* [0-9.]+ us exposed = [0-9.]+% of the exchange$/ { o++ }
    END { if (n == 0 || o != n) { print op ": " n " rows, " o " overlap lines"; bad = 1 } exit bad }'
}

for p in 1 3; do
    out=$(timeout 120 "$bench" cp_ring -t $p -b 8 -e 64K -f 16 -n 3 -w 1)
    echo "$out" | check cp_ring $p "$([ $p -gt 1 ] && echo 1 || echo 0)" || { echo "$out"; fail "cp_ring on $p"; }
    out=$(timeout 120 "$bench" cp_a2a -t $p -b 1K -e 256K -f 16 -n 3 -w 1)
    echo "$out" | check cp_a2a $p "$(awk -v p=$p 'BEGIN { print (p - 1) / p }')" ||
        { echo "$out"; fail "cp_a2a on $p"; }
done
echo "test_bench_cp: ok"
