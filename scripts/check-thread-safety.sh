#!/usr/bin/env bash
# Usage: scripts/check-thread-safety.sh [REGEX]
# Checks the lock annotations of every project source file, tests and
# benchmarks included, with clang's -Wthread-safety
# -Werror=thread-safety (SHARDTRAIN_THREAD_SAFETY):
# a guarded member read or written without its mutex, a function that needs
# a lock called without it, a lock not released on every path. GCC ignores
# the annotations, so this is the only place they are checked.
# The analysis is part of clang's front end, so the files are only parsed
# (-fsyntax-only), not compiled or linked: build-tsa/ holds the
# configuration, the generated protobuf headers and precompiled headers of
# the libraries' headers (syntax-check.py --pch-dir; they halve the time),
# no binaries. Test sources that name no lock are left out (nothing in
# them for the analysis: syntax-check.py --lock-free-tests). REGEX
# limits the check to the source files whose path matches it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tsa_dir="${TSA_BUILD_DIR:-$SHARDTRAIN_ROOT/build-tsa}"
ensure_packages "${SHARDTRAIN_PACKAGES[@]}"

log "checking lock annotations (clang -Wthread-safety) in $tsa_dir"
CC=clang CXX=clang++ cmake -S "$SHARDTRAIN_ROOT" -B "$tsa_dir" \
  -DCMAKE_BUILD_TYPE=Release -DSHARDTRAIN_THREAD_SAFETY=ON \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON \
  -DSHARDTRAIN_WITH_CUDA=OFF -DSHARDTRAIN_BUILD_BENCH=ON \
  -DSHARDTRAIN_BUILD_TESTS=ON >/dev/null
# The sources include the generated protobuf and gRPC headers.
cmake --build "$tsa_dir" -j2 --target shardtrain_proto_sources shardtrain_etcd_proto_sources \
  shardtrain_bench_echo_proto_sources
"$SHARDTRAIN_ROOT/scripts/syntax-check.py" "$tsa_dir/compile_commands.json" \
  --skip "^$tsa_dir/" --only "${1:-}" --lock-free-tests --jobs 2 \
  --pch-dir "$tsa_dir/syntax-check-pch"
log "lock annotations check passed"
