#!/usr/bin/env bash
# hcomm-plan: exact JSON groups for the issue's example (world 32, tp 4, pp 2, dp 4), other
# orders and MoE sizes, the table output, speed at world 65536, and exit codes for bad
# usage (2) and invalid configurations (1). Needs only bash, grep and awk.
# Usage: test_plan.sh BUILD_DIR
set -u
PLAN="${1:?usage: test_plan.sh BUILD_DIR}/hcomm-plan"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
checks=0

fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# expect_line FILE TEXT: FILE has a line containing TEXT exactly (fixed string).
expect_line() {
    checks=$((checks + 1))
    grep -qF -- "$2" "$1" || fail "$1 lacks: $2"
}

# run_plan EXPECTED_STATUS NAME ARGS...: runs hcomm-plan, stdout to $TMP/NAME.out and
# stderr to $TMP/NAME.err, and checks its exit status.
run_plan() {
    local want=$1 name=$2
    shift 2
    timeout 10 "$PLAN" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
    local got=$?
    checks=$((checks + 1))
    [ "$got" -eq "$want" ] || fail "hcomm-plan $* exited $got, expected $want ($(cat "$TMP/$name.err"))"
}

# json_balanced FILE: brackets and braces balance and the object closes on the last line.
json_balanced() {
    checks=$((checks + 1))
    awk '{ for (i = 1; i <= length($0); i++) { c = substr($0, i, 1);
             if (c == "[" || c == "{") d++; if (c == "]" || c == "}") d--; if (d < 0) bad = 1 } }
         END { exit (d != 0 || bad) }' "$1" || fail "$1: unbalanced JSON"
    checks=$((checks + 1))
    [ "$(tail -c 2 "$1")" = "}" ] || fail "$1 does not end with }"
}

# --- the issue's example ---
run_plan 0 brief --world 32 --tp 4 --pp 2 --dp 4 --json
B="$TMP/brief.out"
json_balanced "$B"
expect_line "$B" '"tp": [[0,1,2,3],[4,5,6,7],[8,9,10,11],[12,13,14,15],[16,17,18,19],[20,21,22,23],[24,25,26,27],[28,29,30,31]]'
expect_line "$B" '"dp": [[0,4,8,12],[1,5,9,13],[2,6,10,14],[3,7,11,15],[16,20,24,28],[17,21,25,29],[18,22,26,30],[19,23,27,31]]'
expect_line "$B" '"pp": [[0,16],[1,17],[2,18],[3,19],[4,20],[5,21],[6,22],[7,23],[8,24],[9,25],[10,26],[11,27],[12,28],[13,29],[14,30],[15,31]]'
expect_line "$B" '"embedding": [[0,16],[1,17],[2,18],[3,19],[4,20],[5,21],[6,22],[7,23],[8,24],[9,25],[10,26],[11,27],[12,28],[13,29],[14,30],[15,31]]'
expect_line "$B" '"tp_pp": [[0,1,2,3,16,17,18,19],[4,5,6,7,20,21,22,23],[8,9,10,11,24,25,26,27],[12,13,14,15,28,29,30,31]]'
expect_line "$B" '"dp_cp": [[0,4,8,12],[1,5,9,13],'
expect_line "$B" '"cp": [[0],[1],[2],'
expect_line "$B" '"ep": [[0],[1],[2],'
expect_line "$B" '"etp": [[0,1,2,3],[4,5,6,7],'
expect_line "$B" '"edp": [[0,4,8,12],[1,5,9,13],'
for key in tp pp dp cp dp_cp tp_pp ep etp edp embedding; do
    checks=$((checks + 1))
    [ "$(grep -c "\"$key\": \[\[" "$B")" -eq 1 ] || fail "key \"$key\" not exactly once"
done

