#include "server/membership.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

TEST(MembershipTest, UnseenWorkersHoldBackTheSlowestClock) {
  Membership members(3, absl::Seconds(10));
  const absl::Time t0 = absl::UnixEpoch();
  EXPECT_EQ(members.SlowestActiveClock(), 0);
  members.Update(0, 5, false, t0);
  members.Update(1, 3, false, t0);
  EXPECT_EQ(members.SlowestActiveClock(), 0);  // worker 2 not seen yet
  members.Update(2, 4, false, t0);
  EXPECT_EQ(members.SlowestActiveClock(), 3);
  EXPECT_EQ(members.LiveCount(), 3);
}

TEST(MembershipTest, ClocksNeverGoBackwards) {
  Membership members(1, absl::Seconds(10));
  members.Update(0, 5, false, absl::UnixEpoch());
  EXPECT_FALSE(members.Update(0, 2, false, absl::UnixEpoch()).changed);
  EXPECT_EQ(members.SlowestActiveClock(), 5);
}

TEST(MembershipTest, ASplitPushMovesTheClockWithItsLastCall) {
  Membership members(1, absl::Seconds(10));
  const absl::Time t0 = absl::UnixEpoch();
  members.UpdateFromPush(0, 7, 4, 3, t0);
  members.UpdateFromPush(0, 7, 4, 3, t0);
  EXPECT_EQ(members.Clock(0), 3);
  EXPECT_TRUE(members.UpdateFromPush(0, 7, 4, 3, t0).changed);
  EXPECT_EQ(members.Clock(0), 4);
  // A call of step 6 starts a new count; one of step 5 arriving after it
  // is not counted (step 5 may then never complete: step 6's last call
  // moves the clock past it).
  members.UpdateFromPush(0, 7, 6, 2, t0);
  members.UpdateFromPush(0, 7, 5, 2, t0);
  members.UpdateFromPush(0, 7, 5, 2, t0);
  EXPECT_EQ(members.Clock(0), 5);
  members.UpdateFromPush(0, 7, 6, 2, t0);
  EXPECT_EQ(members.Clock(0), 6);
  // A new incarnation counts afresh, from the clock it starts with.
  members.UpdateFromPush(0, 8, 6, 2, t0);
  EXPECT_EQ(members.Clock(0), 5);
  members.UpdateFromPush(0, 8, 6, 2, t0);
  EXPECT_EQ(members.Clock(0), 6);
  // Not split: at once.
  members.UpdateFromPush(0, 8, 9, 0, t0);
  EXPECT_EQ(members.Clock(0), 9);
}

TEST(MembershipTest, SilentWorkersExpireAndComeBack) {
  Membership members(2, absl::Seconds(10));
  const absl::Time t0 = absl::UnixEpoch();
  members.Update(0, 1, false, t0);
  members.Update(1, 9, false, t0 + absl::Seconds(8));
  EXPECT_FALSE(members.Expire(t0 + absl::Seconds(5)).any());
  EXPECT_TRUE(members.Expire(t0 + absl::Seconds(11)).any());
  EXPECT_EQ(members.LiveCount(), 1);
  EXPECT_EQ(members.SlowestActiveClock(), 9);
  EXPECT_EQ(members.ContributorsForStep(3), 1);
  EXPECT_TRUE(members.Update(0, 2, false, t0 + absl::Seconds(12)).changed);
  EXPECT_EQ(members.LiveCount(), 2);
}

TEST(MembershipTest, DoneWorkersCountOnlyForStepsTheyFinished) {
  Membership members(2, absl::Seconds(10));
  members.Update(0, 10, true, absl::UnixEpoch());
  members.Update(1, 7, false, absl::UnixEpoch());
  EXPECT_EQ(members.ContributorsForStep(9), 2);
  EXPECT_EQ(members.ContributorsForStep(10), 1);
  EXPECT_EQ(members.SlowestActiveClock(), 7);
  members.Update(1, 10, true, absl::UnixEpoch());
  EXPECT_EQ(members.SlowestActiveClock(), std::nullopt);
  EXPECT_EQ(members.Snapshot(absl::UnixEpoch()).size(), 2u);
}

