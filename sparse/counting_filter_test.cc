#include "sparse/counting_filter.h"

#include <limits>
#include <string>

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

TEST(CountingFilterTest, ExportImportRoundTrips) {
  CountingFilter a(1 << 10), b(1 << 10);
  for (uint64_t id = 0; id < 300; ++id) {
    for (uint64_t k = 0; k <= id % 5; ++k) a.Add(id);
  }
  std::string bytes;
  a.Export(&bytes);
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), a.bytes());
  ASSERT_TRUE(b.Import(bytes).ok());
  for (uint64_t id = 0; id < 400; ++id) EXPECT_EQ(a.Estimate(id), b.Estimate(id)) << id;
  // A wrong size is refused and leaves the counters as they were.
  EXPECT_EQ(b.Import(bytes + "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Estimate(4), a.Estimate(4));
}

TEST(CountingFilterTest, ImportsInPieces) {
  CountingFilter a(1 << 10), b(1 << 10);
  for (uint64_t id = 0; id < 300; ++id) {
    for (uint64_t k = 0; k <= id % 7; ++k) a.Add(id);
  }
  std::string bytes;
  a.Export(&bytes);
  const int64_t total = static_cast<int64_t>(bytes.size());
  // Pieces of 100 bytes, in any order (the last one shorter).
  for (int64_t offset = total - total % 100; offset >= 0; offset -= 100) {
    ASSERT_TRUE(b.ImportPiece(absl::string_view(bytes).substr(offset, 100), offset, total).ok())
        << offset;
  }
  for (uint64_t id = 0; id < 400; ++id) EXPECT_EQ(a.Estimate(id), b.Estimate(id)) << id;
  // A piece of a filter of another size, one reaching past the end or at a
  // negative offset is refused and changes nothing.
  CountingFilter c(1 << 10);
  const absl::string_view piece = absl::string_view(bytes).substr(0, 64);
  EXPECT_EQ(c.ImportPiece(piece, 0, total * 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ImportPiece(piece, total - 32, total).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ImportPiece(piece, -8, total).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.ImportPiece(piece, std::numeric_limits<int64_t>::max(), total).code(),
            absl::StatusCode::kInvalidArgument);
  for (uint64_t id = 0; id < 400; ++id) EXPECT_EQ(c.Estimate(id), 0) << id;
}

}  // namespace
}  // namespace shardtrain::sparse
