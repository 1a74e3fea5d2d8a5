#!/usr/bin/env bash
# Installs what the deploy checks need and stages the validators in TOOLS_DIR
# (a build-tree folder, so the source tree stays clean and two build trees do
# not share one node_modules):
#   Debian: docker-compose prometheus (promtool) yamllint gnuplot-nox jq curl, etcd-server etcd-client
#     (flag-parity checks the etcd / etcdctl flags of compose and k8s against their --help)
#   npm (package-lock.json): kubernetes-models, prometheus-operator models,
#     grafana-foundation-sdk, typescript, ajv, dclint (compose schema),
#     dockerfile-utils, yaml
# kubectl (>= 1.27, kustomize v5) must already be on PATH.
# usage: setup.sh TOOLS_DIR
set -euo pipefail
tools=${1:?usage: setup.sh TOOLS_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

need=()
for p in docker-compose prometheus yamllint gnuplot-nox jq curl etcd-server etcd-client; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo=(); [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
for c in node npm kubectl promtool prometheus yamllint docker-compose gnuplot jq curl etcd etcdctl; do
  command -v "$c" >/dev/null || { echo "missing: $c" >&2; exit 1; }
done
kubectl kustomize --help >/dev/null

mkdir -p "$tools"
cp "$here"/*.mjs "$here"/*.sh "$here"/yamllint.yml "$here"/package.json "$here"/package-lock.json "$tools"/
stamp=$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)
if [ "$(cat "$tools/node_modules/.lock-sha256" 2>/dev/null)" != "$stamp" ]; then
  (cd "$tools" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  echo "$stamp" >"$tools/node_modules/.lock-sha256"
fi
echo "deploy-check tools ready in $tools"
