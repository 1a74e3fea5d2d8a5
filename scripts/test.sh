#!/usr/bin/env bash
# Installs what the build and tests need (Debian packages), builds shardtrain
# in Release into build/, checks the lock annotations with clang
# (scripts/check-thread-safety.sh, into build-tsa/; SHARDTRAIN_TSA=0 skips
# it), fuzzes the shard's request path and data port for 60 s
# (scripts/fuzz.sh; SHARDTRAIN_FUZZ_SECONDS sets the time, 0 skips it) and
# runs every test with ctest.
# Extra arguments go to ctest (e.g. -R SyncEquivalence, -L e2e) and skip the
# lock check and the fuzzing. Without arguments the Debian package test
# (label deb: it bootstraps a bookworm root, about 300 MB of downloads and
# 4-5 minutes the first time) is left out unless SHARDTRAIN_DEB_TEST=1;
# `scripts/test.sh -L deb` runs it alone.
#
# Without arguments the phases overlap where they do not compete:
#  - the container tests' base image and Prometheus image (downloads and
#    unpacking, deploy/check/container-live.sh base) are made while the
#    Release build compiles;
#  - the lock check and the fuzz targets' build run beside ctest in the idle
#    scheduling class (chrt --idle: they get only the CPU time no test wants;
#    the multi-process tests leave about a third of two cores idle while
#    they wait on processes, sockets and timeouts), and their logs are
#    printed when they end. The fuzzing itself runs after ctest, alone, as
#    its time limit is wall-clock time.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_packages "${SHARDTRAIN_PACKAGES[@]}"
mkdir -p "$BUILD_DIR"
checks=0
[ $# -eq 0 ] && checks=1
base_pid=""
if [ $checks = 1 ] && [ "$(id -u)" = 0 ] && command -v podman >/dev/null; then
  log "making the container tests' base images in the background (log: $BUILD_DIR/container-base.log)"
  "$SHARDTRAIN_ROOT/deploy/check/container-live.sh" "$SHARDTRAIN_ROOT" "$BUILD_DIR" base \
    >"$BUILD_DIR/container-base.log" 2>&1 &
  base_pid=$!
fi
log "building (Release) into $BUILD_DIR"
build_targets
if [ -n "$base_pid" ]; then
  # A failure here is the container tests' to report: they make what is missing.
  wait "$base_pid" && log "container base images ready" ||
    log "container base images not made (deploy.container-image tries again): $(tail -n 1 "$BUILD_DIR/container-base.log")"
fi

fuzz_seconds="${SHARDTRAIN_FUZZ_SECONDS:-60}"
tsa=0 fuzz=0
[ $checks = 1 ] && [ "${SHARDTRAIN_TSA:-1}" != 0 ] && tsa=1
[ $checks = 1 ] && [ "$fuzz_seconds" -gt 0 ] && fuzz=1
checks_pid=""
checks_log="$BUILD_DIR/background-checks.log"
if [ $tsa = 1 ] || [ $fuzz = 1 ]; then
  log "lock check and fuzz targets' build beside the tests, in the idle class (log: $checks_log)"
  (
    chrt --idle -p 0 "$BASHPID" 2>/dev/null || renice -n 19 -p "$BASHPID" >/dev/null
    [ $tsa = 0 ] || "$SHARDTRAIN_ROOT/scripts/check-thread-safety.sh"
    [ $fuzz = 0 ] || "$SHARDTRAIN_ROOT/scripts/fuzz.sh" --build-only
  ) </dev/null >"$checks_log" 2>&1 &
  checks_pid=$!
fi

log "running tests"
selection=()
if [ $# -eq 0 ] && [ "${SHARDTRAIN_DEB_TEST:-0}" != 1 ]; then
  selection=(-LE '^deb$')
fi
status=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j2 "${selection[@]}" "$@") || status=$?

if [ -n "$checks_pid" ]; then
  checks_status=0
  wait "$checks_pid" || checks_status=$?
  cat "$checks_log" >&2
  if [ $checks_status != 0 ]; then
    log "FAILED: the lock check or the fuzz targets' build (above)"
    exit 1
  fi
fi
if [ $fuzz = 1 ]; then
  "$SHARDTRAIN_ROOT/scripts/fuzz.sh" "$fuzz_seconds"
fi
[ $status = 0 ] || log "FAILED: ctest exited $status"
exit $status
