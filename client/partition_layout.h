// PartitionLayout: where a worker's registered tensors live, as a value.
//
// PlanLayout cuts every tensor into partitions and places each on a shard
// (common/partition.h), numbering them for the client's version table;
// MatchPartitions checks a shard's Register answer against that plan; and
// SplitOverConnections cuts what one call sends to a shard into runs, one
// per connection. Free functions of plain values: PsClient builds its calls
// from them, and they are tested without a shard.
//
//   const PartitionLayout layout = PlanLayout(specs, {max_elements, shards});
//   ASSIGN_OR_RETURN(auto versions,
//                    MatchPartitions(layout.partition_index[s], response, shard));
//
// Thread-compatible.
#ifndef SHARDTRAIN_CLIENT_PARTITION_LAYOUT_H_
#define SHARDTRAIN_CLIENT_PARTITION_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "client/wire_requests.h"
#include "common/partition.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::client {

// (tensor, partition) -> index into the client's version table, for one
// shard (replicated: one replica group).
using PartitionIndex = std::map<std::pair<std::string, uint32_t>, size_t>;

struct PartitionLayout {
  std::vector<int64_t> tensor_sizes;                      // by tensor
  std::vector<int64_t> partition_sizes;                   // by version index
  std::vector<PartitionIndex> partition_index;            // by shard
  std::vector<std::vector<PartitionSlice>> shard_slices;  // by shard
  // by tensor, then shard: that tensor's partitions there
  std::vector<std::vector<std::vector<PartitionSlice>>> tensor_slices;
};

// The layout of `tensors` (validated specs) under `config`. Version indices
// count the partitions in tensor order, then partition order.
PartitionLayout PlanLayout(const std::vector<TensorSpec>& tensors,
                           const common::PartitionConfig& config);

// Who answered a Register, for MatchPartitions' checks and errors.
struct RegisteredShard {
  int shard = 0;
  std::string address;
  // Replicated shards: the replica group whose partitions are matched (a
  // member holds those of every group whose chain it is in) and how many
  // groups there are; -1 when unreplicated (every partition is matched).
  int group = -1;
  int num_groups = 0;
};

// Pairs each partition `response` reports (of `shard.group`, if set) with
// its index in `index` and the version the shard holds. FAILED_PRECONDITION,
// naming the shard, when it holds other partitions than `index` places
// there (the worker's and the shard's --max_partition_elements or shard
// counts differ).
absl::StatusOr<std::vector<std::pair<size_t, int64_t>>> MatchPartitions(
    const PartitionIndex& index, const RegisterResponse& response,
    const RegisteredShard& shard);

// Cuts `slices` (one call's partitions to one shard, in order) into
// contiguous runs of about equal size, one per connection, but none under
// `min_elements` unless there is less than that in all: below that,
// another call costs more than the parallel connection gains
// (bench/results/channels_split_cpu.txt). Returns
// clamp(total / min_elements, 1, connections) runs, run r for the r-th
// connection of the call's; a run is empty when larger slices filled its
// share. No runs for no slices.
std::vector<std::vector<PartitionSlice>> SplitOverConnections(
    const std::vector<PartitionSlice>& slices, int connections, int64_t min_elements);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_PARTITION_LAYOUT_H_
