// PsClient: a worker's connection to every shard of the parameter server;
// the ParameterClient (client/parameter_client.h) a trainer runs on.
//
// The client knows the model's tensors and where each partition lives
// (common/partition.h). Push sends a gradient for every tensor, Pull fetches
// parameters, PushPull does both in one round trip; each talks to all shards
// in parallel over the gRPC callback API and returns when every shard has
// answered. StartExchange/FinishExchanges overlap the same traffic with
// backward, tensor by tensor (client/tensor_exchange.h). Both start the same
// per-shard batch calls (client/batch_call.h) whose requests and answers are
// built, encoded and decoded in one place (client/wire_requests.h); the
// blocking calls only wait for them.
//
//   ASSIGN_OR_RETURN(auto client, PsClient::Create(options, &rpc_metrics));
//   RETURN_IF_ERROR(client->Register(specs));
//   RETURN_IF_ERROR(client->Pull(clock, min_version, params, &pull_stats));
//   RETURN_IF_ERROR(client->Push(clock, grads, &push_stats));
//
// Zero copy. A dense f32 gradient goes out from the caller's memory itself
// (f16/bf16 are converted once into a recycled buffer, top-k compressed into
// the client's payloads); pulled parameters are copied straight from the
// received bytes into the caller's spans. So the caller must leave a
// gradient unchanged while it is being sent:
//  - Push, PushPull: until the call returns;
//  - StartExchange: until FinishExchanges returns.
// Before returning, both wait (up to rpc_timeout) until gRPC has released
// every reference to the gradients; after that the caller may overwrite
// them, and nothing the shards received changes. (In sync mode a Push's
// gradient is also copied once for a possible replay to a restarted shard,
// see client/sync_replay.h.)
//
// Connections. Each shard gets `channels_per_shard` TCP connections; the
// partitions a call sends to one shard are split over them (no part under
// 512 KiB of f32), so that one large push keeps every connection busy.
//
// Faults. Every RPC goes through its shard's ShardChannel
// (client/shard_channel.h): retried while the shard is unreachable, and a
// restarted shard (ABORTED) is resynchronised first (Resync: re-register,
// take its versions, count the updates lost, and in sync mode send again
// the pushes it acknowledged, client/sync_replay.h). Pushes carry a random
// worker incarnation and a per-shard sequence: each is applied at most once.
//
// Replicated shards (replicas > 1): the channel of shard g stands for replica
// group g, its chain's head for pushes and tail for pulls; the control calls
// are ChainControl's (client/chain_control.h). No resync, no replay.
//
// Thread-compatible: one training thread calls Push/Pull; Heartbeat and
// ClusterStatus may be called concurrently from another thread.
#ifndef SHARDTRAIN_CLIENT_PS_CLIENT_H_
#define SHARDTRAIN_CLIENT_PS_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/batch_call.h"
#include "client/chain_router.h"
#include "client/ps_client_metrics.h"
#include "client/control_calls.h"
#include "client/parameter_client.h"
#include "client/partition_layout.h"
#include "client/ps_client_options.h"
#include "client/shard_channel.h"
#include "client/sync_replay.h"
#include "client/tensor_exchange.h"
#include "client/wire_requests.h"
#include "common/rpc_metrics.h"
#include "common/topk_compressor.h"
#include "proto/shardtrain.grpc.pb.h"

namespace shardtrain::client {

class ShardCalls;  // client/shard_calls.h

class PsClient final : public ParameterClient {
 public:
  // `rpc_metrics` and `fault_metrics` may be null; if not, they must
  // outlive the client.
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(
      const PsClientOptions& options, common::RpcMetrics* rpc_metrics,
      PsClientMetrics* fault_metrics = nullptr);
  ~PsClient() override;

  // Sync mode decides how a push is re-sent after a shard restart (see the
  // file comment); async by default. Call before Register.
  void set_sync_mode(bool sync) override { sync_ = sync; }

  // The calls of ParameterClient (client/parameter_client.h), over gRPC.
  // Register reaches every shard and prepares the requests.
  absl::Status Register(const std::vector<TensorSpec>& tensors) override;

