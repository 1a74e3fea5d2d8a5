#include "common/partition.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::common {
namespace {

struct TensorShape {
  std::string name;
  int64_t elements;
};

// The parameters of an MLP with the given layer sizes, named as the worker
// names them.
std::vector<TensorShape> MlpTensors(const std::vector<int64_t>& sizes) {
  std::vector<TensorShape> tensors;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    tensors.push_back({"fc" + std::to_string(i) + ".weight", sizes[i] * sizes[i + 1]});
    tensors.push_back({"fc" + std::to_string(i) + ".bias", sizes[i + 1]});
  }
  return tensors;
}

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

TEST(ReplicaPlacementTest, OneReplicaIsTheUnreplicatedPlacement) {
  for (int shards : {1, 2, 3, 5, 8}) {
    for (const TensorShape& t : MlpTensors({784, 256, 128, 10})) {
      for (const PlacedPartition& p :
           PlaceTensor(t.name, t.elements, {kDefaultMaxPartitionElements, shards})) {
        const int group = ReplicaGroupFor(t.name, p.partition, shards);
        EXPECT_EQ(group, p.shard) << t.name << " part " << p.partition;
        EXPECT_EQ(InitialChain(group, shards, 1), std::vector<int>{p.shard});
      }
    }
  }
}

TEST(ReplicaPlacementTest, InitialChainsAreConsecutiveDistinctShards) {
  for (int shards = 1; shards <= 7; ++shards) {
    for (int replicas = 1; replicas <= std::min(shards, kMaxReplicas); ++replicas) {
      // position_count[i][s]: chains whose i-th member is shard s.
      std::vector<std::vector<int>> position_count(replicas,
                                                   std::vector<int>(shards, 0));
      for (int group = 0; group < shards; ++group) {
        const std::vector<int> chain = InitialChain(group, shards, replicas);
        ASSERT_EQ(chain.size(), static_cast<size_t>(replicas));
        EXPECT_EQ(chain.front(), group) << "the head is the primary";
        std::vector<int> sorted = chain;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end())
            << "shards " << shards << " replicas " << replicas << " group " << group;
        for (int i = 0; i < replicas; ++i) {
          EXPECT_EQ(chain[i], (group + i) % shards);
          ++position_count[i][chain[i]];
        }
      }
      // Every shard is head of one chain, tail of one chain, ...: the work of
      // each role is spread evenly when the groups are.
      for (const auto& counts : position_count) {
        EXPECT_THAT(counts, ::testing::Each(1));
      }
      // InitialGroupsOf is the inverse: shard s is i-th in its i-th group.
      for (int shard = 0; shard < shards; ++shard) {
        const std::vector<int> groups = InitialGroupsOf(shard, shards, replicas);
        ASSERT_EQ(groups.size(), static_cast<size_t>(replicas));
        for (int i = 0; i < replicas; ++i) {
          EXPECT_EQ(InitialChain(groups[i], shards, replicas)[i], shard)
              << "shards " << shards << " replicas " << replicas << " shard " << shard;
        }
      }
    }
  }
}

TEST(ReplicaPlacementTest, ValidateReplicasAcceptsOneToMinOfShardsAndThree) {
  EXPECT_OK(ValidateReplicas(1, 1));
  EXPECT_OK(ValidateReplicas(2, 2));
  EXPECT_OK(ValidateReplicas(3, 3));
  EXPECT_OK(ValidateReplicas(16, 3));
  struct Bad {
    int shards, replicas;
    const char* says;
  };
  for (const Bad& bad : {Bad{2, 0, "at least 1"}, Bad{4, -1, "at least 1"},
                         Bad{8, 4, "at most 3"}, Bad{2, 3, "there are 2"},
                         Bad{1, 2, "distinct shard"}, Bad{0, 1, "shards must"}}) {
    const absl::Status status = ValidateReplicas(bad.shards, bad.replicas);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << bad.shards << " shards, " << bad.replicas << " replicas";
    EXPECT_THAT(status.message(), ::testing::HasSubstr(bad.says));
  }
}

// Elements held per shard: as primary (head) only, and over every replica.
struct ReplicaLoad {
  double primary_max_over_mean = 0;
  double total_max_over_mean = 0;
};

ReplicaLoad MeasureReplicaLoad(const std::vector<TensorShape>& tensors,
                               int shards, int replicas) {
  std::vector<int64_t> primary(shards, 0), total(shards, 0);
  for (const TensorShape& t : tensors) {
    for (const PlacedPartition& p :
         PlaceTensor(t.name, t.elements, {kDefaultMaxPartitionElements, shards})) {
      const int group = ReplicaGroupFor(t.name, p.partition, shards);
      primary[group] += p.range.size;
      for (int shard : InitialChain(group, shards, replicas)) {
        total[shard] += p.range.size;
      }
    }
  }
  auto max_over_mean = [shards](const std::vector<int64_t>& load) {
    const double mean =
        std::accumulate(load.begin(), load.end(), 0.0) / shards;
    return *std::max_element(load.begin(), load.end()) / mean;
  };
  return {max_over_mean(primary), max_over_mean(total)};
}

// The Fashion-MNIST MLP (784-256-128-10, 235,146 elements, default
// partitions). Busiest shard over the mean, measured when written:
//
//   shards  primary  total R=2  total R=3
//     2     1.0049    1.0000        -
//     3     1.0125    1.0036     1.0000
//     4     1.0147    1.0059     1.0023
//     5     1.0203    1.0107     1.0047
//     6     1.0255    1.0093     1.0049
//
// Replicas even the load out: a shard's total is the sum of R consecutive
// groups' primaries.
TEST(ReplicaPlacementTest, FashionMnistMlpReplicasAreBalanced) {
  const auto tensors = MlpTensors({784, 256, 128, 10});
  for (int shards = 2; shards <= 6; ++shards) {
    for (int replicas : {2, 3}) {
      if (!ValidateReplicas(shards, replicas).ok()) continue;
      const ReplicaLoad load = MeasureReplicaLoad(tensors, shards, replicas);
      EXPECT_LE(load.primary_max_over_mean, 1.15)
          << shards << " shards, " << replicas << " replicas";
      EXPECT_LE(load.total_max_over_mean, 1.15)
          << shards << " shards, " << replicas << " replicas";
      RecordProperty(absl::StrCat("s", shards, "_r", replicas, "_primary"),
                     absl::StrFormat("%.4f", load.primary_max_over_mean));
      RecordProperty(absl::StrCat("s", shards, "_r", replicas, "_total"),
                     absl::StrFormat("%.4f", load.total_max_over_mean));
    }
  }
}

}  // namespace
}  // namespace shardtrain::common
