// Process-wide switch for Abseil's mutex deadlock detection.
//
// Debian's Abseil is built without NDEBUG, so by default every absl::Mutex
// acquisition updates a global lock-order graph (a hash-table lookup under a
// global lock) and a process that ever takes two locks in both orders
// aborts. That is what tests want; a release binary should not pay for it
// on every partition lock of every push and pull.
#ifndef SHARDTRAIN_APP_DEADLOCK_DETECTION_H_
#define SHARDTRAIN_APP_DEADLOCK_DETECTION_H_

namespace shardtrain::app {

// In a release build (NDEBUG) turns deadlock detection off; otherwise does
// nothing, so debug builds keep it. Call first thing in main, before any
// thread starts. Test binaries do not call it and keep detection on.
void SkipDeadlockDetectionInRelease();

}  // namespace shardtrain::app

#endif  // SHARDTRAIN_APP_DEADLOCK_DETECTION_H_
