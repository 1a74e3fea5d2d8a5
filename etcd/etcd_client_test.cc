#include "etcd/etcd_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "testing/etcd_process.h"
#include "etcd/testing/event_log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::etcd {
namespace {

using ::shardtrain::testutil::EtcdProcess;
using ::shardtrain::etcd::testing::EventLog;
using ::testing::HasSubstr;

constexpr absl::Duration kRpcTimeout = absl::Milliseconds(800);

// Runs on the keeper's thread; the test waits on it.
struct LossReport {
  absl::Notification lost;
  absl::Status status;  // Written before lost is notified.
  absl::Time when;
};

std::string Describe(const WatchEvent& e) {
  return absl::StrCat(e.type == WatchEvent::Type::kPut ? "put " : "delete ", e.key,
                      e.type == WatchEvent::Type::kPut ? "=" + e.value : "");
}

std::vector<std::string> Describe(const std::vector<WatchEvent>& events) {
  std::vector<std::string> out;
  for (const WatchEvent& e : events) out.push_back(Describe(e));
  return out;
}

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
    ASSERT_OK_AND_ASSIGN(etcd_, EtcdProcess::Start());
    ASSERT_OK_AND_ASSIGN(client_, Connect());
  }

  absl::StatusOr<std::unique_ptr<EtcdClient>> Connect() {
    EtcdClient::Options options;
    options.endpoints = etcd_->endpoint();
    options.rpc_timeout = kRpcTimeout;
    options.max_reconnect_backoff = absl::Milliseconds(300);
    return EtcdClient::Create(options);
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST(PrefixRangeEndTest, IncrementsTheLastByteThatCanBe) {
  EXPECT_EQ(PrefixRangeEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixRangeEnd("ab"), "ac");
  EXPECT_EQ(PrefixRangeEnd("a\xff"), "b");
  EXPECT_EQ(PrefixRangeEnd("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(PrefixRangeEnd(""), std::string(1, '\0'));
}

TEST_F(EtcdClientTest, PutGetDeleteAndPrefix) {
  ASSERT_OK_AND_ASSIGN(int64_t rev1, client_->Put("/a/1", "one"));
  ASSERT_OK_AND_ASSIGN(int64_t rev2, client_->Put("/a/2", "two"));
  ASSERT_OK(client_->Put("/b/1", "other"));
  EXPECT_GT(rev2, rev1);

  ASSERT_OK_AND_ASSIGN(KeyValue kv, client_->Get("/a/1"));
  EXPECT_EQ(kv.key, "/a/1");
  EXPECT_EQ(kv.value, "one");
  EXPECT_EQ(kv.mod_revision, rev1);
  EXPECT_EQ(kv.version, 1);
  EXPECT_EQ(client_->Get("/a/3").status().code(), absl::StatusCode::kNotFound);

  ASSERT_OK_AND_ASSIGN(RangeResult range, client_->GetPrefix("/a/"));
  ASSERT_EQ(range.kvs.size(), 2u);
  EXPECT_EQ(range.kvs[0].value, "one");
  EXPECT_EQ(range.kvs[1].value, "two");
  EXPECT_GT(range.revision, rev2);  // "/b/1" came after.

  ASSERT_OK_AND_ASSIGN(bool existed, client_->Delete("/a/1"));
  EXPECT_TRUE(existed);
  ASSERT_OK_AND_ASSIGN(existed, client_->Delete("/a/1"));
  EXPECT_FALSE(existed);
  EXPECT_EQ(client_->Get("/a/1").status().code(), absl::StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(range, client_->GetPrefix("/a/"));
  ASSERT_EQ(range.kvs.size(), 1u);
  EXPECT_EQ(range.kvs[0].key, "/a/2");

  EXPECT_EQ(client_->Put("", "x").status().code(), absl::StatusCode::kInvalidArgument);
  // Binary values survive the round trip.
  const std::string binary("\0\xff\x01z", 4);
  ASSERT_OK(client_->Put("/bin", binary));
  ASSERT_OK_AND_ASSIGN(kv, client_->Get("/bin"));
  EXPECT_EQ(kv.value, binary);
}

TEST_F(EtcdClientTest, CompareAndSwapChangesOnlyFromTheVersionRead) {
  ASSERT_OK_AND_ASSIGN(CasResult created, client_->CompareAndSwap("/chain/0", 0, "v1"));
  ASSERT_TRUE(created.succeeded);
  ASSERT_OK_AND_ASSIGN(KeyValue kv, client_->Get("/chain/0"));
  EXPECT_EQ(kv.value, "v1");
  EXPECT_EQ(kv.mod_revision, created.revision);

  // "Must not exist" fails now, and says what is there.
  ASSERT_OK_AND_ASSIGN(CasResult again, client_->CompareAndSwap("/chain/0", 0, "other"));
  EXPECT_FALSE(again.succeeded);
  ASSERT_TRUE(again.current.has_value());
  EXPECT_EQ(again.current->value, "v1");
  EXPECT_EQ(again.current->mod_revision, created.revision);

  ASSERT_OK_AND_ASSIGN(CasResult next, client_->CompareAndSwap("/chain/0", created.revision, "v2"));
  ASSERT_TRUE(next.succeeded);
  EXPECT_GT(next.revision, created.revision);

  // A stale revision loses and changes nothing.
  ASSERT_OK_AND_ASSIGN(CasResult stale, client_->CompareAndSwap("/chain/0", created.revision, "v3"));
  EXPECT_FALSE(stale.succeeded);
  ASSERT_TRUE(stale.current.has_value());
  EXPECT_EQ(stale.current->value, "v2");
  EXPECT_EQ(stale.current->mod_revision, next.revision);
  ASSERT_OK_AND_ASSIGN(kv, client_->Get("/chain/0"));
  EXPECT_EQ(kv.value, "v2");

  // Expecting a key that does not exist: failure with no current value.
  ASSERT_OK_AND_ASSIGN(CasResult absent, client_->CompareAndSwap("/chain/9", next.revision, "x"));
  EXPECT_FALSE(absent.succeeded);
  EXPECT_FALSE(absent.current.has_value());
  EXPECT_EQ(client_->Get("/chain/9").status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(client_->CompareAndSwap("/chain/0", -1, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EtcdClientTest, TwoWritersRacingFromTheSameVersionExactlyOneWins) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> other, Connect());
  EtcdClient* writers[2] = {client_.get(), other.get()};
  ASSERT_OK(client_->Put("/race", "start"));
  for (int round = 0; round < 20; ++round) {
    ASSERT_OK_AND_ASSIGN(KeyValue read, client_->Get("/race"));
    std::atomic<int> ready{0};
    absl::StatusOr<CasResult> results[2];
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] {
        ready.fetch_add(1);
        while (ready.load() < 2) {
        }
        results[w] = writers[w]->CompareAndSwap("/race", read.mod_revision,
                                                absl::StrCat("round ", round, " writer ", w));
      });
    }
    for (std::thread& t : threads) t.join();
    ASSERT_OK(results[0]);
    ASSERT_OK(results[1]);
    ASSERT_NE(results[0]->succeeded, results[1]->succeeded) << "round " << round;
    const int winner = results[0]->succeeded ? 0 : 1;
    const CasResult& loser = *results[1 - winner];
    ASSERT_TRUE(loser.current.has_value());
    EXPECT_EQ(loser.current->value, absl::StrCat("round ", round, " writer ", winner));
    EXPECT_EQ(loser.current->mod_revision, results[winner]->revision);
  }
}

TEST_F(EtcdClientTest, LeasedKeyStaysWhileKeptAliveAndGoesAfterTheTtl) {
  ASSERT_OK_AND_ASSIGN(Lease lease, client_->GrantLease(absl::Seconds(2)));
  ASSERT_GE(lease.ttl, absl::Seconds(2));
  ASSERT_OK(client_->Put("/member/0", "alive", lease.id));
  LossReport report;
  auto keeper = client_->KeepLeaseAlive(lease, [&](absl::Status s) {
    report.status = s;
    report.lost.Notify();
  });
  // Longer than the ttl: only the keeper's refreshes keep the key.
  absl::SleepFor(lease.ttl + absl::Milliseconds(800));
  ASSERT_OK_AND_ASSIGN(KeyValue kv, client_->Get("/member/0"));
  EXPECT_EQ(kv.lease, lease.id);
  EXPECT_GE(keeper->refreshes(), 3);
  EXPECT_TRUE(keeper->alive());
  EXPECT_FALSE(report.lost.HasBeenNotified());

  const absl::Time stopped = absl::Now();
  keeper.reset();  // No revoke: etcd expires the lease on its own.
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(1)) << "the destructor must not wait a round";
  absl::Status status;
  while (absl::Now() - stopped < lease.ttl + absl::Seconds(3)) {
    status = client_->Get("/member/0").status();
    if (!status.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound)
      << "key still there " << absl::Now() - stopped << " after the keeper stopped";
  EXPECT_FALSE(report.lost.HasBeenNotified());
}

TEST_F(EtcdClientTest, RevokeDeletesKeysAndTheKeeperReportsTheLoss) {
  ASSERT_OK_AND_ASSIGN(Lease lease, client_->GrantLease(absl::Seconds(3)));
  ASSERT_OK(client_->Put("/member/1", "alive", lease.id));
  LossReport report;
  auto keeper = client_->KeepLeaseAlive(lease, [&](absl::Status s) {
    report.status = s;
    report.when = absl::Now();
    report.lost.Notify();
  });
  ASSERT_OK(client_->RevokeLease(lease.id));
  EXPECT_EQ(client_->Get("/member/1").status().code(), absl::StatusCode::kNotFound);
  // The next refresh (within ttl/3) learns that the lease is gone.
  ASSERT_TRUE(report.lost.WaitForNotificationWithTimeout(lease.ttl / 3 + absl::Seconds(1)));
  EXPECT_EQ(report.status.code(), absl::StatusCode::kNotFound) << report.status;
  EXPECT_FALSE(keeper->alive());
  EXPECT_EQ(client_->RevokeLease(lease.id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Put("/member/1", "x", lease.id).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(EtcdClientTest, KeeperReportsLossWhenEtcdStopsAnsweringPastTheTtl) {
  ASSERT_OK_AND_ASSIGN(Lease lease, client_->GrantLease(absl::Seconds(2)));
  LossReport report;
  auto keeper = client_->KeepLeaseAlive(lease, [&](absl::Status s) {
    report.status = s;
    report.when = absl::Now();
    report.lost.Notify();
  });
  const absl::Time until = absl::Now() + absl::Seconds(2);
  while (keeper->refreshes() < 1 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_GE(keeper->refreshes(), 1);

  ASSERT_OK(etcd_->Pause());
  const absl::Time paused = absl::Now();
  const bool lost = report.lost.WaitForNotificationWithTimeout(lease.ttl + absl::Seconds(2));
  ASSERT_OK(etcd_->Resume());
  ASSERT_TRUE(lost) << "no loss reported " << absl::Now() - paused << " after etcd stopped";
  EXPECT_THAT(report.status.code(),
              ::testing::AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
      << report.status;
  EXPECT_THAT(std::string(report.status.message()), HasSubstr(etcd_->endpoint()));
  // Not before the ttl since the last refresh could have run out, and not long after it.
  EXPECT_LE(report.when - paused, lease.ttl + absl::Milliseconds(300));
  EXPECT_GE(report.when - paused, lease.ttl - lease.ttl / 3 - absl::Milliseconds(100));
  EXPECT_FALSE(keeper->alive());
}

TEST_F(EtcdClientTest, WatchDeliversEventsInOrderAndResumesAfterARestart) {
  ASSERT_OK_AND_ASSIGN(int64_t base, client_->Put("/unwatched", "x"));
  EventLog log;
  auto watcher = client_->Watch("/w/", base + 1, [&](const WatchEvent& e) { log.Add(e); });
  ASSERT_OK(client_->Put("/w/a", "1"));
  ASSERT_OK(client_->Put("/w/b", "2"));
  ASSERT_OK(client_->Put("/x/not-watched", "3"));
  ASSERT_OK(client_->Delete("/w/a"));
  std::vector<WatchEvent> events = log.WaitFor(3, absl::Seconds(3));
  EXPECT_THAT(Describe(events), ::testing::ElementsAre("put /w/a=1", "put /w/b=2", "delete /w/a"));

  // A restart with writes before the watcher can reconnect: it resumes from
  // the revision after the last event it saw, so it misses none and repeats none.
  ASSERT_OK(etcd_->Kill());
  ASSERT_OK(etcd_->Restart());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdClient> writer, Connect());
  ASSERT_OK(writer->Put("/w/c", "4"));
  ASSERT_OK(writer->Delete("/w/b"));
  ASSERT_OK(writer->Put("/w/a", "5"));
  events = log.WaitFor(6, absl::Seconds(5));
  EXPECT_THAT(Describe(events),
              ::testing::ElementsAre("put /w/a=1", "put /w/b=2", "delete /w/a", "put /w/c=4",
                                     "delete /w/b", "put /w/a=5"));
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_GT(events[i].mod_revision, events[i - 1].mod_revision);
  }
  EXPECT_GE(watcher->streams(), 2);
  EXPECT_EQ(watcher->next_revision(), events.back().mod_revision + 1);

  // A second watcher from the same start replays the same history.
  EventLog replay;
  auto second = writer->Watch("/w/", base + 1, [&](const WatchEvent& e) { replay.Add(e); });
  EXPECT_THAT(Describe(replay.WaitFor(6, absl::Seconds(3))),
              ::testing::ElementsAreArray(Describe(events)));
}

// etcd restarted without its data: its revisions start again below the one
// the watch would resume from. Resuming would wait for revisions that
// already happened; the watch ends with DATA_LOSS instead, once.
TEST_F(EtcdClientTest, WatchEndsWithDataLossWhenEtcdLostItsData) {
  int64_t revision = 0;
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK_AND_ASSIGN(revision, client_->Put("/w/k", absl::StrCat(i)));
  }
  EventLog log;
  absl::Notification ended;
  absl::Status why;
  auto watcher = client_->Watch(
      "/w/", revision + 1, [&](const WatchEvent& e) { log.Add(e); },
      [&](absl::Status status) {
        why = status;
        ended.Notify();
      });
  ASSERT_OK(client_->Put("/w/k", "last"));
  ASSERT_EQ(log.WaitFor(1, absl::Seconds(3)).size(), 1u);
  ASSERT_OK(etcd_->RestartEmpty());
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(15)));
  EXPECT_EQ(why.code(), absl::StatusCode::kDataLoss) << why;
  EXPECT_THAT(why.message(), HasSubstr("lost its data"));
}

TEST_F(EtcdClientTest, CallsFailWithinTheDeadlineWhenEtcdIsDeadOrStopped) {
  // Stopped: the connection stays open, nothing answers.
  ASSERT_OK(etcd_->Pause());
  absl::Time start = absl::Now();
  absl::Status status = client_->Put("/k", "v").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(etcd_->endpoint()));
  EXPECT_LT(absl::Now() - start, kRpcTimeout + absl::Milliseconds(500));
  ASSERT_OK(etcd_->Resume());
  ASSERT_OK(client_->Put("/k", "v"));

  // Dead: connections are refused.
  ASSERT_OK(etcd_->Kill());
  start = absl::Now();
  status = client_->Get("/k").status();
  EXPECT_THAT(status.code(),
              ::testing::AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
      << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(etcd_->endpoint()));
  EXPECT_LT(absl::Now() - start, kRpcTimeout + absl::Milliseconds(500));
  start = absl::Now();
  EXPECT_FALSE(client_->GrantLease(absl::Seconds(5)).ok());
  EXPECT_LT(absl::Now() - start, kRpcTimeout + absl::Milliseconds(500));

  EtcdClient::Options options;
  options.endpoints = etcd_->endpoint();
  options.connect_timeout = absl::Milliseconds(300);
  start = absl::Now();
  absl::StatusOr<std::unique_ptr<EtcdClient>> none = EtcdClient::Create(options);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr(etcd_->endpoint()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST_F(EtcdClientTest, CreateUsesTheFirstReachableEndpoint) {
  // A port bound but not listening refuses connections, and stays ours.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string dead = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));

  EtcdClient::Options options;
  options.endpoints = absl::StrCat(dead, ", ", etcd_->endpoint());
  options.connect_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options);
  close(fd);
  ASSERT_OK(client);
  EXPECT_EQ((*client)->endpoint(), etcd_->endpoint());
  ASSERT_OK((*client)->Put("/k", "v"));
}

}  // namespace
}  // namespace shardtrain::etcd
