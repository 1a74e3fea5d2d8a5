#include "server/membership.h"

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
  EXPECT_FALSE(members.Update(0, 2, false, absl::UnixEpoch()));
  EXPECT_EQ(members.SlowestActiveClock(), 5);
}

TEST(MembershipTest, SilentWorkersExpireAndComeBack) {
  Membership members(2, absl::Seconds(10));
  const absl::Time t0 = absl::UnixEpoch();
  members.Update(0, 1, false, t0);
  members.Update(1, 9, false, t0 + absl::Seconds(8));
  EXPECT_FALSE(members.Expire(t0 + absl::Seconds(5)));
  EXPECT_TRUE(members.Expire(t0 + absl::Seconds(11)));
  EXPECT_EQ(members.LiveCount(), 1);
  EXPECT_EQ(members.SlowestActiveClock(), 9);
  EXPECT_EQ(members.ContributorsForStep(3), 1);
  EXPECT_TRUE(members.Update(0, 2, false, t0 + absl::Seconds(12)));
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

}  // namespace
}  // namespace shardtrain::server
