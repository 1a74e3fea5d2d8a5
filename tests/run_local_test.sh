#!/usr/bin/env bash
# Runs the README's main command for one epoch and checks what a user sees:
# per-epoch progress, the final accuracy line, the results file, and that no
# process it started is left running.
set -euo pipefail
root=$1
build_dir=$2
out=$(mktemp -d -t shardtrain-run-local-test.XXXXXX)
trap 'rm -rf "$out"' EXIT

BUILD_DIR="$build_dir" "$root/scripts/run-local.sh" --no-build --epochs 1 \
  --results "$out/results.json" --logs "$out/logs" >"$out/stdout" 2>"$out/stderr" || {
  cat "$out/stdout" "$out/stderr"; exit 1; }
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

# Every process the script started wrote to a log in $out/logs; none may
# still hold one open.
if find /proc/[0-9]*/fd -lname "$out/logs/*" 2>/dev/null | grep -q .; then
  echo "processes started by run-local.sh are still running"; exit 1
fi
echo "run-local OK: accuracy $accuracy"
