#include "bench/replication_cluster.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/partition.h"
#include "common/status_macros.h"
#include "testing/chain_waits.h"

namespace shardtrain::bench {
namespace {

// Every worker of every cluster holds a gradient and a parameter copy, and
// every shard R copies: far beyond this, a run would only swap.
constexpr int64_t kMaxModelBytes = int64_t{1} << 30;

}  // namespace

absl::StatusOr<Cluster> StartCluster(testutil::ProcessGroup& group, etcd::EtcdClient* etcd,
                                     const ClusterOptions& options) {
  Cluster cluster;
  cluster.options = options;
  testutil::LocalClusterOptions shards;
  shards.bin_dir = options.bin_dir;
  shards.shards = kClusterShards;
  shards.workers = options.num_workers;
  shards.start_workers = 0;  // the workers are this process's PsClients
  shards.fixed_ports = true;
  shards.dir = absl::StrCat(options.dir, "/", options.name);
  shards.start_timeout = options.start_timeout;
  shards.server_flags = {"--metrics_listen=127.0.0.1:0", "--optimizer=sgd",
                         "--max_message_mb=256", "--heartbeat_timeout_s=600",
                         absl::StrCat("--replicas=", options.replicas)};
  if (options.replicas > 1) {
    shards.server_flags.push_back(absl::StrCat("--etcd_endpoints=", options.etcd_endpoint));
    shards.server_flags.push_back(absl::StrCat("--job=", options.name));
    shards.server_flags.push_back(absl::StrCat("--lease_ttl_s=", options.lease_ttl_s));
  }
  std::error_code error;
  if (!std::filesystem::create_directory(shards.dir, error)) {
    return absl::InternalError(absl::StrCat("cannot make ", shards.dir));
  }
  // All at once: a group's chain forms when its initial members are up.
  ASSIGN_OR_RETURN(cluster.shards, testutil::StartLocalCluster(group, shards));
  if (options.replicas > 1 &&
      !testutil::WaitForChains(*etcd, options.name, kClusterShards,
                               testutil::HasMembers(options.replicas), options.start_timeout,
                               absl::Milliseconds(20))) {
    return absl::DeadlineExceededError(absl::StrCat("the chains of job ", options.name,
                                                    " did not reach ", options.replicas,
                                                    " members"));
  }
  return cluster;
}

void StopCluster(testutil::ProcessGroup& group, const Cluster& cluster) {
  for (pid_t pid : cluster.pids()) (void)group.Stop(pid);
}

absl::StatusOr<Model> MakeModel(const std::string& layers, int tensor_kb) {
  Model model;
  std::set<int> groups;
  const auto add = [&model, &groups](std::string name, std::vector<int64_t> shape) {
    TensorSpec& spec = model.specs.emplace_back();
    spec.set_name(std::move(name));
    int64_t elements = 1;
    for (int64_t d : shape) {
      spec.add_shape(d);
      elements *= d;
    }
    spec.set_dtype(DTYPE_F32);
    model.bytes += elements * static_cast<int64_t>(sizeof(float));
    common::PartitionConfig config;  // as the shards and workers cut it
    config.num_shards = kClusterShards;
    for (const common::PlacedPartition& part : common::PlaceTensor(spec.name(), elements, config)) {
      groups.insert(part.shard);
    }
    model.groups_touched = static_cast<int>(groups.size());
  };
  if (tensor_kb > kMaxModelBytes / 1024) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--tensor_kb %d is more than the %d KiB this bench allows", tensor_kb,
        kMaxModelBytes / 1024));
  }
  if (tensor_kb > 0) {
    add("bench_tensor", {int64_t{tensor_kb} * 1024 / 4});
    model.description = absl::StrFormat("one f32 tensor of %d KiB", tensor_kb);
    return model;
  }
  std::vector<int64_t> sizes;
  for (absl::string_view size : absl::StrSplit(layers, '-')) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(size, &value) || value < 1 || value > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model \"", layers, "\" is not layer sizes like 784-256-128-10"));
    }
    sizes.push_back(value);
  }
  if (sizes.size() < 2) return absl::InvalidArgumentError("--model needs at least two layers");
  for (size_t l = 0; l + 1 < sizes.size(); ++l) {
    add(absl::StrCat("fc", l, ".weight"), {sizes[l], sizes[l + 1]});
    add(absl::StrCat("fc", l, ".bias"), {sizes[l + 1]});
  }
  if (model.bytes > kMaxModelBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--model %s has %d bytes of f32, more than the %d this bench allows",
                        layers, model.bytes, kMaxModelBytes));
  }
  model.description = absl::StrFormat("MLP %s: %d f32 tensors, %.3f MB", layers,
                                      model.specs.size(), model.bytes / 1e6);
  return model;
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Connect(const Cluster& cluster, int index,
                                                        const Model& model,
                                                        client::PsClientMetrics* metrics,
                                                        absl::Duration max_backoff) {
  client::PsClientOptions options;
  options.servers = cluster.addresses();
  options.worker_index = static_cast<uint32_t>(index);
  options.num_workers = static_cast<uint32_t>(cluster.options.num_workers);
  options.max_message_bytes = kMaxMessageBytes;
  // A bench that cannot reach its shards fails within this, not after 2 min.
  options.reconnect_timeout = absl::Seconds(30);
  options.replicas = cluster.options.replicas;
  if (max_backoff > absl::ZeroDuration()) {
    options.max_backoff = max_backoff;
    options.initial_backoff = std::min(options.initial_backoff, max_backoff);
  }
  if (options.replicas > 1) {
    options.etcd_endpoints = cluster.options.etcd_endpoint;
    options.job = cluster.options.name;
  }
  std::unique_ptr<Worker> worker(new Worker);
  ASSIGN_OR_RETURN(worker->client_, client::PsClient::Create(options, nullptr, metrics));
  RETURN_IF_ERROR(worker->client_->Register(model.specs));
  for (const TensorSpec& spec : model.specs) {
    int64_t elements = 1;
    for (int64_t d : spec.shape()) elements *= d;
    // Small, finite gradients: SGD moves the parameters a little each push.
    worker->grads_.emplace_back(static_cast<size_t>(elements), 1e-3f);
    worker->params_.emplace_back(static_cast<size_t>(elements), 0.0f);
  }
  for (size_t t = 0; t < model.specs.size(); ++t) {
    worker->grad_spans_.push_back(worker->grads_[t]);
    worker->param_spans_.push_back(absl::MakeSpan(worker->params_[t]));
  }
  return worker;
}

OpFn Worker::MakeOp(Op op) {
  switch (op) {
    case Op::kPush:
      return [this] { return client_->Push(++clock_, grad_spans_, &push_stats_); };
    case Op::kPull:
      return [this] { return client_->Pull(clock_, 0, param_spans_, &pull_stats_); };
    case Op::kPushPull:
      return [this] {
        return client_->PushPull(++clock_, 0, grad_spans_, param_spans_, &push_stats_,
                                 &pull_stats_);
      };
  }
  return [] { return absl::InternalError("unknown op"); };
}

double RetriesTotal(const prometheus::Registry& registry) {
  double total = 0;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != "shardtrain_worker_rpc_retries_total") continue;
    for (const prometheus::ClientMetric& metric : family.metric) total += metric.counter.value;
  }
  return total;
}

}  // namespace shardtrain::bench
