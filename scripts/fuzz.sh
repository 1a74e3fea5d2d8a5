#!/usr/bin/env bash
# Usage: scripts/fuzz.sh [SECONDS | --build-only]
# Builds the shard_fuzz, wire_fuzz and data_port_fuzz libFuzzer targets
# (clang, AddressSanitizer, UndefinedBehaviorSanitizer; server/fuzz/) into
# build-fuzz/, replays the crash reproducers in server/fuzz/regressions/,
# then fuzzes for SECONDS in all (default 60): half shard_fuzz from a seed
# corpus of real requests, a quarter wire_fuzz (the zero-copy parsers
# against stock protobuf) from sample messages, a quarter data_port_fuzz
# (connections to a shard's data port) from one connection per call. Fails on any
# crash, sanitizer report, leak, hang (25 s per input), single allocation
# over 512 MB or RSS over 1 GB; the input that did it is kept in
# build-fuzz/fuzz-artifacts/ (replay: build-fuzz/bin/shard_fuzz FILE).
# --build-only builds the targets and stops (scripts/test.sh builds them
# beside the tests and fuzzes after).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

build_only=0
if [ "${1:-}" = --build-only ]; then
  build_only=1
  shift
fi
seconds=${1:-60}
fuzz_dir="${FUZZ_BUILD_DIR:-$SHARDTRAIN_ROOT/build-fuzz}"
ensure_packages "${SHARDTRAIN_PACKAGES[@]}"

log "building shard_fuzz, wire_fuzz and data_port_fuzz (clang, sanitizers) into $fuzz_dir"
CC=clang CXX=clang++ cmake -S "$SHARDTRAIN_ROOT" -B "$fuzz_dir" \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS_RELEASE="-O1 -gline-tables-only" -DCMAKE_CXX_FLAGS_RELEASE="-O1 -gline-tables-only" \
  -DSHARDTRAIN_FUZZ=ON -DSHARDTRAIN_WITH_CUDA=OFF \
  -DSHARDTRAIN_BUILD_TESTS=OFF -DSHARDTRAIN_BUILD_BENCH=OFF >/dev/null
# Each target depends on its seed generator and writes its seeds.
cmake --build "$fuzz_dir" -j2 --target shard_fuzz wire_fuzz data_port_fuzz
[ $build_only = 0 ] || exit 0

fuzzer="$fuzz_dir/bin/shard_fuzz"
seeds="$fuzz_dir/server/fuzz/seeds"
artifacts="$fuzz_dir/fuzz-artifacts"
mkdir -p "$artifacts"
limits=(-rss_limit_mb=1024 -malloc_limit_mb=512 -timeout=25)
fuzz_log="$fuzz_dir/fuzz.log"

# Prints the end of the log and fails.
fail() {
  tail -n 60 "$fuzz_log" >&2
  log "FAILED: $1 (log: $fuzz_log; inputs kept in $artifacts)"
  exit 1
}

regressions=("$SHARDTRAIN_ROOT"/server/fuzz/regressions/*)
if [ -e "${regressions[0]}" ]; then
  log "replaying ${#regressions[@]} regression input(s)"
  "$fuzzer" "${limits[@]}" "${regressions[@]}" >"$fuzz_log" 2>&1 \
    || fail "a regression input crashes again"
fi

wire_seconds=$(( seconds / 4 > 0 ? seconds / 4 : 1 ))
data_port_seconds=$wire_seconds
shard_seconds=$(( seconds - 2 * wire_seconds > 0 ? seconds - 2 * wire_seconds : 1 ))
corpus=$(mktemp -d)
wire_corpus=$(mktemp -d)
data_port_corpus=$(mktemp -d)
trap 'rm -rf "$corpus" "$wire_corpus" "$data_port_corpus"' EXIT

# Prints the end of a run's statistics.
summary() {
  grep -E '^#[0-9]+[[:space:]]+DONE' "$fuzz_log" >&2 || true
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$fuzz_log" >&2 || true
}

log "fuzzing shard_fuzz for ${shard_seconds}s"
"$fuzzer" "${limits[@]}" -max_total_time="$shard_seconds" -print_final_stats=1 \
  -dict="$SHARDTRAIN_ROOT/server/fuzz/shard_fuzz.dict" \
  -artifact_prefix="$artifacts/" "$corpus" "$seeds" >"$fuzz_log" 2>&1 \
  || fail "shard_fuzz found a crash"
summary

log "fuzzing wire_fuzz for ${wire_seconds}s"
"$fuzz_dir/bin/wire_fuzz" "${limits[@]}" -max_total_time="$wire_seconds" -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "$wire_corpus" "$fuzz_dir/server/fuzz/wire_seeds" \
  >"$fuzz_log" 2>&1 || fail "wire_fuzz found a crash (replay: $fuzz_dir/bin/wire_fuzz FILE)"
summary

log "fuzzing data_port_fuzz for ${data_port_seconds}s"
"$fuzz_dir/bin/data_port_fuzz" "${limits[@]}" -max_len=4096 -max_total_time="$data_port_seconds" \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$data_port_corpus" \
  "$fuzz_dir/server/fuzz/data_port_seeds" >"$fuzz_log" 2>&1 \
  || fail "data_port_fuzz found a crash (replay: $fuzz_dir/bin/data_port_fuzz FILE)"
summary

log "fuzzing passed"
