#!/usr/bin/env bash
# Live test: the compose topology on 127.0.0.1, watched by a real Prometheus.
# Runs docker-compose.yml's shard and worker commands (via live-plan.mjs: only
# addresses, ports, checkpoint paths and the run's length differ) from the
# built binaries, scrapes them with deploy/prometheus's config (targets
# replaced) and alert rules, and checks through the HTTP API that every
# target is up, training metrics move, checkpoints happen, every rule
# evaluates cleanly and none fires. Renders the dashboard's timeseries panels
# to PNG in ARTIFACT_DIR/panels and keeps the processes' logs there.
# Prometheus applies new targets on a 5 s tick, so the workers' metrics ports
# are picked before they start and scraped from their first second on: the
# checks see the whole run, the early high loss included.
# usage: live-test.sh BIN_DIR ARTIFACT_DIR [DEPLOY_DIR]
set -euo pipefail
bin=$(cd "$1" && pwd) art=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
deploy=$(cd "${3:-$here/..}" && pwd)
tools=${DEPLOY_CHECK_TOOLS:-$here}
# Run length: 10 epochs of 30000 examples per worker, about 25 s of training on
# 2 cores (6 epochs, ~11 s on a fast machine, made "loss falls" flaky).
EPOCHS=${LIVE_EPOCHS:-10}
LINGER_S=8

