// HugePageBuffer: zero-filled anonymous memory for a table's rows and its
// index, which the kernel backs with 2 MiB transparent huge pages where it
// can (madvise(MADV_HUGEPAGE), which is what Debian's default THP mode,
// "madvise", asks for). A table of 10^7 rows spans about 900 MB that every
// lookup touches at random; with 4 KiB pages nearly every record and index
// slot read also misses the TLB and walks the page table, which cost more
// than the reads themselves (bench/sparse_table_bench: row-wise Adagrad
// applies 9.7 -> 17.3 M rows/s, lookups 22 -> 31 M ids/s with huge pages on
// a 2-core AMD EPYC). Pages are touched, and count in the RSS, only as they
// are written; the mapping itself is only address space.
//
//   HugePageBuffer slots(n * sizeof(uint64_t));   // all zero
//   uint64_t* s = slots.as<uint64_t>();
//
// Move-only; not thread-safe (the owner serialises access).
#ifndef SHARDTRAIN_SPARSE_HUGE_PAGE_BUFFER_H_
#define SHARDTRAIN_SPARSE_HUGE_PAGE_BUFFER_H_

#include <cstddef>

namespace shardtrain::sparse {

class HugePageBuffer {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;

  HugePageBuffer() = default;
  // At least `bytes` bytes, 2 MiB aligned; throws std::bad_alloc when the
  // address space cannot be had (as new does).
  explicit HugePageBuffer(size_t bytes);
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  template <typename T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }
  // The bytes mapped (the size asked for, rounded up to whole pages).
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace shardtrain::sparse

#endif  // SHARDTRAIN_SPARSE_HUGE_PAGE_BUFFER_H_
