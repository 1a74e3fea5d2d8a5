#include "common/huge_page_allocator.h"

#include <cstdint>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardtrain {
namespace {

using HugeFloats = std::vector<float, HugePageAllocator<float>>;

// The VmFlags line of the /proc/self/smaps mapping that holds `address`.
std::string VmFlagsOf(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(HugePageAllocatorTest, LargeBlocksAreAlignedAndAdvised) {
  HugeFloats values(3 * HugePageAllocator<float>::kHugePage / sizeof(float) + 7);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(values.data()) % HugePageAllocator<float>::kHugePage, 0u);
  std::iota(values.begin(), values.end(), 0.0f);
  EXPECT_EQ(values.back(), static_cast<float>(values.size() - 1));
  // The kernel records the advice on the mapping ("hg") where it has
  // transparent huge pages at all.
  if (std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good()) {
    EXPECT_NE(VmFlagsOf(values.data()).find(" hg"), std::string::npos) << VmFlagsOf(values.data());
  }
}

TEST(HugePageAllocatorTest, SmallBlocksAndGrowthKeepTheirValues) {
  HugeFloats values;
  for (int i = 0; i < 1 << 20; ++i) values.push_back(static_cast<float>(i));  // 4 MiB, crossing 2 MiB
  for (int i = 0; i < 1 << 20; i += 4097) ASSERT_EQ(values[i], static_cast<float>(i));
  HugeFloats copy = values;
  EXPECT_EQ(copy, values);
  copy.resize(10);
  copy.shrink_to_fit();
  EXPECT_EQ(copy.back(), 9.0f);
}

TEST(HugePageAllocatorTest, ImpossibleSizesThrowLikeNew) {
  HugePageAllocator<double> allocator;
  EXPECT_THROW((void)allocator.allocate(std::numeric_limits<size_t>::max() / 4), std::bad_array_new_length);
  EXPECT_THROW((void)allocator.allocate(std::numeric_limits<size_t>::max() / sizeof(double) - 1),
               std::bad_alloc);
}

}  // namespace
}  // namespace shardtrain
