#include "sparse/huge_page_buffer.h"

#include <cstdint>
#include <utility>

#include "gtest/gtest.h"

namespace shardtrain::sparse {
namespace {

TEST(HugePageBufferTest, ZeroFilledAlignedAndRoundedUp) {
  HugePageBuffer small(100);
  ASSERT_NE(small.as<uint8_t>(), nullptr);
  EXPECT_GE(small.size(), 100u);
  EXPECT_LT(small.size(), HugePageBuffer::kHugePage) << "a small buffer is not padded to 2 MiB";

  const size_t bytes = 3 * HugePageBuffer::kHugePage + 12345;
  HugePageBuffer large(bytes);
  EXPECT_EQ(large.size(), 4 * HugePageBuffer::kHugePage);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.as<uint8_t>()) % HugePageBuffer::kHugePage, 0u);
  const uint64_t* words = large.as<uint64_t>();
  for (size_t i = 0; i < bytes / 8; i += 4099) ASSERT_EQ(words[i], 0u) << i;
  large.as<uint64_t>()[bytes / 8 - 1] = 7;  // the last byte asked for is writable
  EXPECT_EQ(large.as<uint64_t>()[bytes / 8 - 1], 7u);
}

TEST(HugePageBufferTest, MovesOwnership) {
  HugePageBuffer a(HugePageBuffer::kHugePage);
  a.as<uint32_t>()[0] = 42;
  HugePageBuffer b(std::move(a));
  EXPECT_EQ(a.as<uint32_t>(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.as<uint32_t>()[0], 42u);
  HugePageBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.as<uint32_t>()[0], 42u);
  EXPECT_EQ(HugePageBuffer(0).size(), 0u);
}

}  // namespace
}  // namespace shardtrain::sparse
