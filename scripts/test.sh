#!/usr/bin/env bash
# Installs what the build and tests need (Debian packages), builds shardtrain
# in Release into build/ and runs every test with ctest. Extra arguments go to
# ctest (e.g. -R SyncEquivalence, -L e2e).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_packages "${SHARDTRAIN_PACKAGES[@]}"
log "building (Release) into $BUILD_DIR"
build_targets
log "running tests"
cd "$BUILD_DIR"
ctest --output-on-failure -j2 "$@"
