// A replicated PushPull at its chain's head (server/replication/
// replicator.h): the head answers the pull half itself, but only with
// versions its chain's tail holds. The successor here is a test service
// that holds each forwarded push until the test lets it through, so the
// test decides when the tail "has" an update. Also: a head handing its
// place over (ChainTable::Freeze) waits for that and refuses new pushes;
// a forward stuck on a successor the chain dropped ends at once; one past
// its timeout goes on until the tail has it; a push half that is not one
// field of the request is refused (ReplicatedPushPath forwards it as it
// arrived).
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <prometheus/registry.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/rpc_metrics.h"
#include "common/partition.h"
#include "common/payload.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "proto/shardtrain.grpc.pb.h"
#include "server/replication/chain_table.h"
#include "server/replication/forwarder.h"
#include "server/replication/replicated_push_path.h"
#include "server/replication/replication_metrics.h"
#include "server/replication/replicator.h"
#include "server/parameter_server_service.h"
#include "server/shard.h"
#include "server/shard_metrics.h"

namespace shardtrain::server {
namespace {

constexpr int kShards = 3;
constexpr int kGroup = 0;
constexpr int kElements = 12;  // "w": partitions of 4 elements
constexpr uint64_t kEpoch = 1;

// A chain's next member that acknowledges a forwarded push only when told.
class HeldSuccessor final : public ParameterServer::CallbackService {
 public:
  HeldSuccessor() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~HeldSuccessor() override {
    ReleaseAll();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::ServerUnaryReactor* Replicate(grpc::CallbackServerContext* context,
                                      const PushRequest*, PushResponse*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::MutexLock lock(&mu_);
    held_.push_back(reactor);
    return reactor;
  }

  // Waits (up to 10 s) until `n` forwards have arrived in all.
  bool WaitForHeld(size_t n) {
    absl::MutexLock lock(&mu_);
    const auto arrived = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return held_.size() + released_ >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&arrived), absl::Seconds(10));
  }
  // Forwards arrived in all.
  size_t Arrived() {
    absl::MutexLock lock(&mu_);
    return held_.size() + released_;
  }
  // Acknowledges the oldest held forward.
  void ReleaseOne() {
    grpc::ServerUnaryReactor* reactor;
    {
      absl::MutexLock lock(&mu_);
      ASSERT_FALSE(held_.empty());
      reactor = held_.front();
      held_.pop_front();
      ++released_;
    }
    reactor->Finish(grpc::Status::OK);
  }
  void ReleaseAll() {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (held_.empty()) return;
      }
      ReleaseOne();
    }
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  std::deque<grpc::ServerUnaryReactor*> held_ ABSL_GUARDED_BY(mu_);
  size_t released_ ABSL_GUARDED_BY(mu_) = 0;
};

// One PushPull in flight from a test worker.
struct Call {
  grpc::ClientContext context;
  PushPullRequest request;
  PushPullResponse response;
  grpc::Status status;
  absl::Notification done;
};

