#include "wire/buffer_pool.h"

#include <algorithm>
#include <new>

namespace shardtrain::wire {

// Lies in the 64 bytes before each block.
struct BufferPool::BlockHeader {
  BufferPool* pool;
  int size_class;
};

namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kHeaderBytes = 64;
static_assert(kHeaderBytes >= sizeof(void*) + sizeof(int));

char* AllocateRaw(size_t bytes) {
  return static_cast<char*>(::operator new(kHeaderBytes + bytes, std::align_val_t(kAlignment)));
}

void FreeRaw(char* block) {
  ::operator delete(block - kHeaderBytes, std::align_val_t(kAlignment));
}

}  // namespace

BufferPool::BufferPool(size_t max_kept_bytes) : max_kept_bytes_(max_kept_bytes) {}

BufferPool::~BufferPool() {
  absl::MutexLock lock(&mu_);
  for (std::vector<char*>& blocks : free_) {
    for (char* block : blocks) FreeRaw(block);
    blocks.clear();
  }
}

BufferPool& BufferPool::Default() {
  static BufferPool* const pool = new BufferPool(kDefaultMaxKeptBytes);
  return *pool;
}

char* BufferPool::Allocate(size_t bytes) {
  int size_class = kMinClass;
  while (size_class < kMaxClass && ClassBytes(size_class) < bytes) ++size_class;
  char* block = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (ClassBytes(size_class) >= bytes && !free_[size_class].empty()) {
      block = free_[size_class].back();
      free_[size_class].pop_back();
      stats_.kept_bytes -= ClassBytes(size_class);
      ++stats_.reused;
    } else {
      ++stats_.allocated;
    }
  }
  if (block == nullptr) {
    // Past the largest class the block is exactly as large as asked and
    // freed on release.
    const bool pooled = ClassBytes(size_class) >= bytes;
    block = AllocateRaw(pooled ? ClassBytes(size_class) : bytes) + kHeaderBytes;
    auto* header = reinterpret_cast<BlockHeader*>(block - kHeaderBytes);
    header->pool = this;
    header->size_class = pooled ? size_class : -1;
  }
  return block;
}

void BufferPool::Release(char* block) {
  const auto* header = reinterpret_cast<const BlockHeader*>(block - kHeaderBytes);
  header->pool->Put(block, header->size_class);
}

void BufferPool::Put(char* block, int size_class) {
  {
    absl::MutexLock lock(&mu_);
    if (size_class >= 0 && stats_.kept_bytes + ClassBytes(size_class) <= max_kept_bytes_) {
      free_[size_class].push_back(block);
      stats_.kept_bytes += ClassBytes(size_class);
      return;
    }
    ++stats_.freed;
  }
  FreeRaw(block);
}

void BufferPool::set_max_kept_bytes(size_t bytes) {
  std::vector<char*> over;
  {
    absl::MutexLock lock(&mu_);
    max_kept_bytes_ = bytes;
    for (int size_class = kMaxClass; size_class >= kMinClass && stats_.kept_bytes > bytes;
         --size_class) {
      std::vector<char*>& blocks = free_[size_class];
      while (!blocks.empty() && stats_.kept_bytes > bytes) {
        over.push_back(blocks.back());
        blocks.pop_back();
        stats_.kept_bytes -= ClassBytes(size_class);
        ++stats_.freed;
      }
    }
  }
  for (char* block : over) FreeRaw(block);
}

size_t BufferPool::max_kept_bytes() const {
  absl::MutexLock lock(&mu_);
  return max_kept_bytes_;
}

BufferPool::Stats BufferPool::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace shardtrain::wire