  // Each gradient is computed from the versions of the last Pull, and may
  // be overwritten once Push returns (see the file comment).
  // REQUIRES: Register() succeeded; grads[i].size() == elements of tensor i.
  absl::Status Push(int64_t clock, absl::Span<const absl::Span<const float>> grads,
                    PushStats* stats) override;

  absl::Status Pull(int64_t clock, int64_t min_version,
                    absl::Span<const absl::Span<float>> params, PullStats* stats) override;

  // One RPC per shard connection: each shard applies the gradient and
  // answers with the parameters that include it. Async, to a shard that
  // needs a Heartbeat after a split push (see DefersClock): a push, the
  // Heartbeat, then a pull. REQUIRES: as for Push.
  absl::Status PushPull(int64_t clock, int64_t min_version,
                        absl::Span<const absl::Span<const float>> grads,
                        absl::Span<const absl::Span<float>> params,
                        PushStats* push_stats, PullStats* pull_stats) override;

  // Overlapped exchange of one tensor: sends its gradient (as soon as
  // `grad_ready`, if not empty, has returned OK; its error otherwise fails
  // the exchange) and, once every shard has taken it, asks for its
  // parameters (at least `min_version`) into `params`. Meant to be called
  // from backward as each layer's gradient appears. `clock` counts steps
  // finished including this one.
  // REQUIRES: Register() succeeded; `grad` unchanged and `params` valid
  // until FinishExchanges() returns; no Push/Pull/PushPull until then.
  void StartExchange(int tensor, int64_t clock, int64_t min_version,
                     absl::Span<const float> grad, GradReady grad_ready,
                     absl::Span<float> params) override;
  // Waits for every started exchange; the first error wins. Afterwards the
  // gradients may be overwritten.
  absl::Status FinishExchanges(PushStats* push_stats, PullStats* pull_stats) override;

  // Tells every shard this worker is alive at `clock` (or done). Returns
  // the membership seen by shard 0 (replicated: by the first member that
  // answered). An unreachable shard is retried for at most `retry_for` (and
  // reconnect_timeout; replicated: member_timeout, then skipped while
  // another answered).
  absl::StatusOr<HeartbeatResponse> Heartbeat(int64_t clock, bool done,
                                              absl::Duration retry_for) override;

  // Status of every shard, in shard order. Replicated: of the shards that
  // answered within member_timeout (an error when none did); the others
  // are named in a warning and in `*unreachable` if not null.
  absl::StatusOr<std::vector<StatusResponse>> ClusterStatus(
      std::vector<int>* unreachable = nullptr);

  std::pair<int64_t, int64_t> known_versions() const override;
  // As for a restarted shard: the partitions below `step` catch up on this
  // client's next push (server/shard.h).
  int64_t RaiseKnownVersions(int64_t step) override;
  std::vector<int64_t> PulledVersions() const override;
  void SetNextPushComputedAt(std::vector<int64_t> versions) override;
  int64_t registered_worker_clock() const override { return registered_worker_clock_; }
  uint64_t worker_incarnation() const { return worker_incarnation_; }

  int num_shards() const { return static_cast<int>(channels_.size()); }
  // Shard s's channel (for TableClient's calls); valid while this lives.
  ShardChannel* channel(int s) const { return channels_[s].get(); }
  common::RpcMetrics* rpc_metrics() const { return rpc_metrics_; }
  // Replicated shards: the chains this client routes by; null otherwise.
  ChainRouter* router() const { return router_; }
  const PsClientOptions& options() const { return options_; }

  // Tests: slices of sent requests that still reference gradients, over
  // every batch (0 whenever Push, PushPull or FinishExchanges has
  // returned).
  int referenced_slices() const;
  // Tests: pushes noted for replay to `shard` whose payloads are still
  // referenced (0 whenever Push or FinishExchanges has returned).
  int replay_references(int shard) const { return replay_.Referenced(shard); }