# --- another order, context and expert parallelism (etp 1 != tp 2) ---
run_plan 0 moe --world 16 --tp 2 --cp 2 --pp 2 --ep 2 --etp 1 --experts 4 --json
M="$TMP/moe.out"
json_balanced "$M"
expect_line "$M" '"cp": [[0,2],[1,3],[4,6],[5,7],[8,10],[9,11],[12,14],[13,15]]'
expect_line "$M" '"dp_cp": [[0,2,4,6],[1,3,5,7],[8,10,12,14],[9,11,13,15]]'
expect_line "$M" '"ep": [[0,1],[2,3],[4,5],[6,7],[8,9],[10,11],[12,13],[14,15]]'
expect_line "$M" '"edp": [[0,2,4,6],[1,3,5,7],[8,10,12,14],[9,11,13,15]]'
run_plan 0 order --world=16 --tp=2 --pp=2 --order=tp-pp-dp --json
expect_line "$TMP/order.out" '"pp": [[0,2],[1,3],[4,6],[5,7],[8,10],[9,11],[12,14],[13,15]]'
expect_line "$TMP/order.out" '"dp": [[0,4,8,12],[1,5,9,13],[2,6,10,14],[3,7,11,15]]'

# --- table output ---
run_plan 0 table --world 32 --tp 4 --pp 2
T="$TMP/table.out"
expect_line "$T" 'world=32 tp=4 pp=2 dp=4 cp=1 ep=1 etp=4 edp=4'
expect_line "$T" 'dp: 8 groups of 4'
expect_line "$T" '  [19, 23, 27, 31]'
# Every group is printed: all 16 pp groups, the last one included, and no cut.
expect_line "$T" 'pp: 16 groups of 2'
expect_line "$T" '  [15, 31]'
checks=$((checks + 1))
[ "$(grep -c '^  \[' "$T")" -eq $((8 + 16 + 8 + 32 + 8 + 4 + 32 + 8 + 8 + 16 + 8 + 32 + 8 + 32)) ] ||
    fail "the table does not list every group: $(grep -c '^  \[' "$T") group lines"
checks=$((checks + 1))
grep -q '\.\.\.' "$T" && fail "the table cut a list without --max-groups"
run_plan 0 table-cut --world 32 --tp 4 --pp 2 --max-groups 3
expect_line "$TMP/table-cut.out" '  ... 13 more (16 groups; --max-groups 3 cut the list)'
checks=$((checks + 1))
[ "$(grep -c '^  \[' "$TMP/table-cut.out")" -eq 42 ] || fail "--max-groups 3 did not show 3 per kind"

# --- world 65536 within 5 s, JSON and table ---
checks=$((checks + 1))
timeout 5 "$PLAN" --world 65536 --tp 8 --pp 4 --cp 2 --ep 4 --etp 2 --json >"$TMP/big.out" ||
    fail "world 65536 --json failed or took over 5 s"
json_balanced "$TMP/big.out"
expect_line "$TMP/big.out" '[65528,65529,65530,65531,65532,65533,65534,65535]]'
checks=$((checks + 1))
timeout 5 "$PLAN" --world 65536 --tp 8 --pp 4 --max-groups 8 >"$TMP/bigtable.out" ||
    fail "world 65536 table failed or took over 5 s"
expect_line "$TMP/bigtable.out" '... 8184 more (8192 groups; --max-groups 8 cut the list)'
checks=$((checks + 1))
[ "$(wc -l <"$TMP/bigtable.out")" -lt 200 ] || fail "world 65536 table is not truncated"

# --- usage errors: exit 2, message names the flag and value ---
run_plan 0 help --help
expect_line "$TMP/help.out" '--world'
run_plan 2 unknown --world 8 --bogus 3
expect_line "$TMP/unknown.err" "unknown option --bogus"
run_plan 2 huge --world 99999999999999
expect_line "$TMP/huge.err" "--world 99999999999999: out of range 1..16777216"
run_plan 2 zero-tp --world 8 --tp 0
expect_line "$TMP/zero-tp.err" "--tp 0: out of range 1..16777216"
run_plan 2 negative --world 8 --pp -2
expect_line "$TMP/negative.err" "--pp -2: out of range 1..16777216"
run_plan 2 noworld --tp 2
expect_line "$TMP/noworld.err" "--world"
run_plan 2 nonnum --world 8 --tp abc
expect_line "$TMP/nonnum.err" "--tp: 'abc'"
run_plan 2 trailing --world 8x
expect_line "$TMP/trailing.err" "'8x'"
run_plan 2 novalue --world 8 --pp
expect_line "$TMP/novalue.err" "--pp"

