// EventLog: collects what a Watcher delivers (on its thread) for a test
// thread to wait on.
//
//   EventLog log;
//   auto watcher = client->Watch("/w/", 0, [&](const WatchEvent& e) { log.Add(e); });
//   std::vector<WatchEvent> events = log.WaitFor(3, absl::Seconds(3));
//
// Thread-safe.
#ifndef SHARDTRAIN_ETCD_TESTING_EVENT_LOG_H_
#define SHARDTRAIN_ETCD_TESTING_EVENT_LOG_H_

#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcd/watcher.h"

namespace shardtrain::etcd::testing {

class EventLog {
 public:
  void Add(const WatchEvent& event) {
    absl::MutexLock lock(&mu_);
    events_.push_back(event);
  }
  // The events once there are at least n (fewer when the time ran out).
  std::vector<WatchEvent> WaitFor(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return events_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return events_;
  }

 private:
  absl::Mutex mu_;
  std::vector<WatchEvent> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::etcd::testing

#endif  // SHARDTRAIN_ETCD_TESTING_EVENT_LOG_H_
