#include "server/internal/partition_locks.h"

#include <algorithm>
#include <cassert>
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
  released_.assign(partitions_.size(), false);
  for (Partition* p : partitions_) p->mu.Lock();
}

PartitionLocks::~PartitionLocks() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  for (size_t i = partitions_.size(); i-- > 0;) {
    if (!released_[i]) partitions_[i]->mu.Unlock();
  }
}

void PartitionLocks::Release(Partition* partition) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const auto it =
      std::lower_bound(partitions_.begin(), partitions_.end(), partition, ById);
  assert(it != partitions_.end() && *it == partition);
  const size_t index = static_cast<size_t>(it - partitions_.begin());
  assert(!released_[index]);
  released_[index] = true;
  partition->mu.Unlock();
}

}  // namespace shardtrain::server::internal
