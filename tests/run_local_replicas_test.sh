#!/usr/bin/env bash
# scripts/run-local.sh --replicas, with stand-ins for ps-server and ps-worker
# that record their command lines (so it needs no build and no data set):
#  - without --replicas and with --replicas 1 the command lines are the same
#    and name no etcd;
#  - --replicas 2 starts an etcd that answers before the first shard starts,
#    passes --replicas/--etcd_endpoints/--job (and --lease_ttl_s=1 to the
#    shards) to every process, and stops etcd at the end, after a failed
#    worker and on SIGTERM, leaving no process and no temporary file behind;
#  - bad --replicas values and a missing etcd are refused before anything starts.
# Exits 77 (skipped) without etcd.
set -euo pipefail
root=$1
command -v etcd >/dev/null || { echo "SKIP: etcd is not installed (Debian's etcd-server)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl is not installed"; exit 77; }
out=$(mktemp -d -t shardtrain-run-local-replicas-test.XXXXXX)
source "$(dirname "$0")/run_local_test_lib.sh"

# The stand-ins. A shard writes one argument per line to $RECORD/shard<i>,
# notes whether the etcd it was given answers, writes its port file and
# waits to be stopped. A worker records its arguments; the chief prints a
# final accuracy, or fails with FAKE_WORKER=fail, or waits with FAKE_WORKER=wait.
mkdir -p "$out/build/bin"
cat >"$out/build/bin/ps-server" <<'EOF'
#!/usr/bin/env bash
index="" port_file="" etcd=""
for arg in "$@"; do
  case "$arg" in
    --shard_index=*) index=${arg#*=} ;;
    --port_file=*) port_file=${arg#*=} ;;
    --etcd_endpoints=*) etcd=${arg#*=} ;;
  esac
done
printf '%s\n' "$@" >"$RECORD/shard$index"
if [ -n "$etcd" ]; then
  if curl -sf --max-time 2 "http://$etcd/health" | grep -q '"health":"true"'; then
    echo "etcd answered" >"$RECORD/shard$index.etcd"
  else
    echo "etcd did not answer" >"$RECORD/shard$index.etcd"
  fi
fi
echo "$((7000 + index)) $((9000 + index))" >"$port_file"
exec sleep 300
EOF
cat >"$out/build/bin/ps-worker" <<'EOF'
#!/usr/bin/env bash
index=""
for arg in "$@"; do
  case "$arg" in --worker_index=*) index=${arg#*=} ;; esac
done
printf '%s\n' "$@" >"$RECORD/worker$index"
if [ "$index" = 0 ]; then
  case "${FAKE_WORKER:-}" in
    fail) echo "chief fails on purpose" >&2; exit 3 ;;
    wait) exec sleep 300 ;;
  esac
  echo "epoch 1/1  loss 0.5  test_acc 0.8500  samples/s 1000  staleness 0"
  echo "final test accuracy: 0.8500"
fi
EOF
chmod +x "$out/build/bin/ps-server" "$out/build/bin/ps-worker"

run() {  # name [run-local flags...]: a run with its own records, logs and TMPDIR
  local name=$1
  shift
  mkdir -p "$out/$name/record" "$out/$name/tmp"
  RECORD="$out/$name/record" TMPDIR="$out/$name/tmp" BUILD_DIR="$out/build" \
    "$root/scripts/run-local.sh" --no-build --logs "$out/$name/logs" "$@" \
    >"$out/$name/stdout" 2>"$out/$name/stderr"
}
# A run's command lines with its temporary directory's random part replaced.
command_lines() {
  for f in "$out/$1/record"/shard? "$out/$1/record"/worker?; do
    echo "== $(basename "$f")"
    sed "s|$out/$1/|OUT/|g; s|shardtrain-run\.[A-Za-z0-9]*|shardtrain-run.X|g" "$f"
  done
}
expect_clean() {  # name: no process, no temporary file left
  expect_no_processes "$out/$1/logs"
  [ -z "$(ls -A "$out/$1/tmp")" ] || fail "$1 left behind: $(ls -A "$out/$1/tmp")"
}

# 1. --replicas 1 is the default, to the byte.
run default || fail "default run: $(cat "$out/default/stderr")"
run one --replicas 1 || fail "--replicas 1 run: $(cat "$out/one/stderr")"
[ "$(command_lines default)" = "$(command_lines one)" ] ||
  fail "--replicas 1 changed the command lines: $(diff <(command_lines default) <(command_lines one))"
if command_lines one | grep -q -e replicas -e etcd -e --job -e lease_ttl; then
  fail "--replicas 1 passes replication flags: $(command_lines one)"
fi
[ ! -e "$out/one/logs/etcd.log" ] || fail "--replicas 1 started etcd"
grep -q "^final test accuracy: 0.8500$" "$out/one/stdout" || fail "no final line: $(cat "$out/one/stdout")"
expect_clean one
echo "--replicas 1: the same command lines as without it, no etcd"

