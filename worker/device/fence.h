// Fence: the completion of work a backend runs asynchronously, such as a copy
// of a gradient to the host that proceeds while the next layer computes.
//
// Thread-safe: Wait may be called from any thread (e.g. the thread that sends
// the copied gradient) and more than once; it always returns the same status.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<Fence> copied,
//                    backend->CopyToHostAsync(grad, 0, staging));
//   ... queue more work ...
//   RETURN_IF_ERROR(copied->Wait());  // staging now holds the gradient
#ifndef SHARDTRAIN_WORKER_DEVICE_FENCE_H_
#define SHARDTRAIN_WORKER_DEVICE_FENCE_H_

#include <utility>

#include "absl/status/status.h"

namespace shardtrain::worker {

class Fence {
 public:
  virtual ~Fence() = default;
  Fence(const Fence&) = delete;
  Fence& operator=(const Fence&) = delete;

  // Blocks until the work has finished; its error, if it failed.
  virtual absl::Status Wait() = 0;

 protected:
  Fence() = default;
};

// A fence for work that finished before the fence was made (synchronous
// backends).
class DoneFence final : public Fence {
 public:
  explicit DoneFence(absl::Status status = absl::OkStatus())
      : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  const absl::Status status_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DEVICE_FENCE_H_
