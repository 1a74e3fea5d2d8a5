#!/usr/bin/env bash
# Starts a whole shardtrain cluster on 127.0.0.1 (shards + workers, ports
# picked free at run time) and trains an MLP on Fashion-MNIST, printing one
# line per epoch and the final test accuracy. Every process it starts is
# stopped on exit, error or Ctrl-C. It exits non-zero if any worker fails;
# if the chief (worker 0, which evaluates) dies there is no final accuracy.
#
#   scripts/run-local.sh [--mode sync|async] [--workers N] [--shards N]
#       [--epochs N] [--optimizer sgd|momentum|nesterov|adam|adamw|adagrad]
#       [--lr X] [--lr-schedule cosine|constant] [--batch N]
#       [--max-staleness N] [--model mlp:784-...-10] [--overlap auto|on|off|stale]
#       [--pipeline-stages S --microbatches M --schedule gpipe|1f1b]
#       [--device cpu|cuda] [--gemm-precision fp32|tf32|bf16]
#       [--checkpoint-dir DIR [--checkpoint-every N]] [--resume DIR]
#       [--secure] [--topk RATIO] [--replicas N] [--results FILE] [--logs DIR]
#       [--no-build] [-- extra ps-server flags]
#
#   --checkpoint-dir DIR  shards checkpoint into DIR (sync: every N steps, at
#                         the same step on every shard; async: every N s);
#                         N is --checkpoint-every (default 100 steps / 30 s)
#   --resume DIR          continue the job checkpointed in DIR: run again with
#                         the same flags; the shards restore their newest
#                         checkpoint and the workers resume from the shards
#   --secure              mutual TLS and an auth token made for this run (with
#                         --replicas, etcd serves TLS and takes only its certificates).
#                         Without the token anyone who can reach a shard's port
#                         can act as a worker (claim a worker index, push
#                         gradients, mark workers done); the shards here listen
#                         on 127.0.0.1 only
#   --replicas N          keep every partition on N shards (1..3, at most
#                         --shards; default 1: no replication). N > 1 starts a
#                         local etcd (Debian's etcd-server) for the chains; see
#                         them with the psctl command the run prints
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mode=async workers=2 shards=2 epochs=10 optimizer=adam lr=0.001 batch=64
max_staleness=4 schedule=cosine model=mlp:784-256-128-10 overlap=auto
stages=1 microbatches=1 pipe_schedule=1f1b device=cpu gemm_precision=fp32
results="" logs="" build=1 secure=0 topk=0 checkpoint_dir="" resume=0
checkpoint_every="" replicas=1
server_extra=()
# The comment block at the top of this file.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --mode) mode=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --optimizer) optimizer=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --lr-schedule) schedule=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --max-staleness) max_staleness=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --overlap) overlap=$2; shift 2 ;;
    --pipeline-stages) stages=$2; shift 2 ;;
    --microbatches) microbatches=$2; shift 2 ;;
    --schedule) pipe_schedule=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --gemm-precision) gemm_precision=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --secure) secure=1; shift ;;
    --topk) topk=$2; shift 2 ;;
    --replicas) replicas=$2; shift 2 ;;
    --checkpoint-dir) checkpoint_dir=$2; shift 2 ;;
    --checkpoint-every) checkpoint_every=$2; shift 2 ;;
    --resume) checkpoint_dir=$2; resume=1; shift 2 ;;
    --) shift; server_extra=("$@"); break ;;
    -h|--help) usage 0 ;;
    *) echo "unknown option: $1" >&2; usage 2 ;;
  esac
done
case "$mode" in sync|async) ;; *) echo "--mode must be sync or async" >&2; exit 2 ;; esac
case "$overlap" in auto|on|off|stale) ;; *) echo "--overlap must be auto, on, off or stale" >&2; exit 2 ;; esac
for n in "$workers" "$shards" "$epochs" "$batch" ${checkpoint_every:+"$checkpoint_every"}; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "counts must be positive integers" >&2; exit 2; }
done
[[ "$replicas" =~ ^[1-3]$ ]] || { echo "--replicas must be 1, 2 or 3" >&2; exit 2; }
[ "$replicas" -le "$shards" ] || {
  echo "--replicas $replicas needs at least $replicas shards (--shards $shards)" >&2; exit 2; }
checkpoint_flags=()
if [ -n "$checkpoint_dir" ]; then
  if [ "$resume" = 1 ]; then
    for ((s = 0; s < shards; s++)); do
      compgen -G "$checkpoint_dir/shard-$s-of-$shards-*.ckpt" >/dev/null || {
        echo "--resume $checkpoint_dir: no checkpoint of shard $s of $shards there" >&2
        exit 2; }
    done
  fi
  mkdir -p "$checkpoint_dir"
  checkpoint_dir=$(cd "$checkpoint_dir" && pwd)
  checkpoint_flags=(--checkpoint_dir="$checkpoint_dir")
  if [ "$mode" = sync ]; then
    checkpoint_flags+=(--checkpoint_every_steps="${checkpoint_every:-100}")
  else
    checkpoint_flags+=(--checkpoint_interval_s="${checkpoint_every:-30}")
  fi
