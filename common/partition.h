// Partitioning of tensors and placement of partitions on shards.
//
// A tensor of n elements is cut into k = ceil(n / max_partition_elements)
// partitions whose sizes differ by at most one element; when k > 1 it is
// rounded up to a multiple of the shard count. Partition p of tensor t lives
// on shard (Fnv1a(t) + p) mod num_shards: the partitions of a large tensor go
// round-robin, so every shard gets the same share of it, and a tensor small
// enough for one partition goes whole to a shard picked by its name. Workers and servers call the
// same functions, so they agree on placement without talking.
//
// Replicas. With R replicas (--replicas, default 1) the shard above is the
// partition's primary, and its replica group is that shard's index g: group
// g's initial chain is the R consecutive shards [g, g+1, ..., g+R-1] mod S,
// head first (chain::InitialChain, chain/placement.h). R = 1 is exactly the
// unreplicated placement. The live chain of a group changes when members
// die or join; it is kept in etcd (chain/chain_config.h).
//
// Everything here is a pure function and thread-safe.
#ifndef SHARDTRAIN_COMMON_PARTITION_H_
#define SHARDTRAIN_COMMON_PARTITION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardtrain::common {

// Partitions are at most this many elements (64 KiB of f32) unless
// configured: small enough that a 784x256 layer spreads over the shards.
inline constexpr int64_t kDefaultMaxPartitionElements = 1 << 14;

// Most calls one step's push to one shard may be split into
// (PushRequest.clock_parts): one per connection (at most 64) and, in an
// overlapped exchange, per tensor.
inline constexpr uint32_t kMaxClockParts = 1 << 16;

struct PartitionRange {
  int64_t offset = 0;  // first element of the tensor in this partition
  int64_t size = 0;    // number of elements
};

// 64-bit FNV-1a; stable across processes and builds.
uint64_t Fnv1a(absl::string_view bytes);

// How tensors are cut: the same on every worker and shard of a cluster.
struct PartitionConfig {
  int64_t max_partition_elements = kDefaultMaxPartitionElements;
  int num_shards = 1;
};

// Number of partitions of a tensor with `num_elements` elements.
// REQUIRES: num_elements >= 1, config fields >= 1.
int64_t NumPartitions(int64_t num_elements, const PartitionConfig& config);

// The element range of partition `p`.
// REQUIRES: 0 <= p < NumPartitions(num_elements, config).
PartitionRange PartitionAt(int64_t num_elements, const PartitionConfig& config,
                           int64_t p);

// The shard that owns partition `p` of `tensor`.
// REQUIRES: num_shards >= 1.
int ShardFor(absl::string_view tensor, int64_t p, int num_shards);

// One partition of a tensor with its place.
struct PlacedPartition {
  std::string tensor;
  int64_t partition = 0;
  PartitionRange range;
  int shard = 0;
};

// Every partition of `tensor`, in order.
std::vector<PlacedPartition> PlaceTensor(absl::string_view tensor,
                                         int64_t num_elements,
                                         const PartitionConfig& config);

// The replica group of partition `p` of `tensor`: the index of its primary
// shard, ShardFor(tensor, p, num_shards). There are num_shards groups.
// REQUIRES: num_shards >= 1.
int ReplicaGroupFor(absl::string_view tensor, int64_t p, int num_shards);

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_PARTITION_H_
