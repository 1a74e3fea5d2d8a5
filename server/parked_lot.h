// ParkedLot: the calls a server has parked until they can be answered (a
// pull waiting for its step, a lookup waiting for its step's pushes, a
// committed read waiting for the chain's tail), each with the deadline at
// which it gives up.
//
// The lot only borrows a call: whoever takes one out (Take, TakeExpired,
// Remove, TakeAll) is the one who answers it, so every call is answered
// exactly once. A wake-up cannot be missed: Park checks whether the call
// must still wait under the lot's lock, and Take checks again under it, so
// a state change made before Take is seen by one of the two.
//
//   if (!lot.Park(call, [&] { return !Ready(call); })) Answer(call);
//   ...state changes...
//   for (Call* call : lot.Take([&](const Call* c) { return Ready(c); })) Answer(call);
//
// `Call` has `absl::Time deadline() const`. The size goes to `size_gauge`
// (if not null) whenever it changes. Thread-safe.
#ifndef SHARDTRAIN_SERVER_PARKED_LOT_H_
#define SHARDTRAIN_SERVER_PARKED_LOT_H_

#include <algorithm>
#include <list>
#include <vector>

#include <prometheus/gauge.h>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardtrain::server {

template <typename Call>
class ParkedLot {
 public:
  // `size_gauge` (may be null) is not owned and must outlive the lot.
  explicit ParkedLot(prometheus::Gauge* size_gauge = nullptr) : size_gauge_(size_gauge) {}
  ParkedLot(const ParkedLot&) = delete;
  ParkedLot& operator=(const ParkedLot&) = delete;

  // Parks `call` if `must_wait()` (called under the lot's lock) holds, and
  // returns true; otherwise returns false and the caller answers it.
  bool Park(Call* call, absl::FunctionRef<bool()> must_wait) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!must_wait()) return false;
    calls_.push_back(call);
    SizeChanged();
    return true;
  }

  // Takes out, in parking order, the calls for which `ready(call)` (called
  // under the lot's lock) holds.
  std::vector<Call*> Take(absl::FunctionRef<bool(const Call*)> ready)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return TakeLocked(ready);
  }

  // Takes out the calls whose deadline is at or before `now`.
  std::vector<Call*> TakeExpired(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return TakeLocked([now](const Call* call) { return call->deadline() <= now; });
  }

  // Takes out `call` (its client went away); false if it is not parked
  // (already taken out by someone else, who answers it).
  bool Remove(Call* call) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = std::find(calls_.begin(), calls_.end(), call);
    if (it == calls_.end()) return false;
    calls_.erase(it);
    SizeChanged();
    return true;
  }

  // Takes out every call (shutdown).
  std::vector<Call*> TakeAll() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::vector<Call*> all(calls_.begin(), calls_.end());
    calls_.clear();
    SizeChanged();
    return all;
  }

  size_t size() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return calls_.size();
  }

 private:
  std::vector<Call*> TakeLocked(absl::FunctionRef<bool(const Call*)> take)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Call*> taken;
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (take(*it)) {
        taken.push_back(*it);
        it = calls_.erase(it);
      } else {
        ++it;
      }
    }
    if (!taken.empty()) SizeChanged();
    return taken;
  }

  void SizeChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (size_gauge_ != nullptr) size_gauge_->Set(static_cast<double>(calls_.size()));
  }

  prometheus::Gauge* const size_gauge_;
  mutable absl::Mutex mu_;
  std::list<Call*> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_PARKED_LOT_H_
