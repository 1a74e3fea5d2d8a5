// ps-server: one shard of a shardtrain parameter server.
//
//   ps-server --shard_index=0 --num_shards=2 --num_workers=2 --mode=async
//             --listen=0.0.0.0:7000 --metrics_listen=0.0.0.0:9100
#include <csignal>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "app/buffer_pool_flag.h"
#include "app/deadlock_detection.h"
#include "app/etcd_flags.h"
#include "app/flags_usage.h"
#include "app/malloc_tuning.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "server/ps_server.h"
#include "server/update_rule.h"
#include "wire/tls_context.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "gRPC listen address host:port; port 0 picks a free port");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "Prometheus /metrics address host:port; port 0 picks a free port");
ABSL_FLAG(std::string, data_listen, "",
          "The data port's address host:port (port 0 picks a free port): workers send "
          "Push, Pull, PushPull, Lookup and PushSparse there as frames on TCP, without "
          "HTTP/2 (in TLS with --tls_cert, its client CA and token); empty opens none "
          "and the data path stays on gRPC");
ABSL_FLAG(int, max_data_connections, 256,
          "Data-port connections served at a time; more are closed (their workers use gRPC)");
ABSL_FLAG(int, max_data_calls_per_connection, 64,
          "Unanswered calls on one data-port connection before it stops being read");
ABSL_FLAG(int, data_tls_buffer_kib, 256,
          "With --tls_cert: each data-port connection reads ahead, and gathers its "
          "writes, in buffers of this many KiB (up to twice this per connection; "
          "17 to 65536)");
ABSL_FLAG(double, data_write_timeout_s, 30,
          "A data-port answer the worker does not take within this ends its connection");
ABSL_FLAG(std::string, port_file, "",
          "If set, write 'port metrics_port data_port' here once serving (data_port 0: none)");
ABSL_FLAG(int, shard_index, 0, "This shard's index in [0, num_shards)");
ABSL_FLAG(int, num_shards, 1, "Shards in the cluster");
ABSL_FLAG(int, num_workers, 1, "Workers in the job");
ABSL_FLAG(std::string, mode, "async", "Consistency: sync or async");
ABSL_FLAG(int, replicas_to_aggregate, 0,
          "sync: gradients averaged per step (0: every live worker)");
ABSL_FLAG(int64_t, max_staleness, -1,
          "async: a worker more than this many steps ahead of the slowest "
          "waits (SSP); -1 disables the bound");
ABSL_FLAG(bool, staleness_aware_lr, false,
          "async: scale each update by 1/staleness (a staleness of 0 or 1 leaves "
          "it; with 2 workers taking turns it changes nothing)");
ABSL_FLAG(std::string, optimizer, "sgd",
          "sgd, momentum, nesterov, adam, adamw, adagrad or delayed_nesterov "
          "(async momentum that trains like sync; see --async_momentum)");
ABSL_FLAG(std::string, async_momentum, "delayed_nesterov",
          "async with several workers: how --optimizer=momentum|nesterov runs. "
          "delayed_nesterov: every push applies lr*g/N, every N-th push a Nesterov "
          "momentum step on the N pushes' mean (N = --async_momentum_period), so "
          "--lr means what it means in sync mode; heavy_ball: the rule as in sync "
          "mode, stable only at a much smaller --lr");
ABSL_FLAG(int64_t, async_momentum_period, 0,
          "async delayed_nesterov: pushes per momentum step (0: --num_workers)");
ABSL_FLAG(double, delay_compensation, 0.0,
          "async: DC-ASGD lambda (MXNet's default is 0.04): each gradient g becomes "
          "g + lambda*g*g*(p - p before the last update) before sgd, adam, adamw or "
          "adagrad applies it; 0 disables");
ABSL_FLAG(double, lr, 0.01, "Learning rate");
ABSL_FLAG(double, momentum, 0.9, "Momentum (momentum, nesterov)");
ABSL_FLAG(double, beta1, 0.9, "Adam beta1");
ABSL_FLAG(double, beta2, 0.999, "Adam beta2");
ABSL_FLAG(double, epsilon, 1e-8, "Adam/AdaGrad epsilon");
ABSL_FLAG(double, weight_decay, 0.0, "Weight decay (decoupled for adamw)");
ABSL_FLAG(std::string, lr_schedule, "constant",
          "constant, step, cosine or noam (warmup to --lr, then "
          "--lr*sqrt(warmup_steps/step); async counts N workers' pushes as one step)");
ABSL_FLAG(int64_t, warmup_steps, 0,
          "Linear learning-rate warmup, in updates (noam: in steps; needs > 0)");
