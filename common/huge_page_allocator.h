// HugePageAllocator<T>: a standard allocator whose blocks of 2 MiB and more
// are 2 MiB aligned and marked as transparent-huge-page candidates
// (madvise(MADV_HUGEPAGE), what Debian's default THP mode, "madvise", asks
// for). Smaller blocks come from the default allocator.
//
// For large buffers that are written once in full, such as a worker's
// training set (Fashion-MNIST is 188 MB of floats): with 4 KiB pages every
// page's first write is a page fault, and on a virtual machine with a
// paravirtualised MMU the 46k faults of that buffer cost 0.5-1 s of CPU
// per worker start, more than decompressing the data. With huge pages they
// are 90.
//
//   std::vector<float, HugePageAllocator<float>> features(n * dim);
//
// Stateless: every instance can free what any other allocated.
#ifndef SHARDTRAIN_COMMON_HUGE_PAGE_ALLOCATOR_H_
#define SHARDTRAIN_COMMON_HUGE_PAGE_ALLOCATOR_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>

namespace shardtrain {

template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;
  static constexpr size_t kHugePage = size_t{2} << 20;

  HugePageAllocator() noexcept = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    if (n > std::numeric_limits<size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) return std::allocator<T>().allocate(n);
    if (bytes > std::numeric_limits<size_t>::max() - kHugePage) throw std::bad_alloc();
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* block = std::aligned_alloc(kHugePage, rounded);
    if (block == nullptr) throw std::bad_alloc();
    // Only advice: a kernel without THP refuses it and the block stays usable.
    (void)madvise(block, rounded, MADV_HUGEPAGE);
    return static_cast<T*>(block);
  }

  void deallocate(T* block, size_t n) noexcept {
    if (n * sizeof(T) < kHugePage) {
      std::allocator<T>().deallocate(block, n);
    } else {
      std::free(block);
    }
  }

  friend bool operator==(const HugePageAllocator&, const HugePageAllocator&) { return true; }
  friend bool operator!=(const HugePageAllocator&, const HugePageAllocator&) { return false; }
};

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_HUGE_PAGE_ALLOCATOR_H_
