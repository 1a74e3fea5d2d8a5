#!/usr/bin/env bash
# --help of every binary exits 0 and lists that binary's own flags, including
# the ones it takes from shared files (the TLS flags of ps-worker and psctl);
# an unknown flag still fails, and so does a limit out of its range.
set -euo pipefail
bin=$1
fail() { echo "FAIL: $*" >&2; exit 1; }

expect_help() {  # binary flag...
  local binary=$1 out rc=0
  shift
  out=$("$bin/$binary" --help 2>&1) || rc=$?
  [ "$rc" = 0 ] || fail "$binary --help exited $rc: $out"
  if grep -q "No flags matched" <<<"$out"; then fail "$binary --help: $out"; fi
  for flag in "$@"; do
    grep -q -- "^ *--$flag " <<<"$out" || fail "$binary --help does not list --$flag"
  done
  # Abseil's own flags belong to --helpfull, not --help.
  if grep -q -- "--flagfile" <<<"$out"; then fail "$binary --help lists Abseil's flags"; fi
  echo "$binary --help: OK ($(grep -c -- '^ *--' <<<"$out") flags)"
}

expect_help ps-server listen num_workers mode checkpoint_dir tls_cert auth_token_file
expect_help ps-worker servers worker_index epochs rpc_timeout_s tls_ca tls_cert auth_token_file
expect_help psctl servers server timeout_s tls_ca tls_cert tls_key auth_token_file \
  etcd_endpoints job

rc=0
"$bin/psctl" --no_such_flag status >/dev/null 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "psctl accepted an unknown flag"
out=$("$bin/ps-server" --data_tls_buffer_kib=16 2>&1) && fail "ps-server took --data_tls_buffer_kib=16"
grep -q -- "16384 bytes are not in .*(--data_tls_buffer_kib: 17 to 65536)" <<<"$out" ||
  fail "ps-server --data_tls_buffer_kib=16: $out"
rc=0
"$bin/ps-server" --helpfull >/dev/null 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "ps-server --helpfull exited $rc"
echo "help OK"
