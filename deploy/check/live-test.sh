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
#
# replicated (deploy.live-replicated): docker-compose.yml with
# docker-compose.replicated.yml merged over it, the same way: the override's
# etcd command (one member on 127.0.0.1, free ports, data in the run's
# folder), shards and workers with its replication flags (--etcd_endpoints
# this etcd, --advertise_address the shard's own 127.0.0.1 address), and
# Prometheus with the config the override gives it (etcd scraped too). Besides
# the checks above: etcd up with a leader, chains formed (psctl chains; every
# shard reports every one of its groups with --replicas members), pushes
# forwarded to the tails and their lag recorded. Then, with the workers
# halfway through, one shard is SIGKILLed: the other must drop it from the
# chains (a reconfiguration it counts), ShardtrainChainDegraded's expression
# must hold for every group and the rule go pending (its for: 1m is longer
# than the rest of the run), the workers must see the chain change and keep
# training to the end, and the chief's final accuracy must still pass. The
# checks of the healthy run (targets up, no alert fired) cover the time
# before the kill; after it only the alerts of a lost shard may fire.
# usage: live-test.sh BIN_DIR ARTIFACT_DIR [DEPLOY_DIR [replicated]]
set -euo pipefail
bin=$(cd "$1" && pwd) art=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
deploy=$(cd "${3:-$here/..}" && pwd)
mode=${4:-plain}
case $mode in plain | replicated) ;; *) echo "usage: live-test.sh BIN_DIR ARTIFACT_DIR [DEPLOY_DIR [replicated]]" >&2; exit 2 ;; esac
tools=${DEPLOY_CHECK_TOOLS:-$here}
compose=("$deploy/docker-compose.yml")
[ "$mode" = plain ] || compose+=("$deploy/docker-compose.replicated.yml")
# Run length: 10 epochs of 30000 examples per worker, about 25 s of training on
# 2 cores (6 epochs, ~11 s on a fast machine, made "loss falls" flaky).
# Replicated: 8 epochs, the shard killed once both workers are in epoch 4:
# 3 epochs of healthy run (the victim has checkpointed by then) and 5 after
# the fault, several times the ~2 s the chains take to drop the victim
# (--lease_ttl_s=1), even on a fast machine (2-3 s per epoch on 2 cores).
if [ "$mode" = plain ]; then EPOCHS=${LIVE_EPOCHS:-10}; else EPOCHS=${LIVE_EPOCHS:-8}; fi
FAULT_EPOCH=$((EPOCHS / 2))
LINGER_S=8

