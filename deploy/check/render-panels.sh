#!/usr/bin/env bash
# Render every timeseries panel of a Grafana dashboard JSON to PNG, using Prometheus' query_range API + gnuplot.
# Files are named after the panel title (throughput-samples-s.png, ...); a panel with no data is reported and skipped.
# $__interval, $__rate_interval and $__range are set as Grafana would: step, max(step + scrape, 4 x scrape), range.
# usage: render-panels.sh DASHBOARD.json OUTDIR [PROM_URL] [RANGE_SECONDS] [SCRAPE_INTERVAL_SECONDS]
set -euo pipefail
dash=$1 out=$2 prom=${3:-http://127.0.0.1:9090} range=${4:-600} scrape=${5:-15}
mkdir -p "$out"; end=$(date +%s); start=$((end - range)); step=$(( range / 200 > 1 ? range / 200 : 1 ))
rate=$(( step + scrape > 4 * scrape ? step + scrape : 4 * scrape ))
jq -c '.panels[] | select(.type=="timeseries") | {id, title, unit: (.fieldConfig.defaults.unit // ""), min: (.fieldConfig.defaults.min // null), targets}' "$dash" |
while read -r panel; do
  id=$(jq -r .id <<<"$panel"); title=$(jq -r .title <<<"$panel"); unit=$(jq -r .unit <<<"$panel"); min=$(jq -r .min <<<"$panel")
  name=$(tr 'A-Z' 'a-z' <<<"$title" | sed -E 's/[^a-z0-9]+/-/g; s/^-|-$//g')
  case $unit in s) unit=seconds ;; Bps) unit=bytes/s ;; ops) unit="per second" ;; percentunit) unit=fraction ;;
    suffix:*) unit=${unit#suffix:} ;; short|none) unit= ;; esac
  plot=(); n=0
  while read -r t; do
    expr=$(jq -r .expr <<<"$t" | sed -E "s/\\\$\\{?__rate_interval\\}?/${rate}s/g; s/\\\$\\{?__interval\\}?/${step}s/g; s/\\\$\\{?__range\\}?/${range}s/g" |
      sed -E 's/\$\{?[A-Za-z_]+(:[a-z]+)?\}?/.*/g')
    legend=$(jq -r '.legendFormat // ""' <<<"$t")
    resp=$(curl -sfG "$prom/api/v1/query_range" --data-urlencode "query=$expr" -d start=$start -d end=$end -d step=$step)
    [ "$(jq -r .status <<<"$resp")" = success ] || { echo "panel $id: query failed: $resp" >&2; exit 1; }
    while read -r series; do
      f="$out/$name-$n.dat"
      jq -r '.values[] | "\(.[0]) \(.[1])"' <<<"$series" > "$f"
      label=$(jq -r --arg l "$legend" '.metric as $m | if $l == "" then ($m | tostring) else ($l | gsub("\\{\\{ *(?<k>[a-zA-Z_]+) *\\}\\}"; ($m[.k] // ""))) end' <<<"$series")
      plot+=("'$f' using 1:2 with lines lw 2 title '${label//\'/}'"); n=$((n+1))
    done < <(jq -c '.data.result[]' <<<"$resp")
  done < <(jq -c '.targets[]' <<<"$panel")
  [ $n -gt 0 ] || { echo "panel $id ($title): no data" >&2; continue; }
  gnuplot <<GP
set terminal pngcairo size 900,360 font "DejaVu Sans,10"
set output "$out/$name.png"
set title "${title//\"/}"
set xdata time; set timefmt "%s"; set format x "%H:%M:%S"; set xlabel "time (UTC)"; set grid; set key outside right top
set ylabel "$unit"
$([ "$min" = 0 ] && echo 'set yrange [0:*]')
plot $(IFS=,; echo "${plot[*]}")
GP
  rm -f "$out/$name"-*.dat
  echo "rendered $out/$name.png ($n series)"
done
