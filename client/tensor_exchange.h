// TensorExchange: overlapped, per-tensor push-then-pull for one worker.
//
// Backward produces gradients layer by layer, last layer first. Start()
// sends one tensor's gradient to the shards holding its partitions at once
// and, as each shard acknowledges it, asks that shard for the tensor's
// parameters for the next step, so communication of layer L overlaps the
// backward of layers < L and the next step's parameters arrive while the
// rest of the model is still being computed (prefetch). Finish() waits for
// everything started. Encoding and sending run on the exchange's own thread,
// so the thread computing backward only enqueues.
//
// Every RPC goes through the shard's ShardChannel (client/shard_call.h), so
// the halves are retried across outages and shard restarts like the
// blocking calls; a retried push keeps its sequence number.
//
// Thread-safety: Start and Finish are called from one thread; the sender
// thread and gRPC completions touch only the started tensor's messages and
// partition versions (atomics, which a shard resync may also write).
#ifndef SHARDTRAIN_CLIENT_TENSOR_EXCHANGE_H_
#define SHARDTRAIN_CLIENT_TENSOR_EXCHANGE_H_

#include <cstdint>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/client_context.h>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/shard_call.h"
#include "client/sync_replay.h"
#include "common/topk_compressor.h"
#include "proto/shardtrain.grpc.pb.h"

namespace shardtrain::client {

// Elements [offset, offset + size) of tensor `tensor`, one partition.
struct PartitionSlice {
  int tensor = 0;
  uint32_t partition = 0;
  int64_t offset = 0;
  int64_t size = 0;
  size_t version_index = 0;  // into the client's partition versions
};

// The version of each partition as last learned (pulled, or taken from a
// restarted shard), indexed by PartitionSlice::version_index. A deque, so
// the atomics never move.
using VersionTable = std::deque<std::atomic<int64_t>>;

// Blocks until a gradient handed to an exchange is ready to be read (e.g.
// its copy from a device has landed) and returns that copy's status. An
// empty one: the gradient is already there.
using GradReady = absl::AnyInvocable<absl::Status()>;

// Records one finished RPC for metrics: method, status, bytes sent,
// bytes received, start time.
using RpcRecorder = std::function<void(const char*, const grpc::Status&, size_t,
                                       size_t, absl::Time)>;

class TensorExchange {
 public:
  struct Options {
    uint32_t worker_index = 0;
    uint64_t worker_incarnation = 0;
    // Sync mode: a push re-sent after a shard restart keeps its versions
    // (its step); async: each becomes min(version sent, the shard's now).
    bool sync = false;
    DType wire_dtype = DTYPE_F32;
    // Not owned; null sends gradients dense. Must outlive the exchange.
    common::TopKCompressor* topk = nullptr;
    // Sync mode: notes acknowledged pushes until their pull completes (see
    // client/sync_replay.h). Not owned; null in async mode.
    SyncReplay* replay = nullptr;
    absl::Duration push_timeout = absl::Seconds(30);
    absl::Duration pull_timeout = absl::Seconds(300);
  };

  // One call group: the partitions of one tensor that live on one shard.
  struct Group {
    int shard = 0;
    std::vector<PartitionSlice> slices;
  };

  // `channels` (by shard) and `versions` are not owned and must outlive
  // this; groups[t] are tensor t's groups.
  TensorExchange(const Options& options, std::vector<ShardChannel*> channels,
                 const std::vector<TensorSpec>& tensors,
                 std::vector<std::vector<Group>> groups, VersionTable* versions,
                 RpcRecorder recorder);
  ~TensorExchange();

  // Sends `grad` once `grad_ready` (if not empty) has returned OK, then pulls
  // into `params`. REQUIRES: `grad` and `params` stay valid until Finish()
  // returns.
  void Start(int tensor, int64_t clock, int64_t min_version,
             absl::Span<const float> grad, GradReady grad_ready,
             absl::Span<float> params);
  // Waits for every started exchange. Returns the first error, preferring
  // any other error to a FAILED_PRECONDITION (a late sync gradient, which
  // the trainer recovers from).
  absl::Status Finish(int64_t* max_staleness, double* max_wait_seconds,
                      int64_t* min_version);

 private:
  struct Call;
  struct Task {
    int tensor;
    int64_t clock;
    int64_t min_version;
    absl::Span<const float> grad;
    GradReady grad_ready;  // Empty: grad is already there.
    absl::Span<float> params;
  };

  void SendLoop();
  // SendLoop's wake-up condition: a task is queued or Finish is stopping.
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Send(Task& task);
  void StartPull(Call* call);
  void OnPushed(Call* call, const absl::Status& status);
  void OnPulled(Call* call, const absl::Status& status);
  void Complete(const absl::Status& status);

  const Options options_;
  const std::vector<ShardChannel*> channels_;
  std::vector<std::vector<std::unique_ptr<Call>>> calls_;  // by tensor
  VersionTable* const versions_;
  const RpcRecorder recorder_;

  absl::Mutex mu_;
  // Started and not yet finished (queued, pushing or pulling).
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  int64_t max_staleness_ ABSL_GUARDED_BY(mu_) = 0;
  double max_wait_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t min_version_ ABSL_GUARDED_BY(mu_) = INT64_MAX;
  std::thread sender_;  // last: starts after everything above exists
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_TENSOR_EXCHANGE_H_
