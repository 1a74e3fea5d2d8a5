#include "server/replication/replicator.h"

#include <memory>

#include <grpcpp/support/proto_buffer_writer.h>
#include <prometheus/registry.h>

#include "absl/synchronization/notification.h"
#include "common/partition.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "wire/message_views.h"

namespace shardtrain::server {
namespace {

constexpr int kShards = 3;
constexpr int kGroup = 0;

// Shard 1 of 3 with --replicas 2 (groups 1 and 0), a member of group 0's
// chain behind shard 0, and a push of group 0 forwarded to it.
class ReplicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardOptions options;
    options.shard_index = 1;
    options.partitioning.num_shards = kShards;
    options.partitioning.max_partition_elements = 4;
    options.replicas = 2;
    options.mode = ConsistencyMode::kAsync;
    options.num_workers = 1;
    options.optimizer.name = "sgd";
    shard_metrics_ = std::make_unique<ShardMetrics>(registry_);
    ASSERT_OK_AND_ASSIGN(shard_, Shard::Create(options, shard_metrics_.get()));
    metrics_ = std::make_unique<ReplicationMetrics>(registry_, 2);
    table_ = std::make_unique<ChainTable>(1, shard_->incarnation(), shard_->replica().groups(),
                                          absl::Seconds(60), metrics_.get());
    ASSERT_OK_AND_ASSIGN(
        chain::ChainConfig config,
        chain::MakeChainConfig(kGroup, 2,
                                {{0, "127.0.0.1:1", 7}, {1, "127.0.0.1:2", shard_->incarnation()}}));
    ASSERT_TRUE(table_->Update(config));
    forwarder_ = std::make_unique<Forwarder>(table_.get(), grpc::InsecureChannelCredentials(),
                                             grpc::ChannelArguments(), metrics_.get());
    replicator_ = std::make_unique<Replicator>(shard_.get(), table_.get(), forwarder_.get(),
                                               metrics_.get(), absl::Seconds(5));
    // A partition of group 0 of a tensor this shard has not registered.
    push_.set_worker(0);
    push_.set_clock(1);
    push_.set_chain_epoch(1);
    for (uint32_t p = 0; p < kShards; ++p) {
      if (common::ReplicaGroupFor("w", p, kShards) != kGroup) continue;
      GradientPart& part = *push_.add_parts();
      part.mutable_key()->set_tensor("w");
      part.mutable_key()->set_partition(p);
      part.mutable_grad()->set_dtype(DTYPE_F32);
      part.mutable_grad()->set_data(std::string(16, '\0'));
      ReplicatedOp& op = *push_.add_replicated();
      op.set_op(0);
      op.set_version_after(1);
      break;
    }
    ASSERT_EQ(push_.parts_size(), 1);
  }

  absl::Status Replicate() {
    grpc::ByteBuffer bytes;
    bool own = false;
    const grpc::Status serialized =
        grpc::GenericSerialize<grpc::ProtoBufferWriter, PushRequest>(push_, &bytes, &own);
    EXPECT_TRUE(serialized.ok());
    absl::Status result = absl::InternalError("done not called");
    replicator_->Replicate(bytes, wire::ViewOf(push_),
                           [&](absl::Status status, const PushResponse&) { result = status; });
    return result;
  }

  // Registers the tensor the pushes name ("w", one partition per shard).
  void RegisterTensor() {
    RegisterRequest request;
    TensorSpec& spec = *request.add_tensors();
    spec.set_name("w");
    spec.add_shape(4 * kShards);
    spec.set_dtype(DTYPE_F32);
    RegisterResponse response;
    ASSERT_OK(shard_->Register(request, &response));
  }

  // The fixture's push at operation `op` of its partition.
  PushRequest PushAt(int64_t op) const {
    PushRequest push = push_;
    push.mutable_replicated(0)->set_op(op);
    push.mutable_replicated(0)->set_version_after(op + 1);
    return push;
  }