fi

if [ "$build" = 1 ]; then
  ensure_packages "${SHARDTRAIN_PACKAGES[@]}"
  log "building (Release) into $BUILD_DIR"
  build_targets ps-server ps-worker
fi
bin="$BUILD_DIR/bin"
if [ "$replicas" -gt 1 ] && ! command -v "$ETCD_BIN" >/dev/null; then
  echo "--replicas $replicas needs etcd ($ETCD_BIN not found; Debian package etcd-server)" >&2
  exit 2
fi

run_dir=$(mktemp -d -t shardtrain-run.XXXXXX)
[ -n "$logs" ] || logs="$run_dir"
mkdir -p "$logs"
pids=() etcd_pid=""
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  # etcd last: the shards do not see it go.
  if [ -n "$etcd_pid" ]; then
    kill "$etcd_pid" 2>/dev/null || true
    wait "$etcd_pid" 2>/dev/null || true
  fi
  # The run's directory goes; without --logs it holds the logs, which are
  # kept only when the run failed.
  if [ "$logs" = "$run_dir" ] && [ "$status" != 0 ]; then
    rm -rf "$run_dir/ports" "$run_dir/certs" "$run_dir/chief.out" "$run_dir/chief.fifo" \
      "$run_dir/etcd"
    echo "logs kept in $run_dir" >&2
  else
    rm -rf "$run_dir"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

# A cosine schedule decays over every update a partition will see: one per
# step in sync mode, one per worker step in async mode.
train_examples=60000
steps_per_worker=$(( epochs * (train_examples / workers / batch) ))
total_updates=$steps_per_worker
[ "$mode" = async ] && total_updates=$(( steps_per_worker * workers ))

# The data path (Push, Pull, PushPull, Lookup, PushSparse) goes to each
# shard's data port: frames on TCP, no HTTP/2.
# --secure: a private CA, certificates and a token made for this run; every
# gRPC and data-port connection is mutual TLS and carries the token (the
# /metrics endpoints stay plain HTTP).
server_security=(--data_listen=127.0.0.1:0) client_security=()
if [ "$secure" = 1 ]; then
  certs="$run_dir/certs"
  "$SHARDTRAIN_ROOT/scripts/make-certs.sh" "$certs" >/dev/null
  server_security+=(--tls_cert="$certs/server.pem" --tls_key="$certs/server.key"
                   --tls_client_ca="$certs/ca.pem" --auth_token_file="$certs/token")
  client_security=(--tls_ca="$certs/ca.pem" --tls_cert="$certs/client.pem"
                   --tls_key="$certs/client.key" --auth_token_file="$certs/token")
  log "secure: mutual TLS and an auth token (certificates in $certs)"
fi

# --replicas N > 1: the chains live in an etcd of this run, under a job name
# of this run; 1 s leases, so a dead shard leaves its chains within ~1 s.
server_replication=() worker_replication=()
if [ "$replicas" -gt 1 ]; then
  # --secure: etcd serves TLS and takes only the run's certificates.
  start_etcd "$run_dir/etcd" "$logs/etcd.log" "${certs:-}" || exit 1
  job="local-${run_dir##*.}"
  server_etcd=() worker_etcd=()
  if [ "$secure" = 1 ]; then
    server_etcd=(--etcd_ca="$certs/ca.pem" --etcd_cert="$certs/server.pem"
                 --etcd_key="$certs/server.key")
    worker_etcd=(--etcd_ca="$certs/ca.pem" --etcd_cert="$certs/client.pem"
                 --etcd_key="$certs/client.key")
  fi
  server_replication=(--replicas="$replicas" --etcd_endpoints="$etcd_endpoint"
                      --job="$job" --lease_ttl_s=1 "${server_etcd[@]}")
  worker_replication=(--replicas="$replicas" --etcd_endpoints="$etcd_endpoint" --job="$job"
                      "${worker_etcd[@]}")
  log "etcd on $etcd_endpoint (log $logs/etcd.log); chains of $replicas replicas:" \
    "psctl chains --etcd_endpoints=$etcd_endpoint --job=$job ${worker_etcd[*]}"
fi

mkdir -p "$run_dir/ports"
for ((s = 0; s < shards; s++)); do
  "$bin/ps-server" --shard_index="$s" --num_shards="$shards" \
    --num_workers="$workers" --mode="$mode" --optimizer="$optimizer" \
    --lr="$lr" --max_staleness="$max_staleness" \
    --lr_schedule="$schedule" --lr_total_steps="$total_updates" \
    --port_file="$run_dir/ports/shard$s" "${server_security[@]}" \
    "${server_replication[@]}" "${checkpoint_flags[@]}" "${server_extra[@]}" \
    2>"$logs/shard$s.log" &
  pids+=($!)
