#!/usr/bin/env bash
# hcomm-bench, checked on what it prints and writes:
# - every op on 3 ranks (a non-power of two) gives rows with #wrong 0 in each column it measures,
#   N/A exactly where the op has no such form, and busbw = algbw * the nccl-tests factor;
# - counts are rounded only where the collective needs it, -c 0 prints N/A, and a spoiled
#   output (HCOMM_BENCH_CORRUPT=1) and a reversed block (=2) are counted as wrong (the check can
#   fail); -b 0 gives a row of empty calls, and sizes that round alike run once;
# - --algo all: a row per valid algorithm plus auto naming its choice, the regret line, and a
#   --json array / -F CSV whose records agree with the table (python3 reads them); --plot;
# - under mpirun -np 2: raw MPI rows and hcomm/raw;
# - bad options exit 2 with a message that names the problem.
set -euo pipefail
. "$(dirname "$0")/common.sh" # grep_all
bench=$1/hcomm-bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
export HCOMM_BACKEND=local

# Data rows have 14 fields: size count type redop root, time algbw busbw #wrong twice (nccl-tests'
# order), then algo.
rows() { awk '!/^#/ && NF == 14'; }

# busbw/algbw per op on p ranks (nccl-tests): all_reduce 2(p-1)/p; broadcast, reduce, send_recv
# 1; the others (p-1)/p. Columns have 3 decimals: slack of 0.0015 plus 1%.
check_rows() { # op p placement(both|oop|ip)
    local op=$1 p=$2 place=$3
    awk -v op="$op" -v p="$p" -v place="$place" '
    function factor(o) {
        if (o ~ /all_reduce$/) return 2 * (p - 1) / p
        if (o == "broadcast" || o == "reduce" || o == "pp_send_recv") return 1
        return (p - 1) / p
    }
    function half(t, a, b, w, name,   d) {
        if (t == "N/A") { print op " " name ": no figures"; bad = 1; return }
        if (w != "0") { print op " " name ": #wrong " w; bad = 1 }
        d = b - factor(op) * a; if (d < 0) d = -d
        if (d > 0.0015 + 0.01 * factor(op) * a) { print op " " name ": busbw " b " vs algbw " a; bad = 1 }
    }
    !/^#/ && NF == 14 {
        n++
        if (place != "ip") half($6, $7, $8, $9, "out-of-place"); else if ($6 != "N/A") { print op ": out-of-place measured"; bad = 1 }
        if (place != "oop") half($10, $11, $12, $13, "in-place"); else if ($10 != "N/A") { print op ": in-place measured"; bad = 1 }
    }
    END { if (n == 0) { print op ": no rows"; bad = 1 } exit bad }'
}

# 1. Every op, 3 ranks, sizes 8 B .. 4 KiB.
for spec in all_reduce:both all_gather:both reduce_scatter:both broadcast:ip reduce:both \
    gather:both scatter:both all_to_all:oop all_to_allv:oop all_gatherv:both \
    reduce_scatterv:both tp_all_reduce:both tp_all_gather:oop tp_reduce_scatter:both \
    pp_send_recv:oop dp_all_reduce:ip; do
    op=${spec%%:*}
    out=$(timeout 120 "$bench" "$op" -t 3 -b 8 -e 4K -f 8 -n 2 -w 1 -r 2)
    echo "$out" | check_rows "$op" 3 "${spec##*:}" || { echo "$out"; fail "$op rows"; }
    n=$(echo "$out" | rows | awk '$14 ~ /^auto/' | wc -l)
    [ "$n" -eq 4 ] || fail "$op: $n auto rows, expected 4 (8 B to 4 KiB by 8)"
done
out=$(timeout 120 "$bench" moe_dispatch_combine -t 3 -b 64 -e 4K -f 8 -n 2 -w 1 --moe-hidden 32 \
    --moe-experts 6 --moe-topk 2)
echo "$out"
echo "$out" | check_rows moe_dispatch_combine 3 oop || fail "moe rows"
echo "$out" | rows | awk '$14 == "baseline" {b++} END {exit b != 3}' || fail "moe: no baseline rows"
# the all_to_allv inside the dispatch is no row of this table: auto names no choice
echo "$out" | rows | awk '$14 == "auto" {a++} END {exit a != 3}' || fail "moe: auto rows"
echo "$out" | grep_all "out-of-place: auto/baseline [0-9.]* busbw/memcpy [0-9.]* memcpy [0-9.]* GB/s$" ||
    fail "moe: auto/baseline"
