#include "ctl/chain_admin.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "chain/chain_config.h"
#include "chain/replication_keys.h"
#include "common/testing/status_matchers.h"
#include "etcd/etcd_client.h"
#include "testing/etcd_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::ctl {
namespace {

using ::shardtrain::chain::ChainConfig;
using ::shardtrain::etcd::EtcdClient;
using ::shardtrain::testutil::EtcdProcess;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kJob[] = "admin-test";

ChainConfig::Member Member(int shard) {
  return {shard, absl::StrCat("127.0.0.1:", 7000 + shard),
          0x1000000000000000ull * static_cast<uint64_t>(shard + 1) + 0xabc};
}

class ChainAdminTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
    ASSERT_OK_AND_ASSIGN(etcd_process_, EtcdProcess::Start());
    ASSERT_OK_AND_ASSIGN(etcd_, Connect());
  }

  absl::StatusOr<std::unique_ptr<EtcdClient>> Connect() {
    EtcdClient::Options options;
    options.endpoints = etcd_process_->endpoint();
    return EtcdClient::Create(options);
  }

  // Writes group `group`'s chain: `shards` head first, at `epoch`.
  void PutChain(int group, int replicas, const std::vector<int>& shards,
                int64_t epoch = 1) {
    std::vector<ChainConfig::Member> members;
    for (int shard : shards) members.push_back(Member(shard));
    ASSERT_OK_AND_ASSIGN(ChainConfig chain,
                         chain::MakeChainConfig(group, replicas, members));
    chain.epoch = epoch;
    ASSERT_OK(etcd_->Put(chain::ChainKey(kJob, group), chain::EncodeChainConfig(chain))
                  .status());
  }

  void PutLive(int shard) {
    ASSERT_OK(etcd_->Put(chain::MemberKey(kJob, shard),
                         chain::EncodeChainMember(Member(shard)))
                  .status());
  }

  ChainConfig GetChain(int group) {
    absl::StatusOr<etcd::KeyValue> kv = etcd_->Get(chain::ChainKey(kJob, group));
    EXPECT_OK(kv.status());
    if (!kv.ok()) return {};
    absl::StatusOr<ChainConfig> chain = chain::DecodeChainConfig(kv->value);
    EXPECT_OK(chain.status());
    return chain.ok() ? *chain : ChainConfig{};
  }

  static std::vector<int> Shards(const ChainConfig& chain) {
    std::vector<int> shards;
    for (const ChainConfig::Member& member : chain.members) shards.push_back(member.shard);
    return shards;
  }

  // Every key of the job and the store's revision.
  etcd::RangeResult Snapshot() {
    absl::StatusOr<etcd::RangeResult> range = etcd_->GetPrefix(chain::JobPrefix(kJob));
    EXPECT_OK(range.status());
    return range.ok() ? *range : etcd::RangeResult{};
  }

  // Group 0: 0 -> 1, group 1: 1 -> 2, group 2: 2 alone (degraded), R = 2;
  // shards 0 and 1 live.
  void ThreeGroups() {
    PutChain(0, 2, {0, 1}, 3);
    PutChain(1, 2, {1, 2}, 5);
    PutChain(2, 2, {2}, 7);
    PutLive(0);
    PutLive(1);
  }

  std::unique_ptr<EtcdProcess> etcd_process_;
  std::unique_ptr<EtcdClient> etcd_;
};

TEST_F(ChainAdminTest, ListsChainsLivenessAndDrainedShards) {
  ThreeGroups();
  ASSERT_OK(etcd_->Put(chain::DrainedKey(kJob, 2), "drained by ops").status());
  ASSERT_OK_AND_ASSIGN(ChainsView view, ReadChains(*etcd_, kJob));
  ASSERT_EQ(view.chains.size(), 3u);
  EXPECT_THAT(Shards(view.chains[0]), ElementsAre(0, 1));
  EXPECT_THAT(Shards(view.chains[1]), ElementsAre(1, 2));
  EXPECT_EQ(view.chains[2].epoch, 7);
  EXPECT_FALSE(Degraded(view.chains[0]));
  EXPECT_TRUE(Degraded(view.chains[2]));
  EXPECT_EQ(view.live.size(), 2u);
  EXPECT_EQ(view.live.at(1), Member(1));
  EXPECT_EQ(view.drained.at(2), "drained by ops");
  EXPECT_TRUE(view.bad_keys.empty());

  const std::string out = FormatChains(view);
  const std::vector<std::string> lines = absl::StrSplit(out, '\n');
  auto line_of = [&](absl::string_view start) -> std::string {
    for (const std::string& line : lines) {
      if (absl::StartsWith(line, start)) return line;
    }
    return "";
  };
  EXPECT_THAT(line_of("0     "), HasSubstr("ok"));
  EXPECT_THAT(line_of("0     "), HasSubstr("2/2"));
  EXPECT_THAT(line_of("0     "),
              HasSubstr("0@127.0.0.1:7000/10000000 -> 1@127.0.0.1:7001/20000000"));
  EXPECT_THAT(line_of("2     "), HasSubstr("DEGRADED"));
  EXPECT_THAT(line_of("2     "), HasSubstr("1/2"));
  EXPECT_THAT(line_of("1     "), Not(HasSubstr("DEGRADED")));
  EXPECT_THAT(out, HasSubstr("groups: 3, degraded: 2\n"));
  EXPECT_THAT(out, HasSubstr("shards: live 0, 1; not live 2; drained 2\n"));
  EXPECT_THAT(out, HasSubstr("g0:tail g1:head"));
  EXPECT_THAT(out, HasSubstr("yes: drained by ops"));
}