 private:
  PsClient(const PsClientOptions& options, common::RpcMetrics* rpc_metrics,
           PsClientMetrics* fault_metrics);
  // Batches for `slices` of shard `shard`, split over its connections
  // starting at connection `first`.
  void AddBatches(int shard, const std::vector<PartitionSlice>& slices, int first,
                  std::vector<std::unique_ptr<BatchCall>>* out);
  void BuildCalls(const PartitionLayout& layout);
  // MatchPartitions (client/partition_layout.h) of shard `shard`'s
  // Register answer against group `group`'s partitions in `index`.
  absl::StatusOr<std::vector<std::pair<size_t, int64_t>>> MatchShard(
      int group, int shard, const PartitionIndex& index,
      const RegisterResponse& response) const;
  // Starts `start(batch, done)` for every blocking-call batch, waits for
  // all, then for gRPC to release the gradients; the first error.
  absl::Status RunBatches(
      const std::function<void(BatchCall*, std::function<void(absl::Status)>)>& start,
      bool pushed);
  // ShardChannel::ResyncFn: re-registers on the shard, takes its versions.
  void Resync(ShardChannel* channel, std::function<void(absl::Status)> done);
  // Applies shard `shard`'s Register answer: its incarnation and partition
  // versions. `restarted`: count and log the updates lost.
  absl::Status TakeShardState(int shard, const RegisterResponse& response,
                              bool restarted);
  // Async, a blocking push to `shard` over several connections: the shard
  // may move this worker's clock only once every part is in. A shard that
  // counts a push's calls (ShardChannel::counts_clock_parts) is told how
  // many there are; to any other the parts carry the clock before this step,
  // and AdvanceClock sends the new one with a Heartbeat after them.
  bool DefersClock(int shard) const;
  absl::Status AdvanceClock(int64_t clock);
  // Sends the pushes SetPushes set, then AdvanceClock, and adds them to
  // `stats`.
  absl::Status SendPushes(int64_t clock, PushStats* stats);
  void SetPushes(int64_t clock, absl::Span<const absl::Span<const float>> grads);
  void SetPulls(int64_t clock, int64_t min_version,
                absl::Span<const absl::Span<float>> params);
  void CollectPush(PushStats* stats) const;
  void CollectPull(PullStats* stats) const;
  void RecordRpc(const char* method, const grpc::Status& status,
                 size_t request_bytes, size_t response_bytes, absl::Time start);

  const PsClientOptions options_;
  common::RpcMetrics* const rpc_metrics_;
  PsClientMetrics* const fault_metrics_;
  const uint64_t worker_incarnation_;
  bool sync_ = false;
  std::vector<std::unique_ptr<ShardChannel>> channels_;
  // The control RPCs over the channels, chosen in Create (DirectControl or
  // ChainControl); after the channels, so they go first (a ChainControl
  // owns the router the channels route by).
  std::unique_ptr<ShardCalls> calls_;
  std::unique_ptr<ControlCalls> control_;
  // Replicated shards: control_'s router; null otherwise.
  ChainRouter* router_ = nullptr;
  std::vector<TensorSpec> tensors_;
  std::vector<std::string> tensor_names_;
  // What Register sent; a resync sends it again. Constant between Registers.
  RegisterRequest register_request_;
  int64_t registered_worker_clock_ = 0;
  // Where the registered tensors' partitions live; constant between
  // Registers.
  PartitionLayout layout_;
  // Version of each partition as last pulled (or taken from a restarted
  // shard); PartitionSlice::version_index points here. Written by at most
  // one in-flight pull per partition, and by a resync of its shard.
  VersionTable versions_;
  // SetNextPushComputedAt's versions for the next Push or PushPull; empty:
  // versions_.
  VersionTable computed_at_;
  // Set when options_.topk_ratio > 0: one residual per partition, indexed
  // like versions_. Before the batches, which use it, so it outlives them.
  std::unique_ptr<common::TopKCompressor> topk_;
  // Sync mode: acknowledged pushes to send again to a shard that restarts
  // before their step completes. Before the batches, which use it.
  SyncReplay replay_;
  BatchContext batch_context_;
  // The blocking calls' batches (by shard, then connection) and the
  // exchange's (by tensor, shard, connection).
  std::vector<std::unique_ptr<BatchCall>> shard_batches_;
  std::vector<int> batches_per_shard_;  // of shard_batches_
  // The shards the last SetPushes left for AdvanceClock.
  std::vector<int> advance_shards_;
  std::vector<std::unique_ptr<BatchCall>> tensor_batches_;
  std::unique_ptr<TensorExchange> exchange_;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_PS_CLIENT_H_
