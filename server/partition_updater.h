// PartitionUpdater: how a gradient changes a partition, in the shard's
// consistency mode.
//
//  - sync: a gradient is added to its step's accumulator; once the step has
//    one from each worker that counts for it (Membership::
//    ContributorsForStep, at most replicas_to_aggregate), their mean is
//    applied once and the version moves on. A partition resuming after a
//    restore is fast-forwarded by a push from a later step (the skipped
//    steps are lost updates), a step it was redoing first closed with the
//    gradients it has.
//  - async: a gradient is applied on arrival, scaled down by its staleness
//    with staleness_aware_lr.
// Every applied update goes through the optimizer, moves the partition's
// version (and its gauge), and at every checkpoint_every_steps-th sync step
// the partition is copied into the step snapshot.
//
// The caller holds the partition's lock, checks a part with CheckPart
// before changing anything, and then applies it (AddSyncGradient or
// ApplyAsyncGradient). A chain's follower applies the head's decisions
// (`follow`). Thread-safe as annotated.
#ifndef SHARDTRAIN_SERVER_PARTITION_UPDATER_H_
#define SHARDTRAIN_SERVER_PARTITION_UPDATER_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "proto/shardtrain.pb.h"
#include "server/decoded_push.h"
#include "server/membership.h"
#include "server/optimizer.h"
#include "server/shard_metrics.h"
#include "server/shard_options.h"
#include "server/step_snapshot.h"
#include "server/tensor_store.h"

namespace shardtrain::server {

class PartitionUpdater {
 public:
  // None owned; all must outlive the updater.
  PartitionUpdater(const ShardOptions& options, const Optimizer* optimizer,
                   const Membership* membership, ShardMetrics* metrics,
                   StepSnapshot* step_snapshot);

  // Whether `part` (of worker `worker`) may be applied to `p` now: not from
  // a later version (OUT_OF_RANGE), not for a finished sync step
  // (FAILED_PRECONDITION), not twice in a step (ALREADY_EXISTS). Sets
  // part.ahead for a resuming sync partition the push overtakes; changes
  // nothing else.
  absl::Status CheckPart(const Partition& p, DecodedPart& part, uint32_t worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Sync: adds the gradient to its step (closing the step first if the push
  // overtakes a resuming partition) and finishes the step if it is
  // complete, or, for a follower (`follow` not null), if the head did.
  // Returns the updates the overtaken partition lost.
  int64_t AddSyncGradient(Partition& p, const DecodedPart& part, uint32_t worker,
                          const ReplicatedOp* follow = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Async: applies the gradient now; returns its staleness.
  int64_t ApplyAsyncGradient(Partition& p, const DecodedPart& part)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Sync: applies the step's mean if enough gradients are in; true if it
  // did. `close`: the mean of the gradients present even if fewer than
  // required (a step the head closed, or one a resuming partition redid).
  bool MaybeFinishStep(Partition& part, bool close = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(part.mu);

  // Notes a partition at `version` (restored or copied in).
  void NoteVersion(int64_t version);
  // The sync step from which a worker coming back now (after being dropped)
  // contributes: the steps already under way here (up to the highest
  // partition version) go on without it.
  int64_t RejoinStep() const { return max_version_.load() + 1; }
  int64_t updates_applied() const { return updates_applied_.load(); }

 private:
  // Sync: gradients that complete `part`'s current step: one per worker
  // that still counts for it or has already contributed to it (at most
  // replicas_to_aggregate, at least 1).
  int RequiredGradients(const Partition& part) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(part.mu);
  // Applies a gradient to `part` as update number part.version: `dense`
  // read where it lies if not null, else part.params.size() floats at `grad`.
  void ApplyUpdate(Partition& part, const wire::PayloadView* dense, const float* grad,
                   float lr_scale) ABSL_EXCLUSIVE_LOCKS_REQUIRED(part.mu);

  const ShardOptions& options_;
  const Optimizer* const optimizer_;
  const Membership* const membership_;
  ShardMetrics* const metrics_;
  StepSnapshot* const step_snapshot_;
  // The highest version of any partition.
  std::atomic<int64_t> max_version_{0};
  std::atomic<int64_t> updates_applied_{0};
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_PARTITION_UPDATER_H_
