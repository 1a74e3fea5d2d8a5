// The raw Push, Pull and PushPull methods against a stock protobuf client
// (the generated stub): gradients of every dtype are applied as the shard
// applies them, pulls of every dtype carry the shard's parameters, and a
// pull waiting for a sync step is answered when the step completes or
// ends at its deadline, and so is a sync table's lookup waiting for its
// step.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/shardtrain.grpc.pb.h"
#include "server/ps_server.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

constexpr int kElements = 1000;
constexpr int kPartitions = 8;  // of 125 elements each
constexpr int kPartitionElements = 125;
constexpr float kLearningRate = 0.25f;

class ServiceTest : public ::testing::Test {
 protected:
  void Start(ConsistencyMode mode, int workers) {
    PsServerOptions options;
    options.metrics_address = "";
    options.shard.mode = mode;
    options.shard.num_workers = workers;
    options.shard.optimizer.name = "sgd";
    options.shard.optimizer.learning_rate = kLearningRate;
    options.shard.partitioning.max_partition_elements = 128;
    auto server = PsServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = ParameterServer::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
    RegisterRequest request;
    TensorSpec* spec = request.add_tensors();
    spec->set_name("w");
    spec->add_shape(kElements);
    spec->set_dtype(DTYPE_F32);
    spec->mutable_init()->set_kind(Initializer::KIND_CONSTANT);
    spec->mutable_init()->set_scale(0.5f);
    RegisterResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->Register(&context, request, &response).ok());
    ASSERT_EQ(response.partitions_size(), kPartitions);
  }

  static std::unique_ptr<grpc::ClientContext> Context(int timeout_ms = 10000) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(timeout_ms));
    return context;
  }

  static float Grad(int worker, int p, int i) {
    return 0.01f * static_cast<float>((i * 7 + p * 3 + worker) % 23) - 0.1f;
  }

  static PushRequest MakePush(int worker, int64_t version, DType dtype) {
    PushRequest request;
    request.set_worker(worker);
    request.set_clock(version + 1);
    for (int p = 0; p < kPartitions; ++p) {
      GradientPart* part = request.add_parts();
      part->mutable_key()->set_tensor("w");
      part->mutable_key()->set_partition(p);
      part->set_version(version);
      std::vector<float> values(kPartitionElements);
      for (int i = 0; i < kPartitionElements; ++i) values[i] = Grad(worker, p, i);
      common::EncodeDense(values, dtype, part->mutable_grad()->mutable_data());
      part->mutable_grad()->set_dtype(dtype);
    }
    return request;
  }

  static PullRequest MakePull(int worker, int64_t min_version, DType dtype) {
    PullRequest request;
    request.set_worker(worker);
    request.set_min_version(min_version);
    request.set_dtype(dtype);
    for (int p = kPartitions - 1; p >= 0; --p) {  // answered in the order asked
      PartitionKey* key = request.add_parts();
      key->set_tensor("w");
      key->set_partition(p);
    }
    return request;
  }

  static PushPullRequest MakePushPull(PushRequest push, PullRequest pull) {
    PushPullRequest request;
    *request.mutable_push() = std::move(push);
    *request.mutable_pull() = std::move(pull);
    return request;
  }

  // Element i of partition p after one SGD step from 0.5 with `grad`.
  static float Stepped(float grad) {
    float param = 0.5f;
    const float d = grad + 0.0f * param;
    param -= kLearningRate * d;
    return param;
  }

  // The value of one gradient element sent as `dtype`, as the server reads it.
  static float AsSent(float value, DType dtype) {
    std::string bytes;
    common::EncodeDense(absl::MakeConstSpan(&value, 1), dtype, &bytes);
    float decoded;
    EXPECT_TRUE(common::DecodeDense(dtype, bytes, absl::MakeSpan(&decoded, 1)).ok());
    return decoded;
  }

  // Checks that `response` has every partition, in the order asked, with
  // `expected(p, i)` encoded as `dtype`, at `version`.
  template <typename Expected>
  static void ExpectParts(const PullResponse& response, DType dtype, int64_t version,
                          Expected expected) {
    ASSERT_EQ(response.parts_size(), kPartitions);
    for (int k = 0; k < kPartitions; ++k) {
      const ParameterPart& part = response.parts(k);
      const int p = kPartitions - 1 - k;
      EXPECT_EQ(part.key().tensor(), "w");
      EXPECT_EQ(part.key().partition(), static_cast<uint32_t>(p));
      EXPECT_EQ(part.version(), version);
      EXPECT_EQ(part.value().dtype(), dtype);
      EXPECT_EQ(part.value().encoding(), ENCODING_DENSE);
      std::vector<float> values(kPartitionElements);
      for (int i = 0; i < kPartitionElements; ++i) values[i] = expected(p, i);
      std::string bytes;
      common::EncodeDense(values, dtype, &bytes);
      EXPECT_EQ(part.value().data(), bytes) << "partition " << p;
    }
  }

  std::unique_ptr<PsServer> server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