work=$(mktemp -d /tmp/shardtrain-live.XXXXXX)
rm -rf "$art/panels" "$art/logs"; mkdir -p "$art/logs"
pids=()
cleanup() {
  local status=$? running p alive live=()
  set +e
  running=" $(jobs -p | xargs) "  # started here and not yet reaped, so the PIDs are not reused
  for p in "${pids[@]}"; do [[ $running == *" $p "* ]] && live+=("$p"); done
  for p in "${live[@]}"; do kill "$p" 2>/dev/null; done
  for _ in $(seq 50); do  # at most 5 s for a clean exit (shards checkpoint on SIGTERM)
    alive=0; for p in "${live[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.1
  done
  for p in "${live[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  cp "$work"/*.log "$work"/*.yml "$work"/plan.json "$art/logs/" 2>/dev/null
  rm -rf "$work"
  [ $status = 0 ] || echo "live test FAILED; logs in $art/logs" >&2
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
alive() { kill -0 "$1" 2>/dev/null; }

echo "== plan: docker-compose.yml's commands on 127.0.0.1"
node "$tools/live-plan.mjs" "$deploy/docker-compose.yml" "$work" \
  ps-server:checkpoint_interval_s=5 ps-worker:epochs="$EPOCHS" ps-worker:max_test_examples=2000 ps-worker:linger_s=$LINGER_S >"$work/plan.json"
mapfile -t services < <(jq -r '.processes | keys_unsorted[]' "$work/plan.json")
for s in "${services[@]}"; do
  exe=$(jq -r --arg s "$s" '.processes[$s][0]' "$work/plan.json")
  known=$({ "$bin/$exe" --helpfull 2>&1 || true; } | grep -oE '^    --[a-z0-9_]+' | sed 's/^ *--//')
  for f in $(jq -r --arg s "$s" '.processes[$s][1:][] | capture("^--(?<f>[a-z0-9_]+)").f' "$work/plan.json"); do
    grep -qx "$f" <<<"$known" || fail "$s: $exe has no flag --$f (used by docker-compose.yml)"
  done
done

start_service() {  # service [value for @SERVERS@ [metrics address]]
  local s=$1 argv
  mapfile -t argv < <(jq -r --arg s "$s" --arg sv "${2:-}" --arg m "${3:-}" '.processes[$s][] | sub("@SERVERS@"; $sv)
    | if $m != "" and startswith("--metrics_listen=") then "--metrics_listen=" + $m else . end' "$work/plan.json")
  echo "   $s: ${argv[*]}"
  "$bin/${argv[0]}" "${argv[@]:1}" >"$work/$s.log" 2>&1 &
  pids+=($!); eval "pid_${s//-/_}=$!"
}
shards=() workers=()
for s in "${services[@]}"; do
  if [ "$(jq -r --arg s "$s" '.processes[$s][0]' "$work/plan.json")" = ps-server ]; then shards+=("$s"); else workers+=("$s"); fi
done

echo "== start ${#shards[@]} shards"
t0=$(date +%s)
for s in "${shards[@]}"; do start_service "$s"; done
servers=()
for s in "${shards[@]}"; do
  wait_for 30 "$s port file" test -s "$work/$s.port"
  read -r grpc metrics <"$work/$s.port"
  servers+=("127.0.0.1:$grpc"); echo "$s 127.0.0.1:$metrics" >>"$work/targets.txt"
  # docker-compose.yml's healthcheck (psctl health), against this shard
  mapfile -t hc < <(jq -r --arg a "127.0.0.1:$grpc" '.healthcheck[] | sub("@ADDR@"; $a)' "$work/plan.json")
  [ "${hc[0]}" = psctl ] || fail "compose shard healthcheck is not psctl: ${hc[*]}"
  wait_for 20 "healthcheck of $s" "$bin/psctl" "${hc[@]:1}"
  echo "   $s healthy: ${hc[*]}"
done

echo "== start Prometheus (shards now, workers once their ports are known)"
prom_port=$(node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })')
prom=http://127.0.0.1:$prom_port
write_prometheus_config() {  # from targets.txt: "service 127.0.0.1:port" per line
  jq -Rn --arg p "127.0.0.1:$prom_port" '[inputs | split(" ")] as $t |
    {"ps-server": ($t | map(select(.[0] | startswith("shard"))) | map({(.[0]): .[1]}) | add),
     "ps-worker": ($t | map(select(.[0] | startswith("worker"))) | map({(.[0]): .[1]}) | add),
     "prometheus": {"prometheus": $p}}' <"$work/targets.txt" >"$work/targets.json"
  node "$tools/live-plan.mjs" --prometheus "$deploy/prometheus/prometheus.yml" "$deploy/prometheus/alerts.yml" \
    "$work/targets.json" >"$work/prometheus.yml"
  promtool check config "$work/prometheus.yml" >/dev/null
}
write_prometheus_config
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$work/prometheus.log" 2>&1 &
pids+=($!); prom_pid=$!
wait_for 30 "Prometheus ready" curl -sf "$prom/-/ready"
q() { curl -sfG "$prom/api/v1/query" --data-urlencode "query=$1"; }
targets_up() { [ "$(q 'sum(up)' | jq -r '.data.result[0].value[1] // 0')" = "$1" ]; }
wait_for 20 "shard targets up" targets_up $((${#shards[@]} + 1))

echo "== scrape the workers' metrics ports (picked now) before they start"
# Free ports, all held until every one is picked, so they differ.
mapfile -t worker_ports < <(node -e 'const net = require("net"); const n = +process.argv[1]; const ss = [];
  const next = () => { if (ss.length === n) { ss.forEach(s => { console.log(s.address().port); s.close(); }); return; }
    const s = net.createServer().listen(0, "127.0.0.1", () => { ss.push(s); next(); }); }; next();' "${#workers[@]}")
for i in "${!workers[@]}"; do echo "${workers[$i]} 127.0.0.1:${worker_ports[$i]}" >>"$work/targets.txt"; done
write_prometheus_config
kill -HUP "$prom_pid"  # reload with the worker targets
n_targets=$(($(wc -l <"$work/targets.txt") + 1))
targets_known() { [ "$(curl -sf "$prom/api/v1/targets" | jq '.data.activeTargets | length')" = "$1" ]; }
wait_for 20 "Prometheus to scrape the worker targets" targets_known "$n_targets"

echo "== start ${#workers[@]} workers"
tw=$(date +%s)
for i in "${!workers[@]}"; do
  start_service "${workers[$i]}" "$(IFS=,; echo "${servers[*]}")" "127.0.0.1:${worker_ports[$i]}"
done
for i in "${!workers[@]}"; do
  w=${workers[$i]}
  wait_for 30 "$w port file" test -s "$work/$w.port"
  [ "$(cat "$work/$w.port")" = "${worker_ports[$i]}" ] || fail "$w serves metrics on $(cat "$work/$w.port"), not ${worker_ports[$i]}"
done
wait_for 20 "every target up" targets_up "$n_targets"
curl -sf "$prom/api/v1/targets" | jq -r '.data.activeTargets[] | "   \(.labels.job)/\(.labels.instance) \(.scrapeUrl) \(.health)"'

echo "== psctl against the running cluster"
server_list=$(IFS=,; echo "${servers[*]}")
# A worker's metrics port is up before it has read its data and registered
# its tensors; a checkpoint needs tensors, so retry it until they are there.
wait_for 60 "the workers to register (psctl checkpoint succeeds)" \
  "$bin/psctl" checkpoint --servers="$server_list" --timeout_s=30
"$bin/psctl" status --servers="$server_list" --timeout_s=5 | sed 's/^/   /'
"$bin/psctl" checkpoint --servers="$server_list" --timeout_s=30 | sed 's/^/   /'

echo "== metrics exposition (promtool check metrics)"
while read -r s addr; do
  curl -sf "http://$addr/metrics" >"$work/$s.metrics"
  promtool check metrics <"$work/$s.metrics" >"$work/$s.lint" 2>&1 || fail "$s: $(cat "$work/$s.lint")"
  echo "   ok  $s: $(grep -c '^# TYPE' "$work/$s.metrics") metric families, no lint remarks"
done <"$work/targets.txt"

echo "== training"
for w in "${workers[@]}"; do
  p=pid_${w//-/_}
  until_s=$((SECONDS + 240))
  while alive "${!p}"; do [ $SECONDS -lt $until_s ] || fail "$w still running after 240 s"; sleep 0.5; done
  wait "${!p}" || fail "$w exited with an error (logs/$w.log)"
done
t1=$(date +%s); run=$((t1 - t0)) train=$((t1 - tw - LINGER_S))
sleep 2  # two more rule evaluations
for s in "${shards[@]}"; do p=pid_${s//-/_}; alive "${!p}" || fail "$s died (logs/$s.log)"; done
alive "$prom_pid" || fail "Prometheus died"
grep -h "final test accuracy" "$work"/worker-*.log || true

echo "== checks over the run: ${run}s from the first shard's start, ~${train}s of training"
range() {  # query_range over the run: prints "instance first last min max count" per series
  curl -sfG "$prom/api/v1/query_range" --data-urlencode "query=$1" -d start="$t0" -d end="$(date +%s)" -d step=1 |
    jq -r '.data.result[] | [.metric.instance // "-", .values[0][1], .values[-1][1],
      ([.values[][1] | tonumber] | min), ([.values[][1] | tonumber] | max), (.values | length)] | @tsv'
}
# check DESCRIPTION QUERY CONDITION SERIES: CONDITION is awk over each series' row:
# $1 instance, $2 first value, $3 last, $4 min, $5 max, $6 samples.
check() {
  local what=$1 query=$2 test=$3 rows=$4 out
  out=$(range "$query")
  [ "$(grep -c . <<<"$out")" = "$rows" ] || fail "$what: expected $rows series for $query, got: ${out:-none}"
  awk -F'\t' "!($test) {exit 1}" <<<"$out" || fail "$what: $query -> $(tr '\t\n' ' ;' <<<"$out")"
  printf '   ok  %-48s %s\n' "$what" "$(awk -F'\t' '{printf "%s %.4g->%.4g  ", $1, $2, $3}' <<<"$out")"
}
nw=${#workers[@]} ns=${#shards[@]}
check "shards up throughout"            'up{job="ps-server"}'                              '$4 == 1'              "$ns"
check "samples total increasing"        'shardtrain_worker_samples_total'                  '$3 > $2 && $3 > 100000' "$nw"
check "throughput above 100 samples/s"  'rate(shardtrain_worker_samples_total[10s])'      '$5 > 100'             "$nw"
# The loss gauge is one batch's loss, too noisy for first-vs-last: compare
# the last 5 s average with the highest 5 s average of the run, over the
# samples taken while the worker trains (not the 0 before its first batch,
# nor the last batch's loss it keeps showing while it lingers).
check "loss falls"                      'avg_over_time((shardtrain_worker_loss > 0 and rate(shardtrain_worker_samples_total[3s]) > 0)[5s:1s])' '$3 < $5 - 0.05' "$nw"
check "test accuracy reported (chief)"  'shardtrain_worker_test_accuracy > 0'              '$5 > 0.7'             1
check "updates applied increasing"      'shardtrain_updates_applied_total'                 '$3 > $2'              "$ns"
check "live workers seen by shards"     'shardtrain_live_workers'                          '$5 == '"$nw"          "$ns"
check "staleness recorded"              'shardtrain_gradient_staleness_count'              '$3 > 0'               "$ns"
check "staleness p99 within SSP bound"  'histogram_quantile(0.99, sum by (instance, le) (rate(shardtrain_gradient_staleness_bucket[30s])))' '$5 <= 12' "$ns"
check "push bytes received per shard"   'sum by (instance) (shardtrain_rpc_received_bytes_total{side="server",method=~"Push|PushPull"})' '$3 > 1e6' "$ns"
check "checkpoints written"             'shardtrain_checkpoints_total{result="ok"}'        '$3 >= 2'              "$ns"
check "no checkpoint errors"            'shardtrain_checkpoints_total{result="error"}'     '$5 == 0'              "$ns"
check "last checkpoint within the run"  'shardtrain_last_checkpoint_timestamp_seconds'     '$3 >= '"$t0"          "$ns"
for s in "${shards[@]}"; do
  [ -n "$(ls -A "$work/$s-checkpoints" 2>/dev/null)" ] || fail "$s wrote no checkpoint files"
done

rules=$(curl -sf "$prom/api/v1/rules")
n_rules=$(jq '[.data.groups[].rules[]] | length' <<<"$rules")
want=$(grep -c -- '- alert:' "$deploy/prometheus/alerts.yml")
[ "$n_rules" = "$want" ] || fail "Prometheus loaded $n_rules rules, alerts.yml has $want"
bad=$(jq -r '.data.groups[].rules[] | select(.health != "ok") | "\(.name): \(.health) \(.lastError // "")"' <<<"$rules")
[ -z "$bad" ] || fail "rules not healthy: $bad"
echo "   ok  all $n_rules alert rules evaluate with health ok"
fired=$(range 'ALERTS{alertstate="firing"}' | cut -f1)
[ -z "$fired" ] || fail "alerts fired during a healthy run: $(curl -sfG "$prom/api/v1/query" --data-urlencode 'query=ALERTS' | jq -c '[.data.result[].metric]')"
echo "   ok  no alert fired during the run"

echo "== render dashboard panels"
bash "$tools/render-panels.sh" "$deploy/grafana/dashboards/shardtrain.json" "$art/panels" "$prom" $((run + 10)) 1
for p in throughput-samples-s training-loss test-accuracy push-pull-latency-worker-side bytes-per-shard \
         gradient-staleness updates-applied-per-shard step-time-by-phase live-workers checkpoint-age; do
  [ -s "$art/panels/$p.png" ] || fail "panel $p was not rendered (no data?)"
done
echo "live test: all passed (~${train}s of training); panels in $art/panels"
