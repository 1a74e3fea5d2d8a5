#include "client/sync_replay.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace shardtrain::client {
namespace {

wire::PushHeader Header(int64_t clock, uint64_t shard_incarnation = 0) {
  wire::PushHeader header;
  header.worker = 1;
  header.clock = clock;
  header.sequence = 7;
  header.shard_incarnation = shard_incarnation;
  return header;
}

std::vector<wire::GradientPartOut> Parts(const std::string& data) {
  wire::GradientPartOut part;
  part.tensor = "w";
  part.partition = 2;
  part.version = 3;
  part.data = data;
  return {part};
}

TEST(SyncReplayTest, KeepsAcknowledgedPushesUntilTheirPull) {
  SyncReplay replay(2);
  const std::string data = "abcd";
  int a, b;  // two groups' keys
  replay.Acked(0, &a, Header(3, 11), Parts(data));
  replay.Acked(0, &a, Header(3, 11), Parts(data));  // a retry's answer: not a second push
  replay.Acked(0, &b, Header(3), Parts(data));
  replay.Acked(1, &b, Header(3), Parts(data));
  ASSERT_EQ(replay.Pending(0).size(), 2u);
  const PushRequest first = replay.Pending(0)[0];
  EXPECT_EQ(first.clock(), 3);
  EXPECT_EQ(first.sequence(), 7u);
  EXPECT_EQ(first.shard_incarnation(), 0u);  // for the new shard
  ASSERT_EQ(first.parts_size(), 1);
  EXPECT_EQ(first.parts(0).key().tensor(), "w");
  EXPECT_EQ(first.parts(0).key().partition(), 2u);
  EXPECT_EQ(first.parts(0).version(), 3);
  EXPECT_EQ(first.parts(0).grad().data(), "abcd");

  replay.Pulled(0, &a);
  ASSERT_EQ(replay.Pending(0).size(), 1u);
  replay.Pulled(0, &b);
  EXPECT_TRUE(replay.Pending(0).empty());
  EXPECT_EQ(replay.Pending(1).size(), 1u);  // other shards keep theirs
}

TEST(SyncReplayTest, ALaterStepForgetsEarlierOnes) {
  SyncReplay replay(2);
  const std::string data = "abcd";
  int group;
  replay.Acked(0, &group, Header(3), Parts(data));  // never pulled: the worker moved on
  replay.Acked(1, &group, Header(4), Parts(data));
  EXPECT_TRUE(replay.Pending(0).empty());
  ASSERT_EQ(replay.Pending(1).size(), 1u);
  replay.Acked(0, &group, Header(3), Parts(data));  // a late acknowledgement of the old step
  EXPECT_TRUE(replay.Pending(0).empty());
}

TEST(SyncReplayTest, DetachCopiesThePayloadsSoTheSenderMayReuseThem) {
  SyncReplay replay(1);
  std::string gradient = "abcd";
  int group;
  replay.Acked(0, &group, Header(5), Parts(gradient));
  EXPECT_EQ(replay.Referenced(0), 1);
  gradient[0] = 'z';  // still referenced: a replay now would send this
  EXPECT_EQ(replay.Pending(0)[0].parts(0).grad().data(), "zbcd");
  replay.Detach();
  EXPECT_EQ(replay.Referenced(0), 0);
  gradient = "0000";  // reused by the caller after Detach
  EXPECT_EQ(replay.Pending(0)[0].parts(0).grad().data(), "zbcd");
}

}  // namespace
}  // namespace shardtrain::client
