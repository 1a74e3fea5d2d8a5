#include "server/step_snapshot.h"

#include <glog/logging.h>

#include <utility>

#include "server/partition_record.h"

namespace shardtrain::server {

StepSnapshot::StepSnapshot(int64_t every_steps) : every_steps_(every_steps) {}

void StepSnapshot::Capture(const Partition& part) {
  const int partitions_in_shard = partitions_.load(std::memory_order_relaxed);
  const int64_t step = part.version.load(std::memory_order_relaxed);
  CheckpointRecord record;
  WritePartitionRecord(part, PartitionRecordContents::kModel, &record);
  std::optional<Step> complete =
      Add(part, step, partitions_in_shard, std::move(record));
  if (!complete) return;
  // Unlocked: the hook may copy a lot, and only this thread has the step.
  if (on_complete_) on_complete_(&complete->records);
  absl::MutexLock lock(&mu_);
  if (completed_.has_value() && completed_->step > step) return;  // a newer one is in
  if (completed_.has_value()) {
    LOG(WARNING) << "step checkpoint " << completed_->step
                 << " was not written before step " << step << " completed";
  }
  completed_ = std::move(complete);
}

std::optional<StepSnapshot::Step> StepSnapshot::Add(const Partition& part, int64_t step,
                                                    int partitions_in_shard,
                                                    CheckpointRecord record) {
  absl::MutexLock lock(&mu_);
  if (step <= newest_completed_ || step < pending_step_) {
    // A straggler of a step that was dropped or already complete.
    return std::nullopt;
  }
  if (step > pending_step_) {
    if (!pending_.empty()) {
      ++dropped_;
      LOG(WARNING) << "step checkpoint " << pending_step_ << " dropped: only "
                   << pending_.size() << " of " << partitions_in_shard
                   << " partitions had reached it when " << part.tensor << "/"
                   << part.index << " reached step " << step;
    }
    pending_.clear();
    pending_step_ = step;
  }
  pending_[part.id] = std::move(record);
  if (static_cast<int>(pending_.size()) < partitions_in_shard) return std::nullopt;
  Step complete;
  complete.step = step;
  complete.records.reserve(pending_.size());
  for (auto& [id, copy] : pending_) complete.records.push_back(std::move(copy));
  pending_.clear();
  // Stragglers of this step are stale from now on.
  newest_completed_ = step;
  return complete;
}

std::optional<StepSnapshot::Step> StepSnapshot::TakeCompleted() {
  absl::MutexLock lock(&mu_);
  std::optional<Step> taken = std::move(completed_);
  completed_.reset();
  return taken;
}

int64_t StepSnapshot::completed_step() const {
  absl::MutexLock lock(&mu_);
  return completed_.has_value() ? completed_->step : 0;
}

int64_t StepSnapshot::dropped_steps() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace shardtrain::server