# T = 64 B / (32 * 2 B) = 1 token of k = 2 rows of 64 B: 128 B received per rank on average
echo "$out" | grep_all "received 128 B per rank (mean): auto [0-9.]* GB/s baseline [0-9.]* GB/s$" ||
    fail "moe: received bytes line"
# one dropless dispatch: one count exchange and one token exchange, no agreement (rows of 64 B)
[ "$(echo "$out" | grep -c "permute [0-9.]* GB/s ([0-9]*% of memcpy), unpermute [0-9.]* GB/s \
([0-9]*%), memcpy [0-9.]* GB/s: [0-9]* rows of 64 B, every rank at once; one dispatch: 2 collective \
calls on the EP group (count and token exchange), 0 signature agreements$")" -eq 3 ] ||
    fail "moe: permutation and call-count line"
out=$(timeout 60 "$bench" pp_send_recv -t 2 -b 1K -e 1K -n 2)
echo "$out" | rows | awk '$14 == "p2p" && $9 == 0 {n++} END {exit n != 1}' || fail "pp_send_recv: p2p row"

# Every dtype and reduction of reduce_scatterv (uneven blocks) is right.
for d in f32 f64 f16 bf16 i8 u8 i32 i64; do
    for o in sum prod max min avg; do
        out=$(timeout 60 "$bench" reduce_scatterv -t 3 -b 8 -e 100 -f 11 -n 1 -w 0 -d $d -o $o)
        echo "$out" | check_rows reduce_scatterv 3 both || { echo "$out"; fail "-d $d -o $o"; }
        echo "$out" | rows | awk -v d=$d -v o=$o '$3 != d || $4 != o {exit 1}' || fail "type/redop columns for $d $o"
    done
done

# 2. Counts: rounded only where the collective needs it.
count_of() { timeout 60 "$bench" "$@" -n 1 -w 0 | rows | awk 'NR == 1 {print $2 " " $1}'; }
[ "$(count_of all_reduce -t 8 -b 8 -e 8)" = "2 8" ] || fail "all_reduce -b 8 on 8 ranks: $(count_of all_reduce -t 8 -b 8 -e 8)"
[ "$(count_of all_gatherv -t 3 -b 20 -e 20)" = "5 20" ] || fail "all_gatherv -b 20 on 3 ranks"
[ "$(count_of all_gather -t 3 -b 40 -e 40)" = "9 36" ] || fail "all_gather -b 40 on 3 ranks: a multiple of 3"
[ "$(count_of all_gather -t 3 -b 4 -e 4)" = "3 12" ] || fail "all_gather -b 4 on 3 ranks: one element each"
timeout 60 "$bench" all_gather -t 3 -b 4 -e 4 -n 1 -w 0 |
    grep -q '^# -e 4 B is below the smallest all_gather call on 3 ranks: timed at 12 B$' ||
    fail "all_gather -e 4 on 3 ranks: no note on the row above -e"
[ "$(count_of all_reduce -t 2 -b 8 -e 8 -d f64)" = "1 8" ] || fail "f64 all_reduce of 8 B"
[ "$(count_of all_reduce -t 2 -b 6 -e 6 -d f16)" = "3 6" ] || fail "f16 all_reduce of 6 B"
sizes=$(timeout 60 "$bench" all_reduce -t 2 -b 1K -e 4K -i 1K -n 1 -w 0 | rows | awk '{printf "%s ", $1}')
[ "$sizes" = "1024 2048 3072 4096 " ] || fail "-i 1K: sizes $sizes"

# compare: -b/-e/-f choose its pp_send_recv sizes, -n its iterations.
out=$(timeout 120 "$bench" compare -t 2 -b 8 -e 512 -f 8 -n 3)
echo "$out"
[ "$(echo "$out" | awk '/pp_send_recv/ {on = 1; next} on && !/^#/ {printf "%s ", $1}')" = "8 64 512 " ] ||
    fail "compare -b 8 -e 512 -f 8: pp_send_recv sizes"
echo "$out" | grep -q '^all_reduce 8 B *hcomm' || fail "compare: all_reduce row"
# each size flag alone: the others keep compare's own (8 B, 64 MiB, x8)
out=$(timeout 120 "$bench" compare -t 2 -e 64 -n 2)
[ "$(echo "$out" | awk '/pp_send_recv/ {on = 1; next} on && !/^#/ {printf "%s ", $1}')" = "8 64 " ] ||
    fail "compare -e 64: pp_send_recv sizes"