TEST_F(ServiceTest, StockClientPushesAndPullsEveryDType) {
  for (DType push_dtype : {DTYPE_F32, DTYPE_F16, DTYPE_BF16}) {
    Start(ConsistencyMode::kAsync, 1);
    PushResponse pushed;
    const grpc::Status push = stub_->Push(Context().get(), MakePush(0, 0, push_dtype), &pushed);
    ASSERT_TRUE(push.ok()) << push.error_message();
    EXPECT_EQ(pushed.incarnation(), server_->shard().incarnation());
    EXPECT_FALSE(pushed.duplicate());
    for (DType pull_dtype : {DTYPE_UNSPECIFIED, DTYPE_F32, DTYPE_F16, DTYPE_BF16}) {
      PullResponse pulled;
      const grpc::Status pull = stub_->Pull(Context().get(), MakePull(0, 0, pull_dtype), &pulled);
      ASSERT_TRUE(pull.ok()) << pull.error_message();
      EXPECT_EQ(pulled.incarnation(), server_->shard().incarnation());
      EXPECT_GE(pulled.wait_seconds(), 0.0);
      const DType sent = pull_dtype == DTYPE_UNSPECIFIED ? DTYPE_F32 : pull_dtype;
      ExpectParts(pulled, sent, 1, [&](int p, int i) {
        return Stepped(AsSent(Grad(0, p, i), push_dtype));
      });
    }
  }
}

TEST_F(ServiceTest, PushPullAppliesThenAnswersThePull) {
  Start(ConsistencyMode::kAsync, 1);
  PushPullRequest request = MakePushPull(MakePush(0, 0, DTYPE_BF16), MakePull(0, 1, DTYPE_F16));
  PushPullResponse response;
  const grpc::Status status = stub_->PushPull(Context().get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.push().incarnation(), server_->shard().incarnation());
  EXPECT_EQ(response.pull().incarnation(), server_->shard().incarnation());
  ExpectParts(response.pull(), DTYPE_F16, 1, [&](int p, int i) {
    return Stepped(AsSent(Grad(0, p, i), DTYPE_BF16));
  });

  // A bad pull half refuses the whole request; nothing is applied.
  const uint64_t before = server_->shard().Checksum();
  request.mutable_pull()->mutable_parts(0)->set_tensor("nope");
  *request.mutable_push() = MakePush(0, 1, DTYPE_F32);
  const grpc::Status refused = stub_->PushPull(Context().get(), request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::NOT_FOUND) << refused.error_message();
  EXPECT_EQ(server_->shard().Checksum(), before);
  // So does a bad push half.
  *request.mutable_pull() = MakePull(0, 0, DTYPE_F32);
  request.mutable_push()->mutable_parts(3)->mutable_grad()->mutable_data()->resize(3);
  const grpc::Status bad_push = stub_->PushPull(Context().get(), request, &response);
  EXPECT_EQ(bad_push.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad_push.error_message(), HasSubstr("w/3: payload has 3 bytes"));
  EXPECT_EQ(server_->shard().Checksum(), before);
}

