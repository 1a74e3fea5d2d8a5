#include "server/tensor_store.h"

#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/str_format.h"
#include "common/initializer.h"
#include "common/status_macros.h"

namespace shardtrain::server {

TensorStore::TensorStore(common::PartitionConfig partitioning, int shard_index,
                         SlotSpec slots, int num_workers)
    : partitioning_(partitioning),
      shard_index_(shard_index),
      slots_(std::move(slots)),
      num_workers_(num_workers) {}

void TensorStore::SetOnCreate(std::function<void(Partition*)> on_create) {
  absl::MutexLock lock(&mu_);
  on_create_ = std::move(on_create);
}

absl::StatusOr<std::vector<Partition*>> TensorStore::Register(
    const TensorSpec& spec) {
  RETURN_IF_ERROR(CheckRegistrable(spec));
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(spec.name());
  if (it == tensors_.end()) {
    // Build everything first so a failure leaves no half-registered tensor.
    Tensor tensor;
    tensor.spec = spec;
    const int64_t elements = common::NumElements(spec);
    tensor.num_partitions = common::NumPartitions(elements, partitioning_);
    tensor.local.assign(tensor.num_partitions, nullptr);
    std::vector<std::unique_ptr<Partition>> created;
    for (const common::PlacedPartition& placed :
         common::PlaceTensor(spec.name(), elements, partitioning_)) {
      if (placed.shard != shard_index_) continue;
      auto part = std::make_unique<Partition>();
      part->id = static_cast<int>(partitions_.size() + created.size());
      part->tensor = spec.name();
      part->index = placed.partition;
      part->range = placed.range;
      absl::MutexLock part_lock(&part->mu);
      part->params.resize(placed.range.size);
      common::FillInitialValues(spec, placed.range.offset,
                                absl::MakeSpan(part->params));
      for (int s = 0; s < slots_.count; ++s) {
        part->slots.emplace_back(placed.range.size, slots_.initial_values[s]);
      }
      part->contributed.assign(num_workers_, false);
      tensor.local[placed.partition] = part.get();
      created.push_back(std::move(part));
    }
    it = tensors_.emplace(spec.name(), std::move(tensor)).first;
    for (auto& part : created) {
      part->spec = &it->second.spec;
      if (on_create_) on_create_(part.get());
      partitions_.push_back(std::move(part));
    }
  }
  std::vector<Partition*> local;
  for (Partition* part : it->second.local) {
    if (part != nullptr) local.push_back(part);
  }
  return local;
}

absl::Status TensorStore::CheckRegistrable(const TensorSpec& spec) const {
  RETURN_IF_ERROR(common::ValidateTensorSpec(spec));
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(spec.name());
  if (it != tensors_.end() &&
      !google::protobuf::util::MessageDifferencer::Equals(it->second.spec, spec)) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "tensor %s is already registered with a different spec (%s)",
        spec.name(), it->second.spec.ShortDebugString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Partition*> TensorStore::Find(const PartitionKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(key.tensor());
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("unknown tensor '%s'; register it first", key.tensor()));
  }
  const Tensor& tensor = it->second;
  if (key.partition() >= tensor.num_partitions) {
    return absl::NotFoundError(absl::StrFormat(
        "tensor %s has %d partitions; partition %d does not exist",
        key.tensor(), tensor.num_partitions, key.partition()));
  }
  Partition* part = tensor.local[key.partition()];
  if (part == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "partition %d of %s lives on shard %d, not on shard %d", key.partition(),
        key.tensor(),
        common::ShardFor(key.tensor(), key.partition(), partitioning_.num_shards),
        shard_index_));
  }
  return part;
}

std::vector<Partition*> TensorStore::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<Partition*> all;
  all.reserve(partitions_.size());
  for (const auto& part : partitions_) all.push_back(part.get());
  return all;
}

}  // namespace shardtrain::server