// Shard 0 of 3 (--replicas 2, async, sgd) serving real gRPC, the head of
// group 0's chain [shard 0, HeldSuccessor].
class HeadPushPullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardOptions options;
    options.shard_index = 0;
    options.num_workers = 2;
    options.mode = ConsistencyMode::kAsync;
    options.optimizer.name = "sgd";
    options.optimizer.learning_rate = 1.0f;
    options.partitioning.num_shards = kShards;
    options.partitioning.max_partition_elements = 4;
    options.replicas = 2;
    shard_metrics_ = std::make_unique<ShardMetrics>(registry_);
    rpc_metrics_ = std::make_unique<common::RpcMetrics>(registry_, "server");
    ASSERT_OK_AND_ASSIGN(shard_, Shard::Create(options, shard_metrics_.get()));
    metrics_ = std::make_unique<ReplicationMetrics>(registry_, 2);
    table_ = std::make_unique<ChainTable>(0, shard_->incarnation(), shard_->replica().groups(),
                                          absl::Seconds(60), metrics_.get());
    forwarder_ = std::make_unique<Forwarder>(table_.get(), grpc::InsecureChannelCredentials(),
                                             grpc::ChannelArguments(), metrics_.get());
    replicator_ = std::make_unique<Replicator>(shard_.get(), table_.get(), forwarder_.get(),
                                               metrics_.get(), forward_timeout_);
    service_ = std::make_unique<ParameterServerService>(
        shard_.get(), rpc_metrics_.get(), shard_metrics_.get(), nullptr, absl::Seconds(30));
    push_path_ = std::make_unique<ReplicatedPushPath>(replicator_.get());
    service_->set_push_path(push_path_.get());
    service_->set_replicator(replicator_.get());
    shard_->SetProgressCallback([this] { service_->WakeWaiters(); });
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = ParameterServer::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                                         grpc::InsecureChannelCredentials()));

    RegisterRequest request;
    TensorSpec& spec = *request.add_tensors();
    spec.set_name("w");
    spec.add_shape(kElements);
    spec.set_dtype(DTYPE_F32);
    spec.mutable_init()->set_kind(Initializer::KIND_CONSTANT);
    RegisterResponse response;
    ASSERT_OK(shard_->Register(request, &response));
    for (uint32_t p = 0; p * 4 < kElements; ++p) {
      if (common::ReplicaGroupFor("w", p, kShards) == kGroup) partitions_.push_back(p);
    }
    ASSERT_FALSE(partitions_.empty());
  }

  void TearDown() override {
    if (successor_ != nullptr) successor_->ReleaseAll();
    if (server_ != nullptr) {
      service_->CancelAllWaiters();
      server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    }
    forwarder_->Stop();
  }

  // Group 0's chain at kEpoch: `head_first` puts this shard at its head,
  // else at its tail.
  void SetChain(bool head_first) {
    successor_ = std::make_unique<HeldSuccessor>();
    const chain::ChainConfig::Member self{0, "127.0.0.1:1", shard_->incarnation()};
    const chain::ChainConfig::Member other{1, successor_->address(), 7};
    ASSERT_OK_AND_ASSIGN(chain::ChainConfig config,
                         chain::MakeChainConfig(kGroup, 2,
                                                 head_first ? std::vector{self, other}
                                                            : std::vector{other, self}));
    ASSERT_EQ(config.epoch, static_cast<int64_t>(kEpoch));
    ASSERT_TRUE(table_->Update(config));
  }

  // Worker `worker`'s PushPull is refused UNAVAILABLE with `why` in its
  // message, and the shard's state is unchanged.
  void ExpectRefusedUnchanged(uint32_t worker, const std::string& why) {
    const uint64_t before = shard_->Checksum();
    std::unique_ptr<Call> call = Start(worker);
    ASSERT_TRUE(call->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_EQ(call->status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << call->status.error_message();
    EXPECT_NE(call->status.error_message().find(why), std::string::npos)
        << call->status.error_message();
    EXPECT_EQ(shard_->Checksum(), before);
  }

  // Worker `worker`'s PushPull of gradient 1 for every partition of group 0.
  PushPullRequest RequestOf(uint32_t worker, uint64_t epoch = kEpoch) const {
    PushPullRequest request;
    PushRequest& push = *request.mutable_push();
    push.set_worker(worker);
    push.set_clock(1);
    push.set_worker_incarnation(100 + worker);
    push.set_sequence(1);
    push.set_chain_epoch(epoch);
    PullRequest& pull = *request.mutable_pull();
    pull.set_worker(worker);
    pull.set_clock(1);
    pull.set_chain_epoch(epoch);
    for (uint32_t p : partitions_) {
      GradientPart& part = *push.add_parts();
      part.mutable_key()->set_tensor("w");
      part.mutable_key()->set_partition(p);
      part.mutable_grad()->set_dtype(DTYPE_F32);
      common::EncodeDense(std::vector<float>(4, 1.0f), DTYPE_F32,
                          part.mutable_grad()->mutable_data());
      *pull.add_parts() = part.key();
    }
    return request;
  }

  // Sends RequestOf(worker, epoch).
  std::unique_ptr<Call> Start(uint32_t worker, uint64_t epoch = kEpoch) {
    auto call = std::make_unique<Call>();
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    call->request = RequestOf(worker, epoch);
    Call* raw = call.get();
    stub_->async()->PushPull(&raw->context, &raw->request, &raw->response,
                             [raw](grpc::Status status) {
                               raw->status = std::move(status);
                               raw->done.Notify();
                             });
    return call;
  }

  absl::Duration forward_timeout_ = absl::Seconds(30);
  prometheus::Registry registry_;
  std::unique_ptr<ShardMetrics> shard_metrics_;
  std::unique_ptr<common::RpcMetrics> rpc_metrics_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ReplicationMetrics> metrics_;
  std::unique_ptr<ChainTable> table_;
  std::unique_ptr<Forwarder> forwarder_;
  std::unique_ptr<Replicator> replicator_;
  std::unique_ptr<ReplicatedPushPath> push_path_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<ParameterServer::Stub> stub_;
  std::unique_ptr<HeldSuccessor> successor_;
  std::vector<uint32_t> partitions_;
};

// Worker 0's push is applied, then worker 1's; worker 0's is acknowledged
// down the chain first. Worker 0's answer is read after both were applied,
// so it waits for worker 1's acknowledgement too: no worker sees a version
// the tail does not hold.
TEST_F(HeadPushPullTest, PullHalfWaitsUntilEveryVersionReadIsAtTheTail) {
  SetChain(/*head_first=*/true);
  std::unique_ptr<Call> first = Start(0);
  ASSERT_TRUE(successor_->WaitForHeld(1));
  EXPECT_FALSE(first->done.WaitForNotificationWithTimeout(absl::Milliseconds(200)))
      << "answered before the tail had the push: " << first->status.error_message();

  std::unique_ptr<Call> second = Start(1);
  ASSERT_TRUE(successor_->WaitForHeld(2));
  successor_->ReleaseOne();  // worker 0's push is at the tail
  EXPECT_FALSE(first->done.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "answered with worker 1's update before the tail had it";
  EXPECT_FALSE(second->done.HasBeenNotified());

  successor_->ReleaseOne();
  ASSERT_TRUE(first->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(second->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  for (Call* call : {first.get(), second.get()}) {
    ASSERT_TRUE(call->status.ok()) << call->status.error_message();
    EXPECT_FALSE(call->response.push().duplicate());
    ASSERT_EQ(call->response.pull().parts_size(), static_cast<int>(partitions_.size()));
    for (const ParameterPart& part : call->response.pull().parts()) {
      EXPECT_EQ(part.version(), 2);
      std::vector<float> values(4);
      ASSERT_OK(common::DecodeDense(DTYPE_F32, part.value().data(), absl::MakeSpan(values)));
      EXPECT_EQ(values, std::vector<float>(4, -2.0f));  // 0 - 1.0 * (1 + 1)
    }
  }

  // A retry of worker 0's PushPull (its answer lost) is a duplicate and
  // reads the committed state at once.
  std::unique_ptr<Call> again = Start(0);
  ASSERT_TRUE(again->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(again->status.ok()) << again->status.error_message();
  EXPECT_TRUE(again->response.push().duplicate());
  EXPECT_EQ(again->response.pull().parts(0).version(), 2);
}

// A head handing its place over: Freeze waits until the tail has every
// push it admitted; meanwhile new pushes (and sync-step closes) are refused
// and change nothing; after Unfreeze the group takes pushes again.
TEST_F(HeadPushPullTest, FreezeWaitsForTheTailAndRefusesNewPushes) {
  SetChain(/*head_first=*/true);
  std::unique_ptr<Call> first = Start(0);
  ASSERT_TRUE(successor_->WaitForHeld(1));
  EXPECT_FALSE(table_->Freeze(kGroup, absl::Milliseconds(200)))
      << "drained while worker 0's push was not at the tail";

  ExpectRefusedUnchanged(1, "handing its head over");
  EXPECT_FALSE(table_->AdmitLead(kGroup)) << "a frozen head closed a sync step";

  successor_->ReleaseOne();
  EXPECT_TRUE(table_->Freeze(kGroup, absl::Seconds(10)));
  ASSERT_TRUE(first->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(first->status.ok()) << first->status.error_message();

  table_->Unfreeze(kGroup);
  std::unique_ptr<Call> again = Start(1);
  ASSERT_TRUE(successor_->WaitForHeld(2));
  successor_->ReleaseOne();
  ASSERT_TRUE(again->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(again->status.ok()) << again->status.error_message();
  EXPECT_EQ(again->response.pull().parts(0).version(), 2);
  EXPECT_TRUE(table_->Freeze(kGroup, absl::Seconds(10))) << "an admission was not released";
}

// The successor hangs with the forward in flight (stopped, or cut off: no
// reset comes back); the chain then drops it. AbandonDeparted cancels the
// forward, which ends at once (this shard is the tail now) instead of at
// its 10 s attempt deadline: the worker is told at once that its epoch is
// stale, and its retry under the new one is a duplicate with the pushed
// version committed. A chain change
// that keeps the successor (a newer epoch with the same members) leaves
// the forward alone.
TEST_F(HeadPushPullTest, AForwardStuckOnADroppedSuccessorEndsWhenTheChainDropsIt) {
  SetChain(/*head_first=*/true);
  std::unique_ptr<Call> call = Start(0);
  ASSERT_TRUE(successor_->WaitForHeld(1));
  std::optional<chain::ChainConfig> config = table_->Get(kGroup);
  ASSERT_TRUE(config.has_value());
  chain::ChainConfig same = *config;
  ++same.epoch;
  ASSERT_TRUE(table_->Update(same));
  EXPECT_EQ(forwarder_->AbandonDeparted(kGroup), 0);
  EXPECT_FALSE(call->done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));

  ASSERT_OK_AND_ASSIGN(chain::ChainConfig alone, same.Remove(1, same.members[1].incarnation));
  ASSERT_TRUE(table_->Update(alone));
  shard_->replica().CommitGroup(kGroup);  // as the coordinator does for a new tail
  const absl::Time dropped = absl::Now();
  EXPECT_EQ(forwarder_->AbandonDeparted(kGroup), 1);
  ASSERT_TRUE(call->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_LT(absl::Now() - dropped, absl::Seconds(1)) << "the forward waited for its deadline";
  EXPECT_EQ(call->status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(call->status.error_message().find("stale chain epoch"), std::string::npos)
      << call->status.error_message();
  std::unique_ptr<Call> retry = Start(0, static_cast<uint64_t>(alone.epoch));
  ASSERT_TRUE(retry->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(retry->status.ok()) << retry->status.error_message();
  EXPECT_TRUE(retry->response.push().duplicate());
  EXPECT_EQ(retry->response.pull().parts(0).version(), 1);
}

// The same head with a forward timeout of 300 ms.
class HeadForwardTimeoutTest : public HeadPushPullTest {
 protected:
  HeadForwardTimeoutTest() { forward_timeout_ = absl::Milliseconds(300); }
};

// The successor does not answer the first forward within the forward
// timeout (in a container network its name once took 30-50 s to resolve).
// The worker is told to retry, but the head goes on forwarding: the update
// is applied here, and the successor would wait forever for it (every later
// operation of the group waits there for the one before). Before, the
// forward was dropped at the timeout, the worker's retry was answered OK as
// a duplicate that the tail never had, and every later push of the group
// timed out at the successor. A retry is refused until the tail has it,
// then is a duplicate; the next push goes through.
TEST_F(HeadForwardTimeoutTest, AForwardPastItsTimeoutGoesOnUntilTheTailHasIt) {
  SetChain(/*head_first=*/true);
  std::unique_ptr<Call> first = Start(0);
  ASSERT_TRUE(successor_->WaitForHeld(1));
  ASSERT_TRUE(first->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(first->status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << first->status.error_message();
  EXPECT_NE(first->status.error_message().find("still being forwarded"), std::string::npos)
      << first->status.error_message();
  EXPECT_EQ(metrics_->late_forwards().Value(), 1);

  std::unique_ptr<Call> retry = Start(0);
  ASSERT_TRUE(retry->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(retry->status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a retry was answered before the tail had the push: "
      << retry->status.error_message();
  EXPECT_NE(retry->status.error_message().find("still being replicated"), std::string::npos)
      << retry->status.error_message();

  successor_->ReleaseOne();  // the successor answers at last
  std::unique_ptr<Call> again;
  for (const absl::Time until = absl::Now() + absl::Seconds(10); absl::Now() < until;) {
    again = Start(0);
    ASSERT_TRUE(again->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    if (again->status.ok()) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(again->status.ok()) << again->status.error_message();
  EXPECT_TRUE(again->response.push().duplicate());
  EXPECT_EQ(again->response.pull().parts(0).version(), 1);
  EXPECT_EQ(successor_->Arrived(), 1u) << "the forward was sent again while in flight";

  std::unique_ptr<Call> next = Start(1);
  ASSERT_TRUE(successor_->WaitForHeld(2));
  successor_->ReleaseOne();
  ASSERT_TRUE(next->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(next->status.ok()) << next->status.error_message();
  EXPECT_EQ(next->response.pull().parts(0).version(), 2);
  EXPECT_EQ(metrics_->late_forwards().Value(), 1);
}

TEST_F(HeadPushPullTest, AShardThatIsNotTheHeadRefusesAndChangesNothing) {
  SetChain(/*head_first=*/false);
  ExpectRefusedUnchanged(0, "not its head");
}

TEST_F(HeadPushPullTest, APushHalfInTwoFieldsIsRefusedAndChangesNothing) {
  SetChain(/*head_first=*/true);
  // Worker 0's PushPull, its push half written as two fields (the header,
  // then the parts): protobuf merges them, but the head forwards the push
  // half as it arrived, so it must be one piece of the request.
  const PushPullRequest request = RequestOf(0);
  PushPullRequest first, second, rest;
  *first.mutable_push() = request.push();
  first.mutable_push()->clear_parts();
  *second.mutable_push()->mutable_parts() = request.push().parts();
  *rest.mutable_pull() = request.pull();
  const std::string body =
      first.SerializeAsString() + second.SerializeAsString() + rest.SerializeAsString();
  PushPullRequest merged;
  ASSERT_TRUE(merged.ParseFromString(body));
  ASSERT_EQ(merged.push().parts_size(), static_cast<int>(partitions_.size()))
      << "the body is a valid PushPull";

  const uint64_t before = shard_->Checksum();
  grpc::GenericStub stub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                             grpc::InsecureChannelCredentials()));
  grpc::Slice slice(body);
  grpc::ByteBuffer raw(&slice, 1), response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/shardtrain.ParameterServer/PushPull", grpc::StubOptions(), &raw,
                 &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(15)));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("push half in one field"), std::string::npos)
      << status.error_message();
  EXPECT_EQ(shard_->Checksum(), before);
}

}  // namespace
}  // namespace shardtrain::server
