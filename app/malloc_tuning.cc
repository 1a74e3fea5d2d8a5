#include "app/malloc_tuning.h"

#include <malloc.h>

namespace shardtrain::app {

void KeepLargeBuffersInHeap() {
  // Allocations up to 32 MiB come from the heap (mmap above), and freed heap
  // memory is not trimmed back to the kernel.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace shardtrain::app