TEST_F(ChainAdminTest, ListingReportsKeysThatDoNotDecode) {
  PutChain(0, 2, {0, 1});
  ASSERT_OK(etcd_->Put(chain::ChainKey(kJob, 1), "garbage {").status());
  ASSERT_OK(etcd_->Put(chain::MemberKey(kJob, 0), "shard: 0").status());
  ASSERT_OK(etcd_->Put(absl::StrCat(chain::DrainedPrefix(kJob), "07"), "x").status());
  ASSERT_OK_AND_ASSIGN(ChainsView view, ReadChains(*etcd_, kJob));
  EXPECT_EQ(view.chains.size(), 1u);
  EXPECT_TRUE(view.live.empty());
  EXPECT_TRUE(view.drained.empty());
  ASSERT_EQ(view.bad_keys.size(), 3u);
  const std::string out = FormatChains(view);
  EXPECT_THAT(out, HasSubstr(absl::StrCat("BAD KEY ", chain::ChainKey(kJob, 1))));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("BAD KEY ", chain::MemberKey(kJob, 0))));
}

// Formatting needs no etcd: a view as ReadChains would return it.
TEST(FormatChainsTest, MarksFullChainsOutOfThePlacementOrder) {
  ChainsView view;
  view.job = kJob;
  auto chain = [](int group, const std::vector<int>& shards) {
    std::vector<ChainConfig::Member> members;
    for (int shard : shards) members.push_back(Member(shard));
    absl::StatusOr<ChainConfig> made = chain::MakeChainConfig(group, 2, members);
    EXPECT_OK(made.status());
    return *made;
  };
  // Placement with 3 shards, R=2: g0 {0, 1}, g1 {1, 2}, g2 {2, 0}.
  view.chains = {chain(0, {0, 1}), chain(1, {2, 1}), chain(2, {0})};
  EXPECT_FALSE(OutOfPlacementOrder(view.chains[0], 3));
  EXPECT_TRUE(OutOfPlacementOrder(view.chains[1], 3));
  EXPECT_FALSE(OutOfPlacementOrder(view.chains[2], 3));  // degraded: that says more
  EXPECT_FALSE(OutOfPlacementOrder(view.chains[1], 1));   // not a valid placement

  const std::string out = FormatChains(view);
  EXPECT_THAT(out, HasSubstr(absl::StrCat("2/2 reordered  ", FormatMember(Member(2)),
                                          " -> ", FormatMember(Member(1)))));
  EXPECT_THAT(out, HasSubstr("2/2 ok"));
  EXPECT_THAT(out, HasSubstr("1/2 DEGRADED"));
  EXPECT_THAT(out, HasSubstr("reordered (all members, not in the placement's order): 1;"));
}

TEST_F(ChainAdminTest, AnotherJobsKeysAreNotListed) {
  ThreeGroups();
  ASSERT_OK_AND_ASSIGN(ChainsView view, ReadChains(*etcd_, "admin-test2"));
  EXPECT_TRUE(view.chains.empty());
  EXPECT_TRUE(view.live.empty());
  EXPECT_THAT(FormatChains(view), HasSubstr("no chains under /shardtrain/admin-test2/"));
}

