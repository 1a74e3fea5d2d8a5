#include "client/sync_replay.h"

#include <gtest/gtest.h>

namespace shardtrain::client {
namespace {

TEST(SyncReplayTest, KeepsAcknowledgedPushesUntilTheirPull) {
  SyncReplay replay(2);
  PushRequest a, b;
  a.set_clock(3);
  a.set_shard_incarnation(11);
  b.set_clock(3);
  replay.Acked(0, &a);
  replay.Acked(0, &a);  // a retry's acknowledgement is not a second push
  replay.Acked(0, &b);
  replay.Acked(1, &b);
  ASSERT_EQ(replay.Pending(0).size(), 2u);
  EXPECT_EQ(replay.Pending(0)[0].clock(), 3);
  EXPECT_EQ(replay.Pending(0)[0].shard_incarnation(), 0u);  // for the new shard
  EXPECT_EQ(a.shard_incarnation(), 11u);                     // the original is untouched

  replay.Pulled(0, &a);
  ASSERT_EQ(replay.Pending(0).size(), 1u);
  replay.Pulled(0, &b);
  EXPECT_TRUE(replay.Pending(0).empty());
  EXPECT_EQ(replay.Pending(1).size(), 1u);  // other shards keep theirs
}

TEST(SyncReplayTest, ALaterStepForgetsEarlierOnes) {
  SyncReplay replay(2);
  PushRequest old_step, new_step;
  old_step.set_clock(3);
  new_step.set_clock(4);
  replay.Acked(0, &old_step);  // never pulled: the worker moved on
  replay.Acked(1, &new_step);
  EXPECT_TRUE(replay.Pending(0).empty());
  ASSERT_EQ(replay.Pending(1).size(), 1u);
  replay.Acked(0, &old_step);  // a late acknowledgement of the old step
  EXPECT_TRUE(replay.Pending(0).empty());
}

}  // namespace
}  // namespace shardtrain::client
