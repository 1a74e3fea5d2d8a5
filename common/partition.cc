#include "common/partition.h"

#include "absl/strings/str_cat.h"

namespace shardtrain::common {

uint64_t Fnv1a(absl::string_view bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

int64_t NumPartitions(int64_t num_elements, const PartitionConfig& config) {
  const int64_t max = config.max_partition_elements;
  int64_t parts = (num_elements + max - 1) / max;
  if (parts > 1) {
    const int64_t shards = config.num_shards;
    parts = (parts + shards - 1) / shards * shards;
  }
  return parts;
}

PartitionRange PartitionAt(int64_t num_elements, const PartitionConfig& config,
                           int64_t p) {
  const int64_t parts = NumPartitions(num_elements, config);
  const int64_t base = num_elements / parts;
  const int64_t extra = num_elements % parts;  // the first `extra` get one more
  PartitionRange range;
  range.size = base + (p < extra ? 1 : 0);
  range.offset = p * base + (p < extra ? p : extra);
  return range;
}

int ShardFor(absl::string_view tensor, int64_t p, int num_shards) {
  const uint64_t shards = static_cast<uint64_t>(num_shards);
  const uint64_t start = Fnv1a(tensor) % shards;
  return static_cast<int>((start + static_cast<uint64_t>(p)) % shards);
}

std::vector<PlacedPartition> PlaceTensor(absl::string_view tensor,
                                         int64_t num_elements,
                                         const PartitionConfig& config) {
  std::vector<PlacedPartition> placed;
  const int64_t parts = NumPartitions(num_elements, config);
  placed.reserve(parts);
  for (int64_t p = 0; p < parts; ++p) {
    PlacedPartition part;
    part.tensor = std::string(tensor);
    part.partition = p;
    part.range = PartitionAt(num_elements, config, p);
    part.shard = ShardFor(tensor, p, config.num_shards);
    placed.push_back(std::move(part));
  }
  return placed;
}

absl::Status ValidateReplicas(int num_shards, int replicas) {
  if (num_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of shards must be at least 1, got ", num_shards));
  }
  if (replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas must be at least 1, got ", replicas));
  }
  if (replicas > kMaxReplicas) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replicas ", replicas, " is not supported: at most ", kMaxReplicas));
  }
  if (replicas > num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replicas ", replicas, " needs at least as many shards, but there are ",
        num_shards, ": each replica of a partition lives on a distinct shard"));
  }
  return absl::OkStatus();
}

int ReplicaGroupFor(absl::string_view tensor, int64_t p, int num_shards) {
  return ShardFor(tensor, p, num_shards);
}

std::vector<int> InitialChain(int group, int num_shards, int replicas) {
  std::vector<int> chain;
  chain.reserve(replicas);
  for (int i = 0; i < replicas; ++i) chain.push_back((group + i) % num_shards);
  return chain;
}

std::vector<int> InitialGroupsOf(int shard, int num_shards, int replicas) {
  std::vector<int> groups;
  groups.reserve(replicas);
  for (int i = 0; i < replicas; ++i) {
    groups.push_back((shard - i + num_shards) % num_shards);
  }
  return groups;
}

}  // namespace shardtrain::common
