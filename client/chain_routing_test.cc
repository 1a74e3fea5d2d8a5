// ShardChannel and BatchCall with chain routing (replicated shards): two
// in-process test shards behind real gRPC, chains in a real etcd.
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/security/server_credentials.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/chain_router.h"
#include "client/channel_factory.h"
#include "client/batch_call.h"
#include "client/shard_channel.h"
#include "client/testing/etcd_chains.h"
#include "common/payload.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/shardtrain.grpc.pb.h"

namespace shardtrain::client {
namespace {

using ::shardtrain::client::testing::EtcdChains;
using ::shardtrain::testutil::EtcdProcess;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kJob[] = "routingtest";
constexpr int kPartitionSize = 4;

// What a test shard received.
struct Received {
  std::string method;
  uint64_t chain_epoch = 0;
  uint64_t shard_incarnation = 0;
  uint64_t sequence = 0;

  friend bool operator==(const Received& a, const Received& b) {
    return a.method == b.method && a.chain_epoch == b.chain_epoch &&
           a.shard_incarnation == b.shard_incarnation && a.sequence == b.sequence;
  }
  friend std::ostream& operator<<(std::ostream& os, const Received& r) {
    return os << r.method << "(epoch " << r.chain_epoch << ", incarnation "
              << r.shard_incarnation << ", sequence " << r.sequence << ")";
  }
};

// A ParameterServer that logs what it receives and answers a pull with
// partitions of kPartitionSize elements all equal to its shard index. A
// test policy may refuse a request.
class TestShard final : public ParameterServer::CallbackService {
 public:
  // Returns the status to answer `received` with.
  using Policy = std::function<grpc::Status(const Received& received)>;

  explicit TestShard(int index) : index_(index) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~TestShard() override {
    Hang(false);
    Stop();
  }

  void Stop() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }
  // While hanging, requests are received but not answered (a process that
  // is stopped or cut off: no reset); Hang(false) answers them CANCELLED.
  void Hang(bool hang) {
    std::vector<grpc::ServerUnaryReactor*> held;
    {
      absl::MutexLock lock(&mu_);
      hanging_ = hang;
      if (!hang) held.swap(held_);
    }
    for (grpc::ServerUnaryReactor* reactor : held) reactor->Finish(grpc::Status::CANCELLED);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  void set_policy(Policy policy) {
    absl::MutexLock lock(&mu_);
    policy_ = std::move(policy);
  }
  std::vector<Received> received() const {
    absl::MutexLock lock(&mu_);
    return received_;
  }

  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const PushRequest* request, PushResponse*) override {
    return Answer(context, {"Push", request->chain_epoch(), request->shard_incarnation(),
                            request->sequence()});
  }

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const PullRequest* request,
                                 PullResponse* response) override {
    for (const PartitionKey& key : request->parts()) {
      ParameterPart* part = response->add_parts();
      *part->mutable_key() = key;
      part->set_version(100 + index_);
      part->mutable_value()->set_dtype(DTYPE_F32);
      common::EncodeDense(std::vector<float>(kPartitionSize, static_cast<float>(index_)),
                          DTYPE_F32, part->mutable_value()->mutable_data());
    }
    return Answer(context, {"Pull", request->chain_epoch(), request->shard_incarnation(), 0});
  }

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest*, HeartbeatResponse*) override {
    return Answer(context, {"Heartbeat", 0, 0, 0});
  }

 private:
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                   const Received& received) {
    Policy policy;
    auto* reactor = context->DefaultReactor();
    {
      absl::MutexLock lock(&mu_);
      received_.push_back(received);
      policy = policy_;
      if (hanging_) {
        held_.push_back(reactor);
        return reactor;
      }
    }
    reactor->Finish(policy ? policy(received) : grpc::Status::OK);
    return reactor;
  }

  const int index_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  mutable absl::Mutex mu_;
  Policy policy_ ABSL_GUARDED_BY(mu_);
  std::vector<Received> received_ ABSL_GUARDED_BY(mu_);
  bool hanging_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::ServerUnaryReactor*> held_ ABSL_GUARDED_BY(mu_);
};

class ChainRoutingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int s = 0; s < 2; ++s) shards_.push_back(std::make_unique<TestShard>(s));
    RetryPolicy policy;
    policy.initial_backoff = absl::Milliseconds(10);
    policy.max_backoff = absl::Milliseconds(100);
    policy.reconnect_timeout = absl::Seconds(20);
    MakeChannels(policy);
    for (int i = 0; i < 2; ++i) versions_.emplace_back(0);
  }

  // Every backoff a minute long: a call that ends within seconds did not
  // wait for one.
  static RetryPolicy MinuteBackoff() {
    RetryPolicy policy;
    policy.initial_backoff = absl::Seconds(60);
    policy.max_backoff = absl::Seconds(60);
    policy.routed_max_backoff = absl::Seconds(60);
    policy.reconnect_timeout = absl::Seconds(120);
    return policy;
  }

  void MakeChannels(const RetryPolicy& policy) {
    ASSERT_OK_AND_ASSIGN(ChannelFactory factory, ChannelFactory::Create(ChannelOptions()));
    channels_.clear();
    for (int s = 0; s < 2; ++s) {
      channels_.push_back(std::make_unique<ShardChannel>(
          s, shards_[s]->address(),
          std::vector<std::shared_ptr<grpc::Channel>>{factory.Make(shards_[s]->address())},
          policy, nullptr));
    }
  }

  // Chains in etcd and a router; every channel routes through it. Without
  // `watch` only a Refresh sees a change.
  void Route(bool watch = true) {
    if (!EtcdProcess::Available()) GTEST_SKIP() << EtcdProcess::kMissingMessage;
    ASSERT_OK_AND_ASSIGN(chains_, EtcdChains::Start(kJob));
    ASSERT_OK(chains_->Put(/*group=*/0, {0, 1}).status());  // head 0, tail 1
    ASSERT_OK(chains_->Put(/*group=*/1, {1, 0}).status());
    ChainRouter::Options options;
    options.etcd_endpoints = chains_->endpoint();
    options.job = kJob;
    options.num_groups = 2;
    options.watch = watch;
    ASSERT_OK_AND_ASSIGN(router_, ChainRouter::Create(options));
    RouteChannels(router_.get(), {channels_[0].get(), channels_[1].get()});
  }

  // A call of group `group`: one partition of tensor "w".
  std::unique_ptr<BatchCall> Call(int group) {
    WireOptions wire;
    wire.worker = 3;
    wire.worker_incarnation = 77;
    return std::make_unique<BatchCall>(
        &context_, channels_[group].get(), /*connection=*/0,
        std::make_unique<WireRequests>(
            wire, std::vector<PartitionSlice>{{0, 0, 0, kPartitionSize, 0}}, &names_));
  }

  absl::Status Push(BatchCall& call) {
    call.requests().SetPush(1, call.NextSequence(),
                            [this](int) { return absl::Span<const float>(grad_); }, versions_);
    absl::Notification done;
    absl::Status status;
    call.StartPush([&](absl::Status s) {
      status = s;
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  }

  absl::Status Pull(BatchCall& call) {
    call.requests().SetPull(1, 0, [this](int) { return absl::Span<float>(params_); });
    absl::Notification done;
    absl::Status status;
    call.StartPull([&](absl::Status s) {
      status = s;
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  }

  // Group 0's head (shard 0) is down (`hang`: it takes the push and never
  // answers); 300 ms into the push the chain drops it, as the shards would
  // once its lease expired. The push lands on shard 1; returns how long it
  // took.
  absl::Duration PushWhileTheHeadDies(bool hang = false) {
    if (hang) {
      shards_[0]->Hang(true);
    } else {
      shards_[0]->Stop();
    }
    std::thread reconfigure([this] {
      absl::SleepFor(absl::Milliseconds(300));
      EXPECT_OK(chains_->Change(0, {1}).status());
    });
    std::unique_ptr<BatchCall> call = Call(0);
    const absl::Time start = absl::Now();
    EXPECT_OK(Push(*call));
    const absl::Duration took = absl::Now() - start;
    reconfigure.join();
    EXPECT_THAT(shards_[1]->received(), ElementsAre(Received{"Push", 2, 0, 1}));
    return took;
  }

  // Runs a control RPC (no role) on `channel`; which shard got it is in
  // the shards' logs.
  absl::Status Heartbeat(ShardChannel& channel) {
    HeartbeatRequest request;
    HeartbeatResponse response;
    ShardRpc rpc;
    rpc.method = "Heartbeat";
    rpc.start = [&](const ShardAttempt& attempt, std::function<void(grpc::Status)> done) {
      attempt.target->stub()->async()->Heartbeat(attempt.context, &request, &response,
                                                 std::move(done));
    };
    absl::Notification finished;
    absl::Status status;
    channel.Call(std::move(rpc), [&](absl::Status s) {
      status = s;
      finished.Notify();
    });
    finished.WaitForNotification();
    return status;
  }

  std::vector<std::unique_ptr<TestShard>> shards_;
  std::vector<std::unique_ptr<ShardChannel>> channels_;
  std::unique_ptr<EtcdChains> chains_;
  std::unique_ptr<ChainRouter> router_;
  const std::vector<std::string> names_ = {"w"};
  VersionTable versions_;
  BatchContext context_ = [this] {
    BatchContext context;
    context.versions = &versions_;
    return context;
  }();
  std::vector<float> grad_ = std::vector<float>(kPartitionSize, 0.5f);
  std::vector<float> params_ = std::vector<float>(kPartitionSize, -1.0f);
};

TEST_F(ChainRoutingTest, UnroutedChannelsIgnoreTheRole) {
  // Replicas 1: a pull (role tail) of shard 0 goes to shard 0, unstamped.
  std::unique_ptr<BatchCall> call = Call(0);
  ASSERT_OK(Push(*call));
  ASSERT_OK(Pull(*call));
  EXPECT_THAT(shards_[0]->received(),
              ElementsAre(Received{"Push", 0, 0, 1}, Received{"Pull", 0, 0, 0}));
  EXPECT_TRUE(shards_[1]->received().empty());
  EXPECT_EQ(params_[0], 0.0f);
}

TEST_F(ChainRoutingTest, PushesGoToTheHeadAndPullsToTheTailWithTheEpoch) {
  Route();
  if (IsSkipped()) return;
  std::unique_ptr<BatchCall> group0 = Call(0);
  std::unique_ptr<BatchCall> group1 = Call(1);
  ASSERT_OK(Push(*group0));
  ASSERT_OK(Pull(*group0));
  EXPECT_EQ(params_[0], 1.0f);  // answered by shard 1, the tail
  EXPECT_EQ(versions_[0].load(), 101);
  ASSERT_OK(Push(*group1));
  ASSERT_OK(Pull(*group1));
  EXPECT_EQ(params_[0], 0.0f);
  EXPECT_THAT(shards_[0]->received(),
              ElementsAre(Received{"Push", 1, 0, 1}, Received{"Pull", 1, 0, 0}));
  EXPECT_THAT(shards_[1]->received(),
              ElementsAre(Received{"Pull", 1, 0, 0}, Received{"Push", 1, 0, 1}));

  // Control RPCs stay on the channel's own shard.
  ASSERT_OK(Heartbeat(*channels_[1]));
  EXPECT_EQ(shards_[1]->received().back().method, "Heartbeat");
}

TEST_F(ChainRoutingTest, AStaleEpochRefusalIsRetriedWhereTheNewConfigSays) {
  Route(/*watch=*/false);  // the retry's Refresh must find the change
  if (IsSkipped()) return;
  // Shard 0 has left group 0's chain (say it was drained) before the
  // client heard: it refuses, and the chain is [1] at epoch 2.
  shards_[0]->set_policy([this](const Received& received) {
    if (received.method != "Push") return grpc::Status::OK;
    EXPECT_OK(chains_->Change(0, {1}).status());
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "stale chain epoch 1 for group 0 (now 2)");
  });
  std::unique_ptr<BatchCall> call = Call(0);
  ASSERT_OK(Push(*call));
  EXPECT_THAT(shards_[0]->received(), ElementsAre(Received{"Push", 1, 0, 1}));
  // The retry keeps the push's sequence number.
  EXPECT_THAT(shards_[1]->received(), ElementsAre(Received{"Push", 2, 0, 1}));
  ASSERT_OK_AND_ASSIGN(ChainRoute head, router_->Route(0, ChainRole::kHead));
  EXPECT_EQ(head.shard, 1);
}

// A head that handed its place over refuses; the chain the retry reads is
// newer than the attempt's, so the retry goes at once: no backoff (here a
// minute long) for a chain that simply moved on.
TEST_F(ChainRoutingTest, ARefusalUnderANewerChainIsRetriedAtOnce) {
  MakeChannels(MinuteBackoff());
  Route(/*watch=*/false);
  if (IsSkipped()) return;
  shards_[0]->set_policy([this](const Received& received) {
    if (received.method != "Push") return grpc::Status::OK;
    EXPECT_OK(chains_->Change(0, {1, 0}).status());
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "stale chain epoch 1 for group 0: shard 0 is not its head (shard 1 is)");
  });
  std::unique_ptr<BatchCall> call = Call(0);
  const absl::Time start = absl::Now();
  ASSERT_OK(Push(*call));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "the retry waited for a backoff";
  EXPECT_THAT(shards_[1]->received(), ElementsAre(Received{"Push", 2, 0, 1}));
}

// Refusals that last milliseconds (the head has not read the epoch the
// worker routed by yet; a head handing its place over) are retried after
// a few milliseconds, not after the backoff (a minute here).
TEST_F(ChainRoutingTest, MomentaryRefusalsAreRetriedWithinMilliseconds) {
  MakeChannels(MinuteBackoff());
  Route(/*watch=*/false);
  if (IsSkipped()) return;
  int refusals = 0;
  shards_[0]->set_policy([&refusals](const Received& received) {
    if (received.method != "Push" || refusals >= 2) return grpc::Status::OK;
    ++refusals;
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        refusals == 1
            ? "not serving group 0 yet: shard 0 is at chain epoch 0, behind the request's 1"
            : "not serving group 0: shard 0 is handing its head over (chain epoch 1); retry");
  });
  std::unique_ptr<BatchCall> call = Call(0);
  const absl::Time start = absl::Now();
  ASSERT_OK(Push(*call));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "a momentary refusal waited for a backoff";
  EXPECT_EQ(refusals, 2);
  EXPECT_EQ(shards_[0]->received().size(), 3u);
}