TEST(MembershipTest, ANewIncarnationReplacesTheRecordAndHealsASpoof) {
  Membership members(2, absl::Seconds(10));
  const absl::Time t0 = absl::UnixEpoch();
  constexpr uint64_t kReal = 11, kSpoof = 99;
  EXPECT_EQ(members.Update(0, kReal, 4, false, t0).join, Membership::Join::kFirst);
  members.Update(1, 7, 6, false, t0);
  // Within an incarnation the clock only grows and done only turns on.
  EXPECT_FALSE(members.Update(0, kReal, 2, false, t0).changed);
  EXPECT_EQ(members.SlowestActiveClock(), 4);
  // A spoof with another incarnation and done = true takes the record over.
  const Membership::UpdateResult spoof =
      members.Update(0, kSpoof, kMaxClock, true, t0 + absl::Seconds(1));
  EXPECT_EQ(spoof.join, Membership::Join::kRestart);
  EXPECT_TRUE(spoof.changed);
  EXPECT_EQ(members.SlowestActiveClock(), 6);
  // The real worker's next heartbeat takes it back: not done, its clock.
  EXPECT_EQ(members.Update(0, kReal, 5, false, t0 + absl::Seconds(2)).join,
            Membership::Join::kRestart);
  EXPECT_EQ(members.SlowestActiveClock(), 5);
  EXPECT_EQ(members.Clock(0), 5);
  // Incarnation 0 never replaces: it cannot set done back or lower a clock.
  members.Update(0, 0, 1, false, t0 + absl::Seconds(3));
  EXPECT_EQ(members.Clock(0), 5);
  // A clock beyond kMaxClock is clamped, so sums with it cannot overflow.
  members.Update(1, 7, std::numeric_limits<int64_t>::max(), false, t0);
  EXPECT_EQ(members.Clock(1), kMaxClock);
  const std::vector<WorkerState> states = members.Snapshot(t0 + absl::Seconds(3));
  ASSERT_EQ(states.size(), 2u);
  EXPECT_EQ(states[0].rejoins(), 2);
  EXPECT_EQ(states[0].incarnation(), kReal);
  EXPECT_FALSE(states[0].done());
}

TEST(MembershipTest, RegisterKeepsTheClockForARestartedWorker) {
  Membership members(2, absl::Seconds(10));
  const absl::Time t0 = absl::UnixEpoch();
  members.SeedClocks({12, 30, 99});  // from a checkpoint; extra ignored
  EXPECT_EQ(members.SlowestActiveClock(), 12);  // unseen count with it
  Membership::Join join;
  EXPECT_EQ(members.Register(0, 5, t0, &join), 12);
  EXPECT_EQ(join, Membership::Join::kFirst);
  members.Update(0, 5, 20, true, t0);
  // A new process of worker 0 registers: same clock, training again.
  EXPECT_EQ(members.Register(0, 6, t0 + absl::Seconds(1), &join), 20);
  EXPECT_EQ(join, Membership::Join::kRestart);
  EXPECT_EQ(members.ContributorsForStep(25), 2);  // not done any more
  EXPECT_EQ(members.Clocks(), (std::vector<int64_t>{20, 30}));
}

