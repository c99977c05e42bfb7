#!/usr/bin/env bash
# hcomm_mem_alloc's shared-memory objects do not outlive their process: a program that exits
# without hcomm_mem_free leaves none in /dev/shm, and the objects of a process killed by a signal
# are removed by the next process's first allocation.
# Usage: test_mem_exit.sh BUILD_DIR
set -euo pipefail
prog=$1/test/mem_exit
fail() { echo "FAIL: $*"; exit 1; }
objects_of() { # objects_of PID: how many hcomm objects of that pid are in /dev/shm
    find /dev/shm -maxdepth 1 -name "hcomm-*-$1-*" 2>/dev/null | wc -l
}
[ -d /dev/shm ] || { echo "skipped: no /dev/shm"; exit 77; }

pid=$(timeout 60 "$prog" exit | sed -n 's/^pid //p')
[ -n "$pid" ] || fail "mem_exit exit printed no pid"
[ "$(objects_of "$pid")" -eq 0 ] || fail "a process that exited without hcomm_mem_free left its object"

out=$(mktemp)
"$prog" hang >"$out" &
pid=$!
trap 'kill -9 "$pid" 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 100); do grep -q '^pid ' "$out" && break; sleep 0.1; done
[ "$(sed -n 's/^pid //p' "$out")" = "$pid" ] || fail "mem_exit hang did not print its pid"
[ "$(objects_of "$pid")" -eq 1 ] || fail "a live process's object is not in /dev/shm (the test sees nothing)"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
[ "$(objects_of "$pid")" -eq 1 ] || fail "the killed process's object vanished by itself (the test sees nothing)"
timeout 60 "$prog" alloc >/dev/null
[ "$(objects_of "$pid")" -eq 0 ] || fail "the next allocation left a dead process's object in /dev/shm"
echo "test_mem_exit: passed"
