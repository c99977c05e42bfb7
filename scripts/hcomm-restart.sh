#!/usr/bin/env bash
# Reruns an hcomm-train job from its last checkpoint with one data-parallel replica fewer after a
# failure, as torchrun's --max-restarts does; the path for jobs whose engine cannot recover in
# the job (issue 41 item 5). Run with --help for the rules.
set -u

usage() {
    cat <<'EOF'
usage: hcomm-restart.sh [--max-restarts N] [--] COMMAND...

Runs COMMAND (typically: mpirun ... hcomm-train ... --save DIR --save-every K) and, when it
fails, runs it again from the checkpoint in DIR on one data-parallel replica fewer, at most N
times (default 1). Its standard output goes through to yours unchanged.

A run succeeded only if it exited 0 AND printed the line 'finished S steps' (hcomm-train's
world rank 0 prints it last on success): under 'mpirun --enable-recovery' mpirun's exit status
says nothing about its processes, and without that flag a killed process makes it fail.

Each restart changes the command:
  --resume DIR        added, or its value replaced (DIR: the command's --save value); where DIR
                      has no checkpoint yet (no DIR/latest) the run starts over without --resume
                      (or keeps the command's own --resume, if it had one)
  --dp D              lowered by 1 (not below 1); added as --dp D-1 if the command had none
                      (hcomm-train's default --dp is 2)
  -np/-n/--np P       mpirun's process count, lowered by one replica's ranks, tp*pp*cp (read
                      from --tp/--pp/--cp, else hcomm-train's defaults 2, 2, 1)
  --inject-failure    dropped: the failure it injects is the one being recovered from
Both '--flag value' and '--flag=value' are understood; the flags must be words of COMMAND
(not inside 'sh -c "..."'). A COMMAND without --save is refused: a restart needs a checkpoint.
Keep --batch divisible by dp * micro-batches for the smaller dp, and --ep a divisor of it.

Exit status: 0 after a successful run, else the last run's status (1 where that run exited 0
without its 'finished' line); 2 for a usage error.

Example:
  scripts/hcomm-restart.sh --max-restarts 2 -- mpirun -np 8 build/hcomm-train --tp 2 --pp 1 \
      --dp 4 --ep 1 --steps 1000 --save ck --save-every 50
EOF
}

die() {
    echo "hcomm-restart: $*" >&2
    exit 2
}

max_restarts=1
while [ $# -gt 0 ]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --max-restarts) [ $# -ge 2 ] || die "--max-restarts needs a value"; max_restarts=$2; shift 2 ;;
        --max-restarts=*) max_restarts=${1#*=}; shift ;;
        --) shift; break ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) break ;;
    esac
done
case $max_restarts in
    '' | *[!0-9]*) die "--max-restarts '$max_restarts': expected a count, 0 or more" ;;
esac
[ $# -gt 0 ] || die "no command to run (see --help)"
cmd=("$@")

# The index of the training program among cmd's words (mpirun's flags come before it, the
# program's after it); -1 where no word is hcomm-train: then every word is searched.
train_at=-1
for i in "${!cmd[@]}"; do
    case ${cmd[i]##*/} in
        hcomm-train*) train_at=$i; break ;;
    esac
done

# flag_value NAME: the value of the last --NAME of the training program's arguments (empty
# and status 1 where it has none).
flag_value() {
    local i found=1 value=''
    for ((i = train_at + 1; i < ${#cmd[@]}; i++)); do
        case ${cmd[i]} in
            "--$1") [ $((i + 1)) -lt ${#cmd[@]} ] && { value=${cmd[i + 1]}; found=0; } ;;
            "--$1="*) value=${cmd[i]#*=}; found=0 ;;
        esac
    done
    printf '%s' "$value"
    return $found
}

# set_flag NAME VALUE: every --NAME of the training program gets VALUE; appended where none.
set_flag() {
    local i seen=0
    for ((i = train_at + 1; i < ${#cmd[@]}; i++)); do
        case ${cmd[i]} in
            "--$1") cmd[i + 1]=$2; seen=1; i=$((i + 1)) ;;
            "--$1="*) cmd[i]="--$1=$2"; seen=1 ;;
        esac
    done
    [ $seen -eq 1 ] || cmd+=("--$1" "$2")
}

# drop_flag NAME: removes every --NAME VALUE and --NAME=VALUE of the training program.
drop_flag() {
    local i kept=()
    for ((i = 0; i < ${#cmd[@]}; i++)); do
        if [ "$i" -gt "$train_at" ]; then
            case ${cmd[i]} in
                "--$1") i=$((i + 1)); continue ;;
                "--$1="*) continue ;;
            esac
        fi
        kept+=("${cmd[i]}")
    done
    cmd=("${kept[@]}")
}

# lower_np BY: mpirun's -np/-n/--np values (the words before the program) lowered by BY; the
# new count in $np, empty where the command has none.
lower_np() {
    local i end=${#cmd[@]} v
    np=''
    [ "$train_at" -ge 0 ] && end=$train_at
    for ((i = 0; i < end; i++)); do
        case ${cmd[i]} in
            -np | -n | --np) [ $((i + 1)) -lt "$end" ] || continue; i=$((i + 1)); v=${cmd[i]} ;;
            *) continue ;;
        esac
        case $v in
            '' | *[!0-9]*) die "mpirun's process count '$v' is not a number" ;;
        esac
        np=$((v - $1))
        [ "$np" -ge 1 ] || die "mpirun's process count $v is less than one replica ($1 ranks)"
        cmd[i]=$np
    done
}

# int_flag NAME DEFAULT: a training flag's value as a positive integer (or DEFAULT) in $value.
int_flag() {
    value=$(flag_value "$1") || value=$2
    case $value in
        '' | *[!0-9]* | 0) die "--$1 '$value' in the command: expected a positive integer" ;;
    esac
}

save=$(flag_value save) || die "the command has no --save DIR: a restart needs its checkpoints"
[ -n "$save" ] || die "the command's --save is empty: a restart needs its checkpoints"
flag_value save-every >/dev/null ||
    echo "hcomm-restart: no --save-every in the command: the only checkpoint is the one at" \
        "the end, so a restart starts over" >&2
own_resume=$(flag_value resume) || own_resume=''
replica=1
for f in tp:2 pp:2 cp:1; do
    int_flag "${f%:*}" "${f#*:}"
    replica=$((replica * value))
done
int_flag dp 2
dp=$value

log=$(mktemp "${TMPDIR:-/tmp}/hcomm-restart.XXXXXX") || die "cannot create a temporary file"
interrupted=0
trap 'interrupted=1' INT TERM
trap 'rm -f "$log"' EXIT

run=0
while :; do
    run=$((run + 1))
    "${cmd[@]}" | tee "$log"
    rc=${PIPESTATUS[0]}
    finished=0
    grep -Eq '(^|:)finished [0-9]+ steps$' "$log" && finished=1
    if [ "$rc" -eq 0 ] && [ $finished -eq 1 ]; then
        [ $run -gt 1 ] && echo "hcomm-restart: run $run finished after $((run - 1)) restart(s)" >&2
        exit 0
    fi
    why="exit $rc"
    [ $finished -eq 1 ] || why="$why, no 'finished' line"
    [ "$rc" -ne 0 ] || rc=1
    if [ $interrupted -eq 1 ]; then
        echo "hcomm-restart: run $run interrupted ($why); not restarting" >&2
        exit "$rc"
    fi
    restart=$run
    if [ "$restart" -gt "$max_restarts" ]; then
        echo "hcomm-restart: run $run failed ($why); no restarts left (--max-restarts" \
            "$max_restarts)" >&2
        exit "$rc"
    fi
    drop_flag inject-failure
    if [ -f "$save/latest" ]; then
        set_flag resume "$save"
        from="--resume $save"
    elif [ -n "$own_resume" ]; then
        from="--resume $own_resume (no checkpoint in $save yet)"
    else
        drop_flag resume
        from="no --resume (no checkpoint in $save yet: from the start)"
    fi
    np=''
    if [ "$dp" -gt 1 ]; then
        dp=$((dp - 1))
        lower_np "$replica"
    fi
    set_flag dp "$dp"
    echo "hcomm-restart: run $run failed ($why); restarting with $from --dp $dp${np:+ -np $np}" \
        "(restart $restart of $max_restarts)" >&2
done
