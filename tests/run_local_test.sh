#!/usr/bin/env bash
# Runs the README's main command for one epoch and checks what a user sees:
# per-epoch progress, the final accuracy line, the results file, checkpoints
# in --checkpoint-dir, and that no process it started and no temporary
# directory is left behind. Then kills the chief of a second run: run-local
# must say so and exit non-zero, never 0 without a final accuracy.
set -euo pipefail
root=$1
build_dir=$2
out=$(mktemp -d -t shardtrain-run-local-test.XXXXXX)
source "$(dirname "$0")/run_local_test_lib.sh"
mkdir -p "$out/tmp" "$out/tmp2"

TMPDIR="$out/tmp" BUILD_DIR="$build_dir" "$root/scripts/run-local.sh" --no-build --epochs 1 \
  --results "$out/results.json" --logs "$out/logs" --checkpoint-dir "$out/ckpt" \
  >"$out/stdout" 2>"$out/stderr" || { cat "$out/stdout" "$out/stderr"; exit 1; }
cat "$out/stdout"
grep -q '^epoch 1/1  loss [0-9.]*  test_acc 0\.[0-9]*  samples/s [0-9]*  staleness' "$out/stdout"
grep -q '^final test accuracy: 0\.[0-9]\{4\}$' "$out/stdout"
for key in final_test_accuracy epochs wall_seconds samples_per_second mode \
           workers shards per_epoch; do
  grep -q "\"$key\"" "$out/results.json" || { echo "results lack $key"; exit 1; }
done
grep -q '"mode": "async"' "$out/results.json"
accuracy=$(sed -n 's/.*"final_test_accuracy": \([0-9.]*\).*/\1/p' "$out/results.json")
awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.80) }' || { echo "accuracy $accuracy < 0.80 after one epoch"; exit 1; }
expect_no_processes "$out/logs"
[ -z "$(ls -A "$out/tmp")" ] || fail "run-local.sh left behind: $(ls -A "$out/tmp")"
for s in 0 1; do
  compgen -G "$out/ckpt/shard-$s-of-2-*.ckpt" >/dev/null || fail "no checkpoint of shard $s"
done
echo "run-local OK: accuracy $accuracy, checkpoints in --checkpoint-dir, nothing left behind"

# --overlap stale: each step's PushPull runs behind the next step's compute,
# on the worker's exchange thread; the job trains as well and ends cleanly.
mkdir -p "$out/tmp-stale"
TMPDIR="$out/tmp-stale" BUILD_DIR="$build_dir" "$root/scripts/run-local.sh" --no-build \
  --epochs 1 --workers 1 --shards 1 --overlap stale --results "$out/stale.json" \
  --logs "$out/logs-stale" >"$out/stale.out" 2>&1 || { cat "$out/stale.out"; exit 1; }
grep -q '^epoch 1/1  loss [0-9.]*  test_acc 0\.[0-9]*  samples/s [0-9]*  staleness mean 1\.00 max 1 ' \
  "$out/stale.out" || fail "--overlap stale: no epoch line with staleness 1: $(cat "$out/stale.out")"
accuracy=$(sed -n 's/.*"final_test_accuracy": \([0-9.]*\).*/\1/p' "$out/stale.json")
awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.80) }' || fail "--overlap stale: accuracy $accuracy < 0.80"
expect_no_processes "$out/logs-stale"
[ -z "$(ls -A "$out/tmp-stale")" ] || fail "run-local.sh --overlap stale left behind: $(ls -A "$out/tmp-stale")"
echo "run-local --overlap stale OK: accuracy $accuracy"

# --resume needs a checkpoint of every shard.
rc=0
BUILD_DIR="$build_dir" "$root/scripts/run-local.sh" --no-build --resume "$out/nothing" \
  >/dev/null 2>"$out/resume.err" || rc=$?
[ "$rc" = 2 ] || fail "--resume of an empty directory exited $rc"
grep -q "no checkpoint of shard 0 of 2" "$out/resume.err" || fail "$(cat "$out/resume.err")"

# A dead chief: run-local stops, says so, and exits non-zero.
TMPDIR="$out/tmp2" BUILD_DIR="$build_dir" "$root/scripts/run-local.sh" --no-build --epochs 50 \
  --logs "$out/logs2" >"$out/stdout2" 2>"$out/stderr2" &
run_pid=$!
chief=""
for _ in $(seq 600); do
  chief=$(find /proc/[0-9]*/fd -lname "$out/logs2/worker0.log" 2>/dev/null | head -n 1 | cut -d/ -f3 || true)
  [ -n "$chief" ] && break
  sleep 0.1
done
[ -n "$chief" ] || fail "the chief of the second run did not start: $(cat "$out/stderr2")"
sleep 1
kill -KILL "$chief"
rc=0
for _ in $(seq 600); do kill -0 "$run_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$run_pid" 2>/dev/null && fail "run-local.sh still runs 60 s after its chief died"
wait "$run_pid" || rc=$?
run_pid=""
[ "$rc" != 0 ] || fail "run-local.sh exited 0 after its chief died"
grep -q "chief worker 0 died (killed by SIGKILL); no final evaluation; restart it with the same flags to resume" \
  "$out/stderr2" || fail "no dead-chief message: $(cat "$out/stderr2")"
if grep -q "final test accuracy" "$out/stdout2"; then fail "a final accuracy without a chief"; fi
expect_no_processes "$out/logs2"
[ -z "$(ls -A "$out/tmp2")" ] || fail "run-local.sh left behind: $(ls -A "$out/tmp2")"
echo "dead chief OK: exit $rc"
