#!/usr/bin/env bash
# Negative test: copy deploy/ to a scratch folder, plant one typical mistake,
# and require that the check exits non-zero AND says why (the expected text),
# so a check that breaks for an unrelated reason does not pass as "caught".
# usage: negative.sh CASE [DEPLOY_DIR]     (cases: the list below)
set -euo pipefail
name=${1:?usage: negative.sh CASE [DEPLOY_DIR]}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
deploy=$(cd "${2:-$here/..}" && pwd)

# case: check | file under deploy/ | text to find (first occurrence) | replacement | expected in the output
case $name in
  yamllint-duplicate-key) c=(yamllint docker-compose.yml
    '  restart: on-failure:3' $'  restart: on-failure:3\n  restart: "no"' 'duplication of key "restart"') ;;
  compose-undefined-dependency) c=(compose-config docker-compose.yml
    'shard-1: {condition: service_healthy}' 'shard-2: {condition: service_healthy}' 'shard-2') ;;
  compose-schema-type) c=(compose-schema docker-compose.yml
    'stop_grace_period: 60s' 'stop_grace_period: 60' 'stop_grace_period must be string') ;;
  compose-healthy-without-healthcheck) c=(compose-schema docker-compose.yml
    '    test: ["CMD", "psctl", "health"' '    disable: true\n    x: ["CMD", "psctl", "health"' 'waits for service_healthy but shard-0 has no healthcheck') ;;
  dockerfile-bad-duration) c=(dockerfile Dockerfile
    'HEALTHCHECK --interval=10s' 'HEALTHCHECK --interval=10' 'missing unit in duration') ;;
  dockerfile-copy-from-typo) c=(dockerfile Dockerfile
    'COPY --from=build ' 'COPY --from=biuld ' 'COPY --from=biuld: no earlier stage') ;;
  k8s-missing-resource) c=(k8s-cpu k8s/base/kustomization.yaml
    '  - monitoring.yaml' '  - monitor.yaml' 'monitor.yaml') ;;
  k8s-schema-enum) c=(k8s-cpu k8s/base/workers.yaml
    'completionMode: Indexed' 'completionMode: indexed' 'completionMode must be equal to one of the allowed values') ;;
  k8s-unknown-field) c=(k8s-gpu k8s/overlays/gpu/worker-gpu.yaml
    '      tolerations:' '      toleration:' "Job/ps-worker: .*'\"toleration\"' does not exist") ;;
  k8s-crd-unknown-field) c=(k8s-cpu k8s/base/monitoring.yaml
    'podMetricsEndpoints:' 'podMetricEndpoints:' "PodMonitor/shardtrain: .*podMetricEndpoints") ;;
  k8s-selector-typo) c=(k8s-cpu k8s/base/shards.yaml
    $'  selector:\n    app.kubernetes.io/name: ps-server' $'  selector:\n    app.kubernetes.io/name: ps-sever'
    'Service/ps-server: selector .* matches no pod template') ;;
  k8s-tls-mount-name) c=(k8s-cpu-tls k8s/components/tls/shards-tls.yaml
    '  value: {name: tls, mountPath' '  value: {name: certs, mountPath' 'volumeMount "certs" names no volume of the pod') ;;
  k8s-tls-path-outside-mount) c=(k8s-cpu-tls k8s/components/tls/workers-tls.yaml
    '  value: --tls_ca=/etc/shardtrain/tls/ca.pem' '  value: --tls_ca=/etc/shardtrain/ca.pem' 'container ps-worker: --tls_ca=/etc/shardtrain/ca.pem is under none') ;;
  compose-replicated-etcd-no-healthcheck) c=(compose-schema docker-compose.replicated.yml
    $'    healthcheck:\n      test: ["CMD", "etcdctl"' '    x-healthcheck:\n      test: ["CMD", "etcdctl"' 'waits for service_healthy but etcd has no healthcheck') ;;
  k8s-networkpolicy-no-etcd) c=(k8s-replicated k8s/components/etcd/etcd.yaml
    $'        - podSelector:\n            matchLabels:\n              app.kubernetes.io/name: ps-server\n' ''
    'etcd_endpoints=etcd-0.etcd:2379: no NetworkPolicy admits StatefulSet/ps-server pods to StatefulSet/etcd on port 2379') ;;
  k8s-shards-not-admitted-to-each-other) c=(k8s-replicated k8s/components/replicated/networkpolicy-replicated.yaml
    'app.kubernetes.io/name: ps-server' 'app.kubernetes.io/name: ps-worker'
    'advertise_address=ps-server-0.ps-server:7000: no NetworkPolicy admits StatefulSet/ps-server pods to StatefulSet/ps-server on port 7000') ;;
  k8s-data-port-not-admitted) c=(k8s-cpu k8s/base/networkpolicy.yaml
    '        - {protocol: TCP, port: 7001}' '' "no NetworkPolicy admits Job/ps-worker pods to StatefulSet/ps-server's data port 7001") ;;
  k8s-data-port-not-declared) c=(k8s-cpu k8s/base/shards.yaml
    '            - {name: data, containerPort: 7001}' '' 'the data port 7001 \(--data_listen\) is not a container port of StatefulSet/ps-server') ;;
  flag-parity-tls-without-data-port) c=(flag-parity k8s/components/tls/kustomization.yaml
    $'\npatches:' $'\nconfigMapGenerator:\n  - name: shardtrain-training\n    behavior: merge\n    literals:\n      - DATA_LISTEN=\npatches:'
    "the secured setup's shards open no data port") ;;
  flag-parity-compose-without-data-port) c=(flag-parity docker-compose.yml
    '      - --data_listen=0.0.0.0:7001' '      - --port_file=/tmp/p' "shard flags: compose vs .*--data_listen") ;;
  k8s-advertise-not-own-address) c=(k8s-replicated k8s/components/replicated/shards-replicated.yaml
    '--advertise_address=$(POD_NAME).ps-server:7000' '--advertise_address=ps-server-0.ps-server:7000' "is not the pod's own address \(for pod ps-server-1") ;;
  k8s-component-image-tag) c=(k8s-replicated k8s/overlays/replicated/kustomization.yaml
    $'images:\n  - name: shardtrain\n    newTag: latest\n' '' 'image shardtrain runs with 2 tags') ;;
  k8s-etcd-tls-client-without-ca) c=(k8s-replicated-tls k8s/components/etcd-tls/client-flags.yaml
    $'- op: add\n  path: /spec/template/spec/containers/0/args/-\n  value: --etcd_ca=/etc/shardtrain/etcd-tls/ca.pem\n' ''
    'container ps-worker: StatefulSet/etcd serves https \(--listen-client-urls\), and this client has no --etcd_ca') ;;
  k8s-etcd-tls-peer-scheme) c=(k8s-replicated-tls k8s/components/etcd-tls/etcd-tls.yaml
    '  value: --listen-peer-urls=https://' '  value: --listen-peer-urls=http://' 'container etcd: its peer URLs mix http and https') ;;
  flag-parity-etcd-tls-flag) c=(flag-parity k8s/components/etcd-tls/etcd-tls.yaml
    '  value: --peer-client-cert-auth' '  value: --peer-client-cert-auths' 'etcd has no flag --peer-client-cert-auths') ;;
  flag-parity-replicas-without-etcd) c=(flag-parity docker-compose.replicated.yml
    $'      - --etcd_endpoints=etcd:2379\n      - --job=fashion-mnist\n      - --lease_ttl_s=1\n      - --advertise_address=shard-0:7000'
    $'      - --job=fashion-mnist\n      - --lease_ttl_s=1\n      - --advertise_address=shard-0:7000' 'shard-0: --replicas=2 needs --etcd_endpoints') ;;
  flag-parity-lease-below-etcd-minimum) c=(flag-parity docker-compose.replicated.yml
    $'      - --heartbeat-interval=25\n      - --election-timeout=250\n' '' "lease_ttl_s=1 is below etcd's shortest lease 2 s") ;;
  flag-parity-epochs) c=(flag-parity k8s/base/training.env
    'EPOCHS=10' 'EPOCHS=20' 'worker flags: compose vs .*--epochs is 10 vs 20') ;;
  prom-config-duration) c=(prom-config prometheus/prometheus.yml
    'scrape_interval: 15s' 'scrape_interval: 15' 'not a valid duration string') ;;
  prom-config-replicated-duration) c=(prom-config prometheus/prometheus.replicated.yml
    'evaluation_interval: 15s' 'evaluation_interval: 15' 'not a valid duration string') ;;
  prom-config-sync-drift) c=(prom-config-sync prometheus/prometheus.yml
    'scrape_interval: 15s' 'scrape_interval: 30s' 'prometheus.replicated.yml: global differs') ;;
  prom-config-sync-job-drift) c=(prom-config-sync prometheus/prometheus.replicated.yml
    '"worker-0:9101", "worker-1:9101"' '"worker-0:9101"' 'job ps-worker differs') ;;
  prom-config-sync-etcd-port) c=(prom-config-sync prometheus/prometheus.replicated.yml
    'targets: ["etcd:2379"]' 'targets: ["etcd:2380"]' 'target etcd:2380 is not the client address of an etcd service') ;;
  prom-config-sync-unreplicated-config) c=(prom-config-sync docker-compose.replicated.yml
    '--config.file=/etc/prometheus/prometheus.replicated.yml' '--config.file=/etc/prometheus/prometheus.yml'
    'runs etcd \(etcd\) but its Prometheus loads prometheus.yml') ;;
  prom-config-sync-alert-job) c=(prom-config-sync prometheus/alerts.yml
    'etcd_server_has_leader{job="etcd"}' 'etcd_server_has_leader{job="etcd-server"}' 'selects job="etcd-server", which prometheus.replicated.yml does not scrape') ;;
  prom-rules-syntax) c=(prom-rules prometheus/alerts.yml
    'absent(up{job="ps-server"})' 'absent(up{job="ps-server"}' 'unclosed left parenthesis') ;;
  prom-tests-rule-regression) c=(prom-tests prometheus/alerts.yml
    ' and on() (max(shardtrain_live_workers) > 0)' '' 'alertname: ShardtrainWorkerDown') ;;
  prom-tests-etcd-quorum) c=(prom-tests prometheus/alerts.yml
    'sum by (job) (up{job="etcd"}) * 2 <=' 'sum by (job) (up{job="etcd"}) <=' 'alertname: ShardtrainEtcdDown') ;;
  rules-sync-drift) c=(rules-sync prometheus/alerts.yml
    '> 300' '> 600' 'ShardtrainCheckpointTooOld differs') ;;
  dashboard-promql) c=(dashboard grafana/dashboards/shardtrain.json
    '"expr": "rate(shardtrain_updates_applied_total' '"expr": "rate((shardtrain_updates_applied_total' 'unclosed left parenthesis') ;;
  dashboard-unknown-option) c=(dashboard grafana/dashboards/shardtrain.json
    '"showLegend": true' '"showlegend": true' "panel 9 \"Throughput \\(samples/s\\)\": .*'\"showlegend\"' does not exist") ;;
  dashboard-datasource) c=(dashboard grafana/dashboards/shardtrain.json
    '"uid": "prometheus"' '"uid": "prom"' 'unknown datasource uid "prom"') ;;
  *) echo "unknown case $name; cases: $(grep -oE '^  [a-z0-9-]+\)' "$0" | tr -d ' )' | xargs)" >&2; exit 2 ;;
