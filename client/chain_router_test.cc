#include "client/chain_router.h"

#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "chain/replication_keys.h"
#include "client/ps_client_metrics.h"
#include "client/testing/etcd_chains.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::client {
namespace {

using ::shardtrain::client::testing::EtcdChains;
using ::shardtrain::testutil::EtcdProcess;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kJob[] = "routertest";

// Polls `done` every 10 ms until it holds or `timeout` passes.
template <typename Done>
bool WaitUntil(Done done, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time give_up = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

class ChainRouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
    ASSERT_OK_AND_ASSIGN(chains_, EtcdChains::Start(kJob));
  }

  ChainRouter::Options RouterOptions(int num_groups) const {
    ChainRouter::Options options;
    options.etcd_endpoints = chains_->endpoint();
    options.job = kJob;
    options.num_groups = num_groups;
    options.etcd_timeout = absl::Milliseconds(500);
    return options;
  }

  // The shard of `role` in `group`'s chain, or -1.
  static int ShardOf(const ChainRouter& router, int group, ChainRole role) {
    const absl::StatusOr<ChainRoute> route = router.Route(group, role);
    return route.ok() ? route->shard : -1;
  }

  std::unique_ptr<EtcdChains> chains_;
};

TEST_F(ChainRouterTest, ReadsEveryChainAtCreate) {
  ASSERT_OK(chains_->Put(0, {0, 1}).status());
  ASSERT_OK(chains_->Put(1, {1, 2}, /*epoch=*/7).status());
  ASSERT_OK(chains_->Put(2, {2}).status());
  // Another job's chain is not this one's.
  ASSERT_OK(chains_->client().Put(chain::ChainKey("other", 0),
                                  chain::EncodeChainConfig(*EtcdChains::Config(0, 9, {2}))));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChainRouter> router,
                       ChainRouter::Create(RouterOptions(3)));
  ASSERT_OK(router->WaitForGroups(3, absl::ZeroDuration()));

  ASSERT_OK_AND_ASSIGN(ChainRoute head, router->Route(0, ChainRole::kHead));
  EXPECT_EQ(head.shard, 0);
  EXPECT_EQ(head.epoch, 1u);
  ASSERT_OK_AND_ASSIGN(ChainRoute tail, router->Route(0, ChainRole::kTail));
  EXPECT_EQ(tail.shard, 1);
  ASSERT_OK_AND_ASSIGN(tail, router->Route(1, ChainRole::kTail));
  EXPECT_EQ(tail.shard, 2);
  EXPECT_EQ(tail.epoch, 7u);
  EXPECT_EQ(ShardOf(*router, 2, ChainRole::kHead), 2);
  EXPECT_EQ(ShardOf(*router, 2, ChainRole::kTail), 2);
  EXPECT_THAT(router->MemberShards(), ElementsAre(0, 1, 2));
  EXPECT_EQ(router->changes(), 0);

  EXPECT_EQ(router->Route(3, ChainRole::kHead).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(router->Route(0, ChainRole::kNone).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ChainRouterTest, TheWatchSeesACompareAndSwap) {
  ASSERT_OK(chains_->Put(0, {0, 1}).status());
  ASSERT_OK(chains_->Put(1, {1, 0}).status());
  prometheus::Registry registry;
  PsClientMetrics metrics(registry);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChainRouter> router,
                       ChainRouter::Create(RouterOptions(2), &metrics));

  // Shard 0 died: its chains drop it.
  ASSERT_OK(chains_->Change(0, {1}).status());
  ASSERT_TRUE(WaitUntil([&] { return ShardOf(*router, 0, ChainRole::kHead) == 1; }));
  ASSERT_OK_AND_ASSIGN(ChainRoute head, router->Route(0, ChainRole::kHead));
  EXPECT_EQ(head.epoch, 2u);
  ASSERT_OK(chains_->Change(1, {1}).status());
  ASSERT_TRUE(WaitUntil([&] { return ShardOf(*router, 1, ChainRole::kTail) == 1; }));
  EXPECT_THAT(router->MemberShards(), ElementsAre(1));

  // It came back and rejoined group 0 as its tail.
  ASSERT_OK(chains_->Change(0, {1, 0}).status());
  ASSERT_TRUE(WaitUntil([&] { return ShardOf(*router, 0, ChainRole::kTail) == 0; }));
  EXPECT_EQ(router->Route(0, ChainRole::kTail)->epoch, 3u);
  EXPECT_EQ(router->changes(), 3);
  EXPECT_EQ(metrics.chain_changes(0).Value(), 2);
  EXPECT_EQ(metrics.chain_changes(1).Value(), 1);
  // No etcd read was needed for any of it.
  EXPECT_EQ(router->refresh_reads(), 0);
}