TEST_F(ServiceTest, APullWaitsForTheSyncStepOrItsDeadline) {
  Start(ConsistencyMode::kSync, 2);
  // Nobody completes step 0 within the deadline.
  PullResponse timed_out;
  const grpc::Status expired =
      stub_->Pull(Context(300).get(), MakePull(0, 1, DTYPE_F32), &timed_out);
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);

  // Worker 0's PushPull waits for worker 1's push, then gets the mean step.
  const PushPullRequest request =
      MakePushPull(MakePush(0, 0, DTYPE_F32), MakePull(0, 1, DTYPE_BF16));
  PushPullResponse response;
  grpc::Status status;
  std::thread waiting([&] { status = stub_->PushPull(Context().get(), request, &response); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  PushResponse pushed;
  ASSERT_TRUE(stub_->Push(Context().get(), MakePush(1, 0, DTYPE_F32), &pushed).ok());
  waiting.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(response.pull().wait_seconds(), 0.1);
  ExpectParts(response.pull(), DTYPE_BF16, 1, [&](int p, int i) {
    return Stepped((Grad(0, p, i) + Grad(1, p, i)) * 0.5f);
  });
}

// A sync PushPull to a shard behind the job (it restored an older
// checkpoint): the push brings its partitions up to the step, and the pull
// half, which asks for the step's result, is answered once the step is
// complete instead of refused as too far ahead by the check made before
// the push is applied.
TEST_F(ServiceTest, ASyncPushPullCatchesUpAShardThatRestoredAnOlderStep) {
  Start(ConsistencyMode::kSync, 1);
  // The job is at step 5.
  PushPullRequest request = MakePushPull(MakePush(0, 5, DTYPE_F32), MakePull(0, 6, DTYPE_F32));
  PushPullResponse response;
  const grpc::Status status = stub_->PushPull(Context().get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ExpectParts(response.pull(), DTYPE_F32, 6, [&](int p, int i) { return Stepped(Grad(0, p, i)); });

  // A pull alone still may not ask for more than one step ahead, nor a
  // PushPull's pull half for more than its push's step; nothing changes.
  const uint64_t before = server_->shard().Checksum();
  PullResponse pulled;
  const grpc::Status ahead = stub_->Pull(Context().get(), MakePull(0, 8, DTYPE_F32), &pulled);
  EXPECT_EQ(ahead.error_code(), grpc::StatusCode::OUT_OF_RANGE) << ahead.error_message();
  request = MakePushPull(MakePush(0, 6, DTYPE_F32), MakePull(0, 9, DTYPE_F32));
  const grpc::Status too_far = stub_->PushPull(Context().get(), request, &response);
  EXPECT_EQ(too_far.error_code(), grpc::StatusCode::OUT_OF_RANGE) << too_far.error_message();
  EXPECT_EQ(server_->shard().Checksum(), before);
}

// A sync table's training lookup by a worker whose push of the open step is
// in is parked until the last worker's push applies the step: one that
// runs out of time ends with DEADLINE_EXCEEDED and changes nothing, the
// next is answered with the step's rows as soon as worker 1 pushes.
TEST_F(ServiceTest, ASyncTableLookupWaitsForItsStep) {
  Start(ConsistencyMode::kAsync, 2);
  RegisterTablesRequest tables;
  TableSpec* spec = tables.add_tables();
  spec->set_name("t");
  spec->set_dim(1);
  spec->set_optimizer("sgd");
  spec->set_learning_rate(1.0f);
  spec->set_init(TableSpec::INIT_ZEROS);
  spec->set_sync(true);
  RegisterTablesResponse registered;
  ASSERT_TRUE(stub_->RegisterTables(Context().get(), tables, &registered).ok());
  const uint64_t id = 5;
  LookupRequest lookup;
  lookup.set_table("t");
  lookup.set_ids(std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  lookup.set_train(true);
  LookupResponse rows;
  ASSERT_TRUE(stub_->Lookup(Context().get(), lookup, &rows).ok());
  auto push = [&](uint32_t worker, float grad) {
    PushSparseRequest request;
    request.set_worker(worker);
    request.set_sequence(1);
    request.set_table("t");
    request.set_ids(lookup.ids());
    request.set_grads(std::string(reinterpret_cast<const char*>(&grad), sizeof(grad)));
    PushSparseResponse response;
    return stub_->PushSparse(Context().get(), request, &response);
  };
  ASSERT_TRUE(push(0, -2.0f).ok());
  const grpc::Status expired = stub_->Lookup(Context(300).get(), lookup, &rows);
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);

  grpc::Status status;
  LookupResponse waited;
  std::thread waiting([&] { status = stub_->Lookup(Context().get(), lookup, &waited); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(push(1, -4.0f).ok());
  waiting.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  float row;
  ASSERT_EQ(waited.rows().size(), sizeof(row));
  std::memcpy(&row, waited.rows().data(), sizeof(row));
  EXPECT_EQ(row, 3.0f);  // SGD, lr 1: minus the mean of -2 and -4
}

}  // namespace
}  // namespace shardtrain::server
