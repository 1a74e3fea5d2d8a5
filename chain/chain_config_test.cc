#include "chain/chain_config.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "chain/placement.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/replication.pb.h"

namespace shardtrain::chain {
namespace {

using Member = ChainConfig::Member;
using ::testing::HasSubstr;

Member MemberFor(int shard, uint64_t incarnation = 0) {
  return Member{shard, "10.0.0." + std::to_string(shard) + ":7000",
                incarnation != 0 ? incarnation : 1000 + shard};
}

std::vector<int> Shards(const ChainConfig& config) {
  std::vector<int> shards;
  for (const Member& m : config.members) shards.push_back(m.shard);
  return shards;
}

// Group 3 of a 4-shard job with 3 replicas: chain 3 -> 0 -> 1.
absl::StatusOr<ChainConfig> ThreeMemberChain() {
  std::vector<Member> members;
  for (int shard : InitialChain(3, 4, 3)) members.push_back(MemberFor(shard));
  return MakeChainConfig(3, 3, members);
}

TEST(ChainConfigTest, MakeStartsAtEpochOneWithHeadAndTail) {
  ASSERT_OK_AND_ASSIGN(ChainConfig config, ThreeMemberChain());
  EXPECT_EQ(config.epoch, 1);
  EXPECT_EQ(config.group, 3);
  EXPECT_EQ(Shards(config), (std::vector<int>{3, 0, 1}));
  EXPECT_EQ(config.head(), MemberFor(3));
  EXPECT_EQ(config.tail(), MemberFor(1));
  EXPECT_TRUE(config.Contains(0));
  EXPECT_FALSE(config.Contains(2));
  EXPECT_EQ(config.IndexOf(3), 0u);
  EXPECT_EQ(config.IndexOf(1), 2u);
  EXPECT_EQ(config.IndexOf(2), std::nullopt);
}

TEST(ChainConfigTest, SuccessorAndPredecessorFollowTheChain) {
  ASSERT_OK_AND_ASSIGN(ChainConfig config, ThreeMemberChain());
  EXPECT_EQ(config.Successor(3), MemberFor(0));
  EXPECT_EQ(config.Successor(0), MemberFor(1));
  EXPECT_EQ(config.Successor(1), std::nullopt) << "the tail forwards nowhere";
  EXPECT_EQ(config.Successor(2), std::nullopt) << "not a member";
  EXPECT_EQ(config.Predecessor(3), std::nullopt) << "the head has none";
  EXPECT_EQ(config.Predecessor(0), MemberFor(3));
  EXPECT_EQ(config.Predecessor(1), MemberFor(0));
  EXPECT_EQ(config.Predecessor(2), std::nullopt);
}

TEST(ChainConfigTest, MakeRefusesMalformedChains) {
  struct Bad {
    int group, replicas;
    std::vector<Member> members;
    const char* says;
  };
  const std::vector<Bad> bad = {
      {0, 2, {}, "has 0 members"},
      {0, 1, {MemberFor(0), MemberFor(1)}, "has 2 members; it needs 1 to 1"},
      {0, 3, {MemberFor(0), MemberFor(1), MemberFor(0, 7)}, "lists shard 0 twice"},
      {0, 0, {MemberFor(0)}, "replicas 0"},
      {0, 4, {MemberFor(0)}, "replicas 4"},
      {-1, 1, {MemberFor(0)}, "negative group"},
      {0, 2, {MemberFor(0), Member{-2, "a:1", 5}}, "negative shard"},
      {0, 2, {MemberFor(0), Member{1, "", 5}}, "shard 1 has no address"},
      {0, 2, {MemberFor(0), Member{1, std::string(513, 'a'), 5}}, "513-byte address"},
      {0, 2, {Member{0, "a:1", 0}}, "incarnation 0"},
  };
  for (const Bad& b : bad) {
    const absl::StatusOr<ChainConfig> config =
        MakeChainConfig(b.group, b.replicas, b.members);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << b.says;
    EXPECT_THAT(config.status().message(), HasSubstr(b.says));
  }
}

TEST(ChainConfigTest, RemovingTheHeadPromotesItsSuccessor) {
  ASSERT_OK_AND_ASSIGN(const ChainConfig config, ThreeMemberChain());
  ASSERT_OK_AND_ASSIGN(ChainConfig next, config.Remove(3));
  EXPECT_EQ(Shards(next), (std::vector<int>{0, 1}));
  EXPECT_EQ(next.head(), MemberFor(0));
  EXPECT_EQ(next.epoch, 2);
  EXPECT_EQ(next.group, 3) << "the group keeps its name when its primary dies";
  EXPECT_EQ(Shards(config), (std::vector<int>{3, 0, 1})) << "the old value is kept";
  EXPECT_EQ(config.epoch, 1);
}

TEST(ChainConfigTest, RemovingTheMiddleLinksItsNeighbours) {
  ASSERT_OK_AND_ASSIGN(const ChainConfig config, ThreeMemberChain());
  ASSERT_OK_AND_ASSIGN(ChainConfig next, config.Remove(0));
  EXPECT_EQ(Shards(next), (std::vector<int>{3, 1}));
  EXPECT_EQ(next.Successor(3), MemberFor(1));
  EXPECT_EQ(next.Predecessor(1), MemberFor(3));
  EXPECT_EQ(next.epoch, 2);
}

TEST(ChainConfigTest, RemovingTheTailMakesItsPredecessorTheTail) {
  ASSERT_OK_AND_ASSIGN(const ChainConfig config, ThreeMemberChain());
  ASSERT_OK_AND_ASSIGN(ChainConfig next, config.Remove(1, MemberFor(1).incarnation));
  EXPECT_EQ(Shards(next), (std::vector<int>{3, 0}));
  EXPECT_EQ(next.tail(), MemberFor(0));
  EXPECT_EQ(next.Successor(0), std::nullopt);
}

TEST(ChainConfigTest, RemoveRefusesStrangersOtherIncarnationsAndTheLastMember) {
  ASSERT_OK_AND_ASSIGN(const ChainConfig config, ThreeMemberChain());
  absl::Status status = config.Remove(2).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("shard 2 is not in the chain of group 3"));

