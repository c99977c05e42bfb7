# shellcheck shell=bash
# What the hcomm-train test scripts share (sourced, not a test itself): failures counted in
# $failures, one log per run in $WORK/NAME.log.
failures=0

# fail MSG: reports a failure on stderr and counts it.
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# run NAME CMD...: one training under a timeout, its output in $WORK/NAME.log; a failure is
# reported with that output and returns 1.
run() {
    local name=$1
    shift
    timeout 300 "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "$name: '$*' exited with status $rc; its output:"
        sed 's/^/    /' "$WORK/$name.log" >&2
        return 1
    fi
    return 0
}

# expect_fail NAME PATTERN CMD...: must exit non-zero (not a timeout, EXPECT_FAIL_TIMEOUT s,
# default 120) and print PATTERN (an extended regular expression).
expect_fail() {
    local name=$1 pattern=$2
    shift 2
    timeout "${EXPECT_FAIL_TIMEOUT:-120}" "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
        fail "$name: '$*' exited with $rc, expected a failure"
    elif ! grep -Eq -- "$pattern" "$WORK/$name.log"; then
        fail "$name: the message does not match '$pattern':"
        sed 's/^/    /' "$WORK/$name.log" >&2
    else
        echo "ok   $name (exit $rc): $(head -n 1 "$WORK/$name.log")"
    fi
}
