// PartitionLocks: holds the locks of a set of partitions for its lifetime.
//
// A request that reads or updates several partitions together (a push is
// checked and applied all or nothing) locks them with one PartitionLocks.
// The partitions are locked in id order, the shard-wide lock order
// (tensor_store.h), each once however often it is named, and unlocked in
// reverse order when the object goes out of scope. Partitions the request
// does not name are not locked, so requests on disjoint partitions run in
// parallel. Once every lock is held (the growing phase of two-phase locking
// done), a request may release each partition as soon as it is finished
// with it (Release), so others wait only for their own partitions' work;
// the request still saw and changed all of them as one step.
//
//   PartitionLocks locks(std::move(partitions));
//   ... check every partition ...
//   for (Partition* p : locks.partitions()) { Apply(*p); locks.Release(p); }
//
// Clang's thread-safety analysis cannot follow a set of mutexes decided at
// run time, so it does not know which locks a PartitionLocks holds: code
// using the partitions calls `partition.mu.AssertHeld()` (checked at run
// time) before touching their guarded members, and the analysis checks the
// rest.
#ifndef SHARDTRAIN_SERVER_INTERNAL_PARTITION_LOCKS_H_
#define SHARDTRAIN_SERVER_INTERNAL_PARTITION_LOCKS_H_

#include <vector>

#include "absl/types/span.h"
#include "server/tensor_store.h"

namespace shardtrain::server::internal {

class PartitionLocks {
 public:
  // Locks `partitions` (null entries are not allowed) in id order.
  explicit PartitionLocks(std::vector<Partition*> partitions);
  ~PartitionLocks();

  PartitionLocks(const PartitionLocks&) = delete;
  PartitionLocks& operator=(const PartitionLocks&) = delete;

  // The partitions locked, in id order, without repeats (released ones
  // included).
  absl::Span<Partition* const> partitions() const { return partitions_; }

  // Unlocks `partition` now rather than at destruction.
  // REQUIRES: `partition` is one of partitions() and not yet released.
  void Release(Partition* partition);

 private:
  std::vector<Partition*> partitions_;
  std::vector<bool> released_;
};

}  // namespace shardtrain::server::internal

#endif  // SHARDTRAIN_SERVER_INTERNAL_PARTITION_LOCKS_H_
