#!/usr/bin/env bash
# Training throughput against compute alone: one worker's compute-only
# samples/s (step_bench's compute1 baseline: forward + backward + gradient
# copies of the same model and batch, no parameter server), measured before
# and after a real run of scripts/run-local.sh (1 worker, 1 shard, ps-server
# and ps-worker processes), and the ratio run-local samples/s / compute-only
# samples/s. The compute-only figure is the mean of the two measurements, so
# a machine whose speed drifts during the run affects both sides alike. The
# epochs-only ratio leaves out the time between epochs (the chief evaluates
# the test set after each), which the compute-only side does not spend.
#
#   bench/train_ratio.sh [--build DIR] [--batch N] [--epochs N] [--model SPEC]
#                        [--steps N] [--out FILE] [--server_flag FLAG]...
#                        [--overlap auto|on|off|stale]
#
# --server_flag passes FLAG on to the ps-server (repeatable), e.g.
# --server_flag --data_listen= to keep the data path on gRPC. --overlap goes
# to run-local.sh (default auto: off on a CPU).
#
# Needs ps-server, ps-worker and step_bench built in --build DIR/bin
# (default build/bin) and the dataset run-local.sh uses.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build" batch=128 epochs=3 model=mlp:784-256-128-10 steps=30 out="" overlap=auto
server_flags=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --server_flag) server_flags+=("$2"); shift 2 ;;
    --overlap) overlap=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
bin="$build/bin"
for b in ps-server ps-worker step_bench; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b (build it first)" >&2; exit 1; }
done
tmp=$(mktemp -d -t train_ratio.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# compute1 (ms per step) from step_bench's first table row.
compute_ms() {
  "$bin/step_bench" --model="$model" --batch="$batch" --shards=1 --steps="$steps" \
    >"$tmp/step.txt" 2>"$tmp/step.err"
  awk '$1 == "1" && $2 == "sequential" { print $3; exit }' "$tmp/step.txt"
}

before_ms=$(compute_ms)
start=$(date +%s.%N)
BUILD_DIR="$build" "$root/scripts/run-local.sh" --no-build --workers 1 --shards 1 \
  --batch "$batch" --epochs "$epochs" --model "$model" --overlap "$overlap" \
  --results "$tmp/results.json" \
  -- "${server_flags[@]}" >"$tmp/run.txt" 2>&1 || { cat "$tmp/run.txt" >&2; exit 1; }
end=$(date +%s.%N)
after_ms=$(compute_ms)
train_sps=$(sed -n 's/.*"samples_per_second": \([0-9.]*\).*/\1/p' "$tmp/results.json" | head -1)
# The epochs alone: the samples of all epochs over the sum of their seconds,
# leaving out what the run does between them (the chief's evaluations).
epoch_sps=$(awk -F'[:,]' '/"epoch": / {
    for (i = 1; i < NF; ++i) {
      if ($i ~ /"seconds"/) s = $(i + 1)
      if ($i ~ /"samples_per_second"/) r = $(i + 1)
    }
    secs += s; samples += s * r
  } END { if (secs > 0) printf "%.1f", samples / secs }' "$tmp/results.json")
[ -n "$before_ms" ] && [ -n "$after_ms" ] && [ -n "$train_sps" ] && [ -n "$epoch_sps" ] || {
  echo "could not read the figures" >&2; cat "$tmp/step.txt" "$tmp/run.txt" >&2; exit 1; }

report=$(awk -v b="$before_ms" -v a="$after_ms" -v s="$train_sps" -v n="$batch" \
  -v e="$epoch_sps" -v model="$model" -v epochs="$epochs" -v overlap="$overlap" -v wall="$(awk -v s="$start" -v e="$end" 'BEGIN { print e - s }')" '
BEGIN {
  c1 = n * 1000 / b; c2 = n * 1000 / a; c = (c1 + c2) / 2
  printf "# train_ratio: run-local samples/s vs one worker'"'"'s compute-only samples/s\n"
  printf "# model %s, batch %d; run-local: --workers 1 --shards 1 --epochs %d --overlap %s (%.0f s wall)\n", model, n, epochs, overlap, wall
  printf "# compute-only = batch / step_bench compute1 (forward+backward+gradient copies, no PS), mean of a run before and after\n"
  printf "compute-only samples/s   %10.0f   (before %.0f, after %.0f; compute1 %.2f / %.2f ms)\n", c, c1, c2, b, a
  printf "run-local samples/s      %10.0f   (results JSON samples_per_second, all epochs)\n", s
  printf "ratio                    %10.2f\n", s / c
  printf "epochs-only samples/s    %10.0f   (the epochs alone, without the evaluations between them)\n", e
  printf "epochs-only ratio        %10.2f\n", e / c
}')
# The kernels both sides' GEMMs ran on (step_bench's header says; the
# worker's OpenBLAS loads in the same environment).
kernels=$(sed -n 's/.*OpenBLAS threads, \([^ ]*\) kernels.*/\1/p' "$tmp/step.txt" | head -1)
header="# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')
# machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, OpenBLAS ${kernels:-?} kernels${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}"
printf '%s\n%s\n' "$header" "$report"
[ -z "$out" ] || { printf '%s\n%s\n' "$header" "$report" >"$out"; echo "wrote $out"; }