TEST_F(ChainAdminTest, DrainRemovesTheShardFromEveryChainOneEpochLater) {
  ThreeGroups();
  DrainOptions options;
  options.note = "drained by test";
  ASSERT_OK_AND_ASSIGN(DrainResult result, DrainShard(*etcd_, kJob, 1, options));
  EXPECT_FALSE(result.already_drained);
  EXPECT_EQ(result.cas_conflicts, 0);
  ASSERT_EQ(result.changes.size(), 2u);
  EXPECT_EQ(result.changes[0].before.epoch, 3);
  EXPECT_EQ(result.changes[0].after.epoch, 4);
  EXPECT_EQ(result.changes[1].after.group, 1);

  const ChainConfig g0 = GetChain(0), g1 = GetChain(1), g2 = GetChain(2);
  EXPECT_THAT(Shards(g0), ElementsAre(0));
  EXPECT_EQ(g0.epoch, 4);
  EXPECT_THAT(Shards(g1), ElementsAre(2));  // the head left: 2 is promoted
  EXPECT_EQ(g1.epoch, 6);
  EXPECT_THAT(Shards(g2), ElementsAre(2));
  EXPECT_EQ(g2.epoch, 7);  // untouched
  ASSERT_OK_AND_ASSIGN(etcd::KeyValue drained, etcd_->Get(chain::DrainedKey(kJob, 1)));
  EXPECT_EQ(drained.value, "drained by test");

  // Again: nothing left to remove; the first note stays.
  options.note = "second";
  ASSERT_OK_AND_ASSIGN(result, DrainShard(*etcd_, kJob, 1, options));
  EXPECT_TRUE(result.already_drained);
  EXPECT_TRUE(result.changes.empty());
  ASSERT_OK_AND_ASSIGN(drained, etcd_->Get(chain::DrainedKey(kJob, 1)));
  EXPECT_EQ(drained.value, "drained by test");
}