// etcd loses its data (restarted empty): its revisions start again, and the
// shards put the chains back at later epochs. The watch ends (DATA_LOSS),
// the router reads everything again and adopts them by their epochs,
// though their revisions are lower than those it held, and watches on.
TEST_F(ChainRouterTest, FollowsTheChainsPutBackAfterEtcdLostItsData) {
  ASSERT_OK(chains_->Put(0, {0, 1}).status());
  for (int i = 0; i < 50; ++i) ASSERT_OK(chains_->Change(0, i % 2 == 0 ? std::vector{1, 0}
                                                                      : std::vector{0, 1})
                                             .status());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChainRouter> router,
                       ChainRouter::Create(RouterOptions(2)));
  ASSERT_OK_AND_ASSIGN(ChainRoute before, router->Route(0, ChainRole::kHead));
  ASSERT_EQ(before.epoch, 51u);
  ASSERT_OK(chains_->process().RestartEmpty());
  ASSERT_OK(chains_->Put(0, {1}, /*epoch=*/52).status());
  ASSERT_TRUE(WaitUntil([&] { return ShardOf(*router, 0, ChainRole::kHead) == 1; }));
  EXPECT_EQ(router->Route(0, ChainRole::kHead)->epoch, 52u);
  // An older epoch does not replace it, however late it is written.
  ASSERT_OK(chains_->Put(0, {0, 1}, /*epoch=*/40).status());
  ASSERT_OK(chains_->Change(0, {1, 0}).status());  // epoch 41: still older
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(router->Route(0, ChainRole::kHead)->epoch, 52u);
  ASSERT_OK(chains_->Put(0, {0, 1}, /*epoch=*/53).status());
  ASSERT_TRUE(WaitUntil([&] { return ShardOf(*router, 0, ChainRole::kHead) == 0; }));
}

TEST_F(ChainRouterTest, RefreshRereadsTheKeyAtMostEveryInterval) {
  ASSERT_OK(chains_->Put(0, {0, 1}).status());
  ChainRouter::Options options = RouterOptions(2);
  options.watch = false;  // only Refresh can see a change
  options.refresh_interval = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChainRouter> router, ChainRouter::Create(options));

  ASSERT_OK(chains_->Change(0, {1, 0}).status());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(ShardOf(*router, 0, ChainRole::kHead), 0);  // no watch
  router->Refresh(0);
  ASSERT_EQ(ShardOf(*router, 0, ChainRole::kHead), 1);
  EXPECT_EQ(router->Route(0, ChainRole::kHead)->epoch, 2u);
  EXPECT_EQ(router->refresh_reads(), 1);

  // Within the interval the last read stands.
  ASSERT_OK(chains_->Change(0, {0}).status());
  router->Refresh(0);
  EXPECT_EQ(ShardOf(*router, 0, ChainRole::kHead), 1);
  EXPECT_EQ(router->refresh_reads(), 1);

  absl::SleepFor(absl::Milliseconds(350));
  router->Refresh(0);
  ASSERT_EQ(ShardOf(*router, 0, ChainRole::kHead), 0);
  EXPECT_EQ(router->Route(0, ChainRole::kHead)->epoch, 3u);
  EXPECT_EQ(router->refresh_reads(), 2);
}

TEST_F(ChainRouterTest, KeepsTheRoutesWhileEtcdIsDownAndFollowsAgainAfter) {
  ASSERT_OK(chains_->Put(0, {0, 1}).status());
  ASSERT_OK(chains_->Put(1, {1, 0}).status());
  ChainRouter::Options options = RouterOptions(2);
  options.refresh_interval = absl::ZeroDuration();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChainRouter> router, ChainRouter::Create(options));

  ASSERT_OK(chains_->process().Kill());
  const absl::Time start = absl::Now();
  router->Refresh(0);  // fails: logged, the cached route stays
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_OK_AND_ASSIGN(ChainRoute head, router->Route(0, ChainRole::kHead));
  EXPECT_EQ(head.shard, 0);
  EXPECT_EQ(head.epoch, 1u);
  // Right after a failure etcd is not asked again: no wait.
  const absl::Time again = absl::Now();
  router->RefreshAll();
  EXPECT_LT(absl::Now() - again, absl::Milliseconds(200));
  EXPECT_EQ(ShardOf(*router, 1, ChainRole::kTail), 0);

  // etcd is back: the watch resumes and sees the next change.
  ASSERT_OK(chains_->process().Restart());
  absl::StatusOr<chain::ChainConfig> changed;
  ASSERT_TRUE(WaitUntil([&] {
    changed = chains_->Change(1, {0});
    return changed.ok();
  })) << changed.status();
  ASSERT_TRUE(WaitUntil([&] { return ShardOf(*router, 1, ChainRole::kHead) == 0; },
                        absl::Seconds(20)));
  EXPECT_EQ(router->Route(1, ChainRole::kHead)->epoch, 2u);
}

