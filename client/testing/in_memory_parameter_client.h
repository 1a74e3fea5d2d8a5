// InMemoryParameterClient: a ParameterClient (client/parameter_client.h)
// whose parameter server is a table in this process, for unit tests of the
// code above the client (worker/trainer.h) without shards.
//
// It keeps what the shards keep for one worker's view of a job, one
// partition per tensor: the values (initialised as a shard does,
// common/initializer.h), a version per tensor (its updates), the clock each
// worker index reported, and plain SGD at `learning_rate`:
//  - async: every push is applied at once; its staleness is the updates
//    applied since the versions this client last pulled;
//  - sync: the job is this worker's (every other worker pushes the same
//    gradient, so a step's average is this one): a push for step c is
//    applied when a tensor is at version c - 1 and ends its step; at
//    version >= c the step finished without this worker
//    (FAILED_PRECONDITION, nothing changes). A tensor behind the version
//    this client knows (RaiseKnownVersions) catches up on the push, as a
//    restarted shard's partition does.
// A pull that would wait (a version below min_version) returns
// DEADLINE_EXCEEDED at once: no other worker is there to end the step.
// Exchanges run inside StartExchange (grad_ready first); FinishExchanges
// returns their first error.
//
// What a test stages: another worker's progress (AdvanceSteps,
// AdvanceBeforeNextPush, SetVersion, SetWorkerState), a restarted worker's clock (set_worker_clock), and a
// push's failure (FailNextPush). Thread-safe.
#ifndef SHARDTRAIN_CLIENT_TESTING_IN_MEMORY_PARAMETER_CLIENT_H_
#define SHARDTRAIN_CLIENT_TESTING_IN_MEMORY_PARAMETER_CLIENT_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/parameter_client.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::client::testing {

class InMemoryParameterClient final : public ParameterClient {
 public:
  // This client is worker `worker` of `num_workers`.
  InMemoryParameterClient(uint32_t worker, int num_workers, float learning_rate);

  // ParameterClient.
  void set_sync_mode(bool sync) override;
  absl::Status Register(const std::vector<TensorSpec>& tensors) override;
  absl::Status Push(int64_t clock, absl::Span<const absl::Span<const float>> grads,
                    PushStats* stats) override;
  absl::Status Pull(int64_t clock, int64_t min_version,
                    absl::Span<const absl::Span<float>> params, PullStats* stats) override;
  absl::Status PushPull(int64_t clock, int64_t min_version,
                        absl::Span<const absl::Span<const float>> grads,
                        absl::Span<const absl::Span<float>> params, PushStats* push_stats,
                        PullStats* pull_stats) override;
  void StartExchange(int tensor, int64_t clock, int64_t min_version,
                     absl::Span<const float> grad, GradReady grad_ready,
                     absl::Span<float> params) override;
  absl::Status FinishExchanges(PushStats* push_stats, PullStats* pull_stats) override;
  absl::StatusOr<HeartbeatResponse> Heartbeat(int64_t clock, bool done,
                                              absl::Duration retry_for) override;
  std::pair<int64_t, int64_t> known_versions() const override;
  int64_t RaiseKnownVersions(int64_t step) override;
  std::vector<int64_t> PulledVersions() const override;
  void SetNextPushComputedAt(std::vector<int64_t> versions) override;
  int64_t registered_worker_clock() const override;

  // What a test stages.
  // The other workers finished `steps` more steps without this one: every
  // tensor's version moves on (its values stay).
  void AdvanceSteps(int64_t steps);
  // The same, just before the next push is taken (the others went on while
  // this worker computed: a sync push arrives late).
  void AdvanceBeforeNextPush(int64_t steps);
  // Tensor `tensor`'s version is `version` (its shard restored another step).
  void SetVersion(int tensor, int64_t version);
  // What the next Register reports as this worker's recorded clock.
  void set_worker_clock(int64_t clock);
  // Worker `worker`'s state in heartbeat answers (not this client's own).
  void SetWorkerState(uint32_t worker, int64_t clock, bool done, bool live);
  // The next push (Push, PushPull or an exchange) returns `status`; it is
  // applied first if `applied` (as for ALREADY_EXISTS: an earlier push of
  // this worker index for the step is in).
  void FailNextPush(absl::Status status, bool applied);

  // What a test reads.
  std::vector<float> values(int tensor) const;
  int64_t version(int tensor) const;
  // Pushes applied (an exchange counts once per tensor).
  int64_t pushes_applied() const;
  // Push, Pull and PushPull calls (a PushPull is one round trip).
  int64_t round_trips() const;
  int64_t heartbeats() const;

 private:
  // Push and Pull, not counted as round trips (PushPull makes one of both).
  absl::Status PushOnce(int64_t clock, absl::Span<const absl::Span<const float>> grads,
                        PushStats* stats) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PullOnce(int64_t min_version, absl::Span<const absl::Span<float>> params,
                        PullStats* stats) ABSL_LOCKS_EXCLUDED(mu_);
  void CountRoundTrip() ABSL_LOCKS_EXCLUDED(mu_);
  // The staged push failure and advance, consumed; *applied: the push is
  // applied first.
  std::optional<absl::Status> TakeFailureLocked(bool* applied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sync: FAILED_PRECONDITION unless tensor `tensor` is at step clock - 1
  // (or catches up to it).
  absl::Status CheckPushLocked(int tensor, int64_t clock) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies `grad`, computed at version `computed_at`, to tensor `tensor`
  // for step `clock`; returns the push's staleness. REQUIRES: CheckPushLocked(tensor, clock).ok().
  int64_t ApplyLocked(int tensor, int64_t clock, absl::Span<const float> grad,
                      int64_t computed_at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks every gradient's tensor and size.
  absl::Status CheckSizesLocked(size_t count, const std::vector<size_t>& sizes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PullTensorLocked(int tensor, int64_t min_version, absl::Span<float> params)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t worker_;
  const int num_workers_;
  const float learning_rate_;

  mutable absl::Mutex mu_;
  bool sync_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<TensorSpec> specs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<float>> values_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> versions_ ABSL_GUARDED_BY(mu_);  // the server's
  std::vector<int64_t> known_ ABSL_GUARDED_BY(mu_);     // this client's
  // SetNextPushComputedAt's versions, by tensor; empty: known_.
  std::vector<int64_t> computed_at_ ABSL_GUARDED_BY(mu_);
  int64_t worker_clock_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t registered_clock_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  std::optional<std::pair<absl::Status, bool>> push_failure_ ABSL_GUARDED_BY(mu_);
  absl::Status exchange_status_ ABSL_GUARDED_BY(mu_);
  int64_t advance_before_push_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t exchange_staleness_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushes_applied_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t round_trips_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardtrain::client::testing

#endif  // SHARDTRAIN_CLIENT_TESTING_IN_MEMORY_PARAMETER_CLIENT_H_
