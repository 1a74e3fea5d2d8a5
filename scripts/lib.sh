# Shared helpers for the scripts in this directory. Source, don't run.

SHARDTRAIN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$SHARDTRAIN_ROOT/build}"

# Debian packages the build, the tests and the main job need.
SHARDTRAIN_PACKAGES=(
  build-essential cmake pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgoogle-glog-dev
  libopenblas-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist
  etcd-server
  curl openssl
  clang libclang-rt-14-dev libfuzzer-14-dev
)

log() { printf '[shardtrain] %s\n' "$*" >&2; }

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
# $BUILD_DIR with two jobs.
build_targets() {
  cmake -S "$SHARDTRAIN_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
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
