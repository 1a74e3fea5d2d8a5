#include "sparse/huge_page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>
#include <utility>

namespace shardtrain::sparse {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

HugePageBuffer::HugePageBuffer(size_t bytes) {
  if (bytes == 0) return;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Below a huge page there is nothing to gain: plain pages, no padding.
  const size_t align = bytes >= kHugePage ? kHugePage : page;
  size_ = RoundUp(bytes, align);
  // Over-map by one alignment and trim, so that the buffer starts on a
  // huge-page boundary (the kernel backs only aligned 2 MiB ranges with
  // huge pages). MAP_NORESERVE: address space only until written.
  const size_t mapped = size_ + (align > page ? align : 0);
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    size_ = 0;
    throw std::bad_alloc();
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, align);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = aligned + size_;
  if (start + mapped > end) munmap(reinterpret_cast<void*>(end), start + mapped - end);
  data_ = reinterpret_cast<void*>(aligned);
  // Advice only: where the kernel has THP off, this fails and the buffer
  // works on plain pages.
  if (align == kHugePage) (void)madvise(data_, size_, MADV_HUGEPAGE);
}

HugePageBuffer::~HugePageBuffer() {
  if (data_ != nullptr) munmap(data_, size_);
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace shardtrain::sparse