  // A late report of shard 0's death after it restarted and rejoined.
  status = config.Remove(0, 999).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("it holds incarnation 1000"));

  ASSERT_OK_AND_ASSIGN(ChainConfig two, config.Remove(0));
  ASSERT_OK_AND_ASSIGN(ChainConfig one, two.Remove(3));
  EXPECT_EQ(Shards(one), std::vector<int>{1});
  EXPECT_EQ(one.head(), one.tail());
  status = one.Remove(1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("last member"));
}

TEST(ChainConfigTest, AppendTailAddsTheNewTail) {
  ASSERT_OK_AND_ASSIGN(const ChainConfig config, ThreeMemberChain());
  ASSERT_OK_AND_ASSIGN(ChainConfig removed, config.Remove(3));
  const Member back = MemberFor(3, 4242);  // restarted: a new incarnation
  ASSERT_OK_AND_ASSIGN(ChainConfig next, removed.AppendTail(back));
  EXPECT_EQ(Shards(next), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(next.tail(), back);
  EXPECT_EQ(next.Predecessor(3), MemberFor(1)) << "the new tail copies from here";
  EXPECT_EQ(next.Successor(1), back);
  EXPECT_EQ(next.epoch, 3);
  EXPECT_EQ(Shards(removed), (std::vector<int>{0, 1}));
}

TEST(ChainConfigTest, AppendTailRefusesMembersFullChainsAndBadMembers) {
  ASSERT_OK_AND_ASSIGN(const ChainConfig full, ThreeMemberChain());
  absl::Status status = full.AppendTail(MemberFor(2)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("already has its 3 members"));

  ASSERT_OK_AND_ASSIGN(const ChainConfig two, full.Remove(0));
  status = two.AppendTail(MemberFor(1, 77)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(), HasSubstr("must be removed before it rejoins"));

  status = two.AppendTail(Member{0, "", 9}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  status = two.AppendTail(Member{0, "a:1", 0}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChainConfigTest, ReorderPutsThePlacementOrderBack) {
  ASSERT_OK_AND_ASSIGN(const ChainConfig config, ThreeMemberChain());  // 3 -> 0 -> 1
  ASSERT_OK_AND_ASSIGN(ChainConfig removed, config.Remove(3));
  const Member back = MemberFor(3, 4242);
  ASSERT_OK_AND_ASSIGN(const ChainConfig rejoined, removed.AppendTail(back));  // 0 -> 1 -> 3
  ASSERT_OK_AND_ASSIGN(const ChainConfig restored, rejoined.Reorder(InitialChain(3, 4, 3)));
  EXPECT_EQ(Shards(restored), (std::vector<int>{3, 0, 1}));
  EXPECT_EQ(restored.head(), back) << "the same members, incarnations included";
  EXPECT_EQ(restored.epoch, rejoined.epoch + 1);
  ASSERT_OK(ValidateChainConfig(restored));

  // Members the order does not name go last, in their order; the named
  // ones that are not members are skipped.
  ASSERT_OK_AND_ASSIGN(const ChainConfig partial, rejoined.Reorder({1, 2}));
  EXPECT_EQ(Shards(partial), (std::vector<int>{1, 0, 3}));
  ASSERT_OK_AND_ASSIGN(const ChainConfig same, config.Reorder({3, 0, 1}));
  EXPECT_EQ(same.members, config.members);
  EXPECT_EQ(same.epoch, config.epoch + 1);

  ChainConfig last = config;
  last.epoch = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(last.Reorder({0}).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(ChainConfigTest, TransitionsOfAnInvalidConfigFail) {
  ChainConfig empty;  // no members
  EXPECT_EQ(empty.AppendTail(MemberFor(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ChainConfig dup;
  dup.replicas = 2;
  dup.members = {MemberFor(0), MemberFor(0)};
  EXPECT_EQ(dup.Remove(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChainConfigTest, EpochRisesByOneOnEveryChange) {
  ASSERT_OK_AND_ASSIGN(ChainConfig config, ThreeMemberChain());
  uint64_t incarnation = 5000;
  // Each member dies and comes back in turn, twice round the chain.
  for (int round = 0; round < 6; ++round) {
    const int victim = config.head().shard;
    const int64_t before = config.epoch;
    ASSERT_OK_AND_ASSIGN(config, config.Remove(victim));
    EXPECT_EQ(config.epoch, before + 1);
    ASSERT_OK_AND_ASSIGN(config, config.AppendTail(MemberFor(victim, ++incarnation)));
    EXPECT_EQ(config.epoch, before + 2);
    ASSERT_OK(ValidateChainConfig(config));
  }
  EXPECT_EQ(config.epoch, 13);
  EXPECT_EQ(Shards(config), (std::vector<int>{3, 0, 1})) << "full rotations";

  config.epoch = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(config.Remove(0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(config.AppendTail(MemberFor(2)).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(ChainConfigTest, FitsShardsChecksIndicesAgainstTheJob) {
  ASSERT_OK_AND_ASSIGN(const ChainConfig config, ThreeMemberChain());
  EXPECT_OK(CheckChainFitsShards(config, 4));
  EXPECT_THAT(CheckChainFitsShards(config, 3).message(),
              HasSubstr("does not fit a job of 3 shards"));
  ASSERT_OK_AND_ASSIGN(const ChainConfig far,
                       MakeChainConfig(1, 2, {MemberFor(1), MemberFor(9)}));
  EXPECT_THAT(CheckChainFitsShards(far, 4).message(),
              HasSubstr("lists shard 9, but the job has 4 shards"));
  ASSERT_OK_AND_ASSIGN(const ChainConfig three, MakeChainConfig(0, 3, {MemberFor(0)}));
  EXPECT_EQ(CheckChainFitsShards(three, 2).code(), absl::StatusCode::kInvalidArgument)
      << "3 replicas do not fit 2 shards";
}

TEST(ChainConfigCodecTest, RoundTripsEveryField) {
  std::vector<ChainConfig> configs;
  ASSERT_OK_AND_ASSIGN(ChainConfig three, ThreeMemberChain());
  configs.push_back(three);
  ASSERT_OK_AND_ASSIGN(ChainConfig next, three.Remove(0));
  configs.push_back(next);
  // Group 0 and shard 0 are proto3 defaults, omitted from the text; an
  // address with quotes and non-ASCII bytes is escaped.
  ASSERT_OK_AND_ASSIGN(
      ChainConfig odd,
      MakeChainConfig(0, 2, {Member{0, "h\"o\\st\n\xc3\xa9:1", ~uint64_t{0}}}));
  odd.epoch = std::numeric_limits<int64_t>::max();
  configs.push_back(odd);
  for (const ChainConfig& config : configs) {
    const std::string text = EncodeChainConfig(config);
    EXPECT_EQ(text.find('\n'), std::string::npos) << "one line: " << text;
    ASSERT_OK_AND_ASSIGN(ChainConfig decoded, DecodeChainConfig(text));
    EXPECT_EQ(decoded, config) << text;
  }
  EXPECT_EQ(EncodeChainConfig(three),
            "group: 3 epoch: 1 replicas: 3 "
            "members { shard: 3 address: \"10.0.0.3:7000\" incarnation: 1003 } "
            "members { address: \"10.0.0.0:7000\" incarnation: 1000 } "
            "members { shard: 1 address: \"10.0.0.1:7000\" incarnation: 1001 }");
}

TEST(ChainConfigCodecTest, EncodedEpochFollowsTransitions) {
  ASSERT_OK_AND_ASSIGN(const ChainConfig config, ThreeMemberChain());
  ASSERT_OK_AND_ASSIGN(const ChainConfig next, config.Remove(1));
  ASSERT_OK_AND_ASSIGN(const ChainConfig a, DecodeChainConfig(EncodeChainConfig(config)));
  ASSERT_OK_AND_ASSIGN(const ChainConfig b, DecodeChainConfig(EncodeChainConfig(next)));
  EXPECT_LT(a.epoch, b.epoch);
  EXPECT_NE(EncodeChainConfig(config), EncodeChainConfig(next));
}

TEST(ChainConfigCodecTest, DecodeRefusesGarbage) {
  ASSERT_OK_AND_ASSIGN(const ChainConfig config, ThreeMemberChain());
  const std::string good = EncodeChainConfig(config);
  struct Bad {
    std::string text;
    const char* says;
  };
  std::string binary;
  {
    ChainConfigProto p;
    p.set_group(1);
    p.set_epoch(3);
    p.set_replicas(2);
    p.add_members()->set_address("a:1");
    binary = p.SerializeAsString();
  }
  const std::vector<Bad> bad = {
      {"", "has epoch 0"},  // parses to the empty message, which is invalid
      {"hello", "does not parse"},
      {"group: 1 epoch: 2 replicas: 2", "has 0 members"},
      {good.substr(0, good.size() / 2), "does not parse"},
      {good + " color: 3", "does not parse"},  // unknown field
      {good + " epoch: 9", "does not parse"},  // a field twice
      {"group: 1 epoch: -4 replicas: 1 members { shard: 1 address: \"a:1\" incarnation: 1 }",
       "has epoch -4"},
      {"group: 1 epoch: 99999999999999999999", "does not parse"},  // int64 overflow
      {"group: 1 epoch: 1 replicas: 1 members { shard: 1 address: \"a:1\" incarnation: -1 }",
       "does not parse"},
      {binary, "does not parse"},
      {std::string("\0\xff\x01garbage", 10), "does not parse"},
      {std::string(kMaxEncodedChainConfigBytes + 1, ' '), "the limit is"},
  };
  for (const Bad& b : bad) {
    const absl::StatusOr<ChainConfig> decoded = DecodeChainConfig(b.text);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument)
        << "accepted: " << b.text;
    EXPECT_THAT(decoded.status().message(), HasSubstr(b.says)) << b.text;
  }
}

TEST(ChainMemberCodecTest, RoundTripsAndRefusesGarbage) {
  const Member member{5, "shard-5.shards.default.svc:7000", 0xfeedfacecafebeefull};
  const std::string text = EncodeChainMember(member);
  ASSERT_OK_AND_ASSIGN(const Member decoded, DecodeChainMember(text));
  EXPECT_EQ(decoded, member);
  for (const std::string& garbage :
       {std::string(), std::string("shard: 1"), std::string("shard: 1 address: \"a:1\""),
        std::string("shard: -1 address: \"a:1\" incarnation: 3"), std::string("{{{"),
        std::string("shard: 1 address: \"a:1\" incarnation: 3 members {}")}) {
    EXPECT_EQ(DecodeChainMember(garbage).status().code(),
              absl::StatusCode::kInvalidArgument)
        << garbage;
  }
}

}  // namespace
}  // namespace shardtrain::chain
