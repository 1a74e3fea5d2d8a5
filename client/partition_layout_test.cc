#include "client/partition_layout.h"

#include <set>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::client {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

TensorSpec Spec(const std::string& name, std::vector<int64_t> shape) {
  TensorSpec spec;
  spec.set_name(name);
  for (int64_t dim : shape) spec.add_shape(dim);
  return spec;
}

TEST(PlanLayoutTest, EveryElementIsInExactlyOnePartitionOnItsShard) {
  const std::vector<TensorSpec> tensors = {Spec("w1", {100, 30}), Spec("b1", {30}),
                                           Spec("w2", {30, 7})};
  const common::PartitionConfig config{/*max_partition_elements=*/256, /*num_shards=*/3};
  const PartitionLayout layout = PlanLayout(tensors, config);
  EXPECT_EQ(layout.tensor_sizes, (std::vector<int64_t>{3000, 30, 210}));
  ASSERT_EQ(layout.partition_index.size(), 3u);
  ASSERT_EQ(layout.tensor_slices.size(), 3u);
  // Partitions numbered in tensor order, then partition order.
  size_t next_index = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    std::vector<int> covered(layout.tensor_sizes[t], 0);
    const std::vector<common::PlacedPartition> placed =
        common::PlaceTensor(tensors[t].name(), layout.tensor_sizes[t], config);
    for (const common::PlacedPartition& partition : placed) {
      const PartitionIndex& index = layout.partition_index[partition.shard];
      auto it = index.find({tensors[t].name(), static_cast<uint32_t>(partition.partition)});
      ASSERT_NE(it, index.end());
      EXPECT_EQ(it->second, next_index++);
      EXPECT_EQ(layout.partition_sizes[it->second], partition.range.size);
    }
    for (int s = 0; s < 3; ++s) {
      for (const PartitionSlice& slice : layout.tensor_slices[t][s]) {
        EXPECT_EQ(slice.tensor, static_cast<int>(t));
        EXPECT_EQ(common::ShardFor(tensors[t].name(), slice.partition, 3), s);
        for (int64_t e = slice.offset; e < slice.offset + slice.size; ++e) ++covered[e];
      }
    }
    EXPECT_EQ(std::set<int>(covered.begin(), covered.end()), std::set<int>{1});
  }
  EXPECT_EQ(next_index, layout.partition_sizes.size());
  // A shard's slices are its tensors' slices, in tensor order.
  for (int s = 0; s < 3; ++s) {
    size_t i = 0;
    for (size_t t = 0; t < tensors.size(); ++t) {
      for (const PartitionSlice& slice : layout.tensor_slices[t][s]) {
        ASSERT_LT(i, layout.shard_slices[s].size());
        EXPECT_EQ(layout.shard_slices[s][i++].version_index, slice.version_index);
      }
    }
    EXPECT_EQ(i, layout.shard_slices[s].size());
    EXPECT_EQ(layout.partition_index[s].size(), layout.shard_slices[s].size());
  }
}

RegisterResponse Holding(const std::vector<std::pair<std::string, uint32_t>>& partitions,
                         int64_t version) {
  RegisterResponse response;
  for (const auto& [tensor, partition] : partitions) {
    PartitionInfo* info = response.add_partitions();
    info->set_tensor(tensor);
    info->set_partition(partition);
    info->set_version(version);
  }
  return response;
}

TEST(MatchPartitionsTest, PairsEachPartitionWithItsIndexAndVersion) {
  const PartitionIndex index = {{{"w", 0}, 4}, {{"w", 2}, 6}};
  RegisteredShard shard{1, "10.0.0.2:5000"};
  ASSERT_OK_AND_ASSIGN(auto matched, MatchPartitions(index, Holding({{"w", 2}, {"w", 0}}, 9),
                                                     shard));
  EXPECT_THAT(matched, UnorderedElementsAre(std::pair<size_t, int64_t>{4, 9},
                                            std::pair<size_t, int64_t>{6, 9}));
}

