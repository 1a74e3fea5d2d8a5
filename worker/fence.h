// Forwarding header: Fence now lives in worker/device/fence.h. It stays only
// for worker/tensor_exchange.h, which still includes this path until the
// exchange moves into the client library (which takes a plain "gradient
// ready" callback instead); include worker/device/fence.h in new code.
//
// Example:
//   #include "worker/device/fence.h"
//   std::unique_ptr<Fence> done = std::make_unique<DoneFence>();
#ifndef SHARDTRAIN_WORKER_FENCE_H_
#define SHARDTRAIN_WORKER_FENCE_H_

#include "worker/device/fence.h"  // IWYU pragma: export

#endif  // SHARDTRAIN_WORKER_FENCE_H_