ABSL_FLAG(int64_t, lr_step_size, 1000, "step schedule: updates per decay");
ABSL_FLAG(double, lr_gamma, 0.1, "step schedule: decay factor");
ABSL_FLAG(int64_t, lr_total_steps, 0, "cosine schedule: updates to reach min");
ABSL_FLAG(double, min_lr, 0.0, "cosine schedule: final learning rate");
ABSL_FLAG(int64_t, max_partition_elements,
          shardtrain::common::kDefaultMaxPartitionElements,
          "Largest partition in elements; must match the workers'");
ABSL_FLAG(int, max_message_mb, 256, "Largest gRPC message in MiB");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Write checkpoints here and restore the newest at start; empty "
          "disables checkpoints");
ABSL_FLAG(double, checkpoint_interval_s, 60,
          "async: seconds between periodic checkpoints (one is also written on "
          "SIGTERM/SIGINT; if that one fails the process exits 1). Not used in "
          "sync mode (see --checkpoint_every_steps)");
ABSL_FLAG(int64_t, checkpoint_every_steps, 100,
          "sync: write a checkpoint at every step that is a multiple of this, "
          "the same steps on every shard, so the shards' checkpoints form one "
          "model; no time-based or shutdown checkpoints in sync mode. The "
          "default 100 checkpoints a run-local job (about 470 steps per epoch "
          "with 2 workers) several times per epoch; 0 disables sync "
          "checkpoints");