# --- invalid configurations: exit 1 with hcomm's message ---
run_plan 1 notdiv --world 6 --tp 4
expect_line "$TMP/notdiv.err" "world_size=6"
run_plan 1 product --world 16 --tp 2 --pp 2 --dp 2
expect_line "$TMP/product.err" "does not equal world_size=16"
run_plan 1 badorder --world 8 --order tp-zz-pp
expect_line "$TMP/badorder.err" "'zz'"
run_plan 1 experts --world 8 --ep 2 --experts 3
expect_line "$TMP/experts.err" "num_experts=3"
run_plan 2 zero --world 0

# --- HSDP: dp = dp_shard x dp_replicate, shard index innermost ---
run_plan 0 hsdp --world 8 --dp-shard 4 --json
expect_line "$TMP/hsdp.out" '"dp_shard": [[0,1,2,3],[4,5,6,7]]'
expect_line "$TMP/hsdp.out" '"dp_replicate": [[0,4],[1,5],[2,6],[3,7]]'
run_plan 0 hsdp-table --world 8 --tp 2 --dp-shard 2
expect_line "$TMP/hsdp-table.out" 'dp_shard=2 dp_replicate=2'
expect_line "$TMP/hsdp-table.out" 'dp_shard: 4 groups of 2'
run_plan 1 hsdp-bad --world 8 --dp-shard 3
expect_line "$TMP/hsdp-bad.err" "dp_shard=3 does not divide dp=8"
expect_line "$TMP/zero.err" "--world 0: out of range 1..16777216"

# --- --rank R: one rank's groups, each the group of the full listing that holds R ---
run_plan 0 full --world 32 --tp 4 --pp 2 --dp 4 --json
for r in 0 5 17 31; do
    run_plan 0 "rank$r" --world 32 --tp 4 --pp 2 --dp 4 --rank "$r" --json
    json_balanced "$TMP/rank$r.out"
    for kind in tp pp dp cp dp_cp tp_pp ep etp edp embedding; do
        g=$(grep -o "\"$kind\": [^ ]*" "$TMP/rank$r.out" | sed "s/^\"$kind\": //; s/[,}]*\$//")
        checks=$((checks + 1))
        if [ "$g" = "null" ]; then # only embedding, on a middle stage: no group holds r
            [ "$kind" = embedding ] || fail "--rank $r: $kind is null"
            continue
        fi
        echo ",$g," | grep -q ",\[*$r\]*," || fail "--rank $r: $kind group $g lacks $r"
        checks=$((checks + 1))
        grep "\"$kind\": " "$TMP/full.out" | grep -qF -- "$g" ||
            fail "--rank $r: $kind group $g is not one of the full listing's"
    done
done
run_plan 0 rank5t --world 32 --tp 4 --pp 2 --dp 4 --rank 5
expect_line "$TMP/rank5t.out" "rank 5:"
expect_line "$TMP/rank5t.out" "tp: rank 1 of 4  [4, 5, 6, 7]"
expect_line "$TMP/rank5t.out" "dp: rank 1 of 4  [1, 5, 9, 13]"
run_plan 0 rank2e --world 8 --pp 4 --rank 2
expect_line "$TMP/rank2e.out" "embedding: none"
run_plan 2 rankout --world 8 --rank 8
expect_line "$TMP/rankout.err" "--rank 8 outside 0..7"
run_plan 2 rankneg --world 8 --rank -1
expect_line "$TMP/rankneg.err" "'-1' is not a rank"

echo "test_plan: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
