// TensorExchange: overlapped, per-tensor push-then-pull for one worker.
//
// Backward produces gradients layer by layer, last layer first. Start()
// sends one tensor's gradient to the shards holding its partitions at once
// and, as each shard acknowledges it, asks that shard for the tensor's
// parameters for the next step, so communication of layer L overlaps the
// backward of layers < L and the next step's parameters arrive while the
// rest of the model is still being computed (prefetch). Both go as one
// PushPull per call, one round trip (with replicated shards, to the
// chain's head, which answers once the tail has the push). In a sync job
// its pull half is answered once every worker's gradient of the step is
// in, so no push is acknowledged without its step's parameters (the sync
// replay keeps nothing), and a late gradient fails the whole call
// (FAILED_PRECONDITION) as a push would. Finish() waits for everything
// started. Encoding and sending run on the exchange's own thread,
// so the thread computing backward only enqueues.
//
// The RPCs are the same BatchCalls the blocking PsClient calls make
// (client/batch_call.h), one per (tensor, shard, connection): retried
// across outages and shard restarts, a retried push keeping its sequence
// number, the gradient sent from where it lies.
//
//   TensorExchange exchange(std::move(batches_by_tensor), &versions,
//                           /*release_timeout=*/absl::Seconds(30));
//   exchange.Start(t, clock, min_version, grad, grad_ready, params);
//   ...
//   RETURN_IF_ERROR(exchange.Finish(&staleness, &wait, &version));
//   // now every grad may be overwritten; params hold the pulled values
//
// Thread-safety: Start and Finish are called from one thread; the sender
// thread and gRPC completions touch only the started tensor's batches and
// partition versions (atomics, which a shard resync may also write).
#ifndef SHARDTRAIN_CLIENT_TENSOR_EXCHANGE_H_
#define SHARDTRAIN_CLIENT_TENSOR_EXCHANGE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/batch_call.h"
#include "client/parameter_client.h"
#include "client/shard_channel.h"

namespace shardtrain::client {

class TensorExchange {
 public:
  // batches[t] are tensor t's calls (not owned; they and `versions` must
  // outlive this). `release_timeout` bounds Finish's wait for gRPC to let go
  // of the gradients. `step_calls_by_shard`, when not empty, is how many of
  // those calls go to each shard: every step starts every tensor, and a
  // shard that counts a split push's calls is told so (clock_parts), so
  // that it moves the worker's clock with the step's last call.
  TensorExchange(std::vector<std::vector<BatchCall*>> batches, VersionTable* versions,
                 absl::Duration release_timeout,
                 std::vector<uint32_t> step_calls_by_shard = {});
  ~TensorExchange();

  // Sends `grad` once `grad_ready` (if not empty) has returned OK, then
  // pulls into `params`. REQUIRES: `grad` is not written and `params` stays
  // valid until Finish() returns.
  void Start(int tensor, int64_t clock, int64_t min_version,
             absl::Span<const float> grad, GradReady grad_ready,
             absl::Span<float> params);
  // Waits for every started exchange. Returns the first error, preferring
  // any other error to a FAILED_PRECONDITION (a late sync gradient, which
  // the trainer recovers from). When it returns, gRPC holds no reference to
  // any gradient passed to Start (DEADLINE_EXCEEDED if it still did after
  // the release timeout).
  absl::Status Finish(int64_t* max_staleness, double* max_wait_seconds,
                      int64_t* min_version);

 private:
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
  // The clock_parts of `call`'s push (0: the shard moves the clock at once).
  uint32_t ClockParts(const BatchCall& call) const;
  void OnPushPulled(BatchCall* call, const absl::Status& status);
  void Complete(const absl::Status& status);

  const std::vector<std::vector<BatchCall*>> batches_;  // by tensor
  VersionTable* const versions_;
  const absl::Duration release_timeout_;
  const std::vector<uint32_t> step_calls_by_shard_;

  absl::Mutex mu_;
  // Started and not yet finished (queued, pushing or pulling).
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  // Tensors started since the last Finish.
  std::vector<int> started_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  int64_t max_staleness_ ABSL_GUARDED_BY(mu_) = 0;
  double max_wait_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t min_version_ ABSL_GUARDED_BY(mu_) = INT64_MAX;
  std::thread sender_;  // last: starts after everything above exists
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_TENSOR_EXCHANGE_H_
