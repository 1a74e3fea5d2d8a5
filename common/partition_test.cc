#include "common/partition.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/testing/mlp_tensors.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::common {
namespace {

using ::shardtrain::testutil::MlpTensors;
using ::shardtrain::testutil::TensorShape;

double MaxOverMeanLoad(const std::vector<TensorShape>& tensors,
                       const PartitionConfig& config) {
  std::vector<int64_t> load(config.num_shards, 0);
  for (const TensorShape& t : tensors) {
    for (const PlacedPartition& p : PlaceTensor(t.name, t.elements, config)) {
      load[p.shard] += p.range.size;
    }
  }
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  const double mean = total / config.num_shards;
  return *std::max_element(load.begin(), load.end()) / mean;
}

TEST(PartitionTest, RangesTileTheTensorWithNearEqualSizes) {
  for (int64_t elements : {1, 7, 16384, 16385, 200704, 1000003}) {
    for (int shards : {1, 2, 3, 5}) {
      PartitionConfig config{16384, shards};
      const int64_t parts = NumPartitions(elements, config);
      int64_t next = 0, smallest = elements, largest = 0;
      for (int64_t p = 0; p < parts; ++p) {
        const PartitionRange range = PartitionAt(elements, config, p);
        EXPECT_EQ(range.offset, next);
        EXPECT_LE(range.size, config.max_partition_elements);
        next += range.size;
        smallest = std::min(smallest, range.size);
        largest = std::max(largest, range.size);
      }
      EXPECT_EQ(next, elements);
      EXPECT_LE(largest - smallest, 1);
      if (parts > 1) {
        EXPECT_EQ(parts % shards, 0);
      }
    }
  }
}

TEST(PartitionTest, PlacementIsDeterministic) {
  PartitionConfig config{1024, 4};
  const auto a = PlaceTensor("fc0.weight", 100000, config);
  const auto b = PlaceTensor("fc0.weight", 100000, config);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].shard, b[i].shard);
    EXPECT_EQ(a[i].range.offset, b[i].range.offset);
    EXPECT_EQ(ShardFor("fc0.weight", static_cast<int64_t>(i), 4), a[i].shard);
  }
  // Pinned values: a change here would strand checkpoints and mixed-version
  // clusters, so it must be deliberate.
  EXPECT_EQ(Fnv1a(""), 14695981039346656037ull);
  EXPECT_EQ(Fnv1a("a"), 0xaf63dc4c8601ec8cull);
}

TEST(PartitionTest, FashionMnistMlpIsBalanced) {
  const auto tensors = MlpTensors({784, 256, 128, 10});
  for (int shards : {2, 3, 4}) {
    PartitionConfig config{kDefaultMaxPartitionElements, shards};
    EXPECT_LE(MaxOverMeanLoad(tensors, config), 1.1) << shards << " shards";
  }
}

TEST(PartitionTest, LargeMlpIsBalanced) {
  const auto tensors = MlpTensors({784, 4096, 4096, 10});
  for (int shards : {2, 3, 4, 8}) {
    PartitionConfig config{kDefaultMaxPartitionElements, shards};
    EXPECT_LE(MaxOverMeanLoad(tensors, config), 1.1) << shards << " shards";
  }
}

TEST(PartitionTest, EveryShardGetsWorkFromALargeTensor) {
  PartitionConfig config{kDefaultMaxPartitionElements, 4};
  std::map<int, int> per_shard;
  for (const auto& p : PlaceTensor("big", 4096 * 4096, config)) ++per_shard[p.shard];
  ASSERT_EQ(per_shard.size(), 4u);
  for (const auto& [shard, count] : per_shard) EXPECT_EQ(count, per_shard[0]);
}

}  // namespace
}  // namespace shardtrain::common