  // A forward handed to Replicate, and how it ended.
  struct Forwarded {
    grpc::ByteBuffer bytes;  // alive until it ends, as a call's request is
    absl::Notification ended;
    absl::Status status = absl::InternalError("done not called");
  };
  void StartReplicate(const PushRequest& push, Forwarded* forwarded) {
    bool own = false;
    ASSERT_TRUE((grpc::GenericSerialize<grpc::ProtoBufferWriter, PushRequest>(
                     push, &forwarded->bytes, &own))
                    .ok());
    replicator_->Replicate(forwarded->bytes, wire::ViewOf(push),
                           [forwarded](absl::Status status, const PushResponse&) {
                             forwarded->status = std::move(status);
                             forwarded->ended.Notify();
                           });
  }

  double EarlyForwards(bool waited) { return metrics_->early_forwards(waited).Value(); }

  // How a forward of group 0 ended (status valid once `ended` is notified).
  struct ForwardEnd {
    absl::Notification ended;
    absl::Status status = absl::InternalError("done not called");
  };
  // Forwards an empty push of group 0 with a 10 s deadline.
  void StartForward(ForwardEnd* end) {
    forwarder_->Forward(kGroup, grpc::ByteBuffer(), absl::Seconds(10),
                        [end](absl::Status status) {
                          end->status = std::move(status);
                          end->ended.Notify();
                        });
  }

  prometheus::Registry registry_;
  std::unique_ptr<ShardMetrics> shard_metrics_;
  std::unique_ptr<Shard> shard_;
  std::unique_ptr<ReplicationMetrics> metrics_;
  std::unique_ptr<ChainTable> table_;
  std::unique_ptr<Forwarder> forwarder_;
  std::unique_ptr<Replicator> replicator_;
  PushRequest push_;
};

// A joining tail still copying the group's state has not registered its
// tensors: a forward must be refused as retryable (UNAVAILABLE), never as
// NOT_FOUND, which would fail the worker's push.
TEST_F(ReplicatorTest, ForwardToATailStillCopyingIsRetryable) {
  table_->SetCatchingUp(kGroup, true);
  const absl::Status status = Replicate();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("copying"), absl::string_view::npos) << status;
}

TEST_F(ReplicatorTest, ForwardAtAnotherEpochIsRetryable) {
  push_.set_chain_epoch(2);  // newer than this shard's configuration
  absl::Status status = Replicate();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("behind the request's 2"), absl::string_view::npos) << status;
  chain::ChainConfig newer = *table_->Get(kGroup);
  newer.epoch = 3;
  ASSERT_TRUE(table_->Update(newer));
  status = Replicate();  // older than this shard's configuration
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("stale chain epoch 2"), absl::string_view::npos) << status;
}

