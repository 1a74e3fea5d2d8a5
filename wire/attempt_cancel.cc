#include "wire/attempt_cancel.h"

#include <utility>

namespace shardtrain::wire {

void AttemptCancel::OnCancel(std::function<void()> cancel) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_) {
      cancel_ = std::move(cancel);
      return;
    }
  }
  cancel();
}

void AttemptCancel::Cancel() {
  std::function<void()> cancel;
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return;
    cancelled_ = true;
    cancel = std::move(cancel_);
  }
  if (cancel) cancel();
}

}  // namespace shardtrain::wire