esac
check=${c[0]} file=${c[1]} from=${c[2]} to=${c[3]} expect=${c[4]}

tmp=$(mktemp -d /tmp/deploy-negative.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/deploy"
tar -C "$deploy" --exclude=node_modules --exclude=screenshots -cf - . | tar -C "$tmp/deploy" -xf -
FROM=$from TO=$to node -e '
  const fs = require("fs"), f = process.argv[1], s = fs.readFileSync(f, "utf8");
  const i = s.indexOf(process.env.FROM);
  if (i < 0) { console.error(`planted-mistake anchor not found in ${f}: ${process.env.FROM}`); process.exit(1); }
  fs.writeFileSync(f, s.slice(0, i) + process.env.TO.replace(/\\n/g, "\n") + s.slice(i + process.env.FROM.length));
' "$tmp/deploy/$file"

echo "planted in $file: '${from//$'\n'/\\n}' -> '${to//$'\n'/\\n}'"
set +e
out=$("$here/check.sh" "$check" "$tmp/deploy" 2>&1); status=$?
set -e
echo "$out" | sed 's/^/  | /'
[ $status -ne 0 ] || { echo "FAIL: check '$check' passed with the planted mistake"; exit 1; }
grep -qE -- "$expect" <<<"$out" || { echo "FAIL: check '$check' failed, but without /$expect/"; exit 1; }
echo "ok   check '$check' caught it (exit $status, /$expect/)"
