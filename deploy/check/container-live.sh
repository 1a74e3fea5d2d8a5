#!/usr/bin/env bash
# deploy.container-live: the image and the compose cluster built and run for
# real, with podman (runc) and Debian's docker-compose against podman's
# Docker-compatible API socket.
#
#  1. the base image: debian:12-slim when present; else a bookworm minbase
#     root made by mmdebstrap from this machine's apt sources (cached as a
#     tarball in $SHARDTRAIN_CACHE_DIR) and `podman import`ed under that name;
#  2. the .debs from BUILD_DIR (cpack), and the cpu flavour of
#     deploy/Dockerfile built from them (PACKAGES=context: the runtime stage
#     installs shardtrain_*.deb with apt, exactly as PACKAGES=source does
#     with the .debs its build stage makes); Prometheus from
#     deploy/prometheus/Dockerfile (Debian's package);
#  3. `docker-compose -f deploy/docker-compose.yml [-f
#     deploy/docker-compose.replicated.yml] up -d` of the shards, workers and
#     Prometheus (and etcd); Grafana is not packaged by Debian
#     (deploy.dashboard validates its dashboard offline, deploy.live renders
#     its panels from a live Prometheus);
#  4. checks: both shards healthy by their image's own HEALTHCHECK;
#     Prometheus scrapes every target; a shard container SIGKILLed in epoch 2
#     and started again is survived (the README's fault table) and costs
#     that epoch at most 20 s in all; both workers
#     exit 0 and the chief's final accuracy is >= 0.85; `stop` makes each
#     shard write its final checkpoint (SIGTERM through tini, exit 0); the
#     shards start again from that checkpoint, which user 10001 reads in
#     the volume; `down -v` leaves no container, network or volume.
#
# Why docker-compose and not podman-compose: it is the implementation the
# compose file's users run, and podman-compose 1.0 (Debian 12) does not wait
# for `depends_on: condition: service_healthy`. Podman runs healthchecks
# from systemd timers; where there is no systemd (this test's machines, a
# container, WSL) nothing runs them, so this script runs each container's
# own healthcheck every 2 s (`podman healthcheck run`), as the timer would.
#
# `podman build --format docker`: the OCI image format has no HEALTHCHECK, and
# podman's default (oci) drops it with a warning.
#
# Image layers stay in podman's storage between runs (the base and the
# Prometheus image are then reused; the shardtrain image's last layer is
# rebuilt with the new .deb). Needs root, podman, runc, mmdebstrap (first
# run), docker-compose and cpack; exits 77 (skipped) without them.
#
#   deploy/check/container-live.sh SOURCE_DIR BUILD_DIR base        (step 1 and the Prometheus
#                                                                    image: no build needed)
#   deploy/check/container-live.sh SOURCE_DIR BUILD_DIR image       (steps 1-2)
#   deploy/check/container-live.sh SOURCE_DIR BUILD_DIR plain       (steps 3-4 on those images)
#   deploy/check/container-live.sh SOURCE_DIR BUILD_DIR replicated  (the same, replicated override)
#   (KEEP=1 keeps the scratch directory and logs)
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
mode=${3:-}
case $mode in base | image | plain | replicated) ;; *) echo "usage: container-live.sh SOURCE_DIR BUILD_DIR base|image|plain|replicated" >&2; exit 2 ;; esac

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (podman with runc, container networks)"
for tool in podman runc docker-compose cpack curl; do
  command -v "$tool" >/dev/null || skip "needs $tool (Debian packages podman runc docker-compose cmake curl)"
done

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $* (${SECONDS} s)"; }
figure() { echo "FIGURE $mode: $*"; }

work=$(mktemp -d /tmp/shardtrain-container.XXXXXX)
project=shardtrain$$$mode
service_pid="" ticker_pid=""
compose_files=(-f "$src/deploy/docker-compose.yml")
[ "$mode" = plain ] || compose_files+=(-f "$src/deploy/docker-compose.replicated.yml")
services=(shard-0 shard-1 worker-0 worker-1 prometheus)
[ "$mode" = plain ] || services=(etcd "${services[@]}")

