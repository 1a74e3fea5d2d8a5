// PushOrder: admits an async shard's pushes in a fixed order of workers, so
// that convergence under staleness can be tested without depending on the
// machine's timing (issue 27). A test-only tool: production shards admit
// pushes as they arrive.
//
//   round_robin: workers 0, 1, ..., N-1, 0, ... take turns, so every
//                gradient is exactly N-1 updates stale;
//   random:      each round of N turns is a permutation drawn from a seeded
//                generator, the same on every shard with the same seed.
//
// A push whose worker does not hold the turn is parked, holding no thread,
// and runs on the thread that passes the turn to it. A turn whose worker
// has not pushed for `skip_after` while others wait is passed on (a worker
// that finished, died, or is evaluating), so the order never deadlocks; a
// worker that has not pushed yet (still starting, loading its data) is
// waited for up to `start_wait`, so that the workers' start does not
// change the order.
// The order counts calls: it fits workers that push once per step and
// shard (PushPull, --overlap=off).
//
//   PushOrder order(options);
//   order.Enter(worker, [&](bool admitted) {
//     if (admitted) Apply(...);   // then, always:
//     order.Leave();              // passes the turn; may run parked pushes
//   });
//
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_PUSH_ORDER_H_
#define SHARDTRAIN_SERVER_PUSH_ORDER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace shardtrain::server {

struct PushOrderOptions {
  // "arrival" (no ordering), "round_robin" or "random".
  std::string kind = "arrival";
  // Workers in the job (worker ids 0 .. num_workers-1); >= 1.
  int num_workers = 1;
  // "random": the generator's seed.
  uint64_t seed = 1;
  // A turn whose worker has not pushed for this long while others wait is
  // passed on.
  absl::Duration skip_after = absl::Seconds(2);
  // The same for a turn whose worker has never pushed.
  absl::Duration start_wait = absl::Seconds(60);
};

class PushOrder {
 public:
  // Called with true when the push may be applied, false when it must be
  // finished unapplied (the shard is stopping). Either way the callee must
  // call Leave() exactly once afterwards, from the same or another thread.
  using Admitted = std::function<void(bool admitted)>;

  // INVALID_ARGUMENT for an unknown kind or num_workers < 1.
  static absl::StatusOr<std::unique_ptr<PushOrder>> Create(const PushOrderOptions& options);

  // Whether pushes are ordered at all ("arrival" is not).
  bool ordered() const { return kind_ != Kind::kArrival; }

  // Runs `admitted(true)` now if `worker` holds the turn and no push is
  // being applied, else parks it until then. REQUIRES: worker < num_workers.
  void Enter(uint32_t worker, Admitted admitted);
  // The admitted push is done: the turn passes to the next worker of the
  // order, and that worker's parked push, if any, runs on this thread.
  void Leave();
  // Passes on a turn held too long while pushes are parked (see the file
  // comment). Call periodically.
  void Tick(absl::Time now);
  // Runs every parked push's callback with false (at shutdown).
  void CancelAll();

  // The worker whose turn it is (for tests).
  uint32_t turn() const;
  // Turns passed on by Tick (for tests and the log).
  int64_t skipped() const;

 private:
  enum class Kind { kArrival, kRoundRobin, kRandom };
  PushOrder(Kind kind, const PushOrderOptions& options);

  // Moves the turn to the next worker of the order.
  void Advance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // If the turn's worker has a parked push and none is being applied, takes
  // it (marking it applied) for the caller to run outside the lock.
  Admitted TakeRunnable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Kind kind_;
  const absl::Duration skip_after_;
  const absl::Duration start_wait_;

  mutable absl::Mutex mu_;
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_);
  // The current round's order and the position in it.
  std::vector<uint32_t> round_ ABSL_GUARDED_BY(mu_);
  size_t position_ ABSL_GUARDED_BY(mu_) = 0;
  bool applying_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time turn_started_ ABSL_GUARDED_BY(mu_);
  std::vector<std::deque<Admitted>> parked_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> pushed_ ABSL_GUARDED_BY(mu_);  // by worker: ever entered
  int64_t parked_count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t skipped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_PUSH_ORDER_H_
