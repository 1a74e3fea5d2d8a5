// AttemptCancel: cancels one attempt of a call (a worker's ShardRpc,
// client/shard_channel.h; a chain member's forward,
// server/replication/forwarder.h) that runs on a transport its
// grpc::ClientContext does not reach: a call on a shard's data port
// (wire/frame_channel.h). The attempt registers how to cancel it in the
// phase it is in (waiting for its connection, then sent); AbandonDeparted
// (either's) cancels it together with its context. Either may come first: a
// cancel that comes before a registration runs the registered callback at
// once.
//
//   auto cancel = std::make_shared<AttemptCancel>();  // per routed attempt
//   frames->Call(..., done, cancel.get());  // registers frames->Cancel(id)
//   ...
//   cancel->Cancel();  // another thread: runs frames->Cancel(id) once
//
// Cancel runs the callback registered last, once, outside the object's
// lock, on the thread of whichever call came second; a registration after
// the cancel runs its own callback at once too. Thread-safe.
#ifndef SHARDTRAIN_WIRE_ATTEMPT_CANCEL_H_
#define SHARDTRAIN_WIRE_ATTEMPT_CANCEL_H_

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardtrain::wire {

class AttemptCancel {
 public:
  AttemptCancel() = default;
  AttemptCancel(const AttemptCancel&) = delete;
  AttemptCancel& operator=(const AttemptCancel&) = delete;

  // How to cancel the attempt from now on (it replaces the earlier
  // registration); runs `cancel` now if Cancel() came first.
  void OnCancel(std::function<void()> cancel) ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels the attempt: runs the registered callback, or the one
  // registered later. Later calls do nothing.
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> cancel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_ATTEMPT_CANCEL_H_
