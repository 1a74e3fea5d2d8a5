#include "chain/placement.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/partition.h"
#include "common/testing/mlp_tensors.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::chain {
namespace {

using ::shardtrain::testutil::MlpTensors;
using ::shardtrain::testutil::TensorShape;

TEST(ReplicaPlacementTest, OneReplicaIsTheUnreplicatedPlacement) {
  for (int shards : {1, 2, 3, 5, 8}) {
    for (const TensorShape& t : MlpTensors({784, 256, 128, 10})) {
      for (const common::PlacedPartition& p :
           common::PlaceTensor(t.name, t.elements, {common::kDefaultMaxPartitionElements, shards})) {
        const int group = common::ReplicaGroupFor(t.name, p.partition, shards);
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
    for (const common::PlacedPartition& p :
         common::PlaceTensor(t.name, t.elements, {common::kDefaultMaxPartitionElements, shards})) {
      const int group = common::ReplicaGroupFor(t.name, p.partition, shards);
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
}  // namespace shardtrain::chain
