// PsClient: a worker's connection to every shard of the parameter server.
//
// The client knows the model's tensors and where each partition lives
// (common/partition.h). Push sends a gradient for every tensor, Pull fetches
// parameters, PushPull does both in one round trip; each talks to all shards
// in parallel over the gRPC callback API and returns when every shard has
// answered. Request messages and their byte buffers are reused from call to
// call, and shared by the three.
//
//   ASSIGN_OR_RETURN(auto client, PsClient::Create(options, &rpc_metrics));
//   RETURN_IF_ERROR(client->Register(specs));
//   RETURN_IF_ERROR(client->Pull(clock, min_version, params, &pull_stats));
//   RETURN_IF_ERROR(client->Push(clock, grads, &push_stats));
//
// Faults. Every RPC goes through its shard's ShardChannel
// (client/shard_call.h): it is retried while the shard is unreachable, up
// to `reconnect_timeout` after the call's first failure. Each client draws a
// random non-zero worker incarnation, sent on Register/Push/Pull/Heartbeat,
// and numbers its pushes per shard (1, 2, ...; a retry resends the same
// number) so a shard applies each push at most once. When a shard refuses a
// call with ABORTED (it restarted since this client learned its versions),
// the client re-registers its tensors there, takes the shard's partition
// versions, counts the updates it knew of that the shard lost, and retries:
// in sync mode a push keeps its step; in async mode its versions become
// min(computed from, the shard's now).
//
// Thread-compatible: one training thread calls Push/Pull; Heartbeat and
// ClusterStatus may be called concurrently from another thread.
#ifndef SHARDTRAIN_CLIENT_PS_CLIENT_H_
#define SHARDTRAIN_CLIENT_PS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/client_metrics.h"
#include "client/shard_call.h"
#include "client/sync_replay.h"
#include "client/tensor_exchange.h"
#include "common/credentials.h"
#include "common/metrics.h"
#include "common/partition.h"
#include "common/topk_compressor.h"
#include "proto/shardtrain.grpc.pb.h"

namespace shardtrain::client {

struct PsClientOptions {
  // Shard addresses in shard-index order ("host:port").
  std::vector<std::string> servers;
  uint32_t worker_index = 0;
  // The job's worker count, sent on Register: a shard started for another
  // count refuses (FAILED_PRECONDITION). 0 skips the check.
  uint32_t num_workers = 0;
  // Must match the servers' --max_partition_elements.
  int64_t max_partition_elements = common::kDefaultMaxPartitionElements;
  // Dtype of gradients and parameters on the wire.
  DType wire_dtype = DTYPE_F32;
  // Deadline of a Push/Register/Heartbeat/Status RPC.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Deadline of a Pull, which may wait for a step or the staleness bound.
  absl::Duration pull_timeout = absl::Seconds(300);
  // A call whose shard cannot be reached is retried for this long after
  // its first failure, then fails.
  absl::Duration reconnect_timeout = absl::Seconds(120);
  // Backoff between retries (full jitter, doubling up to the maximum).
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // HTTP/2 keepalive pings on idle and busy connections, so a dead shard or
  // a cut link is noticed within keepalive_time + keepalive_timeout. Zero
  // turns pings off. The shards must permit pings this often.
  absl::Duration keepalive_time = absl::Seconds(10);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  int max_message_bytes = 256 << 20;
  // TLS, mutual TLS and the auth token (common/credentials.h); all off by
  // default.
  common::ClientSecurity security;
  // 0: send gradients dense. In (0, 1]: send the top ratio of each
  // partition's entries with error feedback (common/topk_compressor.h).
  double topk_ratio = 0;
  // Tests only: interceptors for the channel to shard `shard`.
  std::function<std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>(int shard)>
      interceptors;
};

struct PushStats {
  // Largest staleness the shards measured for this push.
  int64_t max_staleness = 0;
};

struct PullStats {
  // Longest time a shard held the pull (sync step or staleness bound).
  double server_wait_seconds = 0;
  // Smallest partition version received.
  int64_t min_version = 0;
};

class PsClient {
 public:
  // `rpc_metrics` and `fault_metrics` may be null; if not, they must
  // outlive the client.
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(
      const PsClientOptions& options, common::RpcMetrics* rpc_metrics,
      PsClientMetrics* fault_metrics = nullptr);
  ~PsClient();

