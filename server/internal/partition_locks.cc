#include "server/internal/partition_locks.h"

#include <algorithm>
#include <utility>

namespace shardtrain::server::internal {

namespace {

bool ById(const Partition* a, const Partition* b) { return a->id < b->id; }

}  // namespace

// The analysis cannot track locks taken in a loop over a run-time set, so
// the two functions that take and release them are not analysed; everything
// else asserts the locks it relies on (see the header).
PartitionLocks::PartitionLocks(std::vector<Partition*> partitions)
    ABSL_NO_THREAD_SAFETY_ANALYSIS : partitions_(std::move(partitions)) {
  std::sort(partitions_.begin(), partitions_.end(), ById);
  partitions_.erase(std::unique(partitions_.begin(), partitions_.end()),
                    partitions_.end());
  for (Partition* p : partitions_) p->mu.Lock();
}

PartitionLocks::~PartitionLocks() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  for (auto it = partitions_.rbegin(); it != partitions_.rend(); ++it) {
    (*it)->mu.Unlock();
  }
}

}  // namespace shardtrain::server::internal
