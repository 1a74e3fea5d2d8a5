// Membership: which workers are alive and how far each has got.
//
// Workers announce themselves with heartbeats, pushes and registrations,
// carrying their clock (steps finished) and their incarnation (a random id
// per worker process). Within one incarnation a clock only grows and `done`
// only goes from false to true; a different incarnation (a restarted worker,
// or a spoof) replaces the record, so the real worker's next message heals a
// spoofed one. Incarnation 0 (tools, old clients) never replaces a record.
//
// A worker silent for longer than the heartbeat timeout is forgotten; a
// worker never seen within the join timeout of the start is given up on;
// either comes back when it is heard from again. A worker that says it is
// done no longer holds others back. Joins and departures are logged.
//
// The staleness bound compares clocks on one scale. A worker that comes back
// after being dropped (or joins after being given up on) is placed on it at
// the slowest clock of the others then: its own clock plus that offset is
// what the bound sees (StalenessClock). The others went on without it, so it
// does not pull them back to where it is; from then on it is bounded like
// everyone else.
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_MEMBERSHIP_H_
#define SHARDTRAIN_SERVER_MEMBERSHIP_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/partition.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::server {

// Largest clock (or step) a worker may report; larger ones are refused, so
// sums like `clock + staleness bound` cannot overflow.
inline constexpr int64_t kMaxClock = int64_t{1} << 40;
using common::kMaxClockParts;

class Membership {
 public:
  // How a message changed a worker's record.
  enum class Join {
    kNone,     // an already live worker, same incarnation
    kFirst,    // first message from this index
    kRejoin,   // same incarnation, back after being forgotten
    kRestart,  // a new incarnation replaced the record
  };
  struct UpdateResult {
    // The slowest active clock, the live set or a done flag changed.
    bool changed = false;
    Join join = Join::kNone;
  };
  struct ExpireResult {
    int silent = 0;        // forgotten now for their silence
    int never_joined = 0;  // given up on now: never seen within join_timeout
    bool any() const { return silent + never_joined > 0; }
  };

  // `start` is when the join timeout starts counting.
  Membership(int num_workers, absl::Duration timeout,
             absl::Duration join_timeout = absl::InfiniteDuration(),
             absl::Time start = absl::Now());

  // Records that `worker` (process `incarnation`) is alive at `now` with
  // `clock` steps done (clamped to [0, kMaxClock]). If this brings back a
  // worker that had been dropped (silent, or given up on as never joined),
  // it is a contributor again only from sync step `rejoin_step` on: the
  // steps already under way went on without it (see ContributorsForStep).
  // REQUIRES: 0 <= worker < num_workers.
  UpdateResult Update(int worker, uint64_t incarnation, int64_t clock,
                      bool done, absl::Time now, int64_t rejoin_step = 0);
  // As above for incarnation 0: nothing is replaced, only moved forward.
  UpdateResult Update(int worker, int64_t clock, bool done, absl::Time now) {
    return Update(worker, 0, clock, done, now);
  }
  // A push's sign of life: as Update (not done). A push split over
  // `clock_parts` > 1 calls (PushRequest.clock_parts) moves the clock to
  // `clock` only with the last of its calls to arrive (counted per clock and
  // incarnation; a call of a later clock starts a new count, one of an
  // earlier clock is not counted), and to clock - 1 with the others.
  UpdateResult UpdateFromPush(int worker, uint64_t incarnation, int64_t clock,
                              uint32_t clock_parts, absl::Time now, int64_t rejoin_step = 0);
  // A registration: a sign of life that keeps the recorded clock. A new
  // incarnation replaces the record with that clock and done = false, so a
  // restarted worker resumes where its predecessor was. Returns the clock.
  // `rejoin_step` as for Update.
  int64_t Register(int worker, uint64_t incarnation, absl::Time now,
                   Join* join = nullptr, int64_t rejoin_step = 0);

  // Forgets workers silent since before now - timeout and gives up on those
  // never seen within join_timeout of the start.
  ExpireResult Expire(absl::Time now);

