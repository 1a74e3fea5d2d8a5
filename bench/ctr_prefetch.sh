#!/usr/bin/env bash
# SparseEmbedding.prefetch against the plain loop: examples/torch_ctr.py
# through scripts/shardtrain-run, the same job with and without --prefetch
# (the next batch's lookup started before this batch computes), in
# interleaved rounds so a machine whose speed drifts affects both sides
# alike. Prints each run's samples/s and AUC, the means and the ratio
# prefetch / plain.
#
#   bench/ctr_prefetch.sh [--workers N] [--shards N] [--samples N]
#                         [--rounds N] [--out FILE]
#
# Needs ps-server and the Python extension built (scripts/shardtrain-run
# finds them) and an interpreter with torch and numpy (PYTHON, default
# /usr/bin/python3).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
workers=1 shards=1 samples=300000 rounds=3 out="" python=${PYTHON:-/usr/bin/python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d -t ctr_prefetch.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

run() {  # run NAME [--prefetch]: appends "NAME samples/s auc" to $tmp/runs
  local name=$1; shift
  "$root/scripts/shardtrain-run" --workers "$workers" --shards "$shards" -- \
    "$python" "$root/examples/torch_ctr.py" --epochs 1 --samples "$samples" \
    --results "$tmp/r.json" "$@" >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
  "$python" -c 'import json, sys
e = json.load(open(sys.argv[1]))["epochs"][-1]
print(sys.argv[2], round(e["samples_per_second"]), "%.4f" % e["auc"])' "$tmp/r.json" "$name" \
    >>"$tmp/runs"
}

for ((r = 0; r < rounds; r++)); do
  run plain
  run prefetch --prefetch
done
report=$(awk -v w="$workers" -v s="$shards" -v n="$samples" '
{ print "run      " $1 "   samples/s " $2 "   AUC " $3; sum[$1] += $2; auc[$1] += $3; k[$1]++ }
END {
  p = sum["plain"] / k["plain"]; f = sum["prefetch"] / k["prefetch"]
  printf "# ctr_prefetch: examples/torch_ctr.py, %d workers x %d shards, %d samples per worker, 1 epoch\n", w, s, n
  printf "mean     plain      samples/s %8.0f   AUC %.4f\n", p, auc["plain"] / k["plain"]
  printf "mean     prefetch   samples/s %8.0f   AUC %.4f\n", f, auc["prefetch"] / k["prefetch"]
  printf "ratio    prefetch / plain   %.2f\n", f / p
}' "$tmp/runs")
header="# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')
# machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
printf '%s\n%s\n' "$header" "$report"
[ -z "$out" ] || { printf '%s\n%s\n' "$header" "$report" >"$out"; echo "wrote $out"; }