# 2. --replicas 2: etcd up before the shards, every process told where.
run two --replicas 2 --shards 3 --workers 2 || fail "--replicas 2 run: $(cat "$out/two/stderr")"
endpoint=$(sed -n 's/^--etcd_endpoints=//p' "$out/two/record/shard0")
job=$(sed -n 's/^--job=//p' "$out/two/record/shard0")
[[ "$endpoint" =~ ^127\.0\.0\.1:[0-9]+$ ]] || fail "shard 0 got --etcd_endpoints=$endpoint"
[[ "$job" =~ ^local-[A-Za-z0-9]+$ ]] || fail "shard 0 got --job=$job"
for s in 0 1 2; do
  f="$out/two/record/shard$s"
  for flag in --replicas=2 "--etcd_endpoints=$endpoint" "--job=$job" --lease_ttl_s=1 \
              "--shard_index=$s" --num_shards=3; do
    grep -qx -- "$flag" "$f" || fail "shard $s lacks $flag: $(cat "$f")"
  done
  [ "$(cat "$out/two/record/shard$s.etcd")" = "etcd answered" ] ||
    fail "shard $s: $(cat "$out/two/record/shard$s.etcd")"
done
for w in 0 1; do
  f="$out/two/record/worker$w"
  for flag in --replicas=2 "--etcd_endpoints=$endpoint" "--job=$job"; do
    grep -qx -- "$flag" "$f" || fail "worker $w lacks $flag: $(cat "$f")"
  done
  if grep -q -- --lease_ttl_s "$f"; then fail "worker $w got --lease_ttl_s"; fi
done
# Apart from the replication flags, the same command lines as unreplicated.
run three_unreplicated --shards 3 --workers 2 || fail "$(cat "$out/three_unreplicated/stderr")"
[ "$(command_lines three_unreplicated)" = "$(command_lines two | grep -v -e '^--replicas=2$' \
    -e '^--etcd_endpoints=' -e '^--job=' -e '^--lease_ttl_s=1$')" ] ||
  fail "--replicas 2 changed more than the replication flags"
grep -q "psctl chains --etcd_endpoints=$endpoint --job=$job" "$out/two/stderr" ||
  fail "the run does not say how to see the chains: $(cat "$out/two/stderr")"
grep -q "heartbeat\|election\|ready to serve" "$out/two/logs/etcd.log" || fail "no etcd log"
if curl -sf --max-time 1 "http://$endpoint/health" >/dev/null 2>&1; then
  fail "etcd still answers on $endpoint after the run"
fi
expect_clean two
echo "--replicas 2: etcd on $endpoint answered every shard; flags passed; etcd stopped"

# 3. A failed chief: run-local fails and still stops etcd.
rc=0
FAKE_WORKER=fail run failed --replicas 2 || rc=$?
[ "$rc" != 0 ] || fail "run-local exited 0 after its chief failed"
grep -q "chief worker 0 died (exit status 3)" "$out/failed/stderr" || fail "$(cat "$out/failed/stderr")"
expect_clean failed
echo "failed chief: exit $rc, etcd stopped"

# 4. SIGTERM while the job runs (as Ctrl-C): everything stops, etcd too.
mkdir -p "$out/term/record" "$out/term/tmp"
RECORD="$out/term/record" TMPDIR="$out/term/tmp" BUILD_DIR="$out/build" FAKE_WORKER=wait \
  "$root/scripts/run-local.sh" --no-build --replicas 2 --logs "$out/term/logs" \
  >"$out/term/stdout" 2>"$out/term/stderr" &
run_pid=$!
for _ in $(seq 300); do [ -s "$out/term/record/worker0" ] && break; sleep 0.1; done
[ -s "$out/term/record/worker0" ] || fail "the chief did not start: $(cat "$out/term/stderr")"
[ -n "$(holders "$out/term/logs/etcd.log")" ] || fail "etcd is not running"
kill -TERM "$run_pid"
rc=0
for _ in $(seq 200); do kill -0 "$run_pid" 2>/dev/null || break; sleep 0.1; done
wait "$run_pid" || rc=$?
run_pid=""
[ "$rc" = 130 ] || fail "run-local exited $rc after SIGTERM: $(cat "$out/term/stderr")"
expect_clean term
echo "SIGTERM: exit 130, etcd stopped"

# 5. Refused before anything starts.
expect_refused() {  # message run-local-flags...
  local message=$1 rc=0
  shift
  mkdir -p "$out/refused/tmp"
  TMPDIR="$out/refused/tmp" BUILD_DIR="$out/build" "$root/scripts/run-local.sh" --no-build "$@" \
    >/dev/null 2>"$out/refused/stderr" || rc=$?
  [ "$rc" = 2 ] || fail "run-local $* exited $rc"
  grep -qF -- "$message" "$out/refused/stderr" || fail "run-local $*: $(cat "$out/refused/stderr")"
  [ -z "$(ls -A "$out/refused/tmp")" ] || fail "run-local $* left $(ls -A "$out/refused/tmp")"
}
expect_refused "--replicas must be 1, 2 or 3" --replicas 4
expect_refused "--replicas must be 1, 2 or 3" --replicas 0
expect_refused "--replicas must be 1, 2 or 3" --replicas two
expect_refused "--replicas 3 needs at least 3 shards (--shards 2)" --replicas 3
ETCD_BIN="$out/no-etcd" expect_refused "needs etcd" --replicas 2
echo "run-local --replicas OK"
