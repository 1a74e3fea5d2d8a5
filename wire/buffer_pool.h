// BufferPool: recycled memory blocks for the payloads of outgoing messages
// and for the bodies of large frames read from a data connection
// (wire/frame_socket.h).
//
// A server answering a steady stream of large pulls, or reading large
// pushes, would otherwise allocate, fault in and free the same tens of
// megabytes on every call (glibc serves large allocations with fresh mmaps;
// see app/malloc_tuning.h). Blocks come in power-of-two size classes and go
// back to a free list of their class when released, while the pool keeps at
// most a bounded number of bytes; past that, released blocks are freed.
//
//   char* block = pool.Allocate(bytes);   // at least `bytes`, 64-byte aligned
//   ... write, send (the slice's destroy callback releases it) ...
//   BufferPool::Release(block);
//
// Thread-safe.
#ifndef SHARDTRAIN_WIRE_BUFFER_POOL_H_
#define SHARDTRAIN_WIRE_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardtrain::wire {

class BufferPool {
 public:
  // Bytes the process-wide pool keeps at most, unless a binary's
  // --buffer_pool_mb (app/buffer_pool_flag.h) says otherwise.
  static constexpr size_t kDefaultMaxKeptBytes = size_t{512} << 20;

  // Keeps at most `max_kept_bytes` of released blocks for reuse.
  explicit BufferPool(size_t max_kept_bytes);
  // Frees the kept blocks. REQUIRES: every block allocated was released.
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // The process-wide pool (kDefaultMaxKeptBytes until set_max_kept_bytes);
  // never destroyed.
  static BufferPool& Default();

  // Keeps at most `bytes` from now on; kept blocks past it are freed now,
  // the largest first. 0 keeps nothing.
  void set_max_kept_bytes(size_t bytes);
  size_t max_kept_bytes() const;

  // A block of at least `bytes` bytes (its size class), 64-byte aligned;
  // owned by the caller until Release.
  char* Allocate(size_t bytes);
  // Gives a block from Allocate back to the pool it came from.
  static void Release(char* block);

  struct Stats {
    int64_t allocated = 0;  // blocks allocated fresh
    int64_t reused = 0;     // blocks served from a free list
    int64_t freed = 0;      // released blocks freed (over the bound)
    size_t kept_bytes = 0;  // bytes in the free lists now
  };
  Stats stats() const;

 private:
  struct BlockHeader;
  static constexpr int kMinClass = 8;    // 256 bytes
  static constexpr int kMaxClass = 40;   // larger blocks are never kept
  static size_t ClassBytes(int size_class) { return size_t{1} << size_class; }

  void Put(char* block, int size_class);

  mutable absl::Mutex mu_;
  size_t max_kept_bytes_ ABSL_GUARDED_BY(mu_);
  std::vector<char*> free_[kMaxClass + 1] ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_BUFFER_POOL_H_
