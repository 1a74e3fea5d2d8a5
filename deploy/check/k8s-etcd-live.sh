#!/usr/bin/env bash
# Live test of a kustomize overlay's etcd: the rendered etcd StatefulSet's
# members started as the pods would start them (k8s-etcd-plan.mjs: only
# addresses, ports and paths changed; every member on 127.0.0.1) with
# Debian's etcd, and its clients as the shards' pods run them. Checks that
# the members form a quorum (every readiness probe answers healthy), that the
# shards' wait-for-etcd init container script gets through with its
# environment, that psctl with the shards' --etcd_* flags reads the job's
# chains, and that, with one member SIGKILLed, it still does through the
# others. Over TLS (overlays/replicated-tls; certificates from
# scripts/make-certs.sh, for 127.0.0.1) also that a client without a
# certificate is refused: the members check client certificates.
# usage: k8s-etcd-live.sh OVERLAY BIN_DIR [DEPLOY_DIR]
set -euo pipefail
overlay=${1:?usage: k8s-etcd-live.sh OVERLAY BIN_DIR [DEPLOY_DIR]}
bin=$(cd "${2:?usage: k8s-etcd-live.sh OVERLAY BIN_DIR [DEPLOY_DIR]}" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
deploy=$(cd "${3:-$here/..}" && pwd)
tools=${DEPLOY_CHECK_TOOLS:-$here}
work=$(mktemp -d /tmp/shardtrain-k8s-etcd.XXXXXX)
pids=()
cleanup() {
  local status=$? p
  set +e
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  [ $status = 0 ] || for p in "$work"/etcd-*.log; do echo "== ${p##*/}"; tail -n 5 "$p"; done
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
fail() { echo "FAIL: $*" >&2; exit 1; }
# wait_for SECONDS DESCRIPTION COMMAND...: polls every 0.25 s.
wait_for() {
  local until=$((SECONDS + $1)) limit=$1 what=$2; shift 2
  until "$@" >/dev/null 2>&1; do [ $SECONDS -lt $until ] || fail "timed out after ${limit}s waiting for $what"; sleep 0.25; done
}
# free_ports N: N free TCP ports on 127.0.0.1, all held until every one is picked, so they differ.
free_ports() {
  node -e 'const net = require("net"); const n = +process.argv[1]; const ss = [];
    const next = () => { if (ss.length === n) { ss.forEach(s => { console.log(s.address().port); s.close(); }); return; }
      const s = net.createServer().listen(0, "127.0.0.1", () => { ss.push(s); next(); }); }; next();' "$1"
}

kubectl kustomize "$deploy/k8s/overlays/$overlay" >"$work/render.yaml"
members=$(NODE_PATH="$tools/node_modules" node -e 'const YAML = require("yaml");
  const docs = YAML.parseAllDocuments(require("fs").readFileSync(process.argv[1], "utf8")).map(d => d.toJS());
  const e = docs.find(o => o?.kind === "StatefulSet" && o.spec.template.spec.containers.some(c => c.command?.[0] === "etcd"));
  console.log(e ? e.spec.replicas ?? 1 : 0)' "$work/render.yaml")
[ "$members" -gt 0 ] || fail "overlays/$overlay renders no etcd StatefulSet"
"$deploy/../scripts/make-certs.sh" "$work/certs" >/dev/null
mapfile -t p < <(free_ports $((3 * members)))
triples=""
for ((i = 0; i < members; i++)); do triples+="${triples:+;}${p[3 * i]},${p[3 * i + 1]},${p[3 * i + 2]}"; done
node "$tools/k8s-etcd-plan.mjs" "$work/render.yaml" "$work/certs" "$work" "$triples" >"$work/plan.sh"
source "$work/plan.sh"
tls=no; [[ " ${shard_etcd_flags[*]} " == *" --etcd_ca="* ]] && tls=yes
echo "== overlays/$overlay: $members etcd members on 127.0.0.1 (TLS: $tls)"

for ((i = 0; i < members; i++)); do
  eval "argv=(\"\${member_$i[@]}\")"
  echo "   ${argv[*]}"
  "${argv[@]}" >"$work/etcd-$i.log" 2>&1 &
  pids+=($!)
done
healthy() { curl -sf --max-time 1 "$1" | grep -q '"health":"true"'; }
for ((i = 0; i < members; i++)); do
  eval "url=\$health_$i"
  wait_for 60 "etcd-$i's readiness probe ($url)" healthy "$url"
done
echo "ok   quorum: every member's readiness probe answers healthy"

(env "${wait_env[@]}" timeout 30 sh -c "$wait_script") >"$work/wait.log" 2>&1 ||
  fail "the shards' wait-for-etcd script did not get through: $(tail -n 3 "$work/wait.log" | tr '\n' ' ')"
echo "ok   the shards' wait-for-etcd init container script gets through (${wait_env[*]%%=*})"

# psctl chains reads the job's chains: none yet ("no chains", exit 1) once it got an answer.
chains() { "$bin/psctl" chains --timeout_s=5 "$@" 2>&1 || true; }
answered() { grep -q "no chains under /shardtrain/" <<<"$1"; }
out=$(chains "${shard_etcd_flags[@]}")
answered "$out" || fail "psctl with the shards' flags (${shard_etcd_flags[*]}): $out"
echo "ok   psctl with the shards' etcd flags reads the job's keys"

if [ $tls = yes ]; then
  out=$(chains $(printf '%s\n' "${shard_etcd_flags[@]}" | grep -v -e '^--etcd_cert=' -e '^--etcd_key='))
  ! answered "$out" || fail "a client without a certificate read the job's keys"
  echo "ok   a client without a certificate is refused: $(tail -n 1 <<<"$out" | cut -c1-120)"
fi

if [ "$members" -ge 3 ]; then
  { kill -9 "${pids[0]}"; wait "${pids[0]}"; } 2>/dev/null || true
  out=$(chains "${shard_etcd_flags[@]}")
  answered "$out" || fail "with etcd-0 SIGKILLed, psctl got no answer from the others: $out"
  echo "ok   etcd-0 SIGKILLed: the other members still answer"
fi
