#include "common/deadlock_detection.h"

#include "absl/synchronization/mutex.h"

namespace shardtrain::common {

void SkipDeadlockDetectionInRelease() {
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace shardtrain::common
