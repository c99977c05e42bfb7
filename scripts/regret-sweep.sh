#!/usr/bin/env bash
# auto's regret (issue 6, section 6): runs `hcomm-bench OP --algo all --json` for every
# (configuration, collective), REPS times interleaved (rep outermost, so each repetition sees
# the same noise everywhere), then prints per size the median over repetitions of auto's time
# over the best of native and every hcomm algorithm, and on mpi over the raw MPI call. Rows where
# auto loses by more than the target (1.10; vs raw with checking on 1.5 up to 4 KiB) are flagged
# with '<' ('<=' where auto chose the algorithm that was fastest: then the gap is noise or
# auto's own overhead, not a wrong choice). A named algorithm that fell back to one with a row
# of its own (the bench's "ran": local has no shm, say) is a second sample of that one, not a
# rival, and is left out. On a shared machine act only on rows that lose in every repetition
# (column 'lost').
#
# Usage: scripts/regret-sweep.sh [BUILD_DIR]   (default: build, built already)
# Environment:
#   CONFIGS  backend:ranks[:off] entries (default "local:2 local:4 local:8 mpi:2 mpi:4 mpi:2:off
#            mpi:4:off"; ':off' runs with HCOMM_CHECK=off, where auto/raw must be <= 1.10)
#   OPS      collectives (default "all_reduce all_gather reduce_scatter broadcast")
#   DTYPE    element type of every run (default f32; bf16, f16, ... as hcomm-bench -d takes)
#   REPS     repetitions (default 3), MIN/MAX sizes (8, 128M), WARMUP iterations per size (2)
#   ITERS    timed iterations per size above SPLIT (default 10), ITERS_SMALL up to SPLIT (default
#            40, SPLIT 128K): small calls are cheap, and under load their medians need more
#   OUT      directory for the JSON files (default: a new one under /tmp); TABLE_ONLY=1 only
#            prints the table from the JSON files already in OUT
#   RUN_TIMEOUT  seconds per bench run (default 900)
set -uo pipefail
build=${1:-build}
configs=${CONFIGS:-"local:2 local:4 local:8 mpi:2 mpi:4 mpi:2:off mpi:4:off"}
ops=${OPS:-"all_reduce all_gather reduce_scatter broadcast"}
reps=${REPS:-3}
out=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/hcomm-regret.XXXXXX")}
bench=$build/hcomm-bench
py=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out"

bench_run() { # json config sizes... (bench flags)
    local json=$1 cfg=$2 backend ranks check
    shift 2
    IFS=: read -r backend ranks check <<<"$cfg"
    local envs=(HCOMM_BACKEND="$backend")
    [ "$check" = off ] && envs+=(HCOMM_CHECK=off)
    if [ "$backend" = mpi ]; then
        timeout "${RUN_TIMEOUT:-900}" mpirun --oversubscribe -np "$ranks" env "${envs[@]}" \
            "$bench" "$@" --json "$json" >"$json.log" 2>&1
    else
        timeout "${RUN_TIMEOUT:-900}" env "${envs[@]}" "$bench" "$@" --json "$json" -t "$ranks" \
            >"$json.log" 2>&1
    fi || echo "regret-sweep: $cfg $* failed (see $json.log)" >&2
}

to_bytes() { # 128K -> 131072
    numfmt --from=iec "$1"
}

run_one() { # rep config op
    local rep=$1 cfg=$2 op=$3 backend ranks check
    IFS=: read -r backend ranks check <<<"$cfg"
    local base="$out/$backend-$ranks-${check:-on}-$op-r$rep" common=(-f 4 -w "${WARMUP:-2}" -c 0
        -d "${DTYPE:-f32}" --algo all) lo hi split
    lo=$(to_bytes "${MIN:-8}") hi=$(to_bytes "${MAX:-128M}") split=$(to_bytes "${SPLIT:-128K}")
    if ((lo <= split)); then
        bench_run "$base-small.json" "$cfg" "$op" -b "$lo" -e "$((hi < split ? hi : split))" \
            -n "${ITERS_SMALL:-40}" "${common[@]}"
    fi
    local big=$lo
    while ((big <= split)); do big=$((big * 4)); done
    if ((big <= hi)); then
        bench_run "$base-large.json" "$cfg" "$op" -b "$big" -e "$hi" -n "${ITERS:-10}" \
            "${common[@]}"
    fi
}

