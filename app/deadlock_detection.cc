#include "app/deadlock_detection.h"

#include "absl/synchronization/mutex.h"

namespace shardtrain::app {

void SkipDeadlockDetectionInRelease() {
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace shardtrain::app
