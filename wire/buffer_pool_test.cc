#include "wire/buffer_pool.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace shardtrain::wire {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(BufferPoolTest, AReleasedBlockServesTheNextAllocationOfItsClass) {
  BufferPool pool(8 * kMiB);
  char* first = pool.Allocate(kMiB - 100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
  std::memset(first, 1, kMiB);  // the whole class is the caller's
  BufferPool::Release(first);
  EXPECT_EQ(pool.stats().kept_bytes, kMiB);
  char* second = pool.Allocate(kMiB);
  EXPECT_EQ(second, first);
  char* larger = pool.Allocate(kMiB + 1);  // the next class: a fresh block
  EXPECT_NE(larger, first);
  const BufferPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.allocated, 2);
  EXPECT_EQ(stats.reused, 1);
  EXPECT_EQ(stats.kept_bytes, 0u);
  BufferPool::Release(second);
  BufferPool::Release(larger);
}

TEST(BufferPoolTest, KeepsAtMostItsBound) {
  BufferPool pool(3 * 4096);
  std::vector<char*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(pool.Allocate(3000 + i));
  for (char* block : blocks) BufferPool::Release(block);
  BufferPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.allocated, 5);
  EXPECT_EQ(stats.kept_bytes, 3u * 4096);
  EXPECT_EQ(stats.freed, 2);
  // Another class is allocated fresh; the same class is reused.
  BufferPool::Release(pool.Allocate(100));
  BufferPool::Release(pool.Allocate(4096));
  stats = pool.stats();
  EXPECT_EQ(stats.allocated, 6);
  EXPECT_EQ(stats.reused, 1);
}

TEST(BufferPoolTest, ALowerBoundFreesKeptBlocksLargestFirst) {
  BufferPool pool(64 * kMiB);
  EXPECT_EQ(pool.max_kept_bytes(), 64 * kMiB);
  char* large = pool.Allocate(16 * kMiB);
  char* small[4];
  for (char*& block : small) block = pool.Allocate(kMiB);
  BufferPool::Release(large);
  for (char* block : small) BufferPool::Release(block);
  ASSERT_EQ(pool.stats().kept_bytes, 20 * kMiB);

  pool.set_max_kept_bytes(8 * kMiB);
  EXPECT_EQ(pool.max_kept_bytes(), 8 * kMiB);
  BufferPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.kept_bytes, 4 * kMiB);  // the 16 MiB block went, the four 1 MiB stay
  EXPECT_EQ(stats.freed, 1);
  char* again = pool.Allocate(kMiB);
  EXPECT_EQ(pool.stats().reused, 1);
  BufferPool::Release(again);

  // The new bound holds for later releases too.
  char* big = pool.Allocate(8 * kMiB);
  BufferPool::Release(big);
  stats = pool.stats();
  EXPECT_EQ(stats.kept_bytes, 4 * kMiB);
  EXPECT_EQ(stats.freed, 2);
}

TEST(BufferPoolTest, ABoundOfZeroKeepsNothing) {
  BufferPool pool(16 * kMiB);
  char* block = pool.Allocate(kMiB);
  BufferPool::Release(block);
  pool.set_max_kept_bytes(0);
  EXPECT_EQ(pool.stats().kept_bytes, 0u);
  block = pool.Allocate(kMiB);
  BufferPool::Release(block);
  const BufferPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.kept_bytes, 0u);
  EXPECT_EQ(stats.allocated, 2);
  EXPECT_EQ(stats.freed, 2);
}

}  // namespace
}  // namespace shardtrain::wire