  // The smallest staleness clock (see StalenessClock) among workers that may
  // still push: live and not done, plus those never seen and not given up on
  // (with their restored clock, else 0), so a late starter holds others back
  // until the join timeout. nullopt when no such worker is left.
  std::optional<int64_t> SlowestActiveClock() const;
  // `clock` of `worker` on the staleness bound's scale: plus the offset it
  // was given when it came back after being dropped (0 for one never
  // dropped, or not a worker index); `clock` is clamped to [0, kMaxClock].
  int64_t StalenessClock(int worker, int64_t clock) const;

  // Workers seen and not yet forgotten or done.
  int LiveCount() const;
  // Workers that may still contribute a gradient to sync step `step`: not
  // forgotten or given up on, either not done or done after finishing that
  // step, and, for a worker that came back after being dropped, `step` at
  // or after its rejoin step (the steps under way when it came back do not
  // wait for it: it rejoins at a later one). Workers never seen count while
  // they may simply start late. Workers marked in `contributed` (indexed by
  // worker; may be empty) count too: their gradient is already in.
  int ContributorsForStep(int64_t step,
                          const std::vector<bool>& contributed = {}) const;
  // Whether `worker` counts for `step` by the rules above (ignoring
  // `contributed`).
  bool CountsForStep(int worker, int64_t step) const;
  // A worker that came back after being dropped, or was restarted (a new
  // process), now pulling the parameters of step `step` will push no earlier step: it
  // counts from `step` at the latest. (Shards may set different rejoin
  // steps for it, or one may have dropped it where another did not: the
  // pull tells each where it really rejoined.) Returns true if that
  // changed anything. No-op for a worker never dropped nor restarted.
  bool RaiseCountsFrom(int worker, int64_t step);

  // Every expected worker, seen or not.
  std::vector<WorkerState> Snapshot(absl::Time now) const;

  // The clock recorded for each worker index (0 where none).
  std::vector<int64_t> Clocks() const;
  int64_t Clock(int worker) const;
  // What StalenessClock adds for each worker index.
  std::vector<int64_t> ClockOffsets() const;
  // Seeds the clocks and staleness offsets of workers not seen yet (from a
  // checkpoint; an offset missing is 0); extra entries are ignored. A seen
  // worker keeps the larger clock and its offset.
  void SeedClocks(const std::vector<int64_t>& clocks,
                  const std::vector<int64_t>& offsets = {});

  int num_workers() const { return num_workers_; }

 private:
  struct Worker {
    bool seen = false;
    bool expired = false;   // silent past the timeout
    bool given_up = false;  // never seen within the join timeout
    bool done = false;
    int64_t clock = 0;
    uint64_t incarnation = 0;
    int64_t rejoins = 0;
    // The first sync step this worker contributes to (set when it comes
    // back after being dropped; 0 for one never dropped).
    int64_t counts_from = 0;
    // A new process replaced this record (a restart): it resumes at the
    // step the shards agree on, which may be past this shard's open one
    // (another shard dropped its predecessor while this one did not), so
    // its pulls may raise counts_from as a rejoined worker's do.
    bool replaced = false;
    // Added to `clock` for the staleness bound (set when it comes back after
    // being dropped; 0 for one never dropped).
    int64_t clock_offset = 0;
    absl::Time last_seen;
    // The split push being counted (UpdateFromPush): its clock, the
    // incarnation that sent it and the calls of it counted so far.
    int64_t parts_clock = -1;
    uint64_t parts_incarnation = 0;
    uint32_t parts_counted = 0;
  };

  static bool Counts(const Worker& w, int64_t step) {
    return !w.expired && !w.given_up && (!w.done || w.clock > step) &&
           step >= w.counts_from;
  }

  // The record after a sign of life; returns how it joined. Sets `*dropped`
  // when it had been dropped or given up on.
  Join Revive(int worker, Worker& w, uint64_t incarnation, absl::Time now,
              int64_t rejoin_step, bool* dropped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For a worker back after being dropped, with its clock set: places it on
  // the staleness scale at the slowest clock of the other active workers,
  // unless it is further on already.
  void AlignClock(int worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `field` of every worker, by index.
  std::vector<int64_t> Each(int64_t Worker::*field) const;
  // Smallest staleness clock among active workers other than `except`.
  std::optional<int64_t> SlowestActiveLocked(int except) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int num_workers_;
  const absl::Duration timeout_;
  const absl::Duration join_timeout_;
  const absl::Time start_;
  mutable absl::Mutex mu_;
  std::vector<Worker> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_MEMBERSHIP_H_
