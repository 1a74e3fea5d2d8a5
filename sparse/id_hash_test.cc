#include "sparse/id_hash.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace shardtrain::sparse {
namespace {

// Ranks 0..n-1 drawn Zipf(alpha) by inverse CDF; rank r is id Mix64(r) or,
// as recommendation ids often are, the raw rank (small consecutive ints).
std::vector<uint64_t> ZipfStream(int64_t n, double alpha, size_t count, bool raw) {
  std::vector<double> cdf(static_cast<size_t>(n));
  double sum = 0;
  for (int64_t r = 0; r < n; ++r) cdf[r] = sum += std::pow(r + 1.0, -alpha);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, sum);
  std::vector<uint64_t> ids(count);
  for (uint64_t& id : ids) {
    const uint64_t r = std::upper_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
    id = raw ? r : Mix64(r);
  }
  return ids;
}

// Hot ids spread over every shard: per 64k-id batch the unique ids (the rows
// a deduplicated request asks each shard for) and over the stream the rows
// stored, busiest shard within 1.1x the mean, for 2 to 8 shards.
TEST(IdHashTest, ZipfStreamSpreadsEvenlyOverShards) {
  for (bool raw : {true, false}) {
    const std::vector<uint64_t> ids = ZipfStream(1'000'000, 1.1, 16 * 65536, raw);
    for (int shards : {2, 3, 4, 8}) {
      std::vector<absl::flat_hash_set<uint64_t>> rows(shards);
      double worst_batch = 0;
      for (size_t b = 0; b < 16; ++b) {
        absl::flat_hash_set<uint64_t> unique(ids.begin() + b * 65536,
                                             ids.begin() + (b + 1) * 65536);
        std::vector<int64_t> per_shard(shards, 0);
        for (uint64_t id : unique) {
          const int s = ShardOfId(id, shards);
          ++per_shard[s];
          rows[s].insert(id);
        }
        const double mean = static_cast<double>(unique.size()) / shards;
        worst_batch = std::max(worst_batch,
                               *std::max_element(per_shard.begin(), per_shard.end()) / mean);
      }
      size_t total = 0, most = 0;
      for (const auto& r : rows) {
        total += r.size();
        most = std::max(most, r.size());
      }
      EXPECT_LE(worst_batch, 1.1) << shards << " shards, raw ids " << raw;
      EXPECT_LE(most / (static_cast<double>(total) / shards), 1.1)
          << shards << " shards, raw ids " << raw;
    }
  }
}

TEST(IdHashTest, SlotsAreStableAndInRange) {
  EXPECT_EQ(SlotOf(12345, kTableSlots), SlotOf(12345, kTableSlots));
  for (uint64_t id = 0; id < 10000; ++id) {
    ASSERT_LT(SlotOf(id, kTableSlots), kTableSlots);
    ASSERT_EQ(ShardOfId(id, 3), static_cast<int>(SlotOf(id, kTableSlots) % 3));
  }
  // The placement is part of the wire contract: these values never change.
  EXPECT_EQ(Mix64(0), 0u);
  EXPECT_EQ(Mix64(1), 0x5692161d100b05e5ULL);
}

}  // namespace
}  // namespace shardtrain::sparse
