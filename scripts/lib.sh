# Shared helpers for the scripts in this directory. Source, don't run.

SHARDTRAIN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$SHARDTRAIN_ROOT/build}"

# Debian packages the build, the tests and the main job need.
SHARDTRAIN_PACKAGES=(
  build-essential cmake pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgoogle-glog-dev
  libopenblas-dev zlib1g-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist vim-runtime
  etcd-server
  mmdebstrap podman runc netavark aardvark-dns iptables docker-compose
  curl openssl
  clang libclang-rt-14-dev libfuzzer-14-dev
  python3-dev pybind11-dev python3-numpy python3-pytest python3-torch
)

# Progress lines, with the time of day (how long each phase of scripts/test.sh
# took is then in its log).
log() { printf '[shardtrain %s] %s\n' "$(date +%T)" "$*" >&2; }

# Installs whichever of the given packages are missing (apt-get, no prompts).
ensure_packages() {
  local missing=()
  local pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Configures (Release) and builds the given targets (all when none) into
# $BUILD_DIR with two jobs. SHARDTRAIN_BUILD_BENCH=OFF leaves the
# benchmarks out (.ci/run: no test runs them, and the lock check parses
# them, so they still have to compile).
build_targets() {
  cmake -S "$SHARDTRAIN_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
    -DSHARDTRAIN_BUILD_BENCH="${SHARDTRAIN_BUILD_BENCH:-ON}" >/dev/null
  if [ $# -eq 0 ]; then
    cmake --build "$BUILD_DIR" -j2
  else
    cmake --build "$BUILD_DIR" -j2 --target "$@"
  fi
}

# Waits up to $2 seconds for file $1 to exist; fails otherwise.
wait_for_file() {
  local file=$1 deadline=$((SECONDS + $2))
  while [ ! -s "$file" ]; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.1
  done
}

# The etcd binary (Debian's etcd-server) for replicated runs.
ETCD_BIN="${ETCD_BIN:-etcd}"

# Prints a TCP port no socket on this machine uses now, below the kernel's
# ephemeral range so that a port the kernel hands out meanwhile (a shard's
# --port 0) is not it. Nothing holds it: bind it soon, and retry on a clash.
free_port() {
  local used port
  used=$(awk 'FNR > 1 { split($2, a, ":"); print a[2] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null || true)
  for _ in $(seq 200); do
    port=$((20000 + RANDOM % 12000))
    grep -qx "$(printf '%04X' "$port")" <<<"$used" || { echo "$port"; return 0; }
  done
  return 1
}

# Whether etcd's client port $1 answers (it has a leader and serves); with
# $2, a make-certs.sh directory, over TLS with its client certificate.
etcd_answers() {
  if command -v curl >/dev/null; then
    local tls=()
    [ -z "${2:-}" ] || tls=(--cacert "$2/ca.pem" --cert "$2/client.pem" --key "$2/client.key")
    curl -sf --max-time 1 "${tls[@]}" "http${2:+s}://127.0.0.1:$1/health" 2>/dev/null |
      grep -q '"health":"true"'
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}

# Starts a single-member etcd on 127.0.0.1 with its data in directory $1 and
# its log appended to $2, on client and peer ports picked free now (another
# pair when etcd exits, e.g. because a port was taken before it bound it),
# with heartbeats and elections fast enough for 1 s leases. Sets etcd_pid
# as soon as etcd runs (so the caller's cleanup can stop it) and, once etcd
# answers, etcd_endpoint (127.0.0.1:PORT). Fails when it does not answer
# within 30 s or exits 5 times; its log then ends in $2. With $3, a
# scripts/make-certs.sh directory, etcd serves https with its server
# certificate and takes only clients with a certificate of its CA
# (--client-cert-auth).
start_etcd() {
  local data=$1 log_file=$2 certs=${3:-} client peer deadline scheme=http tls=()
  if [ -n "$certs" ]; then
    scheme=https
    tls=(--cert-file="$certs/server.pem" --key-file="$certs/server.key"
         --client-cert-auth --trusted-ca-file="$certs/ca.pem")
  fi
  etcd_pid="" etcd_endpoint=""
  for _ in 1 2 3 4 5; do
    client=$(free_port) && peer=$(free_port) || return 1
    [ "$client" != "$peer" ] || continue
    rm -rf "$data"
    "$ETCD_BIN" --name=local --data-dir="$data" \
      --listen-client-urls="$scheme://127.0.0.1:$client" \
      --advertise-client-urls="$scheme://127.0.0.1:$client" "${tls[@]}" \
      --listen-peer-urls="http://127.0.0.1:$peer" \
      --initial-advertise-peer-urls="http://127.0.0.1:$peer" \
      --initial-cluster="local=http://127.0.0.1:$peer" \
      --heartbeat-interval=25 --election-timeout=250 >>"$log_file" 2>&1 &
    etcd_pid=$!
    deadline=$((SECONDS + 30))
    while kill -0 "$etcd_pid" 2>/dev/null; do
      if etcd_answers "$client" "$certs"; then
        etcd_endpoint="127.0.0.1:$client"
        return 0
      fi
      if [ $SECONDS -ge $deadline ]; then
        echo "etcd did not answer on 127.0.0.1:$client within 30 s; its log ($log_file):" >&2
        tail -n 20 "$log_file" >&2
        return 1
      fi
      sleep 0.1
    done
    wait "$etcd_pid" 2>/dev/null || true
    etcd_pid=""
  done
  echo "etcd did not start; its log ($log_file):" >&2
  tail -n 20 "$log_file" >&2
  return 1
}
