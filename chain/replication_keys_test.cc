#include "chain/replication_keys.h"

#include <string>

#include "absl/status/status.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::chain {
namespace {

using ::testing::HasSubstr;

TEST(ReplicationKeysTest, LayoutIsPinned) {
  // Every process of a job, of any version, must agree on these.
  EXPECT_EQ(JobPrefix("mnist"), "/shardtrain/mnist/");
  EXPECT_EQ(ChainsPrefix("mnist"), "/shardtrain/mnist/chains/");
  EXPECT_EQ(MembersPrefix("mnist"), "/shardtrain/mnist/shards/");
  EXPECT_EQ(ChainKey("mnist", 0), "/shardtrain/mnist/chains/0");
  EXPECT_EQ(ChainKey("job-1.a_b", 12), "/shardtrain/job-1.a_b/chains/12");
  EXPECT_EQ(MemberKey("mnist", 3), "/shardtrain/mnist/shards/3");
  EXPECT_EQ(DrainedKey("mnist", 3), "/shardtrain/mnist/drained/3");
  EXPECT_EQ(DrainedPrefix("mnist"), "/shardtrain/mnist/drained/");
}

TEST(ReplicationKeysTest, KeysParseBackToTheirIndex) {
  for (int index : {0, 1, 9, 10, 123, 2147483647}) {
    ASSERT_OK_AND_ASSIGN(int group, GroupFromChainKey("j", ChainKey("j", index)));
    EXPECT_EQ(group, index);
    ASSERT_OK_AND_ASSIGN(int shard, ShardFromMemberKey("j", MemberKey("j", index)));
    EXPECT_EQ(shard, index);
  }
}

TEST(ReplicationKeysTest, ParseRefusesOtherKeys) {
  for (const std::string key :
       {"/shardtrain/j/shards/", "/shardtrain/j/shards/x", "/shardtrain/j/shards/01",
        "/shardtrain/j/shards/+1", "/shardtrain/j/shards/-1", "/shardtrain/j/shards/ 1",
        "/shardtrain/j/shards/1 ", "/shardtrain/j/shards/1/x",
        "/shardtrain/j/shards/2147483648", "/shardtrain/j/chains/1",
        "/shardtrain/jj/shards/1", "/shardtrain/j/shards", "shardtrain/j/shards/1", ""}) {
    const absl::StatusOr<int> shard = ShardFromMemberKey("j", key);
    EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument)
        << "accepted \"" << key << "\"";
  }
  EXPECT_THAT(GroupFromChainKey("j", "/shardtrain/j/shards/1").status().message(),
              HasSubstr("does not start with \"/shardtrain/j/chains/\""));
  EXPECT_THAT(GroupFromChainKey("j", "/shardtrain/j/chains/007").status().message(),
              HasSubstr("\"007\" is not a decimal index"));
}

TEST(ReplicationKeysTest, JobNamesCannotReachIntoOtherJobs) {
  EXPECT_OK(ValidateJobName("mnist"));
  EXPECT_OK(ValidateJobName("Fashion-MNIST_v2.1"));
  EXPECT_OK(ValidateJobName(std::string(kMaxJobNameBytes, 'a')));
  for (const std::string& job :
       {std::string(), std::string(kMaxJobNameBytes + 1, 'a'), std::string("a/chains"),
        std::string("a b"), std::string("a\nb"), std::string("a\0b", 3),
        std::string("caf\xc3\xa9")}) {
    const absl::Status status = ValidateJobName(job);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << job;
  }
  EXPECT_THAT(ValidateJobName("a/b").message(),
              HasSubstr("only letters, digits, '.', '_' and '-'"));
}

}  // namespace
}  // namespace shardtrain::chain
