#include "client/partition_layout.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace shardtrain::client {

PartitionLayout PlanLayout(const std::vector<TensorSpec>& tensors,
                           const common::PartitionConfig& config) {
  const size_t shards = static_cast<size_t>(config.num_shards);
  PartitionLayout layout;
  layout.partition_index.resize(shards);
  layout.shard_slices.resize(shards);
  layout.tensor_slices.resize(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    int64_t elements = 1;
    for (int64_t dim : tensors[t].shape()) elements *= dim;
    layout.tensor_sizes.push_back(elements);
    layout.tensor_slices[t].resize(shards);
    for (const common::PlacedPartition& placed :
         common::PlaceTensor(tensors[t].name(), elements, config)) {
      const PartitionSlice slice{static_cast<int>(t), static_cast<uint32_t>(placed.partition),
                                 placed.range.offset, placed.range.size,
                                 layout.partition_sizes.size()};
      layout.partition_index[placed.shard][{tensors[t].name(), slice.partition}] =
          slice.version_index;
      layout.partition_sizes.push_back(slice.size);
      layout.shard_slices[placed.shard].push_back(slice);
      layout.tensor_slices[t][placed.shard].push_back(slice);
    }
  }
  return layout;
}

absl::StatusOr<std::vector<std::pair<size_t, int64_t>>> MatchPartitions(
    const PartitionIndex& index, const RegisterResponse& response,
    const RegisteredShard& shard) {
  // A replica holds the partitions of every group whose chain it is in.
  std::vector<const PartitionInfo*> infos;
  for (const PartitionInfo& info : response.partitions()) {
    if (shard.group >= 0 &&
        common::ReplicaGroupFor(info.tensor(), info.partition(), shard.num_groups) !=
            shard.group) {
      continue;
    }
    infos.push_back(&info);
  }
  const std::string of_group =
      shard.group < 0 ? "" : absl::StrFormat(" of group %d", shard.group);
  if (infos.size() != index.size()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "shard %d (%s) holds %d partitions%s of these tensors but this worker "
        "expects %d: do --max_partition_elements and the shard count match?",
        shard.shard, shard.address, infos.size(), of_group, index.size()));
  }
  std::vector<std::pair<size_t, int64_t>> matched;
  for (const PartitionInfo* info : infos) {
    auto it = index.find({info->tensor(), info->partition()});
    if (it == index.end()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "shard %d (%s) holds partition %d of %s, which this worker does not "
          "place there: do --max_partition_elements and the shard count match?",
          shard.shard, shard.address, info->partition(), info->tensor()));
    }
    matched.emplace_back(it->second, info->version());
  }
  return matched;
}

std::vector<std::vector<PartitionSlice>> SplitOverConnections(
    const std::vector<PartitionSlice>& slices, int connections, int64_t min_elements) {
  if (slices.empty()) return {};
  int64_t total = 0;
  for (const PartitionSlice& slice : slices) total += slice.size;
  const int used = static_cast<int>(
      std::clamp<int64_t>(total / std::max<int64_t>(min_elements, 1), 1, connections));
  std::vector<std::vector<PartitionSlice>> runs(used);
  int64_t before = 0;
  for (const PartitionSlice& slice : slices) {
    const int run = static_cast<int>(std::min<int64_t>(
        used - 1, (before + slice.size / 2) * used / std::max<int64_t>(total, 1)));
    runs[run].push_back(slice);
    before += slice.size;
  }
  return runs;
}

}  // namespace shardtrain::client