# -c 0: no check, #wrong N/A; a spoiled output is counted.
timeout 60 "$bench" all_reduce -t 2 -b 8 -e 64 -c 0 -n 1 | rows | awk '$9 != "N/A" || $13 != "N/A" {exit 1}' ||
    fail "-c 0 must print N/A for #wrong"
HCOMM_BENCH_CORRUPT=1 timeout 60 "$bench" all_reduce -t 2 -b 8 -e 64 -n 1 | rows |
    awk '$9 == 0 || $13 == 0 {exit 1}' || fail "a spoiled output was not counted as wrong"
# Misplaced data shows too: on 5 ranks a periodic input made every element of a reduce_scatter
# block alike, so a reversed block (HCOMM_BENCH_CORRUPT=2) passed as 0 wrong.
for o in sum max prod; do
    HCOMM_BENCH_CORRUPT=2 timeout 60 "$bench" reduce_scatter -t 5 -b 1K -e 1K -n 1 -o $o | rows |
        awk '$9 == 0 || $13 == 0 {exit 1}' || fail "a reversed block was not counted as wrong ($o)"
done

# -b 0: one row of empty calls, then 1 element; sizes that round alike run once.
out=$(timeout 60 "$bench" all_reduce -t 3 -b 0 -e 16 -f 4 -n 1 -w 0 | rows)
[ "$(echo "$out" | awk '{printf "%s:%s ", $1, $2}')" = "0:0 4:1 16:4 " ] || fail "-b 0: $out"
out=$(timeout 60 "$bench" all_gather -t 7 -b 1 -e 1000 -f 5 -n 1 -w 0 | rows | awk '{print $1}')
[ "$(echo "$out" | sort | uniq -d)" = "" ] || fail "repeated sizes: $out"
# -r is for rooted ops only.
timeout 60 "$bench" all_reduce -t 3 -r 99 -b 8 -e 8 -n 1 | rows | grep -q . || fail "all_reduce -r 99"

# 3. --algo all, --json, -F and --plot (K/M suffixes and --flag=value forms).
out=$(timeout 120 "$bench" all_reduce --ranks=3 -b 8 -e 64K -f 64 --iters=2 -w 1 --algo all \
    --json "$tmp/b.json" -F "$tmp/b.csv")
echo "$out"
echo "$out" | check_rows all_reduce 3 both || fail "--algo all rows"
for a in native rd ring rhd naive; do
    n=$(echo "$out" | rows | awk -v a=$a '$14 == a' | wc -l)
    [ "$n" -eq 3 ] || fail "--algo all: $n rows of $a, expected 3"
done
echo "$out" | rows | awk '$14 ~ /^auto\(.+\)$/ {n++} END {exit n != 3}' || fail "auto rows must name their choice"
[ "$(echo "$out" | grep -c 'out-of-place: regret [0-9.]* (best [a-z]*) busbw/memcpy [0-9.]* in-place: regret [0-9.]* (best [a-z]*) busbw/memcpy [0-9.]* memcpy [0-9.]* GB/s$')" -eq 3 ] ||
    fail "a regret line per size"
echo "$out" | grep_all '^# memcpy, every rank copying at once: 1048576 B in' || fail "memcpy line"
echo "$out" | grep_all '^# Avg bus bandwidth    : [0-9.]*$' || fail "average busbw line"
"$PY" - "$tmp/b.json" "$tmp/b.csv" <<'EOF' || fail "json/csv records"
import csv, json, sys
recs = json.load(open(sys.argv[1]))
assert recs[0]["op"] == "memcpy" and recs[0]["dtype"] == "u8" and recs[0]["busbw"] > 0, recs[0]
rows = [r for r in recs if r["op"] == "all_reduce"]
algos = {r["algo"] for r in rows}
assert {"native", "rd", "ring", "rhd", "naive", "auto"} <= algos, algos
assert len(rows) == 3 * len(algos) * 2, len(rows)  # sizes x (algorithms + auto) x placements
keys = {"op", "algo", "bytes", "count", "dtype", "world", "inplace", "time_us", "algbw", "busbw", "wrong"}
for r in rows:
    assert keys <= set(r), r
    assert r["world"] == 3 and r["dtype"] == "f32" and r["wrong"] == 0, r
    assert r["bytes"] == 4 * r["count"] and r["time_us"] > 0 and r["memcpy_gbs"] > 0, r
    assert abs(r["algbw"] - r["bytes"] / r["time_us"] / 1e3) <= 1e-3 * r["algbw"] + 1e-6, r
    assert abs(r["busbw"] - r["algbw"] * 4 / 3) <= 1e-4 * r["busbw"] + 1e-6, r
    assert (r["algo"] == "auto") == ("chosen" in r), r
    if r["algo"] == "auto":
        assert r["chosen"] in algos - {"auto"}, r