TEST(MatchPartitionsTest, OtherPartitionsAreRefusedNamingTheShard) {
  const PartitionIndex index = {{{"w", 0}, 4}, {{"w", 2}, 6}};
  RegisteredShard shard{1, "10.0.0.2:5000"};
  const absl::Status fewer = MatchPartitions(index, Holding({{"w", 0}}, 0), shard).status();
  EXPECT_EQ(fewer.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fewer.message(), HasSubstr("shard 1 (10.0.0.2:5000) holds 1 partitions"));
  const absl::Status other =
      MatchPartitions(index, Holding({{"w", 0}, {"w", 1}}, 0), shard).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.message(), HasSubstr("holds partition 1 of w, which this worker does not"));
}

TEST(MatchPartitionsTest, AReplicaIsMatchedOnTheGroupAsked) {
  // A member of two chains answers with both groups' partitions.
  constexpr int kGroups = 4;
  std::vector<std::pair<std::string, uint32_t>> held;
  PartitionIndex index;
  int group = -1;
  for (uint32_t p = 0; p < 16; ++p) {
    const int g = common::ReplicaGroupFor("w", p, kGroups);
    if (group < 0) group = g;
    if (g == group) index[{"w", p}] = p;
    if (g == group || g == (group + 1) % kGroups) held.emplace_back("w", p);
  }
  ASSERT_GT(held.size(), index.size());
  RegisteredShard shard{2, "10.0.0.3:5000", group, kGroups};
  ASSERT_OK_AND_ASSIGN(auto matched, MatchPartitions(index, Holding(held, 3), shard));
  EXPECT_EQ(matched.size(), index.size());
  // Unreplicated, the other group's partitions are not this shard's.
  shard.group = -1;
  EXPECT_THAT(MatchPartitions(index, Holding(held, 3), shard).status().message(),
              HasSubstr("of these tensors but this worker expects"));
}

std::vector<PartitionSlice> Slices(const std::vector<int64_t>& sizes) {
  std::vector<PartitionSlice> slices;
  int64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    slices.push_back(PartitionSlice{0, static_cast<uint32_t>(i), offset, sizes[i], i});
    offset += sizes[i];
  }
  return slices;
}

std::vector<int64_t> RunSizes(const std::vector<std::vector<PartitionSlice>>& runs) {
  std::vector<int64_t> sizes;
  for (const auto& run : runs) {
    int64_t size = 0;
    for (const PartitionSlice& slice : run) size += slice.size;
    sizes.push_back(size);
  }
  return sizes;
}

TEST(SplitOverConnectionsTest, EqualContiguousRunsNoneUnderTheMinimum) {
  // 16 partitions of 16 Ki elements over 4 connections, 64 Ki at least each.
  const std::vector<PartitionSlice> slices = Slices(std::vector<int64_t>(16, 16384));
  auto runs = SplitOverConnections(slices, 4, 65536);
  EXPECT_EQ(RunSizes(runs), (std::vector<int64_t>{65536, 65536, 65536, 65536}));
  size_t next = 0;
  for (const auto& run : runs) {
    for (const PartitionSlice& slice : run) EXPECT_EQ(slice.version_index, next++);
  }
  // Half the minimum more than two runs' worth: two connections are used.
  runs = SplitOverConnections(slices, 4, 100000);
  EXPECT_EQ(RunSizes(runs), (std::vector<int64_t>{131072, 131072}));
  // Less than the minimum in all: one call.
  EXPECT_EQ(SplitOverConnections(Slices({10, 20}), 4, 65536).size(), 1u);
  EXPECT_TRUE(SplitOverConnections({}, 4, 65536).empty());
}

TEST(SplitOverConnectionsTest, ALargeSliceLeavesItsNeighbourRunEmpty) {
  const auto runs = SplitOverConnections(Slices({10, 300000, 10}), 3, 1000);
  EXPECT_EQ(RunSizes(runs), (std::vector<int64_t>{10, 300000, 10}));
  const auto skewed = SplitOverConnections(Slices({300000, 10}), 3, 1000);
  ASSERT_EQ(skewed.size(), 3u);
  EXPECT_EQ(RunSizes(skewed), (std::vector<int64_t>{0, 300000, 10}));
}

}  // namespace
}  // namespace shardtrain::client