TEST(MembershipTest, WorkersThatNeverJoinAreGivenUpAndMayStillJoin) {
  const absl::Time t0 = absl::UnixEpoch();
  Membership members(3, absl::Seconds(10), absl::Seconds(60), t0);
  members.Update(0, 1, 8, false, t0 + absl::Seconds(1));
  members.Update(1, 2, 9, false, t0 + absl::Seconds(55));
  EXPECT_EQ(members.SlowestActiveClock(), 0);  // worker 2 may start late
  EXPECT_EQ(members.ContributorsForStep(0), 3);
  std::vector<WorkerState> states = members.Snapshot(t0 + absl::Seconds(30));
  ASSERT_EQ(states.size(), 3u);
  EXPECT_FALSE(states[2].seen());
  EXPECT_FALSE(states[2].live());
  EXPECT_DOUBLE_EQ(states[2].seconds_since_heartbeat(), 30.0);

  // At 61 s worker 2 is given up on, and worker 0 (silent since 1 s) is
  // dropped; worker 1 is fine.
  const Membership::ExpireResult expired = members.Expire(t0 + absl::Seconds(61));
  EXPECT_EQ(expired.never_joined, 1);
  EXPECT_EQ(expired.silent, 1);
  EXPECT_EQ(members.SlowestActiveClock(), 9);
  EXPECT_EQ(members.ContributorsForStep(0), 1);
  EXPECT_FALSE(members.Expire(t0 + absl::Seconds(62)).any());  // counted once

  EXPECT_EQ(members.Update(2, 3, 0, false, t0 + absl::Seconds(70)).join,
            Membership::Join::kFirst);
  EXPECT_EQ(members.Update(0, 1, 8, false, t0 + absl::Seconds(70)).join,
            Membership::Join::kRejoin);
  // Both count for the staleness bound from worker 1's clock (see the next
  // test): neither holds worker 1 back.
  EXPECT_EQ(members.SlowestActiveClock(), 9);
  EXPECT_EQ(members.LiveCount(), 3);
  EXPECT_EQ(members.Snapshot(t0 + absl::Seconds(70))[0].rejoins(), 1);
}

TEST(MembershipTest, AWorkerBackAfterBeingDroppedIsBoundedFromWhereTheOthersAre) {
  const absl::Time t0 = absl::UnixEpoch();
  Membership members(3, absl::Seconds(10), absl::Seconds(60), t0);
  members.Update(0, 1, 40, false, t0 + absl::Seconds(59));
  members.Update(1, 2, 42, false, t0 + absl::Seconds(59));
  EXPECT_EQ(members.Expire(t0 + absl::Seconds(61)).never_joined, 1);
  EXPECT_EQ(members.SlowestActiveClock(), 40);

  // Worker 2 arrives after the others did 40 steps. It starts at clock 0,
  // but the bound counts it from 40: the others are not held back until it
  // has done 40 steps.
  EXPECT_EQ(members.Update(2, 3, 0, false, t0 + absl::Seconds(62)).join,
            Membership::Join::kFirst);
  EXPECT_EQ(members.Clock(2), 0);  // what it resumes from is its own
  EXPECT_EQ(members.StalenessClock(2, 0), 40);
  EXPECT_EQ(members.SlowestActiveClock(), 40);
  // From then on it is bounded like the others: when they run ahead, it is
  // the slowest.
  members.Update(2, 3, 5, false, t0 + absl::Seconds(63));
  members.Update(0, 1, 50, false, t0 + absl::Seconds(63));
  members.Update(1, 2, 50, false, t0 + absl::Seconds(63));
  EXPECT_EQ(members.SlowestActiveClock(), 45);
  EXPECT_EQ(members.StalenessClock(0, 50), 50);  // never dropped: as is
  // A new process of worker 2 (not dropped) resumes on the same scale.
  Membership::Join join = Membership::Join::kNone;
  EXPECT_EQ(members.Register(2, 4, t0 + absl::Seconds(64), &join), 5);
  EXPECT_EQ(join, Membership::Join::kRestart);
  EXPECT_EQ(members.StalenessClock(2, 5), 45);

  // Worker 0 falls silent, is dropped at 50 and comes back at 50 while the
  // others are at 45 and 60: it is ahead of the slowest, so no offset.
  EXPECT_EQ(members.Expire(t0 + absl::Seconds(74)).silent, 2);  // 0 and 1
  members.Update(1, 2, 60, false, t0 + absl::Seconds(75));
  EXPECT_EQ(members.Update(0, 1, 50, false, t0 + absl::Seconds(75)).join,
            Membership::Join::kRejoin);
  EXPECT_EQ(members.StalenessClock(0, 50), 50);
  EXPECT_EQ(members.SlowestActiveClock(), 45);
  // Worker 2 drops out at staleness clock 45 while the others are at 50 and
  // 60; back when they are at 44 (worker 0 restarted from a checkpoint), it
  // stays at 45, not lowered to 44.
  members.Update(2, 4, 5, false, t0 + absl::Seconds(75));
  EXPECT_EQ(members.Expire(t0 + absl::Seconds(90)).silent, 3);
  members.Update(0, 9, 44, false, t0 + absl::Seconds(91));  // new incarnation
  members.Update(2, 4, 5, false, t0 + absl::Seconds(91));
  EXPECT_EQ(members.StalenessClock(2, 5), 45);
  EXPECT_EQ(members.SlowestActiveClock(), 44);
  // Alone, a worker back after being dropped keeps its clock.
  Membership alone(1, absl::Seconds(10));
  alone.Update(0, 1, 7, false, t0);
  EXPECT_EQ(alone.Expire(t0 + absl::Seconds(11)).silent, 1);
  alone.Update(0, 1, 7, false, t0 + absl::Seconds(12));
  EXPECT_EQ(alone.SlowestActiveClock(), 7);
  // A worker index out of range (the caller validates it) adds nothing.
  EXPECT_EQ(members.StalenessClock(7, 3), 3);
  EXPECT_EQ(members.StalenessClock(-1, kMaxClock + 5), kMaxClock);

  // A shard restarted from a checkpoint keeps the scale: restored, worker 2
  // counts from 45 again, not from its own clock 5.
  EXPECT_EQ(members.ClockOffsets(), (std::vector<int64_t>{0, 0, 40}));
  Membership restored(3, absl::Seconds(10));
  restored.SeedClocks(members.Clocks(), members.ClockOffsets());
  EXPECT_EQ(restored.SlowestActiveClock(), 44);  // worker 0
  EXPECT_EQ(restored.Register(2, 4, t0 + absl::Seconds(80)), 5);
  EXPECT_EQ(restored.StalenessClock(2, 5), 45);
  // Offsets out of range are clamped; missing ones are 0.
  Membership seeded(2, absl::Seconds(10));
  seeded.SeedClocks({3, 4}, {-7});
  EXPECT_EQ(seeded.ClockOffsets(), (std::vector<int64_t>{0, 0}));
}

