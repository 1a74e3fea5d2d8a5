#include "server/membership.h"

#include <algorithm>

#include <glog/logging.h>

namespace shardtrain::server {

Membership::Membership(int num_workers, absl::Duration timeout,
                       absl::Duration join_timeout, absl::Time start)
    : num_workers_(num_workers),
      timeout_(timeout),
      join_timeout_(join_timeout),
      start_(start),
      workers_(num_workers) {}

Membership::Join Membership::Revive(int worker, Worker& w, uint64_t incarnation,
                                    absl::Time now, int64_t rejoin_step,
                                    bool* dropped) {
  Join join = Join::kNone;
  // Dropped: sync steps under way went on without it.
  const bool was_dropped = w.expired || w.given_up;
  *dropped = was_dropped;
  if (!w.seen) {
    join = Join::kFirst;
    LOG(INFO) << "worker " << worker << " joined (incarnation " << incarnation
              << ") " << absl::FormatDuration(now - start_)
              << " after the shard started"
              << (w.given_up ? ", after it had been given up on" : "");
  } else if (incarnation != 0 && w.incarnation != 0 &&
             incarnation != w.incarnation) {
    join = Join::kRestart;
    ++w.rejoins;
    w.replaced = true;
    LOG(INFO) << "worker " << worker << " has a new incarnation " << incarnation
              << " (was " << w.incarnation << ", clock " << w.clock
              << "), last heard from " << absl::FormatDuration(now - w.last_seen)
              << " ago; rejoin " << w.rejoins;
  } else if (w.expired) {
    join = Join::kRejoin;
    ++w.rejoins;
    LOG(INFO) << "worker " << worker << " rejoined after "
              << absl::FormatDuration(now - w.last_seen) << " of silence (clock "
              << w.clock << "); rejoin " << w.rejoins;
  }
  if (was_dropped) {
    w.counts_from = std::clamp<int64_t>(rejoin_step, 0, kMaxClock);
    VLOG(1) << "worker " << worker << " contributes to sync steps from "
            << w.counts_from;
  }
  w.seen = true;
  w.expired = false;
  w.given_up = false;
  if (incarnation != 0) w.incarnation = incarnation;
  w.last_seen = now;
  return join;
}

void Membership::AlignClock(int worker) {
  Worker& w = workers_[worker];
  // Never moved back on the scale: a worker that was ahead of the others
  // when dropped stays where it was.
  const std::optional<int64_t> others = SlowestActiveLocked(worker);
  if (!others || *others - w.clock <= w.clock_offset) return;
  w.clock_offset = *others - w.clock;
  LOG(INFO) << "worker " << worker << " is back at clock " << w.clock
            << " where the others are at " << *others
            << " or beyond: the staleness bound counts it from " << *others;
}

std::optional<int64_t> Membership::SlowestActiveLocked(int except) const {
  std::optional<int64_t> slowest;
  for (int i = 0; i < num_workers_; ++i) {
    const Worker& w = workers_[i];
    if (i == except || w.expired || w.given_up || w.done) continue;
    const int64_t clock = w.clock + w.clock_offset;
    if (!slowest || clock < *slowest) slowest = clock;
  }
  return slowest;
}

Membership::UpdateResult Membership::Update(int worker, uint64_t incarnation,
                                            int64_t clock, bool done,
                                            absl::Time now, int64_t rejoin_step) {
  clock = std::clamp<int64_t>(clock, 0, kMaxClock);
  absl::MutexLock lock(&mu_);
  Worker& w = workers_[worker];
  const int64_t old_clock = w.clock;
  const bool old_done = w.done;
  UpdateResult result;
  bool dropped = false;
  result.join = Revive(worker, w, incarnation, now, rejoin_step, &dropped);
  if (result.join == Join::kFirst || result.join == Join::kRestart) {
    // A new record: clock and done are the message's.
    w.clock = clock;
    w.done = done;
  } else {
    w.clock = std::max(w.clock, clock);
    w.done = w.done || done;
  }
  if (dropped) AlignClock(worker);
  if (w.done && !old_done) {
    LOG(INFO) << "worker " << worker << " is done at clock " << w.clock;
  }
  result.changed = result.join != Join::kNone || w.clock != old_clock ||
                   w.done != old_done;
  return result;
}

Membership::UpdateResult Membership::UpdateFromPush(int worker, uint64_t incarnation,
                                                    int64_t clock, uint32_t clock_parts,
                                                    absl::Time now, int64_t rejoin_step) {
  if (clock_parts > 1) {
    absl::MutexLock lock(&mu_);
    Worker& w = workers_[worker];
    if (incarnation != w.parts_incarnation || clock > w.parts_clock) {
      w.parts_clock = clock;
      w.parts_incarnation = incarnation;
      w.parts_counted = 0;
    }
    const bool last = clock == w.parts_clock && ++w.parts_counted >= clock_parts;
    if (!last) clock = clock - 1;
  }
  // Clocks only grow within an incarnation, so two calls' updates may land
  // in either order.
  return Update(worker, incarnation, clock, /*done=*/false, now, rejoin_step);
}

int64_t Membership::Register(int worker, uint64_t incarnation, absl::Time now,
                             Join* join, int64_t rejoin_step) {
  absl::MutexLock lock(&mu_);
  Worker& w = workers_[worker];
  bool dropped = false;
  const Join joined = Revive(worker, w, incarnation, now, rejoin_step, &dropped);
  // The clock is kept (restored or the predecessor's): the new process
  // resumes from it. It is training again, so not done.
  if (joined == Join::kFirst || joined == Join::kRestart) w.done = false;
  if (dropped) AlignClock(worker);
  if (join != nullptr) *join = joined;
  return w.clock;
}

Membership::ExpireResult Membership::Expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  ExpireResult result;
  for (int i = 0; i < num_workers_; ++i) {
    Worker& w = workers_[i];
    if (w.seen && !w.expired && !w.done && now - w.last_seen > timeout_) {
      w.expired = true;
      ++result.silent;
      LOG(WARNING) << "worker " << i << " silent for "
                   << absl::FormatDuration(now - w.last_seen)
                   << " (heartbeat timeout " << absl::FormatDuration(timeout_)
                   << "); dropped at clock " << w.clock
                   << ": it no longer holds back steps or the staleness bound";
    } else if (!w.seen && !w.given_up && now - start_ > join_timeout_) {
      w.given_up = true;
      ++result.never_joined;
      LOG(WARNING) << "worker " << i << " never joined within "
                   << absl::FormatDuration(join_timeout_)
                   << " (join timeout; clock " << w.clock
                   << "): it no longer holds back steps or the staleness "
                      "bound, and joins when it arrives";
    }
  }
  return result;
}