assert sorted({r["bytes"] for r in rows}) == [8, 512, 32768], {r["bytes"] for r in rows}
assert {r["inplace"] for r in rows} == {True, False}
c = list(csv.DictReader(open(sys.argv[2])))
assert len(c) == len(recs) and c[1]["algo"] == recs[1]["algo"], (len(c), len(recs))
for j, r in zip(c, recs):  # the JSON record's fields, one column each
    assert float(j["memcpy_gbs"]) == round(r["memcpy_gbs"], 6), (j, r)
    assert (j["regret"] != "") == ("regret" in r) and j["best"] == r.get("best", ""), (j, r)
EOF
# A named algorithm that falls back to another row's (local has no board for shm, and no
# native scatter: both run direct) is shown as NAME->RAN, recorded with "ran", and is never
# regret's best: it is a second sample of direct.
out=$(timeout 120 "$bench" scatter -t 3 -b 96 -e 96K -f 1024 -n 3 -w 1 --algo all \
    --json "$tmp/f.json")
echo "$out"
[ "$(echo "$out" | rows | awk '$14 == "shm->direct" || $14 == "native->direct"' | wc -l)" -eq 4 ] ||
    fail "scatter on local: shm and native rows must name the direct they ran"
echo "$out" | grep -q 'regret [0-9.]* (best \(shm\|native\))' && fail "regret against a fallback"
"$PY" - "$tmp/f.json" <<'EOF' || fail "fallback json records"
import json, sys
recs = [r for r in json.load(open(sys.argv[1])) if r["op"] == "scatter"]
ran = {r["algo"]: r.get("ran") for r in recs}
assert ran["shm"] == "direct" and ran["native"] == "direct", ran
assert ran["direct"] is None and ran["tree"] is None and ran["auto"] is None, ran
assert all(r.get("best") in ("direct", "tree") for r in recs if r["algo"] == "auto"), recs
EOF
# Two ops in one run: every record names an algorithm of its own op (the table's rows).
timeout 120 "$bench" all_reduce broadcast -t 3 -b 1K -e 1K -n 2 -w 1 --algo all \
    --json "$tmp/two.json" >/dev/null || fail "two ops in one run"
"$PY" - "$tmp/two.json" <<'EOF' || fail "two ops: json records"
import json, sys
ok = {"all_reduce": {"native", "rd", "ring", "rhd", "naive", "auto"},
      "broadcast": {"native", "tree", "chain", "scatter_allgather", "rd", "auto"}}
recs = [r for r in json.load(open(sys.argv[1])) if r["op"] != "memcpy"]
for op, want in ok.items():
    other = [o for o in ok if o != op][0]
    got = {r["algo"] for r in recs if r["op"] == op}
    assert want <= got and not got & (ok[other] - ok[op]), (op, got)
EOF

if command -v gnuplot >/dev/null; then
    timeout 60 "$bench" all_gather -t 2 -b 1K -e 4K -n 1 --algo=all --plot "$tmp/b.png" >/dev/null
    head -c 8 "$tmp/b.png" | od -An -c | grep_all 'P   N   G' || fail "--plot wrote no PNG"
fi
msg=$(PATH=/nonexistent "$bench" --plot "$tmp/x.png" 2>&1 >/dev/null) && fail "--plot without gnuplot ran"
echo "$msg" | grep_all "needs gnuplot" || fail "--plot without gnuplot: '$msg'"

# A simulated 2 x 2 machine: native, twoshot and shm load peers' memory outside the simulated links,
# so they are named as such and never taken as regret's best (hier is the fastest that pays them).
out=$(HCOMM_TOPO='nodes=2x2;intra=1us,10GB/s;inter=10us,0.1GB/s' timeout 120 "$bench" all_reduce \
    -t 4 -b 256K -e 256K -n 2 -w 1 --algo all)