TEST(MembershipTest, ARejoinedWorkersPullRaisesItsFirstStep) {
  const absl::Time t0 = absl::UnixEpoch();
  Membership members(2, absl::Seconds(10), absl::Seconds(60), t0);
  members.Update(0, 1, 4, false, t0 + absl::Seconds(1));
  members.Update(1, 2, 4, false, t0 + absl::Seconds(1));
  EXPECT_TRUE(members.Expire(t0 + absl::Seconds(20)).any());
  members.Update(0, 1, 9, false, t0 + absl::Seconds(20));
  // This shard let worker 1 back from step 8; it pulls step 9 (another
  // shard let it back later): step 8 does not wait for it.
  members.Update(1, 2, 4, false, t0 + absl::Seconds(21), 8);
  EXPECT_TRUE(members.CountsForStep(1, 8));
  EXPECT_TRUE(members.RaiseCountsFrom(1, 9));
  EXPECT_FALSE(members.CountsForStep(1, 8));
  EXPECT_TRUE(members.CountsForStep(1, 9));
  EXPECT_FALSE(members.RaiseCountsFrom(1, 9));  // nothing new
  EXPECT_FALSE(members.RaiseCountsFrom(1, 5));  // never lowered
  EXPECT_FALSE(members.RaiseCountsFrom(0, 50));  // never dropped: unaffected
  EXPECT_TRUE(members.CountsForStep(0, 8));
}