TEST_F(ChainRouterTest, WaitForGroupsNamesTheMissingOnes) {
  ASSERT_OK(chains_->Put(0, {0, 1}).status());
  ASSERT_OK(chains_->Put(2, {2, 0}).status());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChainRouter> router,
                       ChainRouter::Create(RouterOptions(4)));
  const absl::Status missing = router->WaitForGroups(4, absl::Milliseconds(200));
  EXPECT_EQ(missing.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(missing.message(), HasSubstr("groups 1, 3 after"));
  EXPECT_THAT(missing.message(), HasSubstr(chain::ChainsPrefix(kJob)));
  EXPECT_EQ(router->Route(1, ChainRole::kHead).status().code(),
            absl::StatusCode::kUnavailable);
  ASSERT_OK(router->WaitForGroups(1, absl::ZeroDuration()));

  // The shards create the missing chains a little later.
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_OK(chains_->Put(1, {1, 2}).status());
    ASSERT_OK(chains_->Put(3, {3, 0}).status());
  });
  EXPECT_OK(router->WaitForGroups(4, absl::Seconds(10)));
  late.join();
  EXPECT_EQ(ShardOf(*router, 3, ChainRole::kTail), 0);
}

TEST_F(ChainRouterTest, IgnoresValuesThatAreNotThisJobsChains) {
  ASSERT_OK(chains_->Put(0, {0, 1}).status());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChainRouter> router,
                       ChainRouter::Create(RouterOptions(2)));
  etcd::EtcdClient& etcd = chains_->client();
  // Garbage, a config of another group under this key, a member beyond the
  // job's shards, a group beyond the job's: all ignored.
  ASSERT_OK(etcd.Put(chain::ChainKey(kJob, 1), "not a chain"));
  ASSERT_OK(etcd.Put(chain::ChainKey(kJob, 1),
                     chain::EncodeChainConfig(*EtcdChains::Config(0, 5, {1}))));
  ASSERT_OK(etcd.Put(chain::ChainKey(kJob, 0),
                     chain::EncodeChainConfig(*EtcdChains::Config(0, 5, {7}))));
  ASSERT_OK(etcd.Put(chain::ChainKey(kJob, 2),
                     chain::EncodeChainConfig(*EtcdChains::Config(2, 1, {0}))));
  // A good one after them shows the watch went past them.
  ASSERT_OK(chains_->Put(1, {1, 0}, /*epoch=*/4).status());
  ASSERT_TRUE(WaitUntil([&] { return ShardOf(*router, 1, ChainRole::kHead) == 1; }));
  EXPECT_EQ(router->Route(1, ChainRole::kHead)->epoch, 4u);
  ASSERT_OK_AND_ASSIGN(ChainRoute head, router->Route(0, ChainRole::kHead));
  EXPECT_EQ(head.shard, 0);
  EXPECT_EQ(head.epoch, 1u);
  // A deleted chain keeps routing by its last configuration.
  ASSERT_OK(etcd.Delete(chain::ChainKey(kJob, 0)).status());
  router->Refresh(0);
  EXPECT_EQ(ShardOf(*router, 0, ChainRole::kTail), 1);
}

TEST(ChainRouterCreateTest, RefusesBadOptionsAndAnUnreachableEtcd) {
  ChainRouter::Options options;
  options.num_groups = 2;
  EXPECT_EQ(ChainRouter::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.etcd_endpoints = "127.0.0.1:1";
  options.job = "bad/job";
  EXPECT_EQ(ChainRouter::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.job = "ok";
  options.etcd_timeout = absl::Milliseconds(200);
  const absl::Status unreachable = ChainRouter::Create(options).status();
  EXPECT_EQ(unreachable.code(), absl::StatusCode::kUnavailable) << unreachable;
  EXPECT_THAT(unreachable.message(), HasSubstr("127.0.0.1:1"));
}

}  // namespace
}  // namespace shardtrain::client