// A forward that meets this shard fenced (its etcd lease being confirmed,
// say after etcd restarted) is held, not failed: the shard may still be in
// the chain with the push applied here. It ends once the shard serves again
// (here as the group's tail: done) ...
TEST_F(ReplicatorTest, AForwardWaitsOutAFence) {
  table_->Fence("etcd lease expired");
  ForwardEnd end;
  StartForward(&end);
  EXPECT_FALSE(end.ended.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "a fenced shard ended a forward: " << end.status;
  table_->Unfence();
  ASSERT_TRUE(end.ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(end.status);
}

// ... and fails once the chain it finds then has dropped the shard.
TEST_F(ReplicatorTest, AFencedForwardFailsOnceTheChainDropsTheShard) {
  table_->Fence("etcd lease expired");
  ForwardEnd end;
  StartForward(&end);
  ASSERT_OK_AND_ASSIGN(chain::ChainConfig without,
                       chain::MakeChainConfig(kGroup, 2, {{0, "127.0.0.1:1", 7}}));
  without.epoch = 2;
  ASSERT_TRUE(table_->Update(without));
  EXPECT_FALSE(end.ended.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  table_->Unfence();
  ASSERT_TRUE(end.ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(end.status.code(), absl::StatusCode::kUnavailable) << end.status;
  EXPECT_NE(end.status.message().find("left group 0's chain"), absl::string_view::npos)
      << end.status;
}

// Forwards may overtake each other on the way (two head threads send to
// one successor). One that comes before an operation it follows must not
// wait on the thread that received it, which may be the only reader of the
// connection the missing one comes on: Replicate returns at once, and the
// forward is applied, on a thread of its own, when the missing one is.
TEST_F(ReplicatorTest, AForwardAheadOfItsTurnWaitsOffTheReceivingThread) {
  RegisterTensor();
  Forwarded second;
  StartReplicate(PushAt(1), &second);  // returns: this thread goes on
  EXPECT_FALSE(second.ended.WaitForNotificationWithTimeout(absl::Milliseconds(200)))
      << second.status;
  EXPECT_EQ(shard_->replica().Ops(kGroup), 0);
  EXPECT_EQ(EarlyForwards(/*waited=*/true), 1);

  Forwarded first;
  StartReplicate(PushAt(0), &first);  // next: applied on this thread
  EXPECT_GE(shard_->replica().Ops(kGroup), 1);
  ASSERT_TRUE(first.ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(first.status);
  ASSERT_TRUE(second.ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(second.status);
  EXPECT_EQ(shard_->replica().Ops(kGroup), 2);
  EXPECT_EQ(EarlyForwards(/*waited=*/true), 1);
  EXPECT_EQ(EarlyForwards(/*waited=*/false), 0);
}

// With --max_waiting_forwards forwards waiting, one more is refused at once
// as retryable (the predecessor sends it again) and changes nothing.
TEST_F(ReplicatorTest, AForwardAheadOfItsTurnIsRefusedWhenTheMostWaitAlready) {
  RegisterTensor();
  replicator_.reset();
  replicator_ = std::make_unique<Replicator>(shard_.get(), table_.get(), forwarder_.get(),
                                             metrics_.get(), absl::Seconds(5),
                                             /*max_waiting_forwards=*/1);
  Forwarded waiting;
  StartReplicate(PushAt(1), &waiting);
  Forwarded refused;
  StartReplicate(PushAt(2), &refused);
  ASSERT_TRUE(refused.ended.HasBeenNotified());
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kUnavailable) << refused.status;
  EXPECT_NE(refused.status.message().find("--max_waiting_forwards"), absl::string_view::npos)
      << refused.status;
  EXPECT_EQ(EarlyForwards(/*waited=*/false), 1);

  Forwarded first;
  StartReplicate(PushAt(0), &first);
  ASSERT_TRUE(first.ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(first.status);
  ASSERT_TRUE(waiting.ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(waiting.status);
  // The refused forward, sent again, is next now.
  Forwarded again;
  StartReplicate(PushAt(2), &again);
  ASSERT_TRUE(again.ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_OK(again.status);
  EXPECT_EQ(shard_->replica().Ops(kGroup), 3);
}

// Shutdown: a forward waiting for its turn gives up at once, not after
// forward_timeout/2.
TEST_F(ReplicatorTest, StopEndsTheForwardsWaiting) {
  RegisterTensor();
  Forwarded waiting;
  StartReplicate(PushAt(1), &waiting);
  const absl::Time stopped = absl::Now();
  replicator_->Stop();
  ASSERT_TRUE(waiting.ended.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(1));
  EXPECT_EQ(waiting.status.code(), absl::StatusCode::kUnavailable) << waiting.status;
  EXPECT_EQ(shard_->replica().Ops(kGroup), 0);
}

TEST_F(ReplicatorTest, AGroupThisShardNeverHoldsIsABadRequest) {
  push_.mutable_parts(0)->mutable_key()->set_tensor("x");
  for (uint32_t p = 0; p < kShards; ++p) {
    if (common::ReplicaGroupFor("x", p, kShards) == 2) {
      push_.mutable_parts(0)->mutable_key()->set_partition(p);
    }
  }
  const absl::Status status = Replicate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
}

}  // namespace
}  // namespace shardtrain::server
