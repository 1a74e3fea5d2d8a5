#!/usr/bin/env bash
# Usage: scripts/check-sanitizers.sh [ctest -R pattern]
# Builds shardtrain with AddressSanitizer and UndefinedBehaviorSanitizer
# (SHARDTRAIN_SANITIZE, GCC, -O1) into build-asan/ and runs the tests of the
# data path: the wire codec, the client library, the server and the
# multi-process tests that push and pull through them. Any finding (a leak,
# a use after free, an overflow, a misaligned load) fails the test that hit it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

asan_dir="${ASAN_BUILD_DIR:-$SHARDTRAIN_ROOT/build-asan}"
pattern="${1:-^(WireCompat|ZeroCopy|Payload|PayloadPieces|TopKCompressor|Shard|Optimizer|Checkpoint|Membership|PartitionLocks|ResourceLimits|ShardLimits|RetryPolicy|SyncReplay|PsClient|Modes/BadInput|Workers/SyncEquivalence|Security|Overlap|IdempotentPush)}"
ensure_packages "${SHARDTRAIN_PACKAGES[@]}"

log "building with ASan and UBSan into $asan_dir"
cmake -S "$SHARDTRAIN_ROOT" -B "$asan_dir" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DSHARDTRAIN_SANITIZE=ON -DSHARDTRAIN_WITH_CUDA=OFF -DSHARDTRAIN_BUILD_BENCH=OFF \
  -DSHARDTRAIN_BUILD_TESTS=ON >/dev/null
cmake --build "$asan_dir" -j2
log "running tests matching $pattern under ASan and UBSan"
cd "$asan_dir"
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
  LSAN_OPTIONS="suppressions=$SHARDTRAIN_ROOT/scripts/lsan.supp:print_suppressions=0" \
  ctest --output-on-failure -j2 -R "$pattern"
log "sanitizer check passed"
