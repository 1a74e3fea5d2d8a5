#include "sparse/counting_filter.h"

#include "gtest/gtest.h"

namespace shardtrain::sparse {
namespace {

TEST(CountingFilterTest, NeverUndercountsAndSaturates) {
  CountingFilter filter(1 << 12);
  for (uint64_t id = 0; id < 300; ++id) {
    for (uint64_t k = 0; k <= id % 20; ++k) filter.Add(id * 7919);
  }
  for (uint64_t id = 0; id < 300; ++id) {
    const int truth = static_cast<int>(id % 20) + 1;
    EXPECT_GE(filter.Estimate(id * 7919), std::min(truth, CountingFilter::kMaxCount)) << id;
    EXPECT_LE(filter.Estimate(id * 7919), CountingFilter::kMaxCount);
  }
}

TEST(CountingFilterTest, SparseFilterIsMostlyExact) {
  CountingFilter filter(1 << 16);
  for (uint64_t id = 1; id <= 2000; ++id) filter.Add(id);
  int exact = 0;
  for (uint64_t id = 1; id <= 2000; ++id) exact += filter.Estimate(id) == 1;
  EXPECT_GE(exact, 1990);
  int unseen_zero = 0;
  for (uint64_t id = 100000; id < 102000; ++id) unseen_zero += filter.Estimate(id) == 0;
  EXPECT_GE(unseen_zero, 1990);
}

TEST(CountingFilterTest, HalfAByteACounter) {
  CountingFilter filter(1000);  // rounded up to 1024
  EXPECT_EQ(filter.bytes(), 512);
}

}  // namespace
}  // namespace shardtrain::sparse