  // Sync mode decides how a push is re-sent after a shard restart (see the
  // file comment); async by default. Call before Register.
  void set_sync_mode(bool sync) { sync_ = sync; }

  // Registers `tensors` on every shard (idempotent) and prepares the
  // requests. Tensor i of Push/Pull below is tensors[i]. Learns each
  // partition's version and the clock the shards recorded for this worker
  // (see known_versions() and registered_worker_clock()).
  absl::Status Register(const std::vector<TensorSpec>& tensors);

  // Pushes one gradient per tensor, each computed from the versions of the
  // last Pull. `clock` counts steps finished including this one.
  // REQUIRES: Register() succeeded; grads[i].size() == elements of tensor i.
  absl::Status Push(int64_t clock, absl::Span<const absl::Span<const float>> grads,
                    PushStats* stats);

  // Fetches every tensor into `params`, waiting until each partition has at
  // least `min_version` updates and this worker's `clock` is within the
  // staleness bound.
  absl::Status Pull(int64_t clock, int64_t min_version,
                    absl::Span<const absl::Span<float>> params, PullStats* stats);

  // Push(clock, grads) then Pull(clock, min_version, params) in one RPC per
  // shard: each shard applies the gradient and answers with the parameters
  // that include it.
  // REQUIRES: as for Push and Pull.
  absl::Status PushPull(int64_t clock, int64_t min_version,
                        absl::Span<const absl::Span<const float>> grads,
                        absl::Span<const absl::Span<float>> params,
                        PushStats* push_stats, PullStats* pull_stats);

  // Overlapped exchange of one tensor: sends its gradient (as soon as
  // `grad_ready`, if not empty, has returned OK; its error otherwise fails
  // the exchange) and, once
  // every shard has taken it, asks for its parameters (at least
  // `min_version`) into `params`, which must stay valid until
  // FinishExchanges(). Meant to be called from backward as each layer's
  // gradient appears. `clock` counts steps finished including this one.
  // REQUIRES: Register() succeeded; no Push/Pull/PushPull until
  // FinishExchanges() returns.
  void StartExchange(int tensor, int64_t clock, int64_t min_version,
                     absl::Span<const float> grad,
                     GradReady grad_ready,
                     absl::Span<float> params);
  // Waits for every started exchange; the first error wins.
  absl::Status FinishExchanges(PushStats* push_stats, PullStats* pull_stats);

  // Tells every shard this worker is alive at `clock` (or done). Returns
  // the membership seen by shard 0. An unreachable shard is retried for at
  // most `retry_for` (and reconnect_timeout).
  absl::StatusOr<HeartbeatResponse> Heartbeat(
      int64_t clock, bool done, absl::Duration retry_for = absl::InfiniteDuration());

  // Status of every shard, in shard order.
  absl::StatusOr<std::vector<StatusResponse>> ClusterStatus();

  // Smallest and largest partition version this client knows (as
  // registered, pulled, or taken from a restarted shard); {0, 0} before
  // Register.
  std::pair<int64_t, int64_t> known_versions() const;
  // The largest clock any shard recorded for this worker index (from the
  // last Register); 0 for a new job.
  int64_t registered_worker_clock() const { return registered_worker_clock_; }
  uint64_t worker_incarnation() const { return worker_incarnation_; }

  int num_shards() const { return static_cast<int>(channels_.size()); }
  const PsClientOptions& options() const { return options_; }

 private:
  // Per-shard reusable messages: part i of request.push() and
  // request.pull() is slices[i]. Push and Pull send the halves of request
  // and answer into the halves of response, so all three RPCs share buffers.
  struct ShardCalls {
    std::vector<PartitionSlice> slices;
    PushPullRequest request;
    PushPullResponse response;
  };

  // (tensor, partition) -> index into versions_, for one shard.
  using PartitionIndex = std::map<std::pair<std::string, uint32_t>, size_t>;
  // Where a registration's partitions live and the requests that name them:
  // built whole before the client adopts it.
  struct Layout {
    std::vector<int64_t> tensor_sizes;
    std::vector<int64_t> partition_sizes;        // by version index
    std::vector<PartitionIndex> partition_index;  // by shard
    std::vector<ShardCalls> calls;                // by shard
    std::vector<std::vector<TensorExchange::Group>> groups;  // by tensor
  };