# runc (crun cannot set resource limits in some sandboxes) and explicit
# limits (podman's defaults can exceed what the caller may set): 16384 each,
# or the caller's hard limit when lower.
nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
[ "$nofile" = unlimited ] || [ "$nofile" -gt 16384 ] && nofile=16384
[ "$nproc" = unlimited ] || [ "$nproc" -gt 16384 ] && nproc=16384
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$work/containers.conf
export DOCKER_HOST=unix://$work/podman.sock COMPOSE_PROJECT_NAME=$project
export PROMETHEUS_IMAGE=localhost/shardtrain-prometheus:debian
compose() { docker-compose --ansi never "${compose_files[@]}" "$@"; }
container() { echo "${project}_$1_1"; }

cleanup() {
  local status=$?
  set +e
  if [ -S "$work/podman.sock" ]; then
    compose logs --no-color >"$work/compose.log" 2>&1
    if [ "$status" != 0 ]; then
      echo "---- the shards' and workers' logs (the last 160 lines) ----"
      grep -v '^\(prometheus\|etcd\)' "$work/compose.log" | tail -n 160
    fi
    compose down -v --timeout 10 >/dev/null 2>&1
  fi
  # Whatever compose could not remove (a failed start).
  podman ps -aq --filter "label=com.docker.compose.project=$project" | xargs -r podman rm -f -t 0 >/dev/null 2>&1
  podman volume ls -q --filter "label=com.docker.compose.project=$project" | xargs -r podman volume rm -f >/dev/null 2>&1
  podman network rm -f "${project}_default" >/dev/null 2>&1
  [ -n "$ticker_pid" ] && kill "$ticker_pid" 2>/dev/null && wait "$ticker_pid" 2>/dev/null
  [ -n "$service_pid" ] && kill "$service_pid" 2>/dev/null && wait "$service_pid" 2>/dev/null
  if [ -n "${KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# Debian's Prometheus package in an image (the base mode makes it before the
# build, the image mode again from podman's layer cache).
build_prometheus_image() {
  step "podman build: deploy/prometheus/Dockerfile"
  podman build --format docker --network=host -t "$PROMETHEUS_IMAGE" "$src/deploy/prometheus" >"$work/prometheus-build.log" 2>&1 ||
    { tail -n 40 "$work/prometheus-build.log"; fail "the Prometheus image did not build"; }
}

if [ "$mode" = plain ] || [ "$mode" = replicated ]; then
  for image in localhost/shardtrain:latest "$PROMETHEUS_IMAGE"; do
    podman image exists "$image" || fail "no image $image: run container-live.sh $1 $2 image first (ctest: deploy.container-image)"
  done
else
# ---- 1. the base image -------------------------------------------------------
if podman image exists debian:12-slim; then
  step "base image: debian:12-slim is present"
else
  if [ "$(id -u)" = 0 ]; then default_cache=/var/cache/shardtrain; else default_cache=${XDG_CACHE_HOME:-$HOME/.cache}/shardtrain; fi
  cache=${SHARDTRAIN_CACHE_DIR:-$default_cache}
  mkdir -p "$cache"
  sources=()
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -s "$file" ] && grep -q '^[^#]' "$file" && sources+=("$file")
  done
  # What debian:12-slim leaves out: documentation, manual pages, locales.
  base_args=(--variant=minbase --mode=root --format=tar --dpkgopt=force-unsafe-io
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*')
  key=$({ echo "bookworm ${base_args[*]}"; cat "${sources[@]}" /dev/null; } | sha256sum | cut -c1-16)
  tarball=$cache/base-bookworm-$key.tar
  if [ ! -s "$tarball" ]; then
    command -v mmdebstrap >/dev/null || skip "no debian:12-slim image and no mmdebstrap to make one"
    step "mmdebstrap a bookworm minbase root (cached in $tarball)"
    mmdebstrap "${base_args[@]}" bookworm "$work/base.tar" "${sources[@]}" >"$work/mmdebstrap.log" 2>&1 ||
      { tail -n 30 "$work/mmdebstrap.log"; fail "mmdebstrap failed"; }
    find "$cache" -maxdepth 1 -name 'base-bookworm-*.tar' -delete
    mv "$work/base.tar" "$tarball.tmp.$$" && mv "$tarball.tmp.$$" "$tarball"
  fi
  step "podman import $tarball as debian:12-slim"
  podman import --change 'CMD ["bash"]' "$tarball" localhost/debian:12-slim >/dev/null
fi

if [ "$mode" = base ]; then
  build_prometheus_image
  step "base images made"
  exit 0
fi

# ---- 2. packages and images --------------------------------------------------
step "cpack -G DEB"
(cd "$build" && cpack -G DEB -B "$work/pkg") >"$work/cpack.log" 2>&1 ||
  { tail -n 30 "$work/cpack.log"; fail "cpack failed"; }
mkdir "$work/context"
cp "$work"/pkg/shardtrain_*.deb "$work/context/"
step "podman build: deploy/Dockerfile, FLAVOUR=cpu, from $(basename "$work"/context/*.deb)"
podman build --format docker --network=host -f "$src/deploy/Dockerfile" --build-arg FLAVOUR=cpu \
  --build-arg PACKAGES=context -t localhost/shardtrain:latest "$work/context" >"$work/build.log" 2>&1 ||
  { tail -n 40 "$work/build.log"; fail "the cpu image did not build"; }
figure "image shardtrain:latest (cpu flavour) $(podman image inspect --format '{{.Size}}' localhost/shardtrain:latest | awk '{printf "%.0f MB", $1 / 1e6}')"
podman run --rm localhost/shardtrain:latest sh -c 'ps-worker --help >/dev/null && psctl --help >/dev/null && ps-server --help >/dev/null' ||
  fail "the image's binaries do not start"
build_prometheus_image

step "images built"
exit 0
fi

# ---- 3. the cluster -----------------------------------------------------------
podman system service --time=0 "$DOCKER_HOST" >"$work/podman-service.log" 2>&1 &
service_pid=$!
for _ in $(seq 100); do [ -S "$work/podman.sock" ] && break; sleep 0.1; done
[ -S "$work/podman.sock" ] || fail "podman system service did not create $work/podman.sock"
# The healthcheck timer podman would get from systemd.
(
  while sleep 2; do
    for id in $(podman ps -q --filter "label=com.docker.compose.project=$project" --filter health=starting) \
              $(podman ps -q --filter "label=com.docker.compose.project=$project" --filter health=healthy) \
              $(podman ps -q --filter "label=com.docker.compose.project=$project" --filter health=unhealthy); do
      podman healthcheck run "$id" >/dev/null 2>&1 || true
    done
  done
) &
ticker_pid=$!

PROMETHEUS_PORT=$(/usr/bin/env python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export PROMETHEUS_PORT
up_start=$SECONDS
up_at=$(date +%s.%N)
step "compose up -d --no-build ${services[*]}"
compose up -d --no-build "${services[@]}" >"$work/up.log" 2>&1 || { cat "$work/up.log"; fail "compose up failed"; }

health() { podman inspect --format '{{.State.Health.Status}}' "$(container "$1")" 2>/dev/null; }
for shard in shard-0 shard-1; do
  [ "$(health "$shard")" = healthy ] || fail "$shard is $(health "$shard") after compose up"
done
echo "shard-0 and shard-1 healthy by their HEALTHCHECK"

figure "compose up -d to both shards healthy and the workers started: $((SECONDS - up_start)) s"
logs() { podman logs "$(container "$1")" 2>&1; }
# has SERVICE REGEX: its log has a matching line (grep -q on a pipe would
# end podman logs early, and pipefail make that a miss).
has() { local out; out=$(logs "$1"); grep -q -- "$2" <<<"$out"; }

# ---- 4. a shard container SIGKILLed and started again --------------------------
for _ in $(seq 600); do has worker-0 '^epoch 1/' && break; sleep 0.5; done
has worker-0 '^epoch 1/' || fail "worker-0 did not finish epoch 1"
first_step=$(podman logs --timestamps "$(container worker-0)" 2>&1)
first_step=$(grep -m 1 'first training step done' <<<"$first_step" | cut -d' ' -f1)
[ -n "$first_step" ] || fail "worker-0 logged no first training step"
figure "compose up -d to worker-0's first training step: $(awk -v a="$up_at" -v b="$(date -d "$first_step" +%s.%N)" 'BEGIN { printf "%.1f s", b - a }')"
# IP address on the compose network (docker-compose.yml: Addresses).
addresses() {
  podman inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$(container "$1")"
}
shard1_addresses=$(addresses shard-1)
step "SIGKILL shard-1's container"
podman kill --signal KILL "$(container shard-1)" >/dev/null
for _ in $(seq 50); do
  state=$(podman inspect --format '{{.State.Status}}' "$(container shard-1)")
  [ "$state" != running ] && break
  sleep 0.1
done
sleep 3
if [ "$(podman inspect --format '{{.State.Status}}' "$(container shard-1)")" != running ]; then
  echo "shard-1 is $(podman inspect --format '{{.State.Status}}' "$(container shard-1)"); compose start shard-1"
  compose start shard-1 >/dev/null 2>&1 || fail "compose start shard-1 failed"
else
  echo "shard-1 was restarted by its restart policy"
fi
[ "$(addresses shard-1)" = "$shard1_addresses" ] ||
  fail "shard-1 came back at $(addresses shard-1), not at $shard1_addresses"
echo "shard-1 is back at its address ($shard1_addresses)"

# Prometheus scrapes every target it is configured with.
expected=$(grep -o '"[a-z0-9-]*:[0-9]*"' "$src/deploy/prometheus/prometheus$([ "$mode" = plain ] || echo .replicated).yml" | sort -u | wc -l)
query() { curl -sf --max-time 5 "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/query" --data-urlencode "query=$1"; }
# scalar QUERY: the first result's value, 0 when there is none.
scalar() { query "$1" | /usr/bin/env python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)' 2>/dev/null || echo 0; }
up_targets=0
for _ in $(seq 60); do
  up_targets=$(scalar 'count(up == 1)')
  [ "$up_targets" = "$expected" ] && break
  sleep 2
done
[ "$up_targets" = "$expected" ] || { query up || true; fail "Prometheus has $up_targets of $expected targets up"; }
echo "Prometheus: all $expected targets up"

step "waiting for the workers to finish"
for worker in worker-0 worker-1; do
  code=$(timeout 600 podman wait "$(container "$worker")") || fail "$worker did not exit within 600 s"
  [ "$code" = 0 ] || { logs "$worker" | tail -n 30; fail "$worker exited $code"; }
done
out=$(logs worker-0)
grep '^epoch \|^final test accuracy' <<<"$out" || true
# The epoch with the kill: the shard is back within a few seconds, and the
# workers must reach it at once. With Linux's default ARP timing they went on
# sending to an old MAC address for 15-45 s after it was back
# (docker-compose.yml's Addresses); before that, gRPC re-resolved the name
# at most every 30 s. What the workers control is the time from the
# restarted shard's first "serving" line to worker-0's "answers again"
# (plain: the replicated workers go on with the other shard meanwhile), so
# that is bounded tightly; the epoch also holds this script's own restart
# (podman and docker-compose, slow under load: 15.7 s with a build beside it).
longest=$(sed -n 's/^epoch .* time \([0-9.]*\)s .*/\1/p' <<<"$out" | sort -n | tail -n 1)
[ -n "$longest" ] || fail "worker-0 printed no epoch times"
figure "longest epoch of worker-0 (the one with the shard kill): $longest s"
/usr/bin/env python3 -c "import sys; sys.exit(0 if float('$longest') <= 30 else 1)" ||
  fail "an epoch took $longest s: the workers were slow to reach the restarted shard"
if [ "$mode" = plain ]; then
  # glog's time of day (field 2) of the restarted shard's serving line and
  # of worker-0's reconnection.
  served=$(logs shard-1 | grep 'serving on port' | tail -n 1 | awk '{print $2}')
  back=$(logs worker-0 | grep 'shard 1 (.*) answers again' | tail -n 1 | awk '{print $2}')
  [ -n "$served" ] && [ -n "$back" ] ||
    fail "no serving line of the restarted shard-1 ('$served') or no reconnection of worker-0 ('$back')"
  delay=$(/usr/bin/env python3 -c "
t = lambda s: sum(float(x) * m for x, m in zip(s.split(':'), (3600, 60, 1)))
print('%.1f' % ((t('$back') - t('$served')) % 86400))")
  figure "worker-0 reached the restarted shard-1 $delay s after it served"
  /usr/bin/env python3 -c "import sys; sys.exit(0 if float('$delay') <= 8 else 1)" ||
    fail "worker-0 reached the restarted shard-1 $delay s after it served (bound 8 s)"
fi
# The shards open a data port (--data_listen): the workers' data path went
# there, not to gRPC, at the compose network's addresses. The gauge counts
# open connections and Prometheus reads it every 15 s: the shard that stays
# up holds both workers' connections for the whole run (20 s or more), so a
# scrape sees them; the killed one may hold them only between two scrapes
# (before the kill, and after its restart once the workers' 5 s on gRPC are
# over), so the busiest shard is the one asked about.
data=$(scalar 'max(max_over_time(shardtrain_data_connections[15m]))')
/usr/bin/env python3 -c "import sys; sys.exit(0 if float('$data') >= 2 else 1)" ||
  fail "no shard saw more than $data data-port connections (shardtrain_data_connections): the workers' data path did not use the data port"
echo "the workers' data path used the data port: $data connections on a shard"
out=$(logs shard-1)
grep '^W' <<<"$out" | cut -c1-300 || true
accuracy=$(logs worker-0 | sed -n 's/^final test accuracy: \([0-9.]*\).*/\1/p' | tail -n 1)
[ -n "$accuracy" ] || fail "worker-0 printed no final accuracy"
echo "workers exited 0; final test accuracy $accuracy"
/usr/bin/env python3 -c "import sys; sys.exit(0 if float('$accuracy') >= 0.85 else 1)" ||
  fail "final accuracy $accuracy < 0.85"
if [ "$mode" = plain ]; then
  has worker-0 'incarnation\|re-register\|lost' || echo "note: worker-0 logged no re-registration"
fi

# ---- 5. stop: the final checkpoint, then a restart from it ---------------------
checkpoints() { local out; out=$(logs "$1"); grep -c '\] checkpoint /var/lib/shardtrain/checkpoints/' <<<"$out" || true; }
declare -A before=()
for shard in shard-0 shard-1; do before[$shard]=$(checkpoints "$shard"); done
step "compose stop shard-0 shard-1"
compose stop shard-0 shard-1 >/dev/null 2>&1 || fail "compose stop failed"
for shard in shard-0 shard-1; do
  code=$(podman inspect --format '{{.State.ExitCode}}' "$(container "$shard")")
  [ "$code" = 0 ] || { logs "$shard" | tail -n 20; fail "$shard exited $code on SIGTERM (137: it never saw it)"; }
  [ "$(checkpoints "$shard")" -gt "${before[$shard]}" ] || { logs "$shard" | tail -n 20; fail "$shard wrote no final checkpoint on stop"; }
done
echo "both shards wrote a final checkpoint on SIGTERM and exited 0"
step "compose start shard-0 shard-1"
compose start shard-0 shard-1 >/dev/null 2>&1 || fail "compose start failed"
for shard in shard-0 shard-1; do
  for _ in $(seq 60); do [ "$(health "$shard")" = healthy ] && break; sleep 1; done
  [ "$(health "$shard")" = healthy ] || fail "$shard is $(health "$shard") after its restart"
  has "$shard" 'restored .* from /var/lib/shardtrain/checkpoints/' ||
    { logs "$shard" | tail -n 20; fail "$shard did not restore its checkpoint"; }
  compose exec -T "$shard" sh -c 'test "$(id -u)" = 10001 && ls -ln /var/lib/shardtrain/checkpoints && cat /var/lib/shardtrain/checkpoints/* >/dev/null' ||
    fail "user 10001 cannot read $shard's checkpoint volume"
done
echo "both shards restored their checkpoints; user 10001 reads the volumes"

# ---- 6. down -v leaves nothing -------------------------------------------------
compose logs --no-color >"$work/compose.log" 2>&1 || true
step "compose down -v"
compose down -v --timeout 30 >/dev/null 2>&1 || fail "compose down -v failed"
left=$(podman ps -aq --filter "label=com.docker.compose.project=$project"
  podman volume ls -q --filter "label=com.docker.compose.project=$project"
  podman network ls -q --filter "name=^${project}_")
[ -z "$left" ] || fail "left after down -v: $left"
step "container-live $mode OK"
