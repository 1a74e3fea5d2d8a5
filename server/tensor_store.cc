#include "server/tensor_store.h"

#include "absl/strings/str_format.h"
#include "common/initializer.h"
#include "common/status_macros.h"

namespace shardtrain::server {

TensorStore::TensorStore(common::PartitionConfig partitioning, int shard_index,
                         std::vector<int> groups, SlotSpec slots, int num_workers)
    : partitioning_(partitioning),
      shard_index_(shard_index),
      holds_group_(std::max(partitioning.num_shards, 1), false),
      slots_(std::move(slots)),
      num_workers_(num_workers) {
  for (int group : groups) holds_group_.at(group) = true;
}

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
    // Initial values are used once, below, and never kept.
    tensor.spec = common::WithoutValues(spec);
    const int64_t elements = common::NumElements(spec);
    tensor.num_partitions = common::NumPartitions(elements, partitioning_);
    tensor.local.assign(tensor.num_partitions, nullptr);
    std::vector<std::unique_ptr<Partition>> created;
    // Only the partitions of groups held here are visited: group g's are
    // every num_shards-th one.
    const int num_shards = partitioning_.num_shards;
    const int base = common::ShardFor(spec.name(), 0, num_shards);
    for (int64_t p = 0; p < tensor.num_partitions; ++p) {
      const int group = static_cast<int>((base + p) % num_shards);
      if (!holds_group_[group]) continue;
      const common::PartitionRange range =
          common::PartitionAt(elements, partitioning_, p);
      auto part = std::make_unique<Partition>();
      part->id = static_cast<int>(partitions_.size() + created.size());
      part->tensor = spec.name();
      part->index = p;
      part->group = group;
      part->range = range;
      absl::MutexLock part_lock(&part->mu);
      part->params.resize(range.size);
      common::FillInitialValues(spec, range.offset, absl::MakeSpan(part->params));
      for (int s = 0; s < slots_.count; ++s) {
        part->slots.emplace_back(range.size, slots_.initial_values[s]);
      }
      part->contributed.assign(num_workers_, false);
      tensor.local[p] = part.get();
      created.push_back(std::move(part));
    }
    it = tensors_.emplace(spec.name(), std::move(tensor)).first;
    for (auto& part : created) {
      part->spec = &it->second.spec;
      if (on_create_) on_create_(part.get());
      stored_elements_ += part->range.size;
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
  if (spec.shape_size() > kMaxTensorDims) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor %s has %d dimensions; at most %d are supported",
        spec.name().substr(0, 256), spec.shape_size(), kMaxTensorDims));
  }
  RETURN_IF_ERROR(common::ValidateTensorSpec(spec));
  absl::ReaderMutexLock lock(&mu_);
  auto it = tensors_.find(spec.name());
  if (it != tensors_.end() && !common::SameTensorSpec(it->second.spec, spec)) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "tensor %s is already registered with a different spec (%s)",
        spec.name(), it->second.spec.ShortDebugString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Partition*> TensorStore::Find(const PartitionKey& key) const {
  return Find(key.tensor(), key.partition());
}

absl::StatusOr<Partition*> TensorStore::Find(absl::string_view name,
                                             uint32_t partition) const {
  // Shared: lookups of concurrent requests do not wait on each other.
  absl::ReaderMutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("unknown tensor '%s'; register it first", name));
  }
  const Tensor& tensor = it->second;
  if (partition >= tensor.num_partitions) {
    return absl::NotFoundError(absl::StrFormat(
        "tensor %s has %d partitions; partition %d does not exist", name,
        tensor.num_partitions, partition));
  }
  Partition* part = tensor.local[partition];
  if (part == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "partition %d of %s belongs to replica group %d, which shard %d does "
        "not hold",
        partition, name, common::ShardFor(name, partition, partitioning_.num_shards),
        shard_index_));
  }
  return part;
}

int64_t TensorStore::LocalElements(const TensorSpec& spec) const {
  const int64_t elements = common::NumElements(spec);
  const int64_t parts = common::NumPartitions(elements, partitioning_);
  const int64_t shards = partitioning_.num_shards;
  const int64_t primary = common::ShardFor(spec.name(), 0, partitioning_.num_shards);
  int64_t total = 0;
  for (int64_t group = 0; group < shards; ++group) {
    if (!holds_group_[group]) continue;
    // Group g's partitions are p = first (mod shards).
    const int64_t first = (group - primary + shards) % shards;
    if (parts == 1) {
      total += first == 0 ? elements : 0;
      continue;
    }
    // parts is a multiple of shards: each group has parts / shards of them,
    // of `base` elements, plus one for each of its partitions below `extra`.
    const int64_t base = elements / parts;
    const int64_t extra = elements % parts;
    const int64_t bigger = extra > first ? (extra - first + shards - 1) / shards : 0;
    total += parts / shards * base + bigger;
  }
  return total;
}

bool TensorStore::Contains(const std::string& name) const {
  absl::ReaderMutexLock lock(&mu_);
  return tensors_.find(name) != tensors_.end();
}

int64_t TensorStore::num_tensors() const {
  absl::ReaderMutexLock lock(&mu_);
  return static_cast<int64_t>(tensors_.size());
}

int64_t TensorStore::num_partitions() const {
  absl::ReaderMutexLock lock(&mu_);
  return static_cast<int64_t>(partitions_.size());
}

int64_t TensorStore::stored_elements() const {
  absl::ReaderMutexLock lock(&mu_);
  return stored_elements_;
}

std::vector<Partition*> TensorStore::All() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<Partition*> all;
  all.reserve(partitions_.size());
  for (const auto& part : partitions_) all.push_back(part.get());
  return all;
}

}  // namespace shardtrain::server
