// --buffer_pool_mb, shared by ps-server and ps-worker: how many MiB of
// released message buffers and large frame bodies the process keeps for
// reuse (wire::BufferPool::Default()). Past it, released buffers go back to
// the kernel, and the next large message faults its pages in again.
//
//   RETURN_IF_ERROR(app::ApplyBufferPoolFlag());  // after ParseFlags
#ifndef SHARDTRAIN_APP_BUFFER_POOL_FLAG_H_
#define SHARDTRAIN_APP_BUFFER_POOL_FLAG_H_

#include "absl/status/status.h"

namespace shardtrain::app {

// Sets the process-wide pool's bound from --buffer_pool_mb; InvalidArgument
// (and nothing set) when the flag is negative or above 1 TiB.
absl::Status ApplyBufferPoolFlag();

}  // namespace shardtrain::app

#endif  // SHARDTRAIN_APP_BUFFER_POOL_FLAG_H_
