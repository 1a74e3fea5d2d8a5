// For replication_bench: a cluster of ps-server processes with --replicas R
// (chains in etcd for R > 1), its chains as etcd holds them, a model's
// tensors, and workers (PsClients) that push and pull them.
//
//   ClusterOptions options;
//   options.bin_dir = bin_dir;
//   options.dir = temp_dir;
//   options.name = "r2";  // file prefix and etcd job
//   options.replicas = 2;
//   options.etcd_endpoint = etcd_process->endpoint();
//   ASSIGN_OR_RETURN(Cluster cluster, StartCluster(group, etcd.get(), options));
//   ASSIGN_OR_RETURN(Model model, MakeModel("784-256-128-10", 0));
//   ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Connect(cluster, 0, model));
//   OpFn push = worker->MakeOp(Op::kPush);
//   RETURN_IF_ERROR(push());
//   RETURN_IF_ERROR(group.Kill(cluster.pids()[1]));
//   RETURN_IF_ERROR(testutil::RestartShard(group, cluster.shards, 1));
#ifndef SHARDTRAIN_BENCH_REPLICATION_CLUSTER_H_
#define SHARDTRAIN_BENCH_REPLICATION_CLUSTER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bench/bench_util.h"
#include "chain/chain_config.h"
#include "client/ps_client_metrics.h"
#include "client/ps_client.h"
#include "etcd/etcd_client.h"
#include "testing/local_cluster.h"
#include "testing/process_group.h"

namespace shardtrain::bench {

// Shards of every cluster (and replica groups: one per shard).
inline constexpr int kClusterShards = 3;

struct ClusterOptions {
  // Holds ps-server.
  std::string bin_dir;
  // Where port files and logs go.
  std::string dir;
  // Prefix of the files, and the etcd job (--job) when replicas > 1.
  std::string name;
  // --replicas; 1: no etcd.
  int replicas = 1;
  // "host:port" of etcd; used when replicas > 1.
  std::string etcd_endpoint;
  // --lease_ttl_s; used when replicas > 1.
  int lease_ttl_s = 2;
  // --num_workers.
  int num_workers = 1;
  // How long a shard may take to serve, and the chains to form.
  absl::Duration start_timeout = absl::Seconds(30);
};

// kClusterShards ps-server processes (async, sgd; testing/local_cluster.h)
// on 127.0.0.1 ports picked before they start, so that a restarted shard
// keeps its address.
struct Cluster {
  ClusterOptions options;
  testutil::LocalCluster shards;  // pids in shards.shards (stale once killed)

  const std::vector<pid_t>& pids() const { return shards.shards; }
  const std::vector<std::string>& addresses() const { return shards.servers; }
};

// Starts every shard at once (a chain forms when its initial members are
// up), waits for them to serve and, with replicas > 1, for every chain to
// have `replicas` members. `etcd` is used only when replicas > 1.
absl::StatusOr<Cluster> StartCluster(testutil::ProcessGroup& group, etcd::EtcdClient* etcd,
                                     const ClusterOptions& options);

// SIGTERM to every shard (a replicated one revokes its lease), SIGKILL
// after 5 s.
void StopCluster(testutil::ProcessGroup& group, const Cluster& cluster);

// The tensors a worker pushes and pulls.
struct Model {
  std::vector<TensorSpec> specs;
  int64_t bytes = 0;  // f32 payload of all tensors
  std::string description;
  // Replica groups of a kClusterShards cluster holding some partition.
  int groups_touched = 0;
};

// An MLP's tensors, named as the worker names them (fcN.weight, fcN.bias)
// for layer sizes "784-256-128-10"; or, with tensor_kb > 0, one f32 tensor
// of that many KiB. INVALID_ARGUMENT for sizes that do not parse.
absl::StatusOr<Model> MakeModel(const std::string& layers, int tensor_kb);

// One PsClient with a model registered, its gradient and parameter
// buffers and its push clock. Thread-compatible: one thread makes its calls
// (client().router() may be read from another).
class Worker {
 public:
  // Worker `index` of the cluster's num_workers. `metrics` may be null; if
  // not, it must outlive the worker. `max_backoff` > 0 replaces the
  // client's retry backoff ceiling.
  static absl::StatusOr<std::unique_ptr<Worker>> Connect(
      const Cluster& cluster, int index, const Model& model,
      client::PsClientMetrics* metrics = nullptr,
      absl::Duration max_backoff = absl::ZeroDuration());

  // Push(++clock), Pull(clock) or PushPull(++clock) of every tensor. The
  // op must not outlive the worker.
  OpFn MakeOp(Op op);

  client::PsClient& client() { return *client_; }

 private:
  Worker() = default;

  std::unique_ptr<client::PsClient> client_;
  std::vector<std::vector<float>> grads_;
  std::vector<std::vector<float>> params_;
  std::vector<absl::Span<const float>> grad_spans_;
  std::vector<absl::Span<float>> param_spans_;
  int64_t clock_ = 0;
  client::PushStats push_stats_;
  client::PullStats pull_stats_;
};

// Worker RPC attempts retried so far (shardtrain_worker_rpc_retries_total),
// over every client reporting to `registry`.
double RetriesTotal(const prometheus::Registry& registry);

}  // namespace shardtrain::bench

#endif  // SHARDTRAIN_BENCH_REPLICATION_CLUSTER_H_
