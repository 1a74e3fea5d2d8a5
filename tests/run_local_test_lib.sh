# Shared by the run-local.sh tests (sourced): a scratch directory $out that
# is removed at exit (kept when KEEP is set), the run-local.sh process
# $run_pid killed at exit, fail, and expect_no_processes.
#   out=$(mktemp -d -t NAME.XXXXXX); source "$(dirname "$0")/run_local_test_lib.sh"
run_pid=""
cleanup() {
  if [ -n "$run_pid" ]; then kill "$run_pid" 2>/dev/null || true; wait "$run_pid" 2>/dev/null || true; fi
  [ -n "${KEEP:-}" ] || rm -rf "$out"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# The open files of processes that have $1 open. find fails whenever a
# process ends while it looks, so its status says nothing (and with pipefail
# a `find | grep -q .` would never match).
holders() { find /proc/[0-9]*/fd -lname "$1" 2>/dev/null || true; }
# Every process run-local.sh started (etcd included) writes a log under $1;
# none may still hold one open.
expect_no_processes() {
  local open
  open=$(holders "$1/*")
  [ -z "$open" ] || fail "processes started by run-local.sh are still running: $open"
}