TEST_F(ChainAdminTest, DrainOfALastMemberIsRefusedAndChangesNothing) {
  ThreeGroups();
  const etcd::RangeResult before = Snapshot();
  absl::StatusOr<DrainResult> result = DrainShard(*etcd_, kJob, 2, {});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(), HasSubstr("last member of the chain of group 2"));
  EXPECT_THAT(result.status().message(), HasSubstr("nothing changed"));
  const etcd::RangeResult after = Snapshot();
  EXPECT_EQ(after.revision, before.revision);  // not one write
  EXPECT_EQ(after.kvs.size(), before.kvs.size());
  EXPECT_EQ(etcd_->Get(chain::DrainedKey(kJob, 2)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ChainAdminTest, ShardBecomingALastMemberMidwayStopsTheDrainAndDeletesTheKey) {
  ThreeGroups();
  DrainOptions options;
  // While shard 1 leaves group 0, shard 2 dies: shard 1 is now group 1's
  // only copy.
  options.before_cas = [&](int group, int attempt) {
    if (group != 0 || attempt != 0) return;
    PutChain(1, 2, {1}, 6);
  };
  absl::StatusOr<DrainResult> result = DrainShard(*etcd_, kJob, 1, options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(), HasSubstr("last member of the chain of group 1"));
  EXPECT_THAT(result.status().message(), HasSubstr("drained key was deleted again"));
  EXPECT_THAT(result.status().message(), HasSubstr("removed from the chains of groups 0"));
  EXPECT_THAT(Shards(GetChain(0)), ElementsAre(0));
  EXPECT_THAT(Shards(GetChain(1)), ElementsAre(1));
  EXPECT_EQ(GetChain(1).epoch, 6);
  EXPECT_EQ(etcd_->Get(chain::DrainedKey(kJob, 1)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ChainAdminTest, ACompareAndSwapLostToAnotherWriterIsRetried) {
  PutChain(0, 3, {0, 1});
  PutChain(1, 3, {1, 0});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> other, Connect());
  DrainOptions options;
  // Shard 2 joins group 0 as tail between the drain's read and its write.
  options.before_cas = [&](int group, int attempt) {
    if (group != 0 || attempt != 0) return;
    ASSERT_OK_AND_ASSIGN(etcd::KeyValue kv, other->Get(chain::ChainKey(kJob, 0)));
    ASSERT_OK_AND_ASSIGN(ChainConfig chain, chain::DecodeChainConfig(kv.value));
    ASSERT_OK_AND_ASSIGN(ChainConfig next, chain.AppendTail(Member(2)));
    ASSERT_OK_AND_ASSIGN(etcd::CasResult cas,
                         other->CompareAndSwap(kv.key, kv.mod_revision,
                                               chain::EncodeChainConfig(next)));
    ASSERT_TRUE(cas.succeeded);
  };
  ASSERT_OK_AND_ASSIGN(DrainResult result, DrainShard(*etcd_, kJob, 1, options));
  EXPECT_EQ(result.cas_conflicts, 1);
  const ChainConfig g0 = GetChain(0);
  EXPECT_THAT(Shards(g0), ElementsAre(0, 2));  // both changes, neither lost
  EXPECT_EQ(g0.epoch, 3);
  EXPECT_EQ(GetChain(1).epoch, 2);
  EXPECT_THAT(Shards(GetChain(1)), ElementsAre(0));
}

TEST_F(ChainAdminTest, AChainThatChangesUnderEveryAttemptAbortsTheDrain) {
  PutChain(0, 3, {0, 1});
  PutChain(1, 3, {1, 0});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> other, Connect());
  DrainOptions options;
  options.max_attempts_per_chain = 4;
  int calls = 0;
  // Rewrites group 0's chain (a new mod_revision) before every attempt.
  options.before_cas = [&](int group, int) {
    if (group != 0) return;
    ++calls;
    ASSERT_OK_AND_ASSIGN(etcd::KeyValue kv, other->Get(chain::ChainKey(kJob, 0)));
    ASSERT_OK(other->Put(kv.key, kv.value).status());
  };
  absl::StatusOr<DrainResult> result = DrainShard(*etcd_, kJob, 1, options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(result.status().message(), HasSubstr("each of 4 attempts"));
  EXPECT_EQ(calls, 4);
  // Nothing changed, so the marker went again.
  EXPECT_THAT(Shards(GetChain(0)), ElementsAre(0, 1));
  EXPECT_THAT(Shards(GetChain(1)), ElementsAre(1, 0));
  EXPECT_EQ(etcd_->Get(chain::DrainedKey(kJob, 1)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ChainAdminTest, ConcurrentDrainsOfTwoShardsBothTakeEffect) {
  PutChain(0, 3, {0, 1, 2});
  PutChain(1, 3, {1, 2, 0});
  PutChain(2, 3, {2, 0, 1});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> other, Connect());
  absl::StatusOr<DrainResult> first, second;
  std::thread a([&] { first = DrainShard(*etcd_, kJob, 1, {}); });
  std::thread b([&] { second = DrainShard(*other, kJob, 2, {}); });
  a.join();
  b.join();
  ASSERT_OK(first.status());
  ASSERT_OK(second.status());
  EXPECT_EQ(first->changes.size(), 3u);
  EXPECT_EQ(second->changes.size(), 3u);
  for (int group = 0; group < 3; ++group) {
    const ChainConfig chain = GetChain(group);
    EXPECT_THAT(Shards(chain), ElementsAre(0)) << "group " << group;
    EXPECT_EQ(chain.epoch, 3) << "group " << group;
  }
}

TEST_F(ChainAdminTest, UndrainDeletesTheKey) {
  ThreeGroups();
  ASSERT_OK(DrainShard(*etcd_, kJob, 0, {}).status());
  ASSERT_OK(etcd_->Get(chain::DrainedKey(kJob, 0)).status());
  ASSERT_OK_AND_ASSIGN(bool existed, UndrainShard(*etcd_, kJob, 0));
  EXPECT_TRUE(existed);
  EXPECT_EQ(etcd_->Get(chain::DrainedKey(kJob, 0)).status().code(), absl::StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(existed, UndrainShard(*etcd_, kJob, 0));
  EXPECT_FALSE(existed);
  // Undrain leaves the chains to the shard, which rejoins by itself.
  EXPECT_THAT(Shards(GetChain(1)), ElementsAre(1, 2));
  EXPECT_THAT(Shards(GetChain(0)), ElementsAre(1));
}

TEST_F(ChainAdminTest, BadRequestsChangeNothing) {
  ThreeGroups();
  ASSERT_OK(etcd_->Put(chain::ChainKey(kJob, 3), "members {").status());
  const etcd::RangeResult before = Snapshot();
  EXPECT_EQ(DrainShard(*etcd_, kJob, -1, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DrainShard(*etcd_, "no/such", 0, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UndrainShard(*etcd_, "", 0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status status = DrainShard(*etcd_, "other-job", 0, {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("is --job right"));
  // A chain that does not decode might hold the shard.
  status = DrainShard(*etcd_, kJob, 0, {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("does not decode"));
  ASSERT_OK(etcd_->Delete(chain::ChainKey(kJob, 3)).status());
  status = DrainShard(*etcd_, kJob, 9, {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("no shard 9"));
  EXPECT_EQ(Snapshot().kvs.size(), before.kvs.size() - 1);
  EXPECT_EQ(etcd_->Get(chain::DrainedKey(kJob, 9)).status().code(), absl::StatusCode::kNotFound);
}

TEST(ChainAdminFormatTest, MemberShowsTheIncarnationsFirstEightHexDigits) {
  EXPECT_EQ(FormatMember({3, "ps-3.ps:7000", 0x0123456789abcdefull}),
            "3@ps-3.ps:7000/01234567");
}

}  // namespace
}  // namespace shardtrain::ctl
