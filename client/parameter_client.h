// ParameterClient: the calls a training loop makes to the parameter server.
//
// A worker's trainer (worker/trainer.h) and the Python extension's training
// calls see the parameter server only through this interface. PsClient
// (client/ps_client.h) implements it over gRPC against the shards;
// client/testing/in_memory_parameter_client.h implements it in memory for
// unit tests of what sits above it. The contract of every call, including
// which buffers must stay valid while a call runs, is PsClient's.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<PsClient> ps, PsClient::Create(options, nullptr));
//   ParameterClient* client = ps.get();
//   RETURN_IF_ERROR(client->Register(specs));
//   RETURN_IF_ERROR(client->Pull(clock, min_version, params, &pull_stats));
//   RETURN_IF_ERROR(client->Push(clock, grads, &push_stats));
//
// Thread-compatible: one training thread calls Push/Pull; Heartbeat may be
// called concurrently from another thread.
#ifndef SHARDTRAIN_CLIENT_PARAMETER_CLIENT_H_
#define SHARDTRAIN_CLIENT_PARAMETER_CLIENT_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::client {

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

// Blocks until a gradient handed to an exchange is ready to be read (e.g.
// its copy from a device has landed) and returns that copy's status. An
// empty one: the gradient is already there.
using GradReady = absl::AnyInvocable<absl::Status()>;

class ParameterClient {
 public:
  virtual ~ParameterClient() = default;

  // Sync mode decides how a refused or repeated push is treated; async by
  // default. Call before Register.
  virtual void set_sync_mode(bool sync) = 0;

  // Registers `tensors` (idempotent); tensor i of the calls below is
  // tensors[i]. Learns each partition's version and the clock the job
  // recorded for this worker.
  virtual absl::Status Register(const std::vector<TensorSpec>& tensors) = 0;

  // Pushes one gradient per tensor for step `clock` (steps finished
  // including this one). Sync errors a trainer acts on:
  // FAILED_PRECONDITION (the step finished without this worker) and
  // ALREADY_EXISTS (this worker index pushed for the step before).
  virtual absl::Status Push(int64_t clock, absl::Span<const absl::Span<const float>> grads,
                            PushStats* stats) = 0;

  // Fetches every tensor into `params` once each partition has at least
  // `min_version` updates and `clock` is within the staleness bound.
  virtual absl::Status Pull(int64_t clock, int64_t min_version,
                            absl::Span<const absl::Span<float>> params,
                            PullStats* stats) = 0;

  // Push then Pull in one round trip.
  virtual absl::Status PushPull(int64_t clock, int64_t min_version,
                                absl::Span<const absl::Span<const float>> grads,
                                absl::Span<const absl::Span<float>> params,
                                PushStats* push_stats, PullStats* pull_stats) = 0;

  // Overlapped exchange of tensor `tensor`: its gradient goes out once
  // `grad_ready` (if not empty) returned OK, then its parameters of at
  // least `min_version` come back into `params`. `grad` and `params` stay
  // valid until FinishExchanges returns.
  virtual void StartExchange(int tensor, int64_t clock, int64_t min_version,
                             absl::Span<const float> grad, GradReady grad_ready,
                             absl::Span<float> params) = 0;
  // Waits for every started exchange; the first error wins.
  virtual absl::Status FinishExchanges(PushStats* push_stats, PullStats* pull_stats) = 0;

  // Tells the job this worker is alive at `clock` (or done); returns the
  // workers' states as the shards see them. Retried for at most
  // `retry_for` (absl::InfiniteDuration(): the client's own limit) while
  // unreachable.
  virtual absl::StatusOr<HeartbeatResponse> Heartbeat(int64_t clock, bool done,
                                                      absl::Duration retry_for) = 0;

  // Smallest and largest partition version known (registered, pulled or
  // taken from a restarted shard); {0, 0} before Register.
  virtual std::pair<int64_t, int64_t> known_versions() const = 0;
  // Sync: raises every known partition version to at least `step`; returns
  // the steps skipped, summed over the partitions.
  virtual int64_t RaiseKnownVersions(int64_t step) = 0;
  // The largest clock the job recorded for this worker index at the last
  // Register; 0 for a new job.
  virtual int64_t registered_worker_clock() const = 0;

  // Each partition's version as the last pulls fetched it (registered or
  // taken from a restarted shard), in the client's partition order: the
  // versions a push says its gradients were computed at.
  virtual std::vector<int64_t> PulledVersions() const = 0;
  // The next Push or PushPull says its gradients were computed at
  // `versions` (an earlier PulledVersions()) instead: for a worker that
  // computes on parameters older than its last pull (Trainer's stale
  // overlap), so that the shards measure its staleness right. Not for the
  // overlapped exchanges (StartExchange). Call it from the thread that
  // makes that push, or before that thread starts.
  virtual void SetNextPushComputedAt(std::vector<int64_t> versions) = 0;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_PARAMETER_CLIENT_H_
