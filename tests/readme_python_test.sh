#!/usr/bin/env bash
# The README's build and PyTorch commands, in the order a user runs them,
# on a PATH whose `python3` is another interpreter than the one the
# extension is built for (a virtual environment without torch or numpy):
#  1. configure the build again: the Python package stays whole;
#  2. scripts/run-local.sh (reconfigures, builds ps-server and ps-worker,
#     trains one epoch): the package stays whole;
#  3. `shardtrain-run ... -- python3 examples/torch_fmnist_cnn.py` fails
#     before any shard starts, naming that python3, the extension's
#     interpreter and the command to use; that command, as printed, runs;
#  4. `shardtrain-run ... -- examples/torch_fmnist_cnn.py` (a script path)
#     picks the extension's interpreter and runs;
#  5. the README's one-process run of the example (/usr/bin/python3 ... --local).
# The examples train one epoch on 1024 examples.
#
#   tests/readme_python_test.sh SOURCE_DIR BUILD_DIR      (KEEP=1 keeps the scratch directory)
set -euo pipefail
root=$1
build=$2
out=$(mktemp -d -t shardtrain-readme-test.XXXXXX)
cleanup() { if [ -n "${KEEP:-}" ]; then echo "kept $out"; else rm -rf "$out"; fi; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $* (${SECONDS} s)"; }

built_for=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")
[ -x "$built_for" ] || fail "no Python3_EXECUTABLE in $build/CMakeCache.txt"
# Another python3 first on PATH: a virtual environment of the same
# interpreter without its site packages (no torch, no numpy), made by hand
# so that it needs no python3-venv.
mkdir -p "$out/venv/bin"
ln -s "$(readlink -f "$built_for")" "$out/venv/bin/python3"
printf 'home = %s\ninclude-system-site-packages = false\n' "$(dirname "$(readlink -f "$built_for")")" \
  >"$out/venv/pyvenv.cfg"
export PATH="$out/venv/bin:$PATH" BUILD_DIR="$build"
unset PYTHONPATH
! python3 -c 'import torch' 2>/dev/null || fail "the stand-in python3 imports torch"

package_whole() {
  local f
  for f in __init__.py env.py launcher.py torch.py; do
    [ -f "$build/python/shardtrain/$f" ] || fail "$1: build/python/shardtrain/$f is gone"
  done
  compgen -G "$build/python/shardtrain/_core.*.so" >/dev/null ||
    fail "$1: build/python/shardtrain/_core*.so is gone"
}

cd "$root"
step "configure again"
cmake -S "$root" -B "$build" >"$out/configure.log" 2>&1 || { tail -n 20 "$out/configure.log"; fail "cmake failed"; }
package_whole "after configuring again"

step "scripts/run-local.sh --epochs 1"
scripts/run-local.sh --epochs 1 >"$out/run-local.log" 2>&1 ||
  { tail -n 30 "$out/run-local.log"; fail "run-local.sh failed"; }
grep -q '^final test accuracy: ' "$out/run-local.log" || fail "run-local.sh printed no final accuracy"
package_whole "after run-local.sh"

example=(examples/torch_fmnist_cnn.py --epochs 1 --train-examples 1024 --test-examples 1000)
step "scripts/shardtrain-run ... -- python3 examples/torch_fmnist_cnn.py (python3 without torch)"
rc=0
scripts/shardtrain-run --workers 2 --shards 2 --mode sync -- python3 "${example[@]}" \
  >"$out/wrong.log" 2>&1 || rc=$?
cat "$out/wrong.log"
[ "$rc" = 2 ] || fail "exit status $rc, not 2"
! grep -q 'shard 0 on' "$out/wrong.log" || fail "a shard started"
grep -q "workers' Python $out/venv/bin/python3 .*cannot import .*torch" "$out/wrong.log" ||
  fail "the interpreter it found is not named"
grep -q "was built for $built_for" "$out/wrong.log" || fail "the extension's interpreter is not named"
fixed=$(grep -A1 'run the workers with that interpreter:' "$out/wrong.log" | tail -n 1 |
  sed 's/^\[shardtrain-run\] *//')
[[ "$fixed" == *" -- $built_for examples/torch_fmnist_cnn.py "* ]] || fail "no command to use: $fixed"

step "the command it printed: $fixed"
eval "$fixed" >"$out/fixed.log" 2>&1 || { tail -n 30 "$out/fixed.log"; fail "the printed command failed"; }
grep -q '^\[worker 0\] final test accuracy: ' "$out/fixed.log" || fail "no final accuracy"

step "scripts/shardtrain-run ... -- examples/torch_fmnist_cnn.py (a script path)"
scripts/shardtrain-run --workers 2 --shards 2 --mode async --max_staleness 4 -- "${example[@]}" \
  >"$out/script.log" 2>&1 || { tail -n 30 "$out/script.log"; fail "the script path run failed"; }
grep -q '^\[worker 0\] final test accuracy: ' "$out/script.log" || fail "no final accuracy"
package_whole "after the examples"

step "$built_for examples/torch_fmnist_cnn.py --local"
"$built_for" examples/torch_fmnist_cnn.py --local --epochs 1 --train-examples 1024 --test-examples 1000 --batch 128 \
  >"$out/local.log" 2>&1 || { tail -n 30 "$out/local.log"; fail "the --local run failed"; }
grep -q '^final test accuracy: ' "$out/local.log" || { tail "$out/local.log"; fail "no final accuracy"; }
step "README commands OK"