echo "$out" | grep_all '^# native, twoshot, shm: direct loads outside the simulated links' ||
    fail "simulated topology: no note naming the algorithms that bypass its links"
echo "$out" | grep_all 'regret [0-9.]* (best \(native\|twoshot\|shm\))' &&
    fail "simulated topology: regret against an algorithm that bypasses its links"
echo "$out" | grep_all 'out-of-place: regret [0-9.]* (best [a-z]*)' || fail "simulated topology: regret"

# all_to_all --algo all: a checked row per all_to_allv algorithm and size, auto naming its choice.
out=$(timeout 120 "$bench" all_to_all --ranks=3 -b 8 -e 64K -f 64 -n 2 -w 1 -c 1 --algo all)
for a in native pairwise bruck direct hier; do
    n=$(echo "$out" | rows | awk -v a=$a '$14 == a && $9 == 0' | wc -l)
    [ "$n" -eq 3 ] || { echo "$out"; fail "all_to_all --algo all: $n checked rows of $a, expected 3"; }
done
echo "$out" | rows | awk '$14 ~ /^auto\(.+\)$/ {n++} END {exit n != 3}' || fail "all_to_all auto rows"

# 4. Under mpirun -np 2: raw MPI rows beside hcomm's, and hcomm/raw.
if [ "${HCOMM_WITH_MPI:-OFF}" = "ON" ] && command -v "${MPIEXEC:-mpirun}" >/dev/null; then
    # Open MPI's init allocations read as leaks under LeakSanitizer, as in the other mpirun tests
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    out=$(HCOMM_BACKEND=mpi timeout 120 "${MPIEXEC:-mpirun}" --oversubscribe -np 2 "$bench" all_reduce \
        -b 8 -e 32K -f 64 -n 2 -w 1 --algo all --json "$tmp/m.json")
    echo "$out"
    echo "$out" | grep_all '^# all_reduce, 2 ranks on mpi$' || fail "mpirun: header"
    echo "$out" | grep_all '^# buffers from hcomm_mem_alloc$' || fail "mpirun: buffer source"
    # malloc'd buffers: the same rows, read with cross-memory attach instead of mapped
    out=$(HCOMM_BACKEND=mpi timeout 120 "${MPIEXEC:-mpirun}" --oversubscribe -np 2 "$bench" all_reduce \
        -b 8 -e 1M -f 128 -n 2 -w 1 --algo all --mem host)
    echo "$out" | grep_all '^# buffers from malloc (--mem host)$' || fail "--mem host: buffer source"
    echo "$out" | check_rows all_reduce 2 both || { echo "$out"; fail "--mem host rows"; }
    echo "$out" | check_rows all_reduce 2 both || fail "mpirun rows"
    echo "$out" | rows | awk '$14 == "raw" {n++} END {exit n != 3}' || fail "mpirun: a raw row per size"
    [ "$(echo "$out" | grep -c 'hcomm/raw [0-9.]* busbw/memcpy [0-9.]* in-place: .* hcomm/raw [0-9.]* busbw')" -eq 3 ] ||
        fail "mpirun: hcomm/raw per size and placement"
    "$PY" -c 'import json,sys; r=[x for x in json.load(open(sys.argv[1])) if x["algo"]=="raw"]; assert len(r)==6 and all(x["wrong"]==0 and x["world"]==2 for x in r), r' \
        "$tmp/m.json" || fail "mpirun: raw json records"
    # --wrap: the ranks on hcomm_comm_wrap_mpi(MPI_COMM_WORLD); --timing b2b: loops of calls
    out=$(HCOMM_BACKEND=mpi timeout 120 "${MPIEXEC:-mpirun}" --oversubscribe -np 2 "$bench" all_reduce \
        -b 8 -e 32K -f 64 -n 2 -w 1 --wrap --timing b2b)
    echo "$out" | check_rows all_reduce 2 both || { echo "$out"; fail "--wrap --timing b2b rows"; }
    echo "$out" | rows | awk '$14 == "raw" {n++} END {exit n != 3}' || fail "--wrap: a raw row per size"
    # from 32 MiB raw is timed in a block after hcomm's rows: still one checked, timed row (a
    # 33 MiB call takes far more than 10 us)
    out=$(HCOMM_BACKEND=mpi timeout 120 "${MPIEXEC:-mpirun}" --oversubscribe -np 2 "$bench" all_reduce \
        -b 33M -e 33M -n 2 -w 1 -c 1)
    echo "$out" | check_rows all_reduce 2 both || { echo "$out"; fail "mpirun 33 MiB rows"; }
    echo "$out" | rows | awk '$14 == "raw" && $6 > 10 && $10 > 10 && $9 == 0 && $13 == 0 {n++} END {exit n != 1}' ||
        { echo "$out"; fail "mpirun 33 MiB: a checked raw row"; }
    for op in reduce_scatterv all_to_allv broadcast; do
        out=$(HCOMM_BACKEND=mpi timeout 120 "${MPIEXEC:-mpirun}" --oversubscribe -np 3 "$bench" $op \
            -b 8 -e 512 -f 8 -n 1 -w 0 -r 1)
        place=both; [ $op = all_to_allv ] && place=oop; [ $op = broadcast ] && place=ip
        echo "$out" | check_rows $op 3 $place || { echo "$out"; fail "mpirun $op"; }
        echo "$out" | rows | awk '$14 == "raw" {n++} END {exit n != 3}' || fail "mpirun $op: raw rows"
    done