TEST_F(ChainRoutingTest, ADeadHeadIsReplacedByItsSuccessor) {
  Route();
  if (IsSkipped()) return;
  EXPECT_LT(PushWhileTheHeadDies(), absl::Seconds(10));
}

// The call to the dead head is waiting out a long backoff when the watch
// delivers the chain without it: the retry goes then, not after the
// backoff (a minute here).
TEST_F(ChainRoutingTest, ACallWaitingOutABackoffFollowsTheWatchAtOnce) {
  MakeChannels(MinuteBackoff());
  Route();
  if (IsSkipped()) return;
  EXPECT_LT(PushWhileTheHeadDies(), absl::Seconds(5)) << "the retry waited for its backoff";
}

// The head hangs (stopped, or cut off: no reset comes back) with the push
// in flight; 300 ms later the chain drops it. The push is cancelled there
// and lands on the new head at once, not after its 30 s deadline.
TEST_F(ChainRoutingTest, ACallStuckOnAHungHeadMovesWhenTheChainDropsIt) {
  MakeChannels(MinuteBackoff());
  Route();
  if (IsSkipped()) return;
  EXPECT_LT(PushWhileTheHeadDies(/*hang=*/true), absl::Seconds(5))
      << "the push waited for the hung head";
  // The same push (its sequence number) went to shard 1 under the new epoch.
  EXPECT_THAT(shards_[0]->received(), ElementsAre(Received{"Push", 1, 0, 1}));
}

