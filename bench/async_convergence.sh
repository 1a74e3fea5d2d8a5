#!/usr/bin/env bash
# Accuracy against the worker count for the ways a parameter server can run
# momentum SGD asynchronously, all at the same --lr and epochs as a
# synchronous run of the same job (issue 27). Each cell is the final test
# accuracy of scripts/run-local.sh (the Fashion-MNIST MLP, 2 shards,
# ps-server and ps-worker processes, cosine schedule) with:
#
#   sync             --mode sync --optimizer momentum
#   async heavy ball --optimizer momentum --async_momentum=heavy_ball
#   staleness lr     the same with --staleness_aware_lr
#   DC-ASGD          --optimizer sgd --delay_compensation=LAMBDA (MXNet's
#                    formula; it applies to momentum-free rules)
#   Delayed Nesterov --optimizer momentum (the async default)
#
# Pushes are admitted in arrival order, as the machine's timing makes it
# (the table says so); NaN marks a run that diverged: a worker's gradient
# went NaN or Inf, the shard refused it and the job stopped.
#
#   bench/async_convergence.sh [--build DIR] [--workers "2 4 8 16"]
#                              [--epochs N] [--lr X] [--lambda X] [--out FILE]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build" workers="2 4 8 16" epochs=3 lr=0.1 lambda=0.04 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --lambda) lambda=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
for b in ps-server ps-worker; do
  [ -x "$build/bin/$b" ] || { echo "missing $build/bin/$b (build it first)" >&2; exit 1; }
done
tmp=$(mktemp -d -t async_convergence.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# One run-local job; prints its final test accuracy, NaN when it diverged
# (a worker's gradient went NaN or Inf and the shard refused it), "failed"
# when it ended otherwise.
accuracy() {
  local n=$1; shift
  local result="$tmp/result.json"
  rm -f "$result"
  if BUILD_DIR="$build" "$root/scripts/run-local.sh" --no-build --workers "$n" --shards 2 \
      --epochs "$epochs" --lr "$lr" --results "$result" "$@" >"$tmp/run.log" 2>&1 &&
     [ -s "$result" ]; then
    sed -n 's/.*"final_test_accuracy": *\([-0-9.eE+naNinf]*\).*/\1/p' "$result" | head -1
  elif grep -qE 'is -?(nan|inf); NaN and Inf are rejected' "$tmp/run.log"; then
    echo NaN
  else
    echo failed
  fi
}

rules=("sync" "async heavy ball" "staleness lr" "DC-ASGD" "Delayed Nesterov")
args_for() {
  case "$1" in
    "sync") echo "--mode sync --optimizer momentum" ;;
    "async heavy ball") echo "--optimizer momentum -- --async_momentum=heavy_ball" ;;
    "staleness lr") echo "--optimizer momentum -- --async_momentum=heavy_ball --staleness_aware_lr" ;;
    "DC-ASGD") echo "--optimizer sgd -- --delay_compensation=$lambda" ;;
    "Delayed Nesterov") echo "--optimizer momentum" ;;
  esac
}

{
  echo "# async_convergence: final test accuracy, Fashion-MNIST MLP, momentum 0.9, lr $lr,"
  echo "# $epochs epochs, 2 shards, pushes in arrival order; $(nproc) cores, $(date -u +%F)"
  printf '| rule |'; for n in $workers; do printf ' N=%s |' "$n"; done; echo
  printf '| --- |'; for n in $workers; do printf ' --- |'; done; echo
  for rule in "${rules[@]}"; do
    printf '| %s |' "$rule"
    for n in $workers; do
      # shellcheck disable=SC2046  # the rule's flags are words
      printf ' %s |' "$(accuracy "$n" $(args_for "$rule"))"
    done
    echo
  done
} | tee "${out:-/dev/null}"
