#include "server/membership.h"

#include <algorithm>

namespace shardtrain::server {

Membership::Membership(int num_workers, absl::Duration timeout)
    : num_workers_(num_workers), timeout_(timeout), workers_(num_workers) {}

bool Membership::Update(int worker, int64_t clock, bool done, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Worker& w = workers_[worker];
  const bool changed = !w.seen || w.expired || clock > w.clock || done != w.done;
  w.seen = true;
  w.expired = false;
  w.done = w.done || done;
  w.clock = std::max(w.clock, clock);
  w.last_seen = now;
  return changed;
}

bool Membership::Expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  bool any = false;
  for (Worker& w : workers_) {
    if (w.seen && !w.expired && !w.done && now - w.last_seen > timeout_) {
      w.expired = true;
      any = true;
    }
  }
  return any;
}

std::optional<int64_t> Membership::SlowestActiveClock() const {
  absl::MutexLock lock(&mu_);
  std::optional<int64_t> slowest;
  for (const Worker& w : workers_) {
    if (w.expired || w.done) continue;
    const int64_t clock = w.seen ? w.clock : 0;
    if (!slowest || clock < *slowest) slowest = clock;
  }
  return slowest;
}

int Membership::LiveCount() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(
      workers_.begin(), workers_.end(),
      [](const Worker& w) { return w.seen && !w.expired && !w.done; }));
}

int Membership::ContributorsForStep(int64_t step) const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(
      workers_.begin(), workers_.end(), [step](const Worker& w) {
        return !w.expired && (!w.done || w.clock > step);
      }));
}

std::vector<WorkerState> Membership::Snapshot(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerState> states;
  for (int i = 0; i < num_workers_; ++i) {
    const Worker& w = workers_[i];
    if (!w.seen) continue;
    WorkerState state;
    state.set_worker(i);
    state.set_clock(w.clock);
    state.set_live(!w.expired);
    state.set_done(w.done);
    state.set_seconds_since_heartbeat(absl::ToDoubleSeconds(now - w.last_seen));
    states.push_back(std::move(state));
  }
  return states;
}

}  // namespace shardtrain::server
