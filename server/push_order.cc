#include "server/push_order.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

namespace shardtrain::server {

absl::StatusOr<std::unique_ptr<PushOrder>> PushOrder::Create(const PushOrderOptions& options) {
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("push order: num_workers must be >= 1, got ", options.num_workers));
  }
  Kind kind;
  if (options.kind == "arrival") {
    kind = Kind::kArrival;
  } else if (options.kind == "round_robin") {
    kind = Kind::kRoundRobin;
  } else if (options.kind == "random") {
    kind = Kind::kRandom;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--push_order must be arrival, round_robin or random, got \"", options.kind, "\""));
  }
  return std::unique_ptr<PushOrder>(new PushOrder(kind, options));
}

PushOrder::PushOrder(Kind kind, const PushOrderOptions& options)
    : kind_(kind),
      skip_after_(options.skip_after),
      start_wait_(options.start_wait),
      random_(options.seed),
      round_(static_cast<size_t>(options.num_workers)),
      turn_started_(absl::Now()),
      parked_(static_cast<size_t>(options.num_workers)),
      pushed_(static_cast<size_t>(options.num_workers), false) {
  absl::MutexLock lock(&mu_);
  std::iota(round_.begin(), round_.end(), 0u);
  if (kind_ == Kind::kRandom) std::shuffle(round_.begin(), round_.end(), random_);
}

void PushOrder::Advance() {
  if (++position_ == round_.size()) {
    position_ = 0;
    if (kind_ == Kind::kRandom) std::shuffle(round_.begin(), round_.end(), random_);
  }
  turn_started_ = absl::Now();
}

PushOrder::Admitted PushOrder::TakeRunnable() {
  if (applying_) return nullptr;
  std::deque<Admitted>& queue = parked_[round_[position_]];
  if (queue.empty()) return nullptr;
  Admitted next = std::move(queue.front());
  queue.pop_front();
  --parked_count_;
  applying_ = true;
  return next;
}

void PushOrder::Enter(uint32_t worker, Admitted admitted) {
  if (kind_ == Kind::kArrival) {
    admitted(true);
    return;
  }
  Admitted run;
  {
    absl::MutexLock lock(&mu_);
    parked_[worker].push_back(std::move(admitted));
    pushed_[worker] = true;
    ++parked_count_;
    run = TakeRunnable();
  }
  if (run) run(true);
}

void PushOrder::Leave() {
  if (kind_ == Kind::kArrival) return;
  Admitted run;
  {
    absl::MutexLock lock(&mu_);
    applying_ = false;
    Advance();
    run = TakeRunnable();
  }
  if (run) run(true);
}

void PushOrder::Tick(absl::Time now) {
  if (kind_ == Kind::kArrival) return;
  Admitted run;
  {
    absl::MutexLock lock(&mu_);
    if (applying_ || parked_count_ == 0) return;
    const absl::Duration wait = pushed_[round_[position_]] ? skip_after_ : start_wait_;
    if (now - turn_started_ < wait) return;
    // Pass the turn on to the next worker with a parked push: the others
    // skipped have had their turn's time too, since none of them pushed
    // while this one waited.
    int passed = 0;
    while (parked_[round_[position_]].empty()) {
      Advance();
      ++passed;
    }
    skipped_ += passed;
    LOG(INFO) << "push order: passed on " << passed << " turn(s) of silent workers after "
              << absl::FormatDuration(wait) << "; " << skipped_ << " in all";
    run = TakeRunnable();
  }
  if (run) run(true);
}

void PushOrder::CancelAll() {
  std::vector<Admitted> all;
  {
    absl::MutexLock lock(&mu_);
    for (std::deque<Admitted>& queue : parked_) {
      for (Admitted& admitted : queue) all.push_back(std::move(admitted));
      queue.clear();
    }
    parked_count_ = 0;
  }
  for (Admitted& admitted : all) admitted(false);
}

uint32_t PushOrder::turn() const {
  absl::MutexLock lock(&mu_);
  return round_[position_];
}

int64_t PushOrder::skipped() const {
  absl::MutexLock lock(&mu_);
  return skipped_;
}

}  // namespace shardtrain::server