  PsClient(const PsClientOptions& options, common::RpcMetrics* rpc_metrics,
           PsClientMetrics* fault_metrics);
  // Register's steps: the RPC to every shard; the placement of every
  // partition (changes nothing); adding one partition to a shard's reusable
  // requests; the overlapped exchange over the adopted layout.
  absl::Status RegisterOnEveryShard(const RegisterRequest& request,
                                    std::vector<RegisterResponse>* responses);
  Layout PlanLayout(const std::vector<TensorSpec>& tensors) const;
  void AddToRequests(const std::string& tensor, const PartitionSlice& slice,
                     ShardCalls* calls) const;
  void BuildExchange(std::vector<std::vector<TensorExchange::Group>> groups);
  // Pairs each partition `response` reports with its index in `index`;
  // FAILED_PRECONDITION if the shard holds other partitions than this
  // worker places there.
  absl::StatusOr<std::vector<std::pair<size_t, int64_t>>> MatchPartitions(
      int shard, const PartitionIndex& index, const RegisterResponse& response) const;
  // Runs one RPC per shard at once through the shards' channels and waits
  // for all; returns the first error (any other before a
  // FAILED_PRECONDITION). `start(s, ...)` is ShardRpc::start for shard s.
  using StartFn = std::function<void(int shard, grpc::ClientContext* context,
                                     uint64_t shard_incarnation,
                                     std::function<void(grpc::Status)> done)>;
  // `data_only`: only the shards holding partitions of the registered
  // tensors (Push, Pull, PushPull).
  absl::Status CallAllShards(const char* method, absl::Duration attempt_timeout,
                             absl::Duration retry_for, const StartFn& start,
                             bool data_only = false);
  // ShardChannel::ResyncFn: re-registers on the shard, takes its versions.
  void Resync(ShardChannel* channel, std::function<void(absl::Status)> done);
  // Sync: sends the pushes `channel`'s shard acknowledged before it
  // restarted and whose step has not completed there (client/sync_replay.h).
  void ReplayPushes(ShardChannel* channel, std::function<void(absl::Status)> done);
  // Applies shard `shard`'s Register answer: its incarnation and partition
  // versions. `restarted`: count and log the updates lost.
  absl::Status TakeShardState(int shard, const RegisterResponse& response,
                              bool restarted);
  // Async: rewrites the versions of shard `shard`'s push to min(computed
  // from, known now); a no-op in sync mode.
  void ClampPushVersions(int shard);
  // Checks `grads` and writes them and `clock` into every shard's push.
  absl::Status EncodePush(int64_t clock,
                          absl::Span<const absl::Span<const float>> grads);
  // Sets `clock` and `min_version` in every shard's pull.
  absl::Status PreparePull(int64_t clock, int64_t min_version,
                           absl::Span<const absl::Span<float>> params);
  // Reads every shard's push answer into `stats`.
  void CollectPush(PushStats* stats) const;
  // Copies every shard's pull answer into `params` and `stats`.
  absl::Status CollectPull(absl::Span<const absl::Span<float>> params,
                           PullStats* stats);
  void RecordRpc(const char* method, const grpc::Status& status,
                 size_t request_bytes, size_t response_bytes, absl::Time start);

  const PsClientOptions options_;
  common::RpcMetrics* const rpc_metrics_;
  PsClientMetrics* const fault_metrics_;
  const uint64_t worker_incarnation_;
  bool sync_ = false;
  std::vector<std::unique_ptr<ShardChannel>> channels_;
  std::vector<TensorSpec> tensors_;
  std::vector<int64_t> tensor_sizes_;
  // What Register sent; a resync sends it again. Constant between Registers.
  RegisterRequest register_request_;
  int64_t registered_worker_clock_ = 0;
  // Per shard: (tensor, partition) -> index into versions_.
  std::vector<PartitionIndex> partition_index_;
  // Version of each partition as last pulled (or taken from a restarted
  // shard); PartitionSlice::version_index points here. Written by at most
  // one in-flight pull per partition, and by a resync of its shard.
  VersionTable versions_;
  // Set when options_.topk_ratio > 0: one residual per partition, indexed
  // like versions_. Before exchange_, which uses it, so it outlives it.
  std::unique_ptr<common::TopKCompressor> topk_;
  // Sync mode: acknowledged pushes to send again to a shard that restarts
  // before their step completes. Before exchange_, which uses it.
  SyncReplay replay_;
  std::unique_ptr<TensorExchange> exchange_;
  std::vector<ShardCalls> calls_;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_PS_CLIENT_H_
