#!/usr/bin/env bash
# One offline check of deploy/; ctest runs each as a test (deploy/CMakeLists.txt).
# usage: check.sh CHECK [DEPLOY_DIR]
#   yamllint        every YAML file: syntax, duplicate keys, indentation, ...
#   compose-config  docker-compose (v1) config of the file, file + GPU override, file + replicated override
#   compose-schema  compose-spec JSON schema + volume / depends_on / healthcheck references (same pairs)
#   dockerfile      (Dockerfile, prometheus/Dockerfile) dockerfile-utils diagnostics + stage refs, exec-form JSON, USER, HEALTHCHECK
#   k8s-OVERLAY     kubectl kustomize of overlays/OVERLAY (cpu, gpu, cpu-tls, replicated, replicated-tls)
#                   -> schema, unknown fields (incl. CRDs), references (incl. NetworkPolicies on the flags'
#                   connections, TLS to etcd)
#   flag-parity     compose, compose+gpu, compose+replicated and the cpu, gpu, replicated overlays run the
#                   same flags, replication flags consistent with etcd, cpu-tls / replicated-tls = cpu /
#                   replicated + TLS flags; all exist in the built binaries
#   prom-config     promtool check config (prometheus.yml and prometheus.replicated.yml)
#   prom-config-sync  the replicated compose setup's Prometheus config = prometheus.yml + etcd job
#   prom-rules      promtool check rules
#   prom-tests      promtool test rules (each alert: a firing and a quiet case)
#   rules-sync      k8s PrometheusRule = prometheus/alerts.yml
#   dashboard       Grafana dashboard types, panel options, datasource uids, PromQL of every target
# env: DEPLOY_CHECK_TOOLS  validators + node_modules staged by setup.sh (default: this folder)
#      SHARDTRAIN_BIN_DIR  built binaries (flag-parity)
set -euo pipefail
check=${1:?usage: check.sh CHECK [DEPLOY_DIR]}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
deploy=$(cd "${2:-$here/..}" && pwd)
tools=${DEPLOY_CHECK_TOOLS:-$here}
work=$(mktemp -d /tmp/deploy-check.XXXXXX)
trap 'rm -rf "$work"' EXIT

render() { kubectl kustomize "$deploy/k8s/overlays/$1" >"$work/k8s-$1.yaml"; }
case $check in
  yamllint)
    yamllint -s -c "$tools/yamllint.yml" "$deploy" && echo "ok   yamllint" ;;
  compose-config)
    docker-compose -p shardtrain -f "$deploy/docker-compose.yml" config -q
    docker-compose -p shardtrain -f "$deploy/docker-compose.yml" -f "$deploy/docker-compose.gpu.yml" config -q
    docker-compose -p shardtrain -f "$deploy/docker-compose.yml" -f "$deploy/docker-compose.replicated.yml" config -q
    echo "ok   docker-compose config (alone, with the GPU override, with the replicated override)" ;;
  compose-schema)
    node "$tools/validate-compose.mjs" "$deploy/docker-compose.yml" "$deploy/docker-compose.gpu.yml"
    node "$tools/validate-compose.mjs" "$deploy/docker-compose.yml" "$deploy/docker-compose.replicated.yml" ;;
  dockerfile)
    node "$tools/lint-dockerfile.mjs" "$deploy/Dockerfile" "$deploy/prometheus/Dockerfile" ;;
  k8s-*)
    overlay=${check#k8s-}
    render "$overlay"
    echo "ok   kubectl kustomize overlays/$overlay: $(grep -c '^kind:' "$work/k8s-$overlay.yaml") objects"
    status=0
    if node "$tools/validate-k8s.mjs" "$work/k8s-$overlay.yaml" >"$work/schema.out"; then echo "ok   schema"
    else grep -v '^ok' "$work/schema.out"; status=1; fi
    TC_DIR="$work/tc" node "$tools/k8s-typecheck.mjs" "$work/k8s-$overlay.yaml" || status=1
    node "$tools/k8s-refs.mjs" "$work/k8s-$overlay.yaml" || status=1
    exit $status ;;
  flag-parity)
    render cpu; render gpu; render replicated; render cpu-tls; render replicated-tls
    node "$tools/flag-parity.mjs" "$deploy/docker-compose.yml" "$deploy/docker-compose.gpu.yml" \
      "$deploy/docker-compose.replicated.yml" "$work/k8s-cpu.yaml" "$work/k8s-gpu.yaml" "$work/k8s-replicated.yaml" \
      "$work/k8s-cpu-tls.yaml" "$work/k8s-replicated-tls.yaml" ;;
  prom-config)
    promtool check config "$deploy/prometheus/prometheus.yml"
    promtool check config "$deploy/prometheus/prometheus.replicated.yml" ;;
  prom-config-sync)
    node "$tools/prom-config-sync.mjs" "$deploy/docker-compose.yml" "$deploy/docker-compose.replicated.yml" \
      "$deploy/prometheus/alerts.yml" ;;
  prom-rules)
    promtool check rules "$deploy/prometheus/alerts.yml" ;;
  prom-tests)
    promtool test rules "$deploy/prometheus/alerts_test.yml" ;;
  rules-sync)
    node "$tools/rules-sync.mjs" "$deploy/prometheus/alerts.yml" "$deploy/k8s/base/prometheusrule.yaml" ;;
  dashboard)
    WORK_DIR="$work/dash" node "$tools/validate-dashboard.mjs" \
      "$deploy/grafana/provisioning/datasources/prometheus.yml" "$deploy"/grafana/dashboards/*.json ;;
  *)
    echo "unknown check: $check" >&2; exit 2 ;;
esac