std::optional<int64_t> Membership::SlowestActiveClock() const {
  absl::MutexLock lock(&mu_);
  return SlowestActiveLocked(/*except=*/-1);
}

int64_t Membership::StalenessClock(int worker, int64_t clock) const {
  absl::MutexLock lock(&mu_);
  clock = std::clamp<int64_t>(clock, 0, kMaxClock);
  if (worker < 0 || worker >= num_workers_) return clock;
  return clock + workers_[worker].clock_offset;
}

int Membership::LiveCount() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(
      workers_.begin(), workers_.end(),
      [](const Worker& w) { return w.seen && !w.expired && !w.done; }));
}

int Membership::ContributorsForStep(int64_t step,
                                    const std::vector<bool>& contributed) const {
  absl::MutexLock lock(&mu_);
  int count = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (Counts(workers_[i], step) || (i < contributed.size() && contributed[i])) {
      ++count;
    }
  }
  return count;
}

bool Membership::RaiseCountsFrom(int worker, int64_t step) {
  absl::MutexLock lock(&mu_);
  Worker& w = workers_[worker];
  if ((w.counts_from == 0 && !w.replaced) || step <= w.counts_from) return false;
  w.counts_from = step;
  return true;
}

bool Membership::CountsForStep(int worker, int64_t step) const {
  absl::MutexLock lock(&mu_);
  return Counts(workers_[worker], step);
}

std::vector<WorkerState> Membership::Snapshot(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerState> states;
  states.reserve(workers_.size());
  for (int i = 0; i < num_workers_; ++i) {
    const Worker& w = workers_[i];
    WorkerState state;
    state.set_worker(i);
    state.set_clock(w.clock);
    state.set_live(w.seen && !w.expired);
    state.set_done(w.done);
    state.set_seen(w.seen);
    state.set_seconds_since_heartbeat(
        absl::ToDoubleSeconds(now - (w.seen ? w.last_seen : start_)));
    state.set_rejoins(w.rejoins);
    state.set_incarnation(w.incarnation);
    states.push_back(std::move(state));
  }
  return states;
}

std::vector<int64_t> Membership::Each(int64_t Worker::*field) const {
  absl::MutexLock lock(&mu_);
  std::vector<int64_t> values;
  values.reserve(workers_.size());
  for (const Worker& w : workers_) values.push_back(w.*field);
  return values;
}

std::vector<int64_t> Membership::Clocks() const { return Each(&Worker::clock); }

int64_t Membership::Clock(int worker) const {
  absl::MutexLock lock(&mu_);
  return workers_[worker].clock;
}

std::vector<int64_t> Membership::ClockOffsets() const { return Each(&Worker::clock_offset); }

void Membership::SeedClocks(const std::vector<int64_t>& clocks,
                            const std::vector<int64_t>& offsets) {
  absl::MutexLock lock(&mu_);
  const size_t n = std::min(clocks.size(), workers_.size());
  for (size_t i = 0; i < n; ++i) {
    const int64_t clock = std::clamp<int64_t>(clocks[i], 0, kMaxClock);
    Worker& w = workers_[i];
    if (w.seen) {
      w.clock = std::max(w.clock, clock);
    } else {
      w.clock = clock;
      w.clock_offset = i < offsets.size() ? std::clamp<int64_t>(offsets[i], 0, kMaxClock) : 0;
    }
  }
}

}  // namespace shardtrain::server
