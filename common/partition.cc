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

int ReplicaGroupFor(absl::string_view tensor, int64_t p, int num_shards) {
  return ShardFor(tensor, p, num_shards);
}

}  // namespace shardtrain::common
