// Process-wide malloc settings for processes that move large messages.
//
// By default glibc serves allocations above 128 KiB-32 MiB with fresh mmap
// and gives freed memory back to the kernel, so every multi-megabyte gRPC
// message buffer is page-faulted in again (about a million faults per 4 s of
// 64 MiB pushes were measured; throughput roughly doubled without them, for
// raw gRPC too). Keeping such buffers in the heap trades a higher resident
// peak for that.
#ifndef SHARDTRAIN_COMMON_MALLOC_TUNING_H_
#define SHARDTRAIN_COMMON_MALLOC_TUNING_H_

namespace shardtrain::common {

// Call once at the start of main, before threads start.
void KeepLargeBuffersInHeap();

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_MALLOC_TUNING_H_
