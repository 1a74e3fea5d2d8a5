// The tensors a shard holds: registration and lookup of partitions.
//
// Only the partitions of the replica groups this shard serves are created:
// with --replicas 1 the group of the shard itself (common/partition.h), with
// R > 1 the R groups whose initial chain holds it (chain::InitialGroupsOf).
// A partition owns its parameters, optimizer slots and the sync-step
// accumulator, each guarded by the partition's own mutex, so updates to
// different partitions never contend. Partitions are never removed, so a
// Partition* stays valid for the store's lifetime. Thread-safe.
#ifndef SHARDTRAIN_SERVER_TENSOR_STORE_H_
#define SHARDTRAIN_SERVER_TENSOR_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/partition.h"
#include "proto/shardtrain.pb.h"

namespace prometheus {
class Gauge;
}

namespace shardtrain::server {

struct Partition {
  // Constant after construction.
  int id = 0;  // dense index in the store; the order in which locks are taken
  std::string tensor;
  const TensorSpec* spec = nullptr;  // owned by the store
  int64_t index = 0;
  // The replica group: the partition's primary shard (common::ShardFor).
  int group = 0;
  common::PartitionRange range;
  prometheus::Gauge* version_gauge = nullptr;  // owned by the metrics registry

  // Updates applied. Written only under mu; read without it to decide
  // whether a waiting pull may be answered.
  std::atomic<int64_t> version{0};
  // Replicated shards: the highest version that the group's tail is known
  // to hold (an operation producing it was acknowledged down the chain,
  // or the state was restored or copied whole). A head answers a read of
  // version v only once committed >= v, so no worker sees an update that
  // a failover could lose.
  std::atomic<int64_t> committed{0};

  mutable absl::Mutex mu;
  std::vector<float> params ABSL_GUARDED_BY(mu);
  std::vector<std::vector<float>> slots ABSL_GUARDED_BY(mu);
  // Sync mode: the sum of gradients pushed for step `version`, and who
  // pushed them.
  std::vector<float> accum ABSL_GUARDED_BY(mu);
  std::vector<bool> contributed ABSL_GUARDED_BY(mu);
  int contributions ABSL_GUARDED_BY(mu) = 0;
  // Operations applied (each gradient added or applied, each sync step
  // closed): a replica applies a forwarded one only at the same count, so
  // every member of a chain runs the same operations in the same order.
  int64_t ops ABSL_GUARDED_BY(mu) = 0;
  // sync: true from creation (or restore) until the partition's first step
  // completes; while true, a push from a later step may fast-forward it.
  bool resuming ABSL_GUARDED_BY(mu) = true;
};

// Most dimensions a tensor may have.
inline constexpr int kMaxTensorDims = 8;

class TensorStore {
 public:
  struct SlotSpec {
    int count = 0;
    std::vector<float> initial_values;  // one per slot
  };

  // `groups`: the replica groups whose partitions this store holds.
  TensorStore(common::PartitionConfig partitioning, int shard_index,
              std::vector<int> groups, SlotSpec slots, int num_workers);

  // Registers `spec`, creating this shard's partitions with their initial
  // values (common::FillInitialValues: KIND_VALUES takes each partition's
  // slice of spec.values(), zeros when it is empty). The store keeps the
  // spec without its values. Registering an identical spec again (values
  // aside) is a no-op; a different spec under the same name is
  // ALREADY_EXISTS. Returns this shard's partitions of the tensor. Who may
  // create a KIND_VALUES tensor is the caller's rule (Shard::Register).
  absl::StatusOr<std::vector<Partition*>> Register(const TensorSpec& spec);

  // OK if Register(spec) would succeed now; nothing changes.
  absl::Status CheckRegistrable(const TensorSpec& spec) const;

  // Elements of `spec` that would be stored on this shard, computed without
  // allocating. REQUIRES: common::ValidateTensorSpec(spec).ok().
  int64_t LocalElements(const TensorSpec& spec) const;
  // True if a tensor named `name` is registered.
  bool Contains(const std::string& name) const;

  // Tensors registered, partitions held and their elements.
  int64_t num_tensors() const;
  int64_t num_partitions() const;
  int64_t stored_elements() const;

  // The partition named by `key`: NOT_FOUND for an unknown tensor or
  // partition index, INVALID_ARGUMENT for one placed on another shard.
  absl::StatusOr<Partition*> Find(const PartitionKey& key) const;
  absl::StatusOr<Partition*> Find(absl::string_view tensor, uint32_t partition) const;

  // Every partition, ordered by id.
  std::vector<Partition*> All() const;

  // Called with each new partition, before it becomes visible.
  void SetOnCreate(std::function<void(Partition*)> on_create);

 private:
  struct Tensor {
    TensorSpec spec;
    int64_t num_partitions = 0;
    // Indexed by partition number; null where another shard holds it.
    std::vector<Partition*> local;
  };

  const common::PartitionConfig partitioning_;
  const int shard_index_;
  // Indexed by group: held here.
  std::vector<bool> holds_group_;
  const SlotSpec slots_;
  const int num_workers_;

  mutable absl::Mutex mu_;
  std::function<void(Partition*)> on_create_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Tensor, std::less<>> tensors_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Partition>> partitions_ ABSL_GUARDED_BY(mu_);
  int64_t stored_elements_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_TENSOR_STORE_H_
