// EtcdClient against a real three-member etcd cluster: when the member the
// client uses dies or stops answering, calls, lease keep-alives and watches
// go on through the other two, which still hold the quorum.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "etcd/etcd_client.h"
#include "testing/etcd_process.h"
#include "etcd/testing/event_log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::etcd {
namespace {

using ::shardtrain::testutil::EtcdProcess;
using ::shardtrain::etcd::testing::EventLog;

// The values of the events `log` holds once there are n (fewer when the
// time ran out), in order.
std::vector<std::string> Values(EventLog& log, size_t n) {
  std::vector<std::string> values;
  for (const WatchEvent& e : log.WaitFor(n, absl::Seconds(5))) values.push_back(e.value);
  return values;
}

class EtcdClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
    ASSERT_OK_AND_ASSIGN(cluster_, EtcdProcess::StartCluster(3));
    EtcdClient::Options options;
    options.endpoints = EtcdProcess::Endpoints(cluster_);
    options.rpc_timeout = absl::Milliseconds(800);
    options.max_reconnect_backoff = absl::Milliseconds(300);
    ASSERT_OK_AND_ASSIGN(client_, EtcdClient::Create(options));
    ASSERT_EQ(client_->endpoint(), cluster_[0]->endpoint());
    // 2 s: the keeper's rounds (ttl/3 each) must outlast a member's death
    // and a leader election on a loaded machine (elections take 250 ms
    // idle; the shortest ttl etcd grants here is 375 ms).
    ASSERT_OK_AND_ASSIGN(lease_, client_->GrantLease(absl::Seconds(2)));
    keeper_ = client_->KeepLeaseAlive(lease_, [](absl::Status) {});
    ASSERT_OK(client_->Put("/member/0", "live", lease_.id));
    ASSERT_OK_AND_ASSIGN(int64_t revision, client_->Put("/w/0", "before"));
    watcher_ = client_->Watch("/w/", revision, [this](const WatchEvent& e) { events_.Add(e); });
    ASSERT_THAT(Values(events_, 1), ::testing::ElementsAre("before"));
  }

  // Puts /w/<i>, retrying for a few seconds: the first call after a member
  // went may still be sent to it (a failed write is not repeated by the
  // client), and a write waits while the others elect a new leader.
  absl::Status Put(int i, const std::string& value) {
    const std::string key = absl::StrCat("/w/", i);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    absl::Status status = client_->Put(key, value).status();
    while (!status.ok() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
      status = client_->Put(key, value).status();
    }
    return status;
  }

  // Three lease ttls later, the lease and its key are still there.
  void ExpectLeaseKept() {
    const int64_t refreshes = keeper_->refreshes();
    absl::SleepFor(3 * lease_.ttl);
    EXPECT_TRUE(keeper_->alive());
    EXPECT_GE(keeper_->refreshes(), refreshes + 4);
    absl::StatusOr<KeyValue> live = client_->Get("/member/0");
    if (!live.ok()) live = client_->Get("/member/0");  // sent to a member that just went
    ASSERT_OK(live);
    EXPECT_EQ(live->lease, lease_.id);
  }

  std::vector<std::unique_ptr<EtcdProcess>> cluster_;
  std::unique_ptr<EtcdClient> client_;
  Lease lease_;
  std::unique_ptr<LeaseKeeper> keeper_;
  EventLog events_;
  std::unique_ptr<Watcher> watcher_;
};

TEST_F(EtcdClusterTest, ADeadMemberCostsNothing) {
  ASSERT_OK(cluster_[0]->Kill());
  ASSERT_OK(Put(1, "after"));
  EXPECT_NE(client_->endpoint(), cluster_[0]->endpoint());
  ExpectLeaseKept();
  ASSERT_OK(Put(2, "later"));
  EXPECT_THAT(Values(events_, 3),
              ::testing::ElementsAre("before", "after", "later"));
}

TEST_F(EtcdClusterTest, AStoppedMemberCostsNothing) {
  // Its connections stay open and nothing answers: the keeper gives the
  // round up after ttl/3 and moves on; the watch follows it.
  ASSERT_OK(cluster_[0]->Pause());
  ExpectLeaseKept();
  EXPECT_NE(client_->endpoint(), cluster_[0]->endpoint());
  ASSERT_OK(Put(1, "after"));
  EXPECT_THAT(Values(events_, 2), ::testing::ElementsAre("before", "after"));
  ASSERT_OK(cluster_[0]->Resume());
}

TEST_F(EtcdClusterTest, GoesRoundTheMembers) {
  // m0 dies, then m0 comes back and m1 dies: the client moves on past m1
  // (to m2, or on to m0 when a keep-alive waited out m1's successor's
  // election) and the cluster (m0 and m2) keeps the quorum.
  ASSERT_OK(cluster_[0]->Kill());
  ASSERT_OK(Put(1, "one"));
  ASSERT_OK(cluster_[0]->Restart());
  ASSERT_OK(cluster_[1]->Kill());
  ASSERT_OK(Put(2, "two"));
  ExpectLeaseKept();
  EXPECT_NE(client_->endpoint(), cluster_[1]->endpoint());
  EXPECT_THAT(Values(events_, 3),
              ::testing::ElementsAre("before", "one", "two"));
}

}  // namespace
}  // namespace shardtrain::etcd
