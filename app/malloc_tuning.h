// Process-wide malloc settings for processes that move large messages.
//
// By default glibc serves allocations above 128 KiB-32 MiB with fresh mmap
// and gives freed memory back to the kernel, so every multi-megabyte gRPC
// message buffer is page-faulted in again (about a million faults per 4 s of
// 64 MiB pushes were measured; throughput roughly doubled without them, for
// raw gRPC too). Keeping such buffers in the heap trades a higher resident
// peak for that.
#ifndef SHARDTRAIN_APP_MALLOC_TUNING_H_
#define SHARDTRAIN_APP_MALLOC_TUNING_H_

namespace shardtrain::app {

// Call once at the start of main, before threads start.
void KeepLargeBuffersInHeap();

}  // namespace shardtrain::app

#endif  // SHARDTRAIN_APP_MALLOC_TUNING_H_
