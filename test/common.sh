# Helpers the shell tests source (not a test itself: the suite runs test_*.sh).

# grep -q exits at the first match and may close the pipe before the writer is done; pipefail
# would then fail the test on the writer's SIGPIPE. grep_all reads everything.
grep_all() { grep "$@" >/dev/null; }
