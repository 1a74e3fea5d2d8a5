#!/usr/bin/env bash
# A second ps-server on a port another one listens on must fail to start
# with a clear message (no SO_REUSEPORT sharing), and the first keeps serving
# (psctl health and psctl status).
set -euo pipefail
bin=$1
dir=$(mktemp -d -t shardtrain-port-test.XXXXXX)
first=""
cleanup() {
  if [ -n "$first" ]; then kill "$first" 2>/dev/null || true; wait "$first" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$dir"/*.log; do echo "== $f" >&2; cat "$f" >&2; done; exit 1; }

"$bin/ps-server" --listen=127.0.0.1:0 --port_file="$dir/port" 2>"$dir/first.log" &
first=$!
for _ in $(seq 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
[ -s "$dir/port" ] || fail "the first ps-server did not start"
read -r port _ <"$dir/port"

rc=0
timeout 30 "$bin/ps-server" --listen="127.0.0.1:$port" --port_file="$dir/port2" \
  2>"$dir/second.log" || rc=$?
[ "$rc" != 0 ] || fail "a second ps-server started on used port $port"
[ "$rc" != 124 ] || fail "the second ps-server neither failed nor exited"
grep -q "cannot listen on 127.0.0.1:$port" "$dir/second.log" ||
  fail "the second ps-server's log does not say it cannot listen on $port"
[ ! -e "$dir/port2" ] || fail "the second ps-server wrote a port file"

health=$("$bin/psctl" health --server="127.0.0.1:$port" --timeout_s=10) ||
  fail "the first ps-server stopped answering: $health"
[ "$health" = SERVING ] || fail "health: $health"
# psctl status asks every shard at once: the live one is listed, the dead
# address is DOWN and makes it exit 1.
rc=0
"$bin/psctl" status --servers="127.0.0.1:$port,127.0.0.1:1" --timeout_s=10 \
  --max_partitions=5 >"$dir/status.out" 2>"$dir/status.log" || rc=$?
[ "$rc" = 1 ] || fail "psctl status with a dead shard exited $rc: $(cat "$dir/status.out")"
grep -Eq "^0 +127\.0\.0\.1:$port +async" "$dir/status.out" || fail "status: $(cat "$dir/status.out")"
grep -Eq "^1 +127\.0\.0\.1:1 +DOWN" "$dir/status.out" || fail "status: $(cat "$dir/status.out")"
grep -q "shards: 1 of 2 answered" "$dir/status.out" || fail "status: $(cat "$dir/status.out")"
kill -0 "$first" || fail "the first ps-server died"
echo "port in use OK: second exited $rc, first SERVING on $port"
