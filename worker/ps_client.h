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
// Thread-compatible: one training thread calls Push/Pull; Heartbeat and
// ClusterStatus may be called concurrently from another thread.
#ifndef SHARDTRAIN_WORKER_PS_CLIENT_H_
#define SHARDTRAIN_WORKER_PS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/credentials.h"
#include "common/metrics.h"
#include "common/partition.h"
#include "common/topk_compressor.h"
#include "proto/shardtrain.grpc.pb.h"
#include "worker/tensor_exchange.h"

namespace shardtrain::worker {

struct PsClientOptions {
  // Shard addresses in shard-index order ("host:port").
  std::vector<std::string> servers;
  uint32_t worker_index = 0;
  // Must match the servers' --max_partition_elements.
  int64_t max_partition_elements = common::kDefaultMaxPartitionElements;
  // Dtype of gradients and parameters on the wire.
  DType wire_dtype = DTYPE_F32;
  // Deadline of a Push/Register/Heartbeat/Status RPC.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Deadline of a Pull, which may wait for a step or the staleness bound.
  absl::Duration pull_timeout = absl::Seconds(300);
  int max_message_bytes = 256 << 20;
  // TLS, mutual TLS and the auth token (common/credentials.h); all off by
  // default.
  common::ClientSecurity security;
  // 0: send gradients dense. In (0, 1]: send the top ratio of each
  // partition's entries with error feedback (common/topk_compressor.h).
  double topk_ratio = 0;
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
  // `rpc_metrics` may be null; if not, it must outlive the client.
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(
      const PsClientOptions& options, common::RpcMetrics* rpc_metrics);

  // Registers `tensors` on every shard (idempotent) and prepares the
  // requests. Tensor i of Push/Pull below is tensors[i].
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
  // `grad_ready`, if not null, has passed) and, once
  // every shard has taken it, asks for its parameters (at least
  // `min_version`) into `params`, which must stay valid until
  // FinishExchanges(). Meant to be called from backward as each layer's
  // gradient appears. `clock` counts steps finished including this one.
  // REQUIRES: Register() succeeded; no Push/Pull/PushPull until
  // FinishExchanges() returns.
  void StartExchange(int tensor, int64_t clock, int64_t min_version,
                     absl::Span<const float> grad,
                     std::unique_ptr<Fence> grad_ready,
                     absl::Span<float> params);
  // Waits for every started exchange; the first error wins.
  absl::Status FinishExchanges(PushStats* push_stats, PullStats* pull_stats);

  // Tells every shard this worker is alive at `clock` (or done). Returns
  // the membership seen by shard 0.
  absl::StatusOr<HeartbeatResponse> Heartbeat(int64_t clock, bool done);

  // Status of every shard, in shard order.
  absl::StatusOr<std::vector<StatusResponse>> ClusterStatus();

  int num_shards() const { return static_cast<int>(stubs_.size()); }
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

  PsClient(const PsClientOptions& options, common::RpcMetrics* rpc_metrics);
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
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<ParameterServer::Stub>> stubs_;
  std::vector<TensorSpec> tensors_;
  std::vector<int64_t> tensor_sizes_;
  // Version of each partition as last pulled; PartitionSlice::version_index
  // points here. Written by at most one in-flight pull per partition.
  std::vector<int64_t> versions_;
  // Set when options_.topk_ratio > 0: one residual per partition, indexed
  // like versions_. Before exchange_, which uses it, so it outlives it.
  std::unique_ptr<common::TopKCompressor> topk_;
  std::unique_ptr<TensorExchange> exchange_;
  std::vector<ShardCalls> calls_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_PS_CLIENT_H_
