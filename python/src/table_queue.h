// TableQueue: runs a client's sparse-table calls (register, lookup, push)
// one at a time, in the order they were added, on a thread of its own.
//
// A caller adds a lookup or a push and goes on computing while it runs:
// the dense half of a step (forward, backward, the dense push and pull)
// overlaps the table calls. The shards still see this worker's table calls
// in the order it made them, so a lookup added after a push reads the
// pushed rows (async tables) or waits for the push's step (sync tables)
// exactly as it would had it been called after the push returned.
//
//   TableQueue queue;
//   std::shared_ptr<const TableQueue::Call> push =
//       queue.Add([&](client::TableCallStats* stats) {
//         return tables->Push(name, ids, grads, clock, stats);
//       });
//   ...                      // compute
//   push->Wait();
//   if (!push->status().ok()) ...
//
// Thread-safe. The thread starts with the first Add. Close() (and the
// destructor) runs every call added before it, then stops the thread;
// calls added after it fail with FAILED_PRECONDITION without running.
#ifndef SHARDTRAIN_PYTHON_SRC_TABLE_QUEUE_H_
#define SHARDTRAIN_PYTHON_SRC_TABLE_QUEUE_H_

#include <deque>
#include <memory>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/table_client.h"

namespace shardtrain::python {

class TableQueue {
 public:
  // One added call: done once it has run (or was refused).
  class Call {
   public:
    bool done() const { return done_.HasBeenNotified(); }
    // Blocks until done.
    void Wait() const { done_.WaitForNotification(); }
    // REQUIRES: done().
    const absl::Status& status() const { return status_; }
    const client::TableCallStats& stats() const { return stats_; }

   private:
    friend class TableQueue;
    absl::Status status_;
    client::TableCallStats stats_;
    absl::Notification done_;
  };
  // The work of one call: its status, its stats into the argument.
  using Fn = absl::AnyInvocable<absl::Status(client::TableCallStats*)>;

  TableQueue() = default;
  // Close().
  ~TableQueue();
  TableQueue(const TableQueue&) = delete;
  TableQueue& operator=(const TableQueue&) = delete;

  // Runs `fn` after every call added before it.
  std::shared_ptr<const Call> Add(Fn fn) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs what was added, then stops. Idempotent.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasWorkOrClosed() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<std::pair<Fn, std::shared_ptr<Call>>> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::python

#endif  // SHARDTRAIN_PYTHON_SRC_TABLE_QUEUE_H_