done
servers=()
for ((s = 0; s < shards; s++)); do
  if ! wait_for_file "$run_dir/ports/shard$s" 30; then
    echo "shard $s did not start; its log:" >&2
    tail -n 20 "$logs/shard$s.log" >&2
    exit 1
  fi
  read -r port metrics_port data_port <"$run_dir/ports/shard$s"
  servers+=("127.0.0.1:$port")
  log "shard $s on 127.0.0.1:$port (metrics :$metrics_port, data port :$data_port)"
done
server_list=$(IFS=,; echo "${servers[*]}")

log "training $model with $workers workers, $shards shards, $mode mode, $optimizer lr=$lr ($schedule)"
[ "$resume" = 0 ] || log "resuming from the checkpoints in $checkpoint_dir"
[ -z "$checkpoint_dir" ] || [ "$resume" = 1 ] || log "checkpoints in $checkpoint_dir (resume: the same command with --resume $checkpoint_dir)"
worker_pids=()
for ((w = 0; w < workers; w++)); do
  args=(--servers="$server_list" --worker_index="$w" --num_workers="$workers"
        --model="$model" --batch="$batch" --epochs="$epochs"
        --device="$device" --gemm_precision="$gemm_precision" --topk_ratio="$topk"
        --overlap="$overlap" --pipeline_stages="$stages"
        --microbatches="$microbatches" --schedule="$pipe_schedule"
        --port_file="$run_dir/ports/worker$w" "${client_security[@]}"
        "${worker_replication[@]}")
  if [ "$w" = 0 ] && [ -n "$results" ]; then args+=(--results="$results"); fi
  if [ "$w" = 0 ]; then
    # The chief's report goes to the terminal and to chief.out, which is
    # checked for the final accuracy line, through tee on a FIFO: tee ends
    # when the chief's output does, so every line is shown before the run
    # ends (-p: a closed terminal pipe does not stop the chief).
    mkfifo "$run_dir/chief.fifo"
    tee -p "$run_dir/chief.out" <"$run_dir/chief.fifo" &
    chief_echo=$!
    pids+=("$chief_echo")
    "$bin/ps-worker" "${args[@]}" >"$run_dir/chief.fifo" 2>"$logs/worker$w.log" &
  else
    "$bin/ps-worker" "${args[@]}" >/dev/null 2>"$logs/worker$w.log" &
  fi
  pids+=($!)
  worker_pids+=($!)
done

# "exit status 3" or "killed by SIGKILL" for a wait status.
describe_exit() {
  if [ "$1" -gt 128 ]; then echo "killed by SIG$(kill -l "$(($1 - 128))")"; else echo "exit status $1"; fi
}

# Waits for the workers as they end; a failing one is reported at once. The
# chief's death ends the run (nobody else evaluates or reports).
failed=0 remaining=$workers
declare -A index_of
for ((w = 0; w < workers; w++)); do index_of[${worker_pids[$w]}]=$w; done
running=("${worker_pids[@]}")
# Sets `ended` to a worker that has ended and `status` to its exit status.
# Polled: bash 5.2's `wait -n -p` can miss a worker that ended while the
# shell was reaping another one and then block for good (a finished run
# once hung here with its shards still up).
next_ended() {
  while true; do
    for pid in "${running[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        ended=$pid status=0
        wait "$pid" || status=$?
        return
      fi
    done
    sleep 0.1
  done
}
while [ "$remaining" -gt 0 ]; do
  next_ended
  remaining=$((remaining - 1))
  w=${index_of[$ended]}
  still=()
  for pid in "${running[@]}"; do [ "$pid" = "$ended" ] || still+=("$pid"); done
  running=("${still[@]}")
  [ "$status" = 0 ] && continue
  failed=1
  if [ "$w" = 0 ]; then
    wait "$chief_echo" 2>/dev/null || true
    echo "chief worker 0 died ($(describe_exit "$status")); no final evaluation;" \
      "restart it with the same flags to resume. Its log ($logs/worker0.log):" >&2
    tail -n 20 "$logs/worker0.log" >&2
    exit 1
  fi
  echo "worker $w failed ($(describe_exit "$status")); its log ($logs/worker$w.log):" >&2
  tail -n 20 "$logs/worker$w.log" >&2
done
wait "$chief_echo" 2>/dev/null || true
if ! grep -q '^final test accuracy:' "$run_dir/chief.out"; then
  echo "chief worker 0 exited without a final accuracy line; its log:" >&2
  tail -n 20 "$logs/worker0.log" >&2
  exit 1
fi
[ "$failed" = 0 ] || { echo "a worker failed (above); the chief finished the job" >&2; exit 1; }
[ -z "$results" ] || log "results written to $results"
[ "$logs" = "$run_dir" ] || log "logs in $logs"