work=$(mktemp -d /tmp/shardtrain-live.XXXXXX)
rm -rf "$art/panels" "$art/logs"; mkdir -p "$art/logs"
pids=() etcd_pids=()
# stop_pids PID...: SIGTERM to those started here and not yet reaped (so the
# PIDs are not reused), at most 5 s for a clean exit (shards checkpoint on
# SIGTERM), then SIGKILL.
stop_pids() {
  local running p alive live=()
  running=" $(jobs -p | xargs) "
  for p in "$@"; do [[ $running == *" $p "* ]] && live+=("$p"); done
  for p in "${live[@]}"; do kill "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0; for p in "${live[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.1
  done
  for p in "${live[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
}
cleanup() {
  local status=$?
  set +e
  stop_pids "${pids[@]}"
  stop_pids "${etcd_pids[@]}"  # last: the shards give up their leases on exit
  cp "$work"/*.log "$work"/*.yml "$work"/plan.json "$art/logs/" 2>/dev/null
  rm -rf "$work"
  [ $status = 0 ] || echo "live test FAILED; logs in $art/logs" >&2
  exit $status
}
trap cleanup EXIT
trap "exit 130" INT
trap "exit 143" TERM
exec 3>&2  # fail's message gets through wait_for's redirections
fail() { echo "FAIL: $*" >&3; exit 1; }
# wait_for SECONDS DESCRIPTION COMMAND...: polls every 0.25 s.
wait_for() {
  local until=$((SECONDS + $1)) limit=$1 what=$2; shift 2
  until "$@" >/dev/null 2>&1; do [ $SECONDS -lt $until ] || fail "timed out after ${limit}s waiting for $what"; sleep 0.25; done
}
alive() { kill -0 "$1" 2>/dev/null; }
# alive_and PID SERVICE COMMAND...: fails at once when SERVICE has exited
# (e.g. a port picked for it was taken meanwhile), else runs COMMAND.
alive_and() {
  local pid=$1 s=$2; shift 2
  alive "$pid" || fail "$s exited early (logs/$s.log): $(tail -n 3 "$work/$s.log" | tr '\n' ' ')"
  "$@"
}
# free_ports N: N free TCP ports on 127.0.0.1, all held until every one is picked, so they differ.
free_ports() {
  node -e 'const net = require("net"); const n = +process.argv[1]; const ss = [];
    const next = () => { if (ss.length === n) { ss.forEach(s => { console.log(s.address().port); s.close(); }); return; }
      const s = net.createServer().listen(0, "127.0.0.1", () => { ss.push(s); next(); }); }; next();' "$1"
}

echo "== plan: $(IFS=+; echo "${compose[*]##*/}")'s commands on 127.0.0.1"
node "$tools/live-plan.mjs" "${compose[@]}" "$work" \
  ps-server:checkpoint_interval_s=5 ps-worker:epochs="$EPOCHS" ps-worker:max_test_examples=2000 ps-worker:linger_s=$LINGER_S >"$work/plan.json"
mapfile -t services < <(jq -r '.processes | keys_unsorted[]' "$work/plan.json")
mapfile -t etcds < <(jq -r '.etcd | keys_unsorted[]' "$work/plan.json")
for s in "${services[@]}"; do
  exe=$(jq -r --arg s "$s" '.processes[$s][0]' "$work/plan.json")
  known=$({ "$bin/$exe" --helpfull 2>&1 || true; } | grep -oE '^    --[a-z0-9_]+' | sed 's/^ *--//')
  for f in $(jq -r --arg s "$s" '.processes[$s][1:][] | capture("^--(?<f>[a-z0-9_]+)").f' "$work/plan.json"); do
    grep -qx "$f" <<<"$known" || fail "$s: $exe has no flag --$f (used by ${compose[*]##*/})"
  done
done
[ "$mode" = plain ] || [ ${#etcds[@]} -gt 0 ] || fail "the replicated compose setup has no etcd service"

# start_service SERVICE SUBSTITUTIONS [METRICS_ADDRESS]: SUBSTITUTIONS is a JSON
# object {"@PLACEHOLDER@": value} for the plan's placeholders (live-plan.mjs).
start_service() {
  local s=$1 argv
  mapfile -t argv < <(jq -r --arg s "$s" --argjson sub "$2" --arg m "${3:-}" '.processes[$s][]
    | reduce ($sub | to_entries[]) as $e (.; gsub($e.key; $e.value))
    | if $m != "" and startswith("--metrics_listen=") then "--metrics_listen=" + $m else . end' "$work/plan.json")
  [[ "${argv[*]}" != *@*@* ]] || fail "$s: placeholder left in ${argv[*]}"
  echo "   $s: ${argv[*]}"
  "$bin/${argv[0]}" "${argv[@]:1}" >"$work/$s.log" 2>&1 &
  pids+=($!); eval "pid_${s//-/_}=$!"
}
shards=() workers=()
for s in "${services[@]}"; do
  if [ "$(jq -r --arg s "$s" '.processes[$s][0]' "$work/plan.json")" = ps-server ]; then shards+=("$s"); else workers+=("$s"); fi
done
: >"$work/targets.txt"  # "job service 127.0.0.1:port" per scrape target
t0=$(date +%s)

etcd_sub='{}' etcd_endpoints=""
for e in "${etcds[@]}"; do
  echo "== start $e (etcd, the override's command)"
  read -r client peer < <(free_ports 2 | xargs)
  mapfile -t argv < <(jq -r --arg e "$e" --arg c "$client" --arg p "$peer" \
    '.etcd[$e][] | gsub("@CLIENT_PORT@"; $c) | gsub("@PEER_PORT@"; $p)' "$work/plan.json")
  echo "   $e: ${argv[*]}"
  command -v "${argv[0]}" >/dev/null || fail "$e: ${argv[0]} is not installed"
  "${argv[@]}" >"$work/$e.log" 2>&1 &
  etcd_pids+=($!); pid=$!
  mapfile -t hc < <(jq -r --arg a "127.0.0.1:$client" '.etcd_healthcheck[] | sub("@ADDR@"; $a)' "$work/plan.json")
  wait_for 30 "healthcheck of $e" alive_and "$pid" "$e" "${hc[@]}"
  echo "   $e healthy: ${hc[*]}"
  etcd_sub=$(jq -c --arg k "@$e@" --arg v "127.0.0.1:$client" '. + {($k): $v}' <<<"$etcd_sub")
  etcd_endpoints+=${etcd_endpoints:+,}127.0.0.1:$client
  echo "etcd $e 127.0.0.1:$client" >>"$work/targets.txt"
done

echo "== start ${#shards[@]} shards"
# A replicated shard listens on a port picked here, the one it advertises.
mapfile -t shard_ports < <(free_ports ${#shards[@]})
for i in "${!shards[@]}"; do
  start_service "${shards[$i]}" "$(jq -c --arg p "${shard_ports[$i]}" '. + {"@PORT@": $p}' <<<"$etcd_sub")"
done
servers=()
for s in "${shards[@]}"; do
  p=pid_${s//-/_}
  wait_for 30 "$s port file" alive_and "${!p}" "$s" test -s "$work/$s.port"
  read -r grpc metrics _ <"$work/$s.port"
  servers+=("127.0.0.1:$grpc"); echo "ps-server $s 127.0.0.1:$metrics" >>"$work/targets.txt"
  # docker-compose.yml's healthcheck (psctl health), against this shard
  mapfile -t hc < <(jq -r --arg a "127.0.0.1:$grpc" '.healthcheck[] | sub("@ADDR@"; $a)' "$work/plan.json")
  [ "${hc[0]}" = psctl ] || fail "compose shard healthcheck is not psctl: ${hc[*]}"
  wait_for 20 "healthcheck of $s" "$bin/psctl" "${hc[@]:1}"
  echo "   $s healthy: ${hc[*]}"
done

echo "== start Prometheus (shards now, workers once their ports are known)"
prom_port=$(node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })')
prom=http://127.0.0.1:$prom_port
prom_config=$(jq -r .prometheus_config "$work/plan.json")
echo "   config: ${prom_config#"$deploy"/} (the compose Prometheus's), targets replaced"
write_prometheus_config() {  # from targets.txt
  jq -Rn --arg p "127.0.0.1:$prom_port" '[inputs | split(" ")] | group_by(.[0])
    | map({(.[0][0]): (map({(.[1]): .[2]}) | add)}) | add + {"prometheus": {"prometheus": $p}}' \
    <"$work/targets.txt" >"$work/targets.json"
  node "$tools/live-plan.mjs" --prometheus "$prom_config" "$deploy/prometheus/alerts.yml" \
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
wait_for 20 "shard$([ ${#etcds[@]} = 0 ] || echo " and etcd") targets up" targets_up $(($(wc -l <"$work/targets.txt") + 1))

echo "== scrape the workers' metrics ports (picked now) before they start"
mapfile -t worker_ports < <(free_ports ${#workers[@]})
for i in "${!workers[@]}"; do echo "ps-worker ${workers[$i]} 127.0.0.1:${worker_ports[$i]}" >>"$work/targets.txt"; done
write_prometheus_config
kill -HUP "$prom_pid"  # reload with the worker targets
n_targets=$(($(wc -l <"$work/targets.txt") + 1))
targets_known() { [ "$(curl -sf "$prom/api/v1/targets" | jq '.data.activeTargets | length')" = "$1" ]; }
wait_for 20 "Prometheus to scrape the worker targets" targets_known "$n_targets"

echo "== start ${#workers[@]} workers"
tw=$(date +%s)
for i in "${!workers[@]}"; do
  start_service "${workers[$i]}" "$(jq -c --arg s "$(IFS=,; echo "${servers[*]}")" '. + {"@SERVERS@": $s}' <<<"$etcd_sub")" \
    "127.0.0.1:${worker_ports[$i]}"
done
for i in "${!workers[@]}"; do
  w=${workers[$i]} p=pid_${workers[$i]//-/_}
  wait_for 30 "$w port file" alive_and "${!p}" "$w" test -s "$work/$w.port"
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
if [ "$mode" = replicated ]; then
  job=$(jq -r '.processes[] | select(.[0] == "ps-server") | .[] | capture("^--job=(?<j>.*)").j' "$work/plan.json" | head -n 1)
  replicas=$(jq -r '.processes[] | select(.[0] == "ps-server") | .[] | capture("^--replicas=(?<r>.*)").r' "$work/plan.json" | head -n 1)
  # psctl chains (its last output kept in logs/chains.log)
  chains() { "$bin/psctl" chains --etcd_endpoints="$etcd_endpoints" --job="$job" --timeout_s=5 >"$work/chains.log" 2>&1; local rc=$?; cat "$work/chains.log"; return $rc; }
  # Every group's chain at --replicas members, every shard live at the address
  # it advertises (its --listen): "groups: N, degraded: none", "shards: live 0, 1, ...".
  chains_full() {
    local out; out=$(chains) || return 1
    grep -q "^groups: ${#shards[@]}, degraded: none$" <<<"$out" || return 1
    grep -q "^shards: live $(seq -s ', ' 0 $((${#shards[@]} - 1))); not live none;" <<<"$out" || return 1
    for i in "${!shards[@]}"; do grep -qE "^$i +live +${servers[$i]} " <<<"$out" || return 1; done
  }
  wait_for 20 "psctl chains: every chain of $replicas, every shard live at its address (logs/chains.log)" chains_full
  chains | sed 's/^/   /'
fi

echo "== metrics exposition (promtool check metrics)"
while read -r target_job s addr; do
  [ "$target_job" != etcd ] || continue  # not ours
  curl -sf "http://$addr/metrics" >"$work/$s.metrics"
  promtool check metrics <"$work/$s.metrics" >"$work/$s.lint" 2>&1 || fail "$s: $(cat "$work/$s.lint")"
  echo "   ok  $s: $(grep -c '^# TYPE' "$work/$s.metrics") metric families, no lint remarks"
done <"$work/targets.txt"

# range QUERY [END]: query_range over the run (to END, default now): prints
# "instance first last min max count" per series.
range() {
  curl -sfG "$prom/api/v1/query_range" --data-urlencode "query=$1" -d start="${range_start:-$t0}" -d end="${2:-$(date +%s)}" -d step=1 |
    jq -r '.data.result[] | [.metric.instance // "-", .values[0][1], .values[-1][1],
      ([.values[][1] | tonumber] | min), ([.values[][1] | tonumber] | max), (.values | length)] | @tsv'
}
# check DESCRIPTION QUERY CONDITION SERIES [END]: CONDITION is awk over each series' row:
# $1 instance, $2 first value, $3 last, $4 min, $5 max, $6 samples.
check() {
  local what=$1 query=$2 test=$3 rows=$4 out
  out=$(range "$query" "${5:-}")
  [ "$(grep -c . <<<"$out")" = "$rows" ] || fail "$what: expected $rows series for $query, got: ${out:-none}"
  awk -F'\t' "!($test) {exit 1}" <<<"$out" || fail "$what: $query -> $(tr '\t\n' ' ;' <<<"$out")"
  printf '   ok  %-48s %s\n' "$what" "$(awk -F'\t' '{printf "%s %.4g->%.4g  ", $1, $2, $3}' <<<"$out")"
}
# value QUERY [TIME]: the first result's value (0 when there is none).
value() {
  curl -sfG "$prom/api/v1/query" --data-urlencode "query=$1" ${2:+-d time="$2"} | jq -r '.data.result[0].value[1] // "0"'
}
# fired [END]: the alerts that fired during the run (to END), one "alertname instance" per line.
fired() {
  curl -sfG "$prom/api/v1/query_range" --data-urlencode 'query=ALERTS{alertstate="firing"}' \
    -d start="$t0" -d end="${1:-$(date +%s)}" -d step=1 | jq -r '.data.result[].metric | "\(.alertname) \(.instance // .group // "-")"' | sort -u
}
nw=${#workers[@]} ns=${#shards[@]}
workers_alive() { for w in "${workers[@]}"; do p=pid_${w//-/_}; alive "${!p}" || fail "$w exited before the fault (logs/$w.log)"; done; }

t_fault=""
if [ "$mode" = replicated ]; then
  echo "== replication while the workers train (until both are in epoch $FAULT_EPOCH of $EPOCHS)"
  in_epoch() { workers_alive; [ "$(value 'min(shardtrain_worker_epoch)')" -ge "$1" ]; }
  wait_for 200 "the workers to reach epoch $FAULT_EPOCH" in_epoch "$FAULT_EPOCH"
  t_fault=$(date +%s)
  check "etcd up throughout"                 'up{job="etcd"}'                                   '$4 == 1' ${#etcds[@]} "$t_fault"
  check "etcd has a leader throughout"       'etcd_server_has_leader{job="etcd"}'               '$4 == 1' ${#etcds[@]} "$t_fault"
  check "every target up"                    'up'                                               '$3 == 1' "$n_targets" "$t_fault"
  check "chain length = --replicas"          'shardtrain_chain_replicas'                        '$3 == '"$replicas" "$ns" "$t_fault"
  # Every shard serves --replicas groups (its own and its predecessors').
  check "chains formed (members per group)"  'shardtrain_chain_members'                         '$3 == '"$replicas" $((ns * replicas)) "$t_fault"
  check "etcd leases alive"                  'shardtrain_etcd_lease_alive'                      '$3 == 1' "$ns" "$t_fault"
  # Each shard heads its own group: it forwards that group's pushes to the tail.
  check "pushes forwarded to the tail"       'sum by (instance) (shardtrain_replication_forwarded_bytes_total)' '$3 > $2 && $3 > 1e6' "$ns" "$t_fault"
  check "replication lag recorded"           'sum by (instance) (shardtrain_replication_lag_seconds_count)' '$3 > $2 && $3 > 100' "$ns" "$t_fault"
  check "replication lag p99 under 0.5 s (alert's)" 'histogram_quantile(0.99, sum by (instance, le) (rate(shardtrain_replication_lag_seconds_bucket[10s])))' '$3 < 0.5' "$ns" "$t_fault"
  check "no catch-up, no stale-epoch refusals" 'shardtrain_catchup_in_progress + on (instance) shardtrain_stale_epoch_refusals_total' '$5 == 0' "$ns" "$t_fault"
  fired_before=$(fired "$t_fault")
  [ -z "$fired_before" ] || fail "alerts fired during the healthy run: $(tr '\n' ';' <<<"$fired_before")"
  echo "   ok  no alert fired during the healthy run"

  victim=${shards[$((ns - 1))]} survivor=${shards[0]}
  echo "== fault: SIGKILL $victim while the workers train (epoch $FAULT_EPOCH of $EPOCHS)"
  reconf_query="sum(shardtrain_chain_reconfigurations_total{instance=\"$survivor\"}) or vector(0)"
  reconf_before=$(value "$reconf_query")
  declare -A changes_before
  for w in "${workers[@]}"; do changes_before[$w]=$(value "sum(shardtrain_worker_chain_changes_total{instance=\"$w\"}) or vector(0)"); done
  p=pid_${victim//-/_}
  kill -9 "${!p}"; wait "${!p}" 2>/dev/null || true
  t_kill=$(date +%s.%N)
  reconfigured() { awk -v a="$(value "$reconf_query")" -v b="$reconf_before" 'BEGIN { exit !(a > b) }'; }
  wait_for 20 "$survivor to drop $victim from the chains (shardtrain_chain_reconfigurations_total)" reconfigured
  t_reconf=$(date +%s)
  printf '   ok  %-48s %s\n' "chain reconfigured by $survivor" \
    "reconfigurations_total $reconf_before -> $(value "$reconf_query") (seen $(awk -v a="$t_kill" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after the kill)"
  short() { [ "$(value "count(shardtrain_chain_members{instance=\"$survivor\"} == $((replicas - 1)))")" = "$replicas" ]; }
  wait_for 10 "$survivor's chains to have $((replicas - 1)) member(s)" short
  echo "   ok  $survivor: shardtrain_chain_members = $((replicas - 1)) in each of its $replicas groups"
  # The rule's own expression, through the API: its for: 1m outlasts the run,
  # so the rule itself is required to be pending (or firing), not firing.
  degraded_expr=$(curl -sf "$prom/api/v1/rules" | jq -r '.data.groups[].rules[] | select(.name == "ShardtrainChainDegraded") | .query')
  [ -n "$degraded_expr" ] || fail "no rule ShardtrainChainDegraded loaded"
  degraded() { [ "$(curl -sfG "$prom/api/v1/query" --data-urlencode "query=$degraded_expr" | jq '.data.result | length')" = "$ns" ]; }
  wait_for 10 "ShardtrainChainDegraded's expression to hold for all $ns groups" degraded
  echo "   ok  ShardtrainChainDegraded expression: $(curl -sfG "$prom/api/v1/query" --data-urlencode "query=$degraded_expr" |
    jq -r '[.data.result[] | "group \(.metric.group) = \(.value[1])"] | join(", ")')"
  rule_state() { curl -sf "$prom/api/v1/rules" | jq -r '.data.groups[].rules[] | select(.name == "ShardtrainChainDegraded") | .state'; }
  rule_active() { [[ $(rule_state) =~ ^(pending|firing)$ ]]; }
  wait_for 10 "rule ShardtrainChainDegraded to go pending" rule_active
  echo "   ok  rule ShardtrainChainDegraded is $(rule_state)"
  # psctl chains exits 1 while a chain is short.
  chains_degraded() {
    local out rc=0; out=$(chains) || rc=$?
    [ $rc = 1 ] || return 1
    grep -q "^groups: $ns, degraded: $(seq -s ', ' 0 $((ns - 1)))$" <<<"$out" &&
      grep -q "^shards: live $(seq -s ', ' 0 $((ns - 2))); not live $((ns - 1));" <<<"$out"
  }
  wait_for 10 "psctl chains: every group degraded, shard $((ns - 1)) not live, exit status 1 (logs/chains.log)" chains_degraded
  { chains || true; } | sed 's/^/   /'
fi

echo "== training"
for w in "${workers[@]}"; do
  p=pid_${w//-/_}
  until_s=$((SECONDS + 240))
  while alive "${!p}"; do [ $SECONDS -lt $until_s ] || fail "$w still running after 240 s"; sleep 0.5; done
  wait "${!p}" || fail "$w exited with an error (logs/$w.log)"
done
t1=$(date +%s); run=$((t1 - t0)) train=$((t1 - tw - LINGER_S))
sleep 2  # two more rule evaluations
for s in "${shards[@]}"; do
  [ "$s" != "${victim:-}" ] || continue
  p=pid_${s//-/_}; alive "${!p}" || fail "$s died (logs/$s.log)"
done
alive "$prom_pid" || fail "Prometheus died"
grep -h "final test accuracy" "$work"/worker-*.log || true

if [ "$mode" = replicated ]; then
  echo "== after the fault: training went on with $survivor alone"
  range_start=$t_reconf
  check "samples increasing after the fault"     'shardtrain_worker_samples_total'                  '$3 > $2'   "$nw"
  check "$survivor applies updates after it"      "shardtrain_updates_applied_total{instance=\"$survivor\"}" '$3 > $2' 1
  check "$victim down after it"                   "up{instance=\"$victim\"}"                         '$3 == 0'  1
  unset range_start
  for w in "${workers[@]}"; do
    after=$(value "sum(last_over_time(shardtrain_worker_chain_changes_total{instance=\"$w\"}[5m])) or vector(0)")  # it has exited
    awk -v a="$after" -v b="${changes_before[$w]}" 'BEGIN { exit !(a > b) }' || fail "$w saw no chain change (shardtrain_worker_chain_changes_total $after)"
    printf '   ok  %-48s %s\n' "$w routed by the new chains" "shardtrain_worker_chain_changes_total ${changes_before[$w]} -> $after"
  done
  unexpected=$(fired | grep -vE '^(ShardtrainShardDown|ShardtrainChainDegraded) ' || true)
  [ -z "$unexpected" ] || fail "alerts other than a lost shard's fired after the fault: $(tr '\n' ';' <<<"$unexpected")"
  echo "   ok  after the fault no alert fired but a lost shard's (fired: $(fired | cut -d' ' -f1 | sort -u | xargs | sed 's/^$/none/'))"
fi

echo "== checks over the run: ${run}s from the first $([ "$mode" = plain ] && echo shard || echo process)'s start, ~${train}s of training"
check "shards up throughout${t_fault:+ (to the fault)}" 'up{job="ps-server"}'         '$4 == 1'              "$ns" "$t_fault"
check "samples total increasing"        'shardtrain_worker_samples_total'                  '$3 > $2 && $3 > 100000' "$nw"
check "throughput above 100 samples/s"  'rate(shardtrain_worker_samples_total[10s])'      '$5 > 100'             "$nw"
# The step loss gauge is one batch's loss: with ~10 s of training its 5 s
# averages moved less than their noise (a run failed "loss falls" on it).
# The epoch's mean loss falls from ~0.5 (epoch 1) or ~0.32 (epoch 2, if
# the first scrape came after it) to ~0.2.
check "step loss reported"              'shardtrain_worker_loss > 0'                       '$5 > 0'               "$nw"
check "epoch loss falls"                'shardtrain_worker_epoch_loss > 0'                 '$3 < $5 - 0.05'       "$nw"
check "final test accuracy (chief)"     'shardtrain_worker_test_accuracy > 0'              '$3 > 0.7'             1
check "updates applied increasing"      'shardtrain_updates_applied_total'                 '$3 > $2'              "$ns"
check "live workers seen by shards"     'shardtrain_live_workers'                          '$5 == '"$nw"          "$ns"
check "staleness recorded"              'shardtrain_gradient_staleness_count'              '$3 > 0'               "$ns"
check "staleness p99 within SSP bound"  'histogram_quantile(0.99, sum by (instance, le) (rate(shardtrain_gradient_staleness_bucket[30s])))' '$5 <= 12' "$ns"
check "push bytes received per shard"   'sum by (instance) (shardtrain_rpc_received_bytes_total{side="server",method=~"Push|PushPull"})' '$3 > 1e6' "$ns"
# The shards open a data port, and the workers' data path goes there
# (each worker keeps its connections to every shard open; replicated: to
# every member its calls are routed to).
check "workers connected to each data port" 'shardtrain_data_connections'             '$5 >= '"$nw"          "$ns"
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
if [ "$mode" = plain ]; then
  fired_all=$(fired)
  [ -z "$fired_all" ] || fail "alerts fired during a healthy run: $(curl -sfG "$prom/api/v1/query" --data-urlencode 'query=ALERTS' | jq -c '[.data.result[].metric]')"
  echo "   ok  no alert fired during the run"
fi

echo "== render dashboard panels"
bash "$tools/render-panels.sh" "$deploy/grafana/dashboards/shardtrain.json" "$art/panels" "$prom" $((run + 10)) 1
panels=(throughput-samples-s training-loss test-accuracy push-pull-latency-worker-side bytes-per-shard
        gradient-staleness updates-applied-per-shard step-time-by-phase live-workers checkpoint-age)
[ "$mode" = plain ] || panels+=(chain-members-vs-replicas chain-epoch etcd-lease-alive replication-lag
                                 forwarded-to-successors chain-reconfigurations-per-minute)
for p in "${panels[@]}"; do
  [ -s "$art/panels/$p.png" ] || fail "panel $p was not rendered (no data?)"
done
echo "live test ($mode): all passed (~${train}s of training); panels in $art/panels"