// A chain change that keeps the call's shard (a tail joins behind the
// head) leaves the call alone.
TEST_F(ChainRoutingTest, ACallToAShardStillInTheChainIsLeftAlone) {
  Route();
  if (IsSkipped()) return;
  shards_[0]->Hang(true);
  std::unique_ptr<BatchCall> call = Call(0);
  absl::Notification done;
  absl::Status status;
  call->requests().SetPush(1, call->NextSequence(),
                           [this](int) { return absl::Span<const float>(grad_); }, versions_);
  call->StartPush([&](absl::Status s) {
    status = s;
    done.Notify();
  });
  while (shards_[0]->received().empty()) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(channels_[0]->AbandonDeparted(/*epoch=*/2, {0, 1}), 0);
  EXPECT_EQ(channels_[0]->AbandonDeparted(/*epoch=*/1, {1}), 0);  // not newer
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  shards_[0]->Hang(false);  // answers CANCELLED: the call ends with it
  done.WaitForNotification();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_TRUE(shards_[1]->received().empty());
}

TEST_F(ChainRoutingTest, ErrorsNameTheGroupAndTheShardTried) {
  Route();
  if (IsSkipped()) return;
  shards_[1]->set_policy([](const Received&) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no such tensor");
  });
  std::unique_ptr<BatchCall> call = Call(0);
  const absl::Status pulled = Pull(*call);
  EXPECT_EQ(pulled.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pulled.message(),
              HasSubstr(absl::StrCat("Pull of group 0 to shard 1 (", shards_[1]->address(),
                                     "): no such tensor")));
}

}  // namespace
}  // namespace shardtrain::client