if [ -z "${TABLE_ONLY:-}" ]; then
    if [ ! -x "$bench" ]; then
        echo "regret-sweep: $bench is missing; build first" >&2
        exit 2
    fi
    for ((rep = 1; rep <= reps; rep++)); do
        for cfg in $configs; do
            for op in $ops; do
                echo "regret-sweep: rep $rep/$reps $cfg $op" >&2
                run_one "$rep" "$cfg" "$op"
            done
        done
    done
fi

"$py" - "$out" <<'EOF'
import glob, json, os, re, statistics, sys
from collections import defaultdict
out = sys.argv[1]
# (config, op) -> (bytes, inplace) -> algo -> [time per rep]; auto's choices per rep
times = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
chosen = defaultdict(lambda: defaultdict(list))
ran = defaultdict(lambda: defaultdict(dict))  # a named algorithm that fell back: what ran
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    m = re.match(r"(\w+)-(\d+)-(\w+)-(\w+)-r(\d+)(-small|-large)?\.json$", os.path.basename(f))
    if not m:
        continue
    try:
        recs = json.load(open(f))
    except (OSError, ValueError):
        continue
    cfg = "%s:%s%s" % (m.group(1), m.group(2), ":off" if m.group(3) == "off" else "")
    for r in recs:
        if r["op"] == "memcpy":
            continue
        key = (r["bytes"], r["inplace"])
        times[(cfg, r["op"])][key][r["algo"]].append(r["time_us"])
        if r.get("ran"):
            ran[(cfg, r["op"])][key][r["algo"]] = r["ran"].split("+")[0]  # +deterministic
        if r["algo"] == "auto":
            chosen[(cfg, r["op"])][key].append(r.get("chosen", "?"))
worst = []
for (cfg, op) in sorted(times):
    print("\n# %s %s   (medians over repetitions; lost = reps where auto > 1.10 x that rep's best)"
          % (cfg, op))
    print("# %10s %3s %-14s %8s %10s %-10s %6s %4s %8s" %
          ("bytes", "ip", "auto(chosen)", "auto_us", "best_us", "best", "regret", "lost", "auto/raw"))
    for key in sorted(times[(cfg, op)]):
        t = times[(cfg, op)][key]
        if "auto" not in t:
            continue
        # a row that ran another row's algorithm is a second sample of it, not a rival
        alias = ran[(cfg, op)][key]
        named = {a: v for a, v in t.items()
                 if a not in ("auto", "raw", "p2p") and alias.get(a) not in t}
        med = {a: statistics.median(v) for a, v in named.items()}
        best = min(med, key=med.get)
        auto = statistics.median(t["auto"])
        regret = auto / med[best]
        nrep = len(t["auto"])
        lost = sum(1 for i in range(nrep)
                   if t["auto"][i] > 1.10 * min(v[i] for v in named.values() if len(v) > i))
        raw = ""
        ch = ",".join(sorted({c or "-" for c in chosen[(cfg, op)][key]}))  # primitives: null
        flag = (" <=" if ch == best else " <") if regret > 1.10 else ""
        if "raw" in t:
            vs = auto / statistics.median(t["raw"])
            raw = "%.2f" % vs
            limit = 1.5 if (key[0] <= 4096 and not cfg.endswith(":off")) else 1.10
            if vs > limit:
                flag += " <raw"
        print("  %10d %3s %-14s %8.1f %10.1f %-10s %6.2f %2d/%d %8s%s" %
              (key[0], "ip" if key[1] else "op", "auto(%s)" % ch, auto, med[best], best, regret,
               lost, nrep, raw, flag))
        if flag:
            worst.append((cfg, op, key[0], "ip" if key[1] else "op", regret, lost, nrep, raw,
                          ch, best, flag))
print("\n# over target (config op bytes placement regret lost/reps auto/raw chosen best flag):")
for w in worst:
    print("  %s %s %d %s %.2f %d/%d %s %s %s%s" % w)
EOF
echo "regret-sweep: JSON in $out" >&2
