// Membership: which workers are alive and how far each has got.
//
// Workers announce themselves with heartbeats and pushes, carrying their
// clock (steps finished). A worker silent for longer than the timeout is
// forgotten; a worker that says it is done no longer holds others back.
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_MEMBERSHIP_H_
#define SHARDTRAIN_SERVER_MEMBERSHIP_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::server {

class Membership {
 public:
  Membership(int num_workers, absl::Duration timeout);

  // Records that `worker` is alive at `now` with `clock` steps done; a
  // clock never moves backwards. Returns true if the slowest live clock or
  // the live set changed. REQUIRES: 0 <= worker < num_workers.
  bool Update(int worker, int64_t clock, bool done, absl::Time now);

  // Forgets workers silent since before now - timeout. Returns true if any
  // was forgotten.
  bool Expire(absl::Time now);

  // The smallest clock among workers that may still push: those live and not
  // done, plus those never seen (clock 0), so a late starter holds others
  // back. nullopt when no such worker is left.
  std::optional<int64_t> SlowestActiveClock() const;

  // Workers seen and not yet forgotten or done.
  int LiveCount() const;
  // Workers that may still contribute a gradient to sync step `step`: not
  // forgotten, and either not done or done after finishing that step.
  // Workers never seen count, since they may simply start late.
  int ContributorsForStep(int64_t step) const;

  std::vector<WorkerState> Snapshot(absl::Time now) const;

  int num_workers() const { return num_workers_; }

 private:
  struct Worker {
    bool seen = false;
    bool expired = false;
    bool done = false;
    int64_t clock = 0;
    absl::Time last_seen;
  };

  const int num_workers_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  std::vector<Worker> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_MEMBERSHIP_H_
