#!/usr/bin/env bash
# scripts/run-local.sh --replicas 2 end to end with the real binaries: one
# epoch with every partition on two of three shards (and the etcd run-local
# starts for them) reaches the accuracy of an unreplicated run and leaves
# nothing behind; then a shard killed after the first epoch of a second run
# costs no data: the job finishes on the other replicas without a restart.
# Exits 77 (skipped) without etcd.
set -euo pipefail
root=$1
build_dir=$2
command -v etcd >/dev/null || { echo "SKIP: etcd is not installed (Debian's etcd-server)"; exit 77; }
out=$(mktemp -d -t shardtrain-run-local-replicated-test.XXXXXX)
source "$(dirname "$0")/run_local_test_lib.sh"
mkdir -p "$out/tmp1"
TMPDIR="$out/tmp1" BUILD_DIR="$build_dir" "$root/scripts/run-local.sh" --no-build --epochs 1 \
  --shards 3 --replicas 2 --logs "$out/logs1" >"$out/stdout1" 2>"$out/stderr1" ||
  fail "--replicas 2 run: $(cat "$out/stdout1" "$out/stderr1")"
grep -q '^final test accuracy: 0\.[0-9]\{4\}$' "$out/stdout1" ||
  fail "--replicas 2: no final accuracy; stdout ends: $(tail -n 5 "$out/stdout1"); stderr ends: $(tail -n 5 "$out/stderr1")"
accuracy=$(sed -n 's/^final test accuracy: //p' "$out/stdout1")
awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.80) }' || fail "--replicas 2: accuracy $accuracy < 0.80"
grep -q "psctl chains --etcd_endpoints=127.0.0.1:[0-9]* --job=local-" "$out/stderr1" ||
  fail "--replicas 2 does not say where its chains are: $(cat "$out/stderr1")"
expect_no_processes "$out/logs1"  # etcd too: it logs to logs1/etcd.log
[ -z "$(ls -A "$out/tmp1")" ] || fail "run-local.sh --replicas 2 left behind: $(ls -A "$out/tmp1")"
echo "replicated run OK: accuracy $accuracy with 3 shards x 2 replicas, etcd stopped"

# A replicated shard killed mid-run: its groups keep another copy, so the
# job finishes (the chief's final accuracy) without anyone restarting it.
mkdir -p "$out/tmp2"
TMPDIR="$out/tmp2" BUILD_DIR="$build_dir" "$root/scripts/run-local.sh" --no-build --epochs 3 \
  --shards 3 --replicas 2 --logs "$out/logs2" >"$out/stdout2" 2>"$out/stderr2" &
run_pid=$!
for _ in $(seq 1800); do
  grep -q '^epoch 1/3' "$out/stdout2" 2>/dev/null && break
  kill -0 "$run_pid" 2>/dev/null || break
  sleep 0.1
done
grep -q '^epoch 1/3' "$out/stdout2" || fail "the second run did not finish epoch 1 in 180 s: $(cat "$out/stderr2")"
shard=$(find /proc/[0-9]*/fd -lname "$out/logs2/shard1.log" 2>/dev/null | head -n 1 | cut -d/ -f3 || true)
[ -n "$shard" ] || fail "shard 1 of the second run is not running"
kill -KILL "$shard"
rc=0
for _ in $(seq 1800); do kill -0 "$run_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$run_pid" 2>/dev/null && fail "run-local.sh still runs 180 s after shard 1 died"
wait "$run_pid" || rc=$?
run_pid=""
[ "$rc" = 0 ] || fail "losing one of 2 replicas failed the run (exit $rc): $(tail -n 20 "$out/stderr2")"
grep -q '^final test accuracy: 0\.[0-9]\{4\}$' "$out/stdout2" || fail "no final accuracy after losing shard 1"
expect_no_processes "$out/logs2"
[ -z "$(ls -A "$out/tmp2")" ] || fail "run-local.sh left behind: $(ls -A "$out/tmp2")"
echo "replicated shard lost OK: the job finished on the other replicas"