// A worker restarts while live here, but another shard dropped its
// predecessor and went a step on: the new process resumes at that later
// step, and its pull of it tells this shard not to wait for its gradient
// of the step open here (it never comes; the pull would wait for the step).
TEST(MembershipTest, ARestartedWorkersPullRaisesItsFirstStep) {
  const absl::Time t0 = absl::UnixEpoch();
  Membership members(2, absl::Seconds(10), absl::Seconds(60), t0);
  members.Update(0, 1, 376, false, t0 + absl::Seconds(1));
  members.Update(1, 2, 377, false, t0 + absl::Seconds(1));
  Membership::Join join = Membership::Join::kNone;
  EXPECT_EQ(members.Register(0, 3, t0 + absl::Seconds(2), &join, 377), 376);
  EXPECT_EQ(join, Membership::Join::kRestart);
  EXPECT_TRUE(members.CountsForStep(0, 376));  // it may resume here and push it
  EXPECT_EQ(members.ContributorsForStep(376, {false, true}), 2);
  EXPECT_TRUE(members.RaiseCountsFrom(0, 377));
  EXPECT_FALSE(members.CountsForStep(0, 376));
  EXPECT_EQ(members.ContributorsForStep(376, {false, true}), 1);
  EXPECT_TRUE(members.CountsForStep(0, 377));
  EXPECT_FALSE(members.RaiseCountsFrom(1, 400));  // never dropped nor restarted
}

TEST(MembershipTest, ADroppedWorkerCountsOnlyFromItsRejoinStep) {
  const absl::Time t0 = absl::UnixEpoch();
  Membership members(3, absl::Seconds(10), absl::Seconds(60), t0);
  members.Update(0, 1, 4, false, t0 + absl::Seconds(55));
  members.Update(1, 2, 4, false, t0 + absl::Seconds(1));
  // Worker 1 is dropped (silent), worker 2 given up on (never joined).
  EXPECT_TRUE(members.Expire(t0 + absl::Seconds(61)).any());
  EXPECT_EQ(members.ContributorsForStep(7), 1);

  // Both come back while steps up to 7 are under way: they contribute from
  // step 8 on, so step 7 still needs only worker 0's gradient.
  EXPECT_EQ(members.Update(1, 2, 4, false, t0 + absl::Seconds(62), 8).join,
            Membership::Join::kRejoin);
  Membership::Join join = Membership::Join::kNone;
  members.Register(2, 3, t0 + absl::Seconds(62), &join, 8);
  EXPECT_EQ(join, Membership::Join::kFirst);
  EXPECT_EQ(members.ContributorsForStep(7), 1);
  EXPECT_FALSE(members.CountsForStep(1, 7));
  EXPECT_TRUE(members.CountsForStep(0, 7));
  EXPECT_EQ(members.ContributorsForStep(8), 3);
  EXPECT_TRUE(members.CountsForStep(1, 8));
  // A gradient already in counts, from whichever worker.
  EXPECT_EQ(members.ContributorsForStep(7, {false, true, false}), 2);
  EXPECT_EQ(members.ContributorsForStep(8, {true, true, false}), 3);

  // Heard from again while live: nothing changes.
  members.Update(1, 2, 9, false, t0 + absl::Seconds(63), 20);
  EXPECT_TRUE(members.CountsForStep(1, 8));

  // A new incarnation replacing a dropped record also waits for a later
  // step; one replacing a live record counts as before.
  EXPECT_TRUE(members.Expire(t0 + absl::Seconds(80)).any());  // all silent
  EXPECT_EQ(members.Update(1, 7, 12, false, t0 + absl::Seconds(81), 15).join,
            Membership::Join::kRestart);
  EXPECT_FALSE(members.CountsForStep(1, 14));
  EXPECT_TRUE(members.CountsForStep(1, 15));
  EXPECT_EQ(members.Update(1, 8, 12, false, t0 + absl::Seconds(82), 30).join,
            Membership::Join::kRestart);
  EXPECT_TRUE(members.CountsForStep(1, 15));
}

TEST(MembershipTest, AWorkerNeverDroppedCountsForEveryStep) {
  const absl::Time t0 = absl::UnixEpoch();
  Membership members(2, absl::Seconds(10));
  members.Update(0, 1, 0, false, t0, 50);
  members.Update(1, 2, 0, false, t0, 50);
  EXPECT_EQ(members.ContributorsForStep(0), 2);
  members.Update(1, 2, 3, false, t0 + absl::Seconds(5), 50);
  EXPECT_EQ(members.ContributorsForStep(0), 2);
}

}  // namespace
}  // namespace shardtrain::server
