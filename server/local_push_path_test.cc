#include "server/local_push_path.h"

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <prometheus/registry.h>

#include "common/payload.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/shardtrain.grpc.pb.h"

namespace shardtrain::server {
namespace {

using ::testing::ElementsAre;

constexpr int kElements = 4;

// One async shard of two workers holding "w" (4 zeros), SGD at lr 1.
class LocalPushPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardOptions options;
    options.mode = ConsistencyMode::kAsync;
    options.num_workers = 2;
    options.optimizer.name = "sgd";
    options.optimizer.learning_rate = 1.0f;
    ASSERT_OK_AND_ASSIGN(shard_, Shard::Create(options, &metrics_));
    RegisterRequest request;
    TensorSpec* spec = request.add_tensors();
    spec->set_name("w");
    spec->add_shape(kElements);
    spec->set_dtype(DTYPE_F32);
    spec->mutable_init()->set_kind(Initializer::KIND_CONSTANT);
    RegisterResponse response;
    ASSERT_OK(shard_->Register(request, &response));
  }

  // A Push of gradient `grad` (every element) from `worker`, as gRPC hands
  // it over, and a view parsed from it.
  struct Received {
    grpc::ByteBuffer buffer;
    wire::ReceivedMessage message;
    wire::PushView view;
  };
  std::unique_ptr<Received> MakePush(uint32_t worker, float grad) {
    PushRequest request;
    request.set_worker(worker);
    request.set_clock(1);
    GradientPart* part = request.add_parts();
    part->mutable_key()->set_tensor("w");
    part->mutable_key()->set_partition(0);
    common::EncodeDense(std::vector<float>(kElements, grad), DTYPE_F32,
                        part->mutable_grad()->mutable_data());
    part->mutable_grad()->set_dtype(DTYPE_F32);
    auto received = std::make_unique<Received>();
    bool own = false;
    EXPECT_TRUE(grpc::SerializationTraits<PushRequest>::Serialize(request, &received->buffer,
                                                                  &own)
                    .ok());
    EXPECT_OK(received->message.Take(received->buffer));
    EXPECT_OK(wire::ParsePush(received->message, &received->view, 100));
    return received;
  }

  // Workers 0 and 1 take turns.
  static absl::StatusOr<std::unique_ptr<PushOrder>> RoundRobin() {
    PushOrderOptions options;
    options.kind = "round_robin";
    options.num_workers = 2;
    return PushOrder::Create(options);
  }

  std::vector<float> Values() {
    PullRequest request;
    request.set_worker(0);
    PartitionKey* key = request.add_parts();
    key->set_tensor("w");
    key->set_partition(0);
    PullResponse response;
    shard_->pulls().Fill(request, &response);
    std::vector<float> values(kElements);
    EXPECT_EQ(response.parts_size(), 1);
    EXPECT_OK(common::DecodePayload(response.parts(0).value(), absl::MakeSpan(values)));
    return values;
  }

  prometheus::Registry registry_;
  ShardMetrics metrics_{registry_};
  std::unique_ptr<Shard> shard_;
};

TEST_F(LocalPushPathTest, UnorderedPushIsAppliedBeforeItReturns) {
  LocalPushPath path(shard_.get(), /*order=*/nullptr);
  const auto push = MakePush(1, 0.5f);
  bool answered = false;
  path.Push(push->buffer, push->view, [&](absl::Status status, const PushResponse& response) {
    EXPECT_OK(status);
    EXPECT_EQ(response.incarnation(), shard_->incarnation());
    answered = true;
  });
  EXPECT_TRUE(answered);
  EXPECT_THAT(Values(), ElementsAre(-0.5f, -0.5f, -0.5f, -0.5f));
  EXPECT_FALSE(path.committed_reads());
  EXPECT_OK(path.CheckPull(PullRequest()));
}

TEST_F(LocalPushPathTest, OrderedPushWaitsForItsWorkersTurn) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PushOrder> order, RoundRobin());
  LocalPushPath path(shard_.get(), order.get());
  std::vector<std::string> answered;
  auto record = [&](const char* who) {
    return [&answered, who](absl::Status status, const PushResponse&) {
      EXPECT_OK(status);
      answered.push_back(who);
    };
  };
  // Worker 1 first: parked (its view is dropped; the request is parsed
  // again when the turn comes).
  auto late = MakePush(1, 2.0f);
  path.Push(late->buffer, late->view, record("worker 1"));
  late->view = wire::PushView();
  EXPECT_TRUE(answered.empty());
  EXPECT_THAT(Values(), ElementsAre(0.0f, 0.0f, 0.0f, 0.0f));
  // Worker 0's turn: its push, then worker 1's.
  const auto first = MakePush(0, 1.0f);
  path.Push(first->buffer, first->view, record("worker 0"));
  EXPECT_THAT(answered, ElementsAre("worker 0", "worker 1"));
  EXPECT_THAT(Values(), ElementsAre(-3.0f, -3.0f, -3.0f, -3.0f));
}

TEST_F(LocalPushPathTest, ParkedPushesEndUnavailableAtShutdown) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<PushOrder> order, RoundRobin());
  LocalPushPath path(shard_.get(), order.get());
  absl::Status parked_status;
  auto push = MakePush(1, 2.0f);
  path.Push(push->buffer, push->view,
            [&](absl::Status status, const PushResponse&) { parked_status = status; });
  path.CancelAll();
  EXPECT_EQ(parked_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Values(), ElementsAre(0.0f, 0.0f, 0.0f, 0.0f));
}

TEST_F(LocalPushPathTest, SparseOperationsRunHereWithoutAnOp) {
  LocalPushPath path(shard_.get(), /*order=*/nullptr);
  bool applied = false;
  absl::Status done_status;
  path.Sparse(
      SparseCall(),
      [&](SparseOp* op, bool* duplicate) {
        EXPECT_EQ(op, nullptr);
        EXPECT_NE(duplicate, nullptr);
        applied = true;
        return absl::NotFoundError("no table \"t\"");
      },
      [&](absl::Status status) { done_status = status; });
  EXPECT_TRUE(applied);
  EXPECT_EQ(done_status.code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shardtrain::server