else
    echo "skip the mpirun checks (HCOMM_WITH_MPI=${HCOMM_WITH_MPI:-OFF})"
fi

# 5. Bad options: exit 2, and the message names the problem.
expect_msg() {
    local want=$1
    shift
    set +e
    msg=$(timeout 30 "$bench" "$@" 2>&1 >/dev/null)
    rc=$?
    set -e
    [ "$rc" -eq 2 ] || fail "hcomm-bench $* exited $rc, expected 2 ($msg)"
    echo "$msg" | grep_all -F -- "$want" || fail "hcomm-bench $*: '$msg' does not say '$want'"
}
expect_msg "unknown option --bogus" --bogus
expect_msg "unknown option --bogus" all_reduce -t 2 --bogus 3
expect_msg "unknown option --bogus" --bogus=3
expect_msg "unknown option -x" -x 1
expect_msg "-t 0: out of range 1..4096" -t 0
expect_msg "-n -3: out of range 1..1048576" -n -3
expect_msg "--iters 99999999999999: out of range 1..1048576" --iters 99999999999999
expect_msg "-a 4: out of range 0..3" -a 4
expect_msg "-n needs a value" -n
expect_msg "--algo needs a value" --algo --json x
expect_msg "--json needs a value" all_reduce --json -t 2
expect_msg "--json $tmp/no/b.json: cannot write the file" all_reduce -t 2 -b 8 -e 8 --json "$tmp/no/b.json"
expect_msg "-F $tmp/no/b.csv: cannot write the file" all_reduce -t 2 -b 8 -e 8 -F "$tmp/no/b.csv"
expect_msg "--json $tmp/s.out and -F $tmp/s.out name the same file" all_reduce -t 2 --json "$tmp/s.out" -F "$tmp/s.out"
expect_msg "--json $tmp/s.out and -F $tmp/./s.out name the same file" all_reduce -t 2 --json "$tmp/s.out" -F "$tmp/./s.out"
expect_msg "--json - is not a file name" all_reduce --json -
expect_msg "--plot $tmp/p.txt: the file name must end in .png" all_reduce --plot "$tmp/p.txt"
expect_msg "--backend foo is not a backend (local or mpi)" all_reduce --backend foo
expect_msg '-b "" is not a size' -b ''
expect_msg "-b 1024 (the default) is larger than -e 64" -e 64
expect_msg "--calibrate measures the cost model's links, not an operation" --calibrate all_reduce
expect_msg "--calibrate measures the cost model's links, not an operation" all_reduce --calibrate
expect_msg "--calibrate takes -t, --backend and --mem, not --json" --calibrate --json "$tmp/c.json"
expect_msg "compare takes -b -e -f -i -n (and -t, --backend, --mem), not --algo" compare --algo ring
expect_msg "compare runs alone" compare all_reduce
expect_msg "moe_dispatch_combine does not reduce; -o max does not apply" moe_dispatch_combine -o max
expect_msg "--algo rd does not run reduce (OP all, the default, runs every collective" --algo rd
expect_msg "-e -1 is not a size" -e -1
expect_msg "-e 65G is not a size" -e 65G
expect_msg "-b 1073741824 is larger than -e 1024" -b 1G -e 1K
expect_msg "-b 8589934592 is larger than -e 4294967296" -b 8G -e 4G
expect_msg "-f 2x must be a number above 1" -f 2x
expect_msg "-i 0: the step must be at least 1 byte" -i 0
expect_msg "-f and -i exclude each other" -f 2 -i 8
expect_msg "-d f12 is not a dtype" -d f12
expect_msg '--mem="device" is not shared or host' --mem=device
expect_msg '--timing="later" is not window or b2b' --timing=later
expect_msg "--wrap runs under mpirun (the mpi backend), not on local" all_reduce --wrap -t 2
expect_msg "-o mean is not a reduction" -o mean
expect_msg "gatherx is not an operation; valid: all_reduce" gatherx
expect_msg "--op gatherx is not an operation" --op gatherx
expect_msg "--algo bogus is not an algorithm; valid: auto, all, raw, native" --algo bogus
expect_msg "--algo tree does not run all_reduce; valid: auto, all, native, rd, ring, rhd, naive" all_reduce --algo tree
expect_msg "--algo raw needs the mpi backend" all_reduce --algo raw
expect_msg "-r 3: out of range 0..2 for 3 ranks" broadcast -t 3 -r 3 -b 8 -e 8
expect_msg "dp_all_reduce reduces with sum or avg, not -o max" dp_all_reduce -o max
expect_msg "moe_dispatch_combine combines f32, f64, f16 or bf16, not -d i32" moe_dispatch_combine -d i32
v=$("$bench" --version)
echo "$v" | grep_all -E '^hcomm-bench [0-9]+\.[0-9]+\.[0-9]+ \(hcomm library [0-9.]+; backends: local( mpi)?\)$' ||
    fail "--version: '$v'"