ABSL_FLAG(bool, allow_fresh_start, false,
          "Start with fresh parameters when the checkpoints in "
          "--checkpoint_dir were written with other flags (optimizer, "
          "--num_shards, --max_partition_elements, --mode) or cannot be read, "
          "instead of refusing to start; the existing files are left "
          "untouched");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain to serve TLS with (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates it signed (mutual TLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the shared token every call must carry (needs TLS)");
ABSL_FLAG(double, heartbeat_timeout_s, 10.0,
          "Forget a worker silent for this many seconds");
ABSL_FLAG(double, max_pull_wait_s, 120.0,
          "Longest a pull waits for a step or the staleness bound");
ABSL_FLAG(double, join_timeout_s, 60.0,
          "A worker never seen this many seconds after the start no longer "
          "holds back sync steps or the staleness bound (it joins on arrival)");
ABSL_FLAG(int64_t, max_stored_elements, int64_t{1} << 30,
          "Most parameter elements this shard stores (optimizer slots on top)");
ABSL_FLAG(int64_t, max_tensors, 100000, "Most tensors registered on this shard");
ABSL_FLAG(int, max_tensors_per_request, 10000,
          "Most tensors in one Register request");
ABSL_FLAG(int, max_parts_per_request, 65536,
          "Most partitions in one Push or Pull request");
ABSL_FLAG(int, replicas, 1,
          "Shards holding each partition (1-3, at most --num_shards): pushes are "
          "chain-replicated and acknowledged once every replica has them, so a "
          "shard can die without losing an update. 1: unreplicated, no etcd");
ABSL_FLAG(int, lease_ttl_s, 2,
          "With --replicas > 1: etcd lease ttl in seconds; a shard that dies is "
          "dropped from its chains about this long after (etcd's default "
          "election timeout allows >= 2; see the README for 1)");
ABSL_FLAG(bool, restore_chain_order, true,
          "With --replicas > 1: after a failure and a rejoin, a chain's head hands "
          "its place back to the placement's order once every member has all its "
          "operations (pushes to that group pause for a moment), so primaries stay "
          "balanced");
ABSL_FLAG(int, last_copy_wait_s, 30,
          "With --replicas > 1: a shard rejoining a chain as tail that is still "
          "copying the group's state when every member before it loses its etcd "
          "lease waits this long for one of them to come back (a hung or cut-off "
          "process holds the only complete copy) before it takes the group over "
          "with the parameters it holds");
ABSL_FLAG(int, catchup_timeout_s, 3600,
          "With --replicas > 1: how long a shard joining a chain may take to copy "
          "a group's state from its predecessor as a whole (a large table takes "
          "as long as its bytes need); each part of it must come within "
          "max(10 s, 4 lease ttls), so a predecessor that hangs fails the copy "
          "soon, and it is tried again");
ABSL_FLAG(int, forward_timeout_s, 30,
          "With --replicas > 1: a worker's update applied at a chain's head that "
          "has not reached the tail after this is answered UNAVAILABLE (the "
          "worker retries); the head goes on forwarding it until the tail has it "
          "or the chain drops the successor. A member's forward down the chain "
          "fails after it (the head sends it again)");
ABSL_FLAG(int, max_waiting_forwards, 64,
          "With --replicas > 1: forwards that may wait at once, each on a thread "
          "of its own, for an operation before theirs that has not reached this "
          "member yet (forwards may overtake each other on the way); one more is "
          "refused UNAVAILABLE and sent again by the predecessor");
ABSL_FLAG(std::string, advertise_address, "",
          "With --replicas > 1: host:port the other shards reach this one at "
          "(default: the --listen host and the bound port; required when "
          "listening on 0.0.0.0)");
ABSL_FLAG(std::string, tls_peer_ca, "",
          "With --replicas > 1 and TLS: PEM CA that signed the other shards' "
          "certificates (default: --tls_client_ca); with mutual TLS this "
          "shard's own certificate identifies it to them");
ABSL_FLAG(std::string, push_order, "arrival",
          "For tests of async convergence: apply pushes in arrival order (the "
          "default), round_robin (workers take turns, every gradient N-1 updates "
          "stale) or random (each round a seeded permutation); needs --mode=async, "
          "--replicas=1 and workers that push once per step (--overlap=off)");
ABSL_FLAG(uint64_t, push_order_seed, 1, "--push_order=random: the permutations' seed");
ABSL_FLAG(double, push_order_skip_s, 2.0,
          "--push_order: pass a turn on when its worker has not pushed for this "
          "long while others wait (a finished or evaluating worker)");
ABSL_FLAG(double, push_order_start_s, 60.0,
          "--push_order: the same for a worker that has not pushed yet (still "
          "starting), so that the workers' start does not change the order");
ABSL_FLAG(int, max_tables, 64, "Most sparse tables registered on this shard");
ABSL_FLAG(int, max_table_dim, 1024, "Largest embedding dim of a sparse table");
ABSL_FLAG(int64_t, max_table_rows, int64_t{1} << 28,
          "Most rows of one sparse table on this shard: a table's capacity is at most "
          "this, and one without a capacity stops creating rows here");
ABSL_FLAG(int64_t, max_table_ids_per_request, int64_t{1} << 20,
          "Most ids in one Lookup or PushSparse request");
ABSL_FLAG(int64_t, max_table_filter_counters, int64_t{1} << 30,
          "Most counters of a sparse table's admission filter (half a byte each)");
ABSL_FLAG(int, max_partition_metrics, 256,
          "Partitions that get their own version gauge in /metrics");

namespace {

absl::StatusOr<shardtrain::server::PsServerOptions> OptionsFromFlags() {
  using shardtrain::server::ConsistencyMode;
  shardtrain::server::PsServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_listen);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_mb) << 20;
  options.data_listen = absl::GetFlag(FLAGS_data_listen);
  options.max_data_connections = absl::GetFlag(FLAGS_max_data_connections);
  options.data_limits.max_calls_in_flight = absl::GetFlag(FLAGS_max_data_calls_per_connection);
  options.data_limits.write_timeout = absl::Seconds(absl::GetFlag(FLAGS_data_write_timeout_s));
  const int64_t tls_buffer_bytes = int64_t{absl::GetFlag(FLAGS_data_tls_buffer_kib)} * 1024;
  RETURN_IF_ERROR(shardtrain::wire::TlsContext::CheckBufferBytes(tls_buffer_bytes));
  options.data_tls_buffer_bytes = static_cast<size_t>(tls_buffer_bytes);
  options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options.security.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.security.key_file = absl::GetFlag(FLAGS_tls_key);
  options.security.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.security.token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.checkpoint_interval =
      absl::Seconds(absl::GetFlag(FLAGS_checkpoint_interval_s));
  options.allow_fresh_start = absl::GetFlag(FLAGS_allow_fresh_start);
  if (absl::GetFlag(FLAGS_checkpoint_interval_s) <= 0) {
    return absl::InvalidArgumentError("--checkpoint_interval_s must be > 0");
  }
  if (absl::GetFlag(FLAGS_checkpoint_every_steps) < 0) {
    return absl::InvalidArgumentError("--checkpoint_every_steps must be >= 0");
  }
  if (options.max_data_connections < 1 || options.data_limits.max_calls_in_flight < 1) {
    return absl::InvalidArgumentError(
        "--max_data_connections and --max_data_calls_per_connection must be >= 1");
  }
  if (absl::GetFlag(FLAGS_data_write_timeout_s) <= 0) {
    return absl::InvalidArgumentError("--data_write_timeout_s must be > 0");
  }
  shardtrain::server::ShardOptions& shard = options.shard;
  shard.replicas = absl::GetFlag(FLAGS_replicas);
  if (shard.replicas > 1) {
    const shardtrain::app::EtcdFlags etcd = shardtrain::app::EtcdFromFlags();
    options.replication.etcd_endpoints = etcd.endpoints;
    if (options.replication.etcd_endpoints.empty()) {
      return absl::InvalidArgumentError("--replicas > 1 needs --etcd_endpoints");
    }
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> etcd_credentials =
        shardtrain::common::MakeEtcdCredentials(etcd.security);
    if (!etcd_credentials.ok()) return etcd_credentials.status();
    options.replication.etcd_credentials = *std::move(etcd_credentials);
    options.replication.job = etcd.job;
    if (absl::GetFlag(FLAGS_lease_ttl_s) < 1) {
      return absl::InvalidArgumentError("--lease_ttl_s must be >= 1");
    }
    options.replication.lease_ttl = absl::Seconds(absl::GetFlag(FLAGS_lease_ttl_s));
    options.replication.advertise_address = absl::GetFlag(FLAGS_advertise_address);
    options.replication.restore_order = absl::GetFlag(FLAGS_restore_chain_order);
    if (absl::GetFlag(FLAGS_last_copy_wait_s) < 0) {
      return absl::InvalidArgumentError("--last_copy_wait_s must be >= 0");
    }
    options.replication.last_copy_wait = absl::Seconds(absl::GetFlag(FLAGS_last_copy_wait_s));
    if (absl::GetFlag(FLAGS_catchup_timeout_s) < 1) {
      return absl::InvalidArgumentError("--catchup_timeout_s must be >= 1");
    }
    options.replication.catchup_timeout = absl::Seconds(absl::GetFlag(FLAGS_catchup_timeout_s));
    if (absl::GetFlag(FLAGS_forward_timeout_s) < 1) {
      return absl::InvalidArgumentError("--forward_timeout_s must be >= 1");
    }
    options.forward_timeout = absl::Seconds(absl::GetFlag(FLAGS_forward_timeout_s));
    if (absl::GetFlag(FLAGS_max_waiting_forwards) < 1) {
      return absl::InvalidArgumentError("--max_waiting_forwards must be >= 1");
    }
    options.max_waiting_forwards = absl::GetFlag(FLAGS_max_waiting_forwards);
    if (options.security.tls()) {
      shardtrain::common::ClientSecurity& peer = options.peer_security;
      peer.ca_file = absl::GetFlag(FLAGS_tls_peer_ca).empty()
                         ? options.security.client_ca_file
                         : absl::GetFlag(FLAGS_tls_peer_ca);
      if (peer.ca_file.empty()) {
        return absl::InvalidArgumentError(
            "--replicas > 1 with TLS needs --tls_peer_ca (or --tls_client_ca) to "
            "verify the other shards");
      }
      if (!options.security.client_ca_file.empty()) {
        peer.cert_file = options.security.cert_file;
        peer.key_file = options.security.key_file;
      }
      peer.token_file = options.security.token_file;
    }
  }
  shard.shard_index = absl::GetFlag(FLAGS_shard_index);
  shard.partitioning.num_shards = absl::GetFlag(FLAGS_num_shards);
  shard.partitioning.max_partition_elements =
      absl::GetFlag(FLAGS_max_partition_elements);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "sync") {
    shard.mode = ConsistencyMode::kSync;
  } else if (mode == "async") {
    shard.mode = ConsistencyMode::kAsync;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode must be sync or async, got ", mode));
  }
  shard.checkpoint_every_steps = absl::GetFlag(FLAGS_checkpoint_every_steps);
  shard.num_workers = absl::GetFlag(FLAGS_num_workers);
  shard.replicas_to_aggregate = absl::GetFlag(FLAGS_replicas_to_aggregate);
  shard.max_staleness = absl::GetFlag(FLAGS_max_staleness);
  shard.staleness_aware_lr = absl::GetFlag(FLAGS_staleness_aware_lr);
  shard.heartbeat_timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  shard.max_pull_wait = absl::Seconds(absl::GetFlag(FLAGS_max_pull_wait_s));
  shard.join_timeout = absl::Seconds(absl::GetFlag(FLAGS_join_timeout_s));
  shard.limits.max_stored_elements = absl::GetFlag(FLAGS_max_stored_elements);
  shard.limits.max_tensors = absl::GetFlag(FLAGS_max_tensors);
  shard.limits.max_tensors_per_request = absl::GetFlag(FLAGS_max_tensors_per_request);
  shard.limits.max_parts_per_request = absl::GetFlag(FLAGS_max_parts_per_request);
  shard.limits.max_partition_metrics = absl::GetFlag(FLAGS_max_partition_metrics);
  shard.limits.max_tables = absl::GetFlag(FLAGS_max_tables);
  shard.limits.max_table_dim = absl::GetFlag(FLAGS_max_table_dim);
  shard.limits.max_table_rows = absl::GetFlag(FLAGS_max_table_rows);
  shard.limits.max_table_ids_per_request = absl::GetFlag(FLAGS_max_table_ids_per_request);
  shard.limits.max_table_filter_counters = absl::GetFlag(FLAGS_max_table_filter_counters);
  shard.limits.max_response_bytes = options.max_message_bytes;
  shardtrain::server::OptimizerOptions& opt = shard.optimizer;
  opt.name = absl::GetFlag(FLAGS_optimizer);
  opt.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_lr));
  opt.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  opt.beta1 = static_cast<float>(absl::GetFlag(FLAGS_beta1));
  opt.beta2 = static_cast<float>(absl::GetFlag(FLAGS_beta2));
  opt.epsilon = static_cast<float>(absl::GetFlag(FLAGS_epsilon));
  opt.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  opt.schedule.kind = absl::GetFlag(FLAGS_lr_schedule);
  opt.schedule.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  opt.schedule.step_size = absl::GetFlag(FLAGS_lr_step_size);
  opt.schedule.gamma = static_cast<float>(absl::GetFlag(FLAGS_lr_gamma));
  opt.schedule.total_steps = absl::GetFlag(FLAGS_lr_total_steps);
  opt.schedule.min_lr = static_cast<float>(absl::GetFlag(FLAGS_min_lr));
  opt.delay_compensation = static_cast<float>(absl::GetFlag(FLAGS_delay_compensation));
  options.push_order.kind = absl::GetFlag(FLAGS_push_order);
  options.push_order.seed = absl::GetFlag(FLAGS_push_order_seed);
  if (!(absl::GetFlag(FLAGS_push_order_skip_s) > 0)) {
    return absl::InvalidArgumentError("--push_order_skip_s must be > 0");
  }
  options.push_order.skip_after = absl::Seconds(absl::GetFlag(FLAGS_push_order_skip_s));
  if (!(absl::GetFlag(FLAGS_push_order_start_s) > 0)) {
    return absl::InvalidArgumentError("--push_order_start_s must be > 0");
  }
  options.push_order.start_wait = absl::Seconds(absl::GetFlag(FLAGS_push_order_start_s));
  shardtrain::server::UpdateRuleChoice rule;
  rule.async_momentum = absl::GetFlag(FLAGS_async_momentum);
  rule.period = absl::GetFlag(FLAGS_async_momentum_period);
  absl::StatusOr<std::vector<std::string>> warnings =
      shardtrain::server::ResolveUpdateRule(rule, &shard);
  if (!warnings.ok()) return warnings.status();
  for (const std::string& warning : *warnings) LOG(WARNING) << warning;
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  shardtrain::app::SkipDeadlockDetectionInRelease();
  shardtrain::app::ParseFlags(argc, argv, "One shard of a shardtrain parameter server.");
  shardtrain::app::KeepLargeBuffersInHeap();
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  // Block the stop signals before any thread starts, so every thread
  // inherits the mask and only sigwait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (const absl::Status pool = shardtrain::app::ApplyBufferPoolFlag(); !pool.ok()) {
    LOG(ERROR) << pool;
    return 2;
  }
  absl::StatusOr<shardtrain::server::PsServerOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    LOG(ERROR) << options.status();
    return 2;
  }
  auto server = shardtrain::server::PsServer::Start(*options);
  if (!server.ok()) {
    LOG(ERROR) << "cannot start: " << server.status();
    return 1;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    const absl::Status written = shardtrain::common::WriteFileAtomically(
        port_file, absl::StrCat((*server)->port(), " ", (*server)->metrics_port(), " ",
                                (*server)->data_port(), "\n"));
    if (!written.ok()) {
      LOG(ERROR) << written;
      return 1;
    }
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  LOG(INFO) << "signal " << signal << ": shutting down";
  const absl::Status stopped = (*server)->Shutdown();
  if (!stopped.ok()) {
    LOG(ERROR) << "shut down without saving the newest state: " << stopped;
    return 1;
  }
  return 0;
}
