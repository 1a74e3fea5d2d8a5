#!/usr/bin/env bash
# Training throughput with replicated shards against the same job
# unreplicated: scripts/run-local.sh with --replicas 1, 2 and 3 in
# interleaved rounds (1,2,3,1,2,3,...), so machine drift hits every setting
# alike. Per setting: the median round's samples/s (the chief's results
# JSON, all epochs), its ratio to R=1, and the CPU seconds (user + sys of
# every process of the run: shards, workers, etcd) per 1000 samples, with
# its ratio to R=1. On a machine whose cores are all busy, samples/s falls
# with the CPU per sample; with cores to spare it falls only with latency.
#
#   bench/replication_train_ratio.sh [--build DIR] [--rounds N] [--shards N]
#       [--workers N] [--epochs N] [--batch N] [--replicas "1 2 3"]
#       [--mode async|sync] [--device cpu|cuda] [--paths "frames grpc base"]
#       [--base-build DIR] [--out FILE]
#
# --paths: the data paths to run, interleaved too: frames (the shards' data
# ports, run-local's default) and grpc (ps-server --data_listen= : the data
# path on gRPC) and base (the binaries of an earlier build, --base-build
# DIR/bin, on gRPC: the job as it ran before the data port); each frames
# row also gives its samples/s and CPU against the other paths. With
# --replicas 1 it compares the data paths alone, e.g. issue 29's run-local
# sync 2 x 2 against the build it started from: --mode sync --shards 2
# --workers 2 --replicas 1 --paths "frames grpc base" --base-build DIR.
# --mode: run-local's (default async).
#
# The cost of replication per step grows with the model's bytes, the
# compute per step with the batch: a larger --batch shows what it costs a
# job whose steps are not mostly communication. --device cuda runs the
# workers' compute on the GPU (run-local's --device).
#
# Needs ps-server and ps-worker in --build DIR/bin (default build/bin),
# etcd (Debian etcd-server) and the dataset run-local.sh uses.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build" rounds=3 shards=3 workers=2 epochs=10 batch=64 replicas="1 2 3" device=cpu out=""
mode=async base_build=""
paths=frames
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --replicas) replicas=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --paths) paths=$2; shift 2 ;;
    --base-build) base_build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
for b in ps-server ps-worker; do
  [ -x "$build/bin/$b" ] || { echo "missing $build/bin/$b (build it first)" >&2; exit 1; }
done
if [[ " $paths " == *" base "* ]]; then
  for b in ps-server ps-worker; do
    [ -x "$base_build/bin/$b" ] || { echo "--paths base needs --base-build DIR with bin/$b" >&2; exit 1; }
  done
fi
tmp=$(mktemp -d -t replication_ratio.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# One run of R replicas on data path P: prints "samples/s cpu_seconds accuracy".
run_once() {
  local r=$1 path=$2 json="$tmp/results-$1.json" server_flags=() binaries=$build
  [ "$path" = frames ] || server_flags=(-- --data_listen=)
  [ "$path" = base ] && binaries=$base_build
  rm -f "$json"
  /usr/bin/time -f '%U %S' -o "$tmp/time" env BUILD_DIR="$binaries" "$root/scripts/run-local.sh" \
    --no-build --shards "$shards" --workers "$workers" --epochs "$epochs" --batch "$batch" \
    --replicas "$r" --device "$device" --mode "$mode" \
    --results "$json" "${server_flags[@]}" >"$tmp/run-$r.txt" 2>&1 || { cat "$tmp/run-$r.txt" >&2; exit 1; }
  local sps acc cpu
  sps=$(sed -n 's/.*"samples_per_second": *\([0-9.]*\).*/\1/p' "$json" | head -1)
  acc=$(sed -n 's/.*"test_accuracy": *\([0-9.]*\).*/\1/p' "$json" | tail -1)
  cpu=$(awk '{ print $1 + $2 }' "$tmp/time")
  [ -n "$sps" ] || { echo "no samples_per_second in $json" >&2; cat "$tmp/run-$r.txt" >&2; exit 1; }
  echo "$sps $cpu ${acc:-0}"
}

samples=$((60000 / workers * workers * epochs))  # every worker's share of the epoch, every epoch
for ((i = 1; i <= rounds; i++)); do
  for r in $replicas; do
    for path in $paths; do
      read -r sps cpu acc < <(run_once "$r" "$path")
      printf 'round %d  R=%d  %-6s  samples/s %8.0f  cpu %6.1f s  accuracy %s\n' "$i" "$r" "$path" "$sps" "$cpu" "$acc" >&2
      echo "$path $r $sps $cpu $acc" >>"$tmp/rows"
    done
  done
done

# Per data path and R, the median round by samples/s.
report=$(sort -k1,1 -k2,2n -k3,3n "$tmp/rows" | awk -v rounds="$rounds" -v samples="$samples" -v paths="$paths" '
{ k = $1 SUBSEP $2; n[k]++; sps[k, n[k]] = $3; cpu[k, n[k]] = $4; acc[k, n[k]] = $5 }
END {
  mid = int((rounds + 1) / 2)
  np = split(paths, p, " ")
  printf "%-7s %-3s %12s %8s %16s %8s %9s%s\n", "path", "R", "samples/s", "vs R=1", "CPU-s/1k samples",
    "vs R=1", "accuracy", (np > 1 ? "  frames against: samples/s, CPU" : "")
  for (i = 1; i <= np; i++) {
    base = p[i] SUBSEP 1
    base_sps = sps[base, mid]; base_cpu = cpu[base, mid] * 1000 / samples
    for (r = 1; r <= 3; r++) {
      k = p[i] SUBSEP r
      if (!(k in n)) continue
      c = cpu[k, mid] * 1000 / samples
      vs = ""
      for (j = 1; j <= np && p[i] == "frames"; j++) {
        g = p[j] SUBSEP r
        if (p[j] == "frames" || !(g in n)) continue
        vs = vs sprintf("  %s %.2f, %.2f", p[j], sps[k, mid] / sps[g, mid], cpu[k, mid] / cpu[g, mid])
      }
      printf "%-7s %-3d %12.0f %8.2f %16.3f %8.2f %9s%s\n", p[i], r, sps[k, mid], (base_sps ? sps[k, mid] / base_sps : 0),
        c, (base_cpu ? c / base_cpu : 0), acc[k, mid], vs
    }
  }
}')
header="# replication_train_ratio: scripts/run-local.sh --mode $mode --shards $shards --workers $workers --epochs $epochs --batch $batch --device $device --replicas R; data paths: $paths${base_build:+ (base: a build of $(git -C "$base_build/.." rev-parse --short HEAD 2>/dev/null || echo "another tree"))}
# $rounds interleaved rounds, median round per data path and R (by samples/s); CPU = user+sys of every process of the run
# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)
# machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
printf '%s\n%s\n' "$header" "$report"
[ -z "$out" ] || { printf '%s\n%s\n' "$header" "$report" >"$out"; echo "wrote $out"; }
