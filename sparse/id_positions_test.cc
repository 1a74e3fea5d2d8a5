#include "sparse/id_positions.h"

#include <cstdint>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"

namespace shardtrain::sparse {
namespace {

TEST(IdPositionsTest, FirstPositionsAsAMapGivesThem) {
  IdPositions positions;
  std::mt19937_64 rng(3);
  for (int batch = 0; batch < 20; ++batch) {
    // Batches of different sizes over a small id range: many repeats, and
    // ids of earlier batches that must read as unseen.
    const size_t n = 1 + rng() % 5000;
    positions.Reset(n);
    absl::flat_hash_map<uint64_t, uint32_t> want;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t id = rng() % 3000 + (batch % 2 ? 0 : uint64_t{1} << 63);
      auto [first, fresh] = positions.Insert(id, static_cast<uint32_t>(i));
      auto [it, inserted] = want.try_emplace(id, static_cast<uint32_t>(i));
      ASSERT_EQ(fresh, inserted) << "batch " << batch << " id " << id;
      ASSERT_EQ(first, it->second) << "batch " << batch << " id " << id;
    }
  }
}

TEST(IdPositionsTest, ResetForgetsEveryEarlierBatch) {
  IdPositions positions;
  positions.Reset(4);
  EXPECT_TRUE(positions.Insert(7, 0).second);
  EXPECT_FALSE(positions.Insert(7, 1).second);
  for (int i = 0; i < 5; ++i) positions.Reset(4);
  EXPECT_TRUE(positions.Insert(7, 2).second);
  EXPECT_EQ(positions.Insert(7, 3).first, 2u);
}

TEST(IdPositionsTest, StrictlyIncreasingBatchesHaveNoRepeats) {
  EXPECT_TRUE(StrictlyIncreasing({}));
  EXPECT_TRUE(StrictlyIncreasing({7}));
  EXPECT_TRUE(StrictlyIncreasing({1, 2, 9, UINT64_MAX}));
  EXPECT_FALSE(StrictlyIncreasing({1, 2, 2, 3})) << "a repeat";
  EXPECT_FALSE(StrictlyIncreasing({3, 1, 2})) << "unsorted: may repeat";
  EXPECT_FALSE(StrictlyIncreasing({UINT64_MAX, 0}));
}

}  // namespace
}  // namespace shardtrain::sparse
