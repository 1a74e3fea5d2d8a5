#include "server/internal/partition_locks.h"

#include <array>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server::internal {
namespace {

using ::testing::ElementsAre;

class PartitionLocksTest : public ::testing::Test {
 protected:
  PartitionLocksTest() {
    for (int i = 0; i < static_cast<int>(parts_.size()); ++i) parts_[i].id = i;
  }

  // Whether another thread finds `p` locked.
  static bool LockedElsewhere(Partition& p) {
    bool locked = false;
    std::thread probe([&] {
      if (p.mu.TryLock()) {
        p.mu.Unlock();
      } else {
        locked = true;
      }
    });
    probe.join();
    return locked;
  }

  std::array<Partition, 4> parts_;
};

TEST_F(PartitionLocksTest, LocksEachNamedPartitionOnceInIdOrder) {
  {
    PartitionLocks locks({&parts_[3], &parts_[0], &parts_[3], &parts_[1]});
    EXPECT_THAT(locks.partitions(), ElementsAre(&parts_[0], &parts_[1], &parts_[3]));
    EXPECT_TRUE(LockedElsewhere(parts_[0]));
    EXPECT_TRUE(LockedElsewhere(parts_[1]));
    EXPECT_FALSE(LockedElsewhere(parts_[2]));  // not named: not serialised
    EXPECT_TRUE(LockedElsewhere(parts_[3]));
  }
  for (Partition& p : parts_) EXPECT_FALSE(LockedElsewhere(p));
}

TEST_F(PartitionLocksTest, AReleasedPartitionIsFreeWhileTheOthersStayHeld) {
  {
    PartitionLocks locks({&parts_[2], &parts_[0], &parts_[1]});
    locks.Release(&parts_[0]);
    EXPECT_FALSE(LockedElsewhere(parts_[0]));
    EXPECT_TRUE(LockedElsewhere(parts_[1]));
    EXPECT_TRUE(LockedElsewhere(parts_[2]));
    locks.Release(&parts_[2]);
    EXPECT_FALSE(LockedElsewhere(parts_[2]));
    EXPECT_TRUE(LockedElsewhere(parts_[1]));
  }  // unlocks only parts_[1]; unlocking a released one again would abort
  for (Partition& p : parts_) EXPECT_FALSE(LockedElsewhere(p));
}

TEST_F(PartitionLocksTest, EmptySetLocksNothing) {
  PartitionLocks locks({});
  EXPECT_TRUE(locks.partitions().empty());
  for (Partition& p : parts_) EXPECT_FALSE(LockedElsewhere(p));
}

TEST_F(PartitionLocksTest, OverlappingSetsNamedInOppositeOrdersDoNotDeadlock) {
  // absl reports a lock taken out of the order seen before as a potential
  // deadlock even when the threads happen not to interleave.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  constexpr int kRounds = 2000;
  int updates = 0;  // guarded by parts_[1] (in both sets)
  auto run = [&](std::vector<Partition*> set) {
    for (int i = 0; i < kRounds; ++i) {
      PartitionLocks locks(set);
      ++updates;
    }
  };
  std::thread forward(run, std::vector<Partition*>{&parts_[0], &parts_[1], &parts_[2]});
  std::thread backward(run, std::vector<Partition*>{&parts_[2], &parts_[1], &parts_[0]});
  forward.join();
  backward.join();
  EXPECT_EQ(updates, 2 * kRounds);
}

}  // namespace
}  // namespace shardtrain::server::internal
