// StepSnapshot: collects one shard's copy of a sync step for a coordinated
// checkpoint.
//
// In sync mode a partition's version is the job's step. Every shard copies
// each of its partitions when that partition's version becomes a multiple
// of `every_steps` (the copy is taken by PartitionUpdater::MaybeFinishStep
// under the partition's lock, right after the step was applied), so the copies of
// step T on all shards describe the same model. When every partition of
// the shard has been copied for T the step is complete: the completion
// hook adds what else belongs with it (the shard's sparse tables as they
// are at that moment: no worker has all of step T's parameters from this
// shard yet, so no table push of step T+1 is in), and it waits for the
// checkpoint writer (server/checkpoint.h) to take it.
//
// Memory: at most one incomplete step is collected; when a partition starts
// a newer step before the older one completed, the older one is dropped
// with a warning. Besides it at most one complete step waits to be written
// (a newer complete step replaces it). So the collector holds at most two
// copies of the shard's state, and only for a moment: the housekeeping
// thread takes a complete step within its interval.
//
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_STEP_SNAPSHOT_H_
#define SHARDTRAIN_SERVER_STEP_SNAPSHOT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "proto/shardtrain.pb.h"
#include "server/tensor_store.h"

namespace shardtrain::server {

class StepSnapshot {
 public:
  // every_steps <= 0 disables the collector: Due() is always false.
  explicit StepSnapshot(int64_t every_steps);

  int64_t every_steps() const { return every_steps_; }

  // True when a partition that just reached `version` must be copied.
  bool Due(int64_t version) const {
    return every_steps_ > 0 && version > 0 && version % every_steps_ == 0;
  }

  // Counts a partition of the shard (called as it is created): a step is
  // complete when this many partitions have been copied for it.
  void AddPartition() { partitions_.fetch_add(1, std::memory_order_relaxed); }

  // Runs with the records of each step as it completes, on the thread that
  // copied its last partition (holding that partition's lock, not the
  // collector's), to append the records that belong with the step. Set
  // before the first Capture.
  void SetOnComplete(std::function<void(std::vector<CheckpointRecord>* records)> on_complete) {
    on_complete_ = std::move(on_complete);
  }

  // Copies `part` (spec, version, parameters, optimizer slots) as its share
  // of step part.version.
  void Capture(const Partition& part) ABSL_SHARED_LOCKS_REQUIRED(part.mu);

  struct Step {
    int64_t step = 0;
    std::vector<CheckpointRecord> records;  // ordered by partition id
  };
  // Moves out the newest complete step, if any.
  std::optional<Step> TakeCompleted();
  // The newest complete step not yet taken; 0 if none.
  int64_t completed_step() const;
  // Incomplete steps dropped because a newer one started first.
  int64_t dropped_steps() const;

 private:
  // Files `record` as part's share of `step`; the step, once complete.
  std::optional<Step> Add(const Partition& part, int64_t step, int partitions_in_shard,
                          CheckpointRecord record);

  const int64_t every_steps_;
  std::atomic<int> partitions_{0};
  std::function<void(std::vector<CheckpointRecord>*)> on_complete_;
  mutable absl::Mutex mu_;
  int64_t pending_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, CheckpointRecord> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<Step> completed_ ABSL_GUARDED_BY(mu_);
  // The newest step that completed (taken or not): older copies are stale.
  int64_t newest_completed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_STEP_SNAPSHOT_H_
