#!/usr/bin/env bash
# `cmake --install` of a build into a scratch prefix, then used as a user
# would use it:
#  - every installed header preprocesses with the installed include
#    directory alone (the project headers it includes are installed too);
#  - a program outside the project (tests/install/consumer) finds the
#    client with find_package(shardtrain CONFIG), builds against
#    shardtrain::client, and pushes and pulls against the installed
#    ps-server; the installed psctl reads that shard's status;
#  - the installed shardtrain-run runs tests/install/tiny_job.py given as a
#    script path (2 sync workers on 2 shards, shardtrain.torch) with the
#    installed package, which the workers must import (not the build's).
#
#   tests/install_test.sh SOURCE_DIR BUILD_DIR      (KEEP=1 keeps the scratch directory)
set -euo pipefail
root=$1
build=$2
out=$(mktemp -d -t shardtrain-install-test.XXXXXX)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  if [ -n "${KEEP:-}" ]; then echo "kept $out"; else rm -rf "$out"; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $* (${SECONDS} s)"; }

prefix=$out/prefix
step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$out/install.log" 2>&1 ||
  { cat "$out/install.log"; fail "cmake --install failed"; }
for f in bin/ps-server bin/ps-worker bin/psctl bin/shardtrain-run; do
  [ -x "$prefix/$f" ] || fail "$f is not installed"
done
config=$(find "$prefix" -name shardtrainConfig.cmake -path '*/cmake/shardtrain/*')
[ -n "$config" ] || fail "no shardtrainConfig.cmake under $prefix"
[ -n "$(find "$prefix" -name libshardtrain_client.a)" ] || fail "no libshardtrain_client.a"
include=$prefix/include/shardtrain
[ -f "$include/client/ps_client.h" ] || fail "no include/shardtrain/client/ps_client.h"
init=$(find "$prefix" -path '*-packages/shardtrain/__init__.py')
[ -n "$init" ] || fail "the Python package is not installed"
[ -n "$(find "$(dirname "$init")" -name '_core.*.so')" ] || fail "the extension is not installed"
[ -f "$(dirname "$init")/torch.py" ] || fail "shardtrain/torch.py is not installed"

step "the installed headers include only installed headers"
# One translation unit with every header, preprocessed with the installed
# include directory alone: an include that is not installed fails it.
find "$include" -name '*.h' | sort | sed "s|^$include/|#include \"|; s|\$|\"|" >"$out/all_headers.cc"
"${CXX:-c++}" -std=c++17 -E -x c++ -I"$include" "$out/all_headers.cc" -o /dev/null 2>"$out/pp.err" ||
  { head -n 20 "$out/pp.err"; fail "installed headers include files that are not installed"; }
echo "$(wc -l <"$out/all_headers.cc") headers"

step "an out-of-tree program: find_package(shardtrain CONFIG), shardtrain::client"
cmake -S "$root/tests/install/consumer" -B "$out/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$out/consumer.log" 2>&1 ||
  { cat "$out/consumer.log"; fail "configuring the consumer failed"; }
found=$(sed -n 's/^shardtrain_DIR:PATH=//p' "$out/consumer/CMakeCache.txt")
[ "$found" = "$(dirname "$config")" ] || fail "find_package found $found, not $(dirname "$config")"
cmake --build "$out/consumer" -j2 >>"$out/consumer.log" 2>&1 ||
  { tail -n 40 "$out/consumer.log"; fail "building the consumer failed"; }

# A shard from the installed binaries on a free port (SGD, lr 0.5).
"$prefix/bin/ps-server" --shard_index=0 --num_shards=1 --num_workers=1 --mode=async \
  --optimizer=sgd --lr=0.5 --listen=127.0.0.1:0 --port_file="$out/port" \
  2>"$out/server.log" &
server_pid=$!
for _ in $(seq 300); do
  [ -s "$out/port" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$out/server.log"; fail "ps-server exited"; }
  sleep 0.1
done
[ -s "$out/port" ] || { tail -n 20 "$out/server.log"; fail "ps-server did not start within 30 s"; }
read -r port _ <"$out/port"
timeout 60 "$out/consumer/push_pull" "127.0.0.1:$port" ||
  { tail -n 20 "$out/server.log"; fail "push_pull against the installed ps-server failed"; }
timeout 30 "$prefix/bin/psctl" status --servers="127.0.0.1:$port" >"$out/psctl.out" 2>&1 ||
  { cat "$out/psctl.out"; fail "psctl status failed"; }
grep -q "$port" "$out/psctl.out" || { cat "$out/psctl.out"; fail "psctl status does not show the shard"; }
kill "$server_pid"
wait "$server_pid" 2>/dev/null || true
server_pid=""

step "the installed shardtrain-run: a tiny shardtrain.torch job, script path only"
# The launcher runs the script with the extension's interpreter and puts
# the installed package first on the workers' PYTHONPATH.
(cd "$out" && timeout 300 "$prefix/bin/shardtrain-run" --workers 2 --shards 2 --mode sync \
  --optimizer sgd --lr 0.1 --stop-timeout 5 -- \
  "$root/tests/install/tiny_job.py" --psctl "$prefix/bin/psctl") >"$out/job.log" 2>&1 ||
  { tail -n 40 "$out/job.log"; fail "the tiny job failed"; }
grep -q '^\[worker 0\] tiny job OK' "$out/job.log" || { tail -n 40 "$out/job.log"; fail "no 'tiny job OK'"; }
grep -q "from $init" "$out/job.log" ||
  { grep 'shardtrain .* from' "$out/job.log"; fail "the workers did not import the installed package $init"; }
grep '^\[worker [01]\] worker' "$out/job.log"
step "install OK"
