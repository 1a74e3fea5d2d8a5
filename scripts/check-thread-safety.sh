#!/usr/bin/env bash
# Usage: scripts/check-thread-safety.sh [targets...]
# Builds shardtrain with clang and -Wthread-safety -Werror=thread-safety
# (SHARDTRAIN_THREAD_SAFETY) into build-tsa/, tests included so their locking
# is checked too. Fails on any lock-annotation finding: a guarded member read
# or written without its mutex, a function that needs a lock called without
# it, a lock not released on every path. GCC ignores the annotations, so this
# is the only place they are checked. The analysis runs in the front end, so
# the build is unoptimised (-O0, still NDEBUG to see the release code paths):
# its binaries are for the check only, not for running.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tsa_dir="${TSA_BUILD_DIR:-$SHARDTRAIN_ROOT/build-tsa}"
ensure_packages "${SHARDTRAIN_PACKAGES[@]}"

log "checking lock annotations (clang -Wthread-safety) in $tsa_dir"
CC=clang CXX=clang++ cmake -S "$SHARDTRAIN_ROOT" -B "$tsa_dir" \
  -DCMAKE_BUILD_TYPE=Release -DSHARDTRAIN_THREAD_SAFETY=ON \
  -DCMAKE_C_FLAGS_RELEASE="-O0 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O0 -DNDEBUG" \
  -DSHARDTRAIN_WITH_CUDA=OFF -DSHARDTRAIN_BUILD_BENCH=OFF \
  -DSHARDTRAIN_BUILD_TESTS=ON >/dev/null
if [ $# -eq 0 ]; then
  cmake --build "$tsa_dir" -j2
else
  cmake --build "$tsa_dir" -j2 --target "$@"
fi
log "lock annotations check passed"
