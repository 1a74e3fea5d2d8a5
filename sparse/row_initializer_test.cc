#include "sparse/row_initializer.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace shardtrain::sparse {
namespace {

std::vector<float> Row(const RowInit& init, const char* table, uint64_t id, int dim = 8) {
  std::vector<float> row(dim);
  RowInitializer(init, table, dim).Fill(id, row.data());
  return row;
}

TEST(RowInitializerTest, PureFunctionOfSeedTableAndId) {
  RowInit init;
  init.seed = 7;
  EXPECT_EQ(Row(init, "t", 42), Row(init, "t", 42));
  EXPECT_NE(Row(init, "t", 42), Row(init, "t", 43));
  EXPECT_NE(Row(init, "t", 42), Row(init, "u", 42));
  RowInit other = init;
  other.seed = 8;
  EXPECT_NE(Row(init, "t", 42), Row(other, "t", 42));
}

TEST(RowInitializerTest, UniformStaysWithinScaleAndCoversIt) {
  RowInit init;
  init.kind = RowInit::Kind::kUniform;
  init.scale = 0.5f;
  double sum = 0, lo = 1, hi = -1;
  const int n = 20000;
  for (uint64_t id = 0; id < n / 8; ++id) {
    for (float v : Row(init, "t", id)) {
      ASSERT_LE(std::fabs(v), 0.5f);
      sum += v;
      lo = std::min<double>(lo, v);
      hi = std::max<double>(hi, v);
    }
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_LT(lo, -0.49);
  EXPECT_GT(hi, 0.49);
}

TEST(RowInitializerTest, NormalHasItsStddev) {
  RowInit init;
  init.kind = RowInit::Kind::kNormal;
  init.scale = 2.0f;
  double sum = 0, sum_sq = 0;
  const int n = 40000;
  for (uint64_t id = 0; id < n / 8; ++id) {
    for (float v : Row(init, "t", id)) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sum_sq += double{v} * v;
    }
  }
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(std::sqrt(sum_sq / n - mean * mean), 2.0, 0.05);
}

TEST(RowInitializerTest, ZerosAreZero) {
  RowInit init;
  init.kind = RowInit::Kind::kZeros;
  for (float v : Row(init, "t", 5)) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace shardtrain::sparse
