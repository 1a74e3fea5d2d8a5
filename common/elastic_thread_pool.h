// ElasticThreadPool: threads for tasks that may wait a long while (a chain
// member's forward waiting for the operations before it,
// server/replication/replicator.h), so that the thread that received them
// (a data connection's only reader, a gRPC callback thread) goes on.
//
// A task runs at once on a thread of its own: an idle one, or one started
// for it while fewer than max_threads exist. With max_threads busy, TryRun
// refuses it (false) and the caller answers "busy, retry": the pool never
// queues a task it cannot start, so a task never waits behind tasks that
// may themselves be waiting for something still to come. Threads are kept
// for the pool's life; the destructor waits for the tasks running.
//
//   ElasticThreadPool pool(64);
//   if (!pool.TryRun([call] { Serve(call); })) Refuse(call);
//
// Thread-safe.
#ifndef SHARDTRAIN_COMMON_ELASTIC_THREAD_POOL_H_
#define SHARDTRAIN_COMMON_ELASTIC_THREAD_POOL_H_

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace shardtrain::common {

class ElasticThreadPool {
 public:
  // max_threads >= 1.
  explicit ElasticThreadPool(int max_threads);
  // Waits for the tasks running, then joins the threads.
  ~ElasticThreadPool();
  ElasticThreadPool(const ElasticThreadPool&) = delete;
  ElasticThreadPool& operator=(const ElasticThreadPool&) = delete;

  // Runs `task` on a thread of the pool (see the file comment); false,
  // with `task` dropped unrun, when max_threads are busy.
  bool TryRun(absl::AnyInvocable<void() &&> task) ABSL_LOCKS_EXCLUDED(mu_);

  // Threads started so far, and those running a task (or about to).
  int threads() const ABSL_LOCKS_EXCLUDED(mu_);
  int busy() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const int max_threads_;
  mutable absl::Mutex mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  // Tasks handed over and not taken by a thread yet: never more than the
  // threads without a task.
  std::deque<absl::AnyInvocable<void() &&>> handed_ ABSL_GUARDED_BY(mu_);
  int busy_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_ELASTIC_THREAD_POOL_H_