"$bench" --help | grep_all -- "--algo A" || fail "--help"

# nccl-tests' habits: its column order (parsers read by position; hcomm's algo last), -g
# ranks per thread, -N cycles, -z/-C accepted, -m/-G beyond their neutral value refused as
# not applicable on CPU, -d all / -o all every dtype and redop the op takes.
out=$(timeout 60 "$bench" all_reduce -t 2 -b 8 -e 8 -n 1 -w 0)
echo "$out" | grep -q '^# *size(B) *count *type *redop *root *time(us) *algbw *busbw *#wrong *time(us) *algbw *busbw *#wrong *algo$' ||
    fail "nccl-tests' column order: $out"
echo "$out" | rows | awk '$14 ~ /^auto\(/ && $9 == 0 && $13 == 0 {n++} END {exit n != 1}' || fail "algo last: $out"
timeout 60 "$bench" all_gather -t 2 -g 3 -b 1K -e 1K -n 1 -w 0 | grep -q "^# all_gather, 6 ranks" || fail "-t 2 -g 3"
timeout 60 "$bench" all_gather -g 3 -b 1K -e 1K -n 1 -w 0 | grep -q "^# all_gather, 3 ranks" || fail "-g 3 alone"
n=$(timeout 60 "$bench" broadcast -t 2 -N 3 -z 1 -C 1 -m 1 -G 0 -b 1K -e 1K -n 1 -w 0 | rows | wc -l)
[ "$n" -eq 3 ] || fail "-N 3: $n rows"
expect_msg "-m 4: not applicable on CPU" all_reduce -m 4
expect_msg "-G 1: not applicable on CPU" all_reduce -G 1
out=$(timeout 120 "$bench" all_reduce -t 2 -b 64 -e 64 -n 1 -w 0 -d all -o all)
[ "$(echo "$out" | rows | wc -l)" -eq 40 ] || fail "-d all -o all: not 8 dtypes x 5 redops"
echo "$out" | rows | awk '$9 != 0 || $13 != 0 {exit 1}' || fail "-d all -o all: wrong results"
[ "$(echo "$out" | rows | awk '{print $3 "/" $4}' | sort -u | wc -l)" -eq 40 ] || fail "-d all -o all: repeats"
n=$(timeout 60 "$bench" dp_all_reduce -t 2 -b 64 -e 64 -n 1 -w 0 -o all -d all | rows | wc -l)
[ "$n" -eq 16 ] || fail "dp_all_reduce -o all: $n rows, expected 8 dtypes x (sum, avg)"
n=$(timeout 60 "$bench" all_gather -t 2 -b 64 -e 64 -n 1 -w 0 -o all | rows | wc -l)
[ "$n" -eq 1 ] || fail "all_gather -o all: $n rows, expected 1 (it does not reduce)"
echo "bench test passed"
