#include "server/shard.h"

#include <cstring>
#include <vector>

#include <prometheus/registry.h>

#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

constexpr int kElements = 6;

TensorSpec Spec(const std::string& name, float value) {
  TensorSpec spec;
  spec.set_name(name);
  spec.add_shape(kElements);
  spec.set_dtype(DTYPE_F32);
  spec.mutable_init()->set_kind(Initializer::KIND_CONSTANT);
  spec.mutable_init()->set_scale(value);
  return spec;
}

class ShardTest : public ::testing::Test {
 protected:
  void Start(ConsistencyMode mode, int workers, int64_t max_staleness = -1) {
    ShardOptions options;
    options.mode = mode;
    options.num_workers = workers;
    options.max_staleness = max_staleness;
    options.optimizer.name = "sgd";
    options.optimizer.learning_rate = 0.5f;
    auto shard = Shard::Create(options, &metrics_);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = std::move(*shard);
    RegisterRequest request;
    *request.add_tensors() = Spec("w", 1.0f);
    RegisterResponse response;
    ASSERT_TRUE(shard_->Register(request, &response).ok());
    ASSERT_EQ(response.partitions_size(), 1);
  }

  PushRequest Push(uint32_t worker, int64_t version, float grad) {
    PushRequest request;
    request.set_worker(worker);
    request.set_clock(version + 1);
    GradientPart* part = request.add_parts();
    part->mutable_key()->set_tensor("w");
    part->set_version(version);
    std::vector<float> values(kElements, grad);
    common::EncodeDense(values, DTYPE_F32, part->mutable_grad()->mutable_data());
    part->mutable_grad()->set_dtype(DTYPE_F32);
    return request;
  }

  PullRequest Pull(uint32_t worker, int64_t clock, int64_t min_version) {
    PullRequest request;
    request.set_worker(worker);
    request.set_clock(clock);
    request.set_min_version(min_version);
    request.add_parts()->set_tensor("w");
    return request;
  }

  // The first element and the version of "w".
  std::pair<float, int64_t> Value() {
    PullRequest request = Pull(0, 0, 0);
    PullResponse response;
    EXPECT_TRUE(shard_->ValidatePull(request).ok());
    shard_->FillPull(request, &response);
    float value;
    std::memcpy(&value, response.parts(0).value().data().data(), sizeof(value));
    return {value, response.parts(0).version()};
  }

  absl::Status DoPush(const PushRequest& request) {
    PushResponse response;
    return shard_->Push(request, &response);
  }

  prometheus::Registry registry_;
  ShardMetrics metrics_{registry_};
  std::unique_ptr<Shard> shard_;
};

TEST_F(ShardTest, SyncAppliesTheMeanOnceEveryWorkerPushed) {
  Start(ConsistencyMode::kSync, 2);
  ASSERT_TRUE(DoPush(Push(0, 0, 1.0f)).ok());
  EXPECT_EQ(Value(), std::make_pair(1.0f, int64_t{0}));  // waiting for worker 1
  EXPECT_FALSE(shard_->PullReady(Pull(0, 1, 1)));
  ASSERT_TRUE(DoPush(Push(1, 0, 3.0f)).ok());
  // mean gradient 2, lr 0.5: 1 - 0.5 * 2 = 0
  EXPECT_EQ(Value(), std::make_pair(0.0f, int64_t{1}));
  EXPECT_TRUE(shard_->PullReady(Pull(0, 1, 1)));
}

TEST_F(ShardTest, SyncRejectsLateAndDuplicateGradientsWithoutChange) {
  Start(ConsistencyMode::kSync, 2);
  ASSERT_TRUE(DoPush(Push(0, 0, 1.0f)).ok());
  const uint64_t before = shard_->Checksum();
  absl::Status duplicate = DoPush(Push(0, 0, 1.0f));
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(shard_->Checksum(), before);
  ASSERT_TRUE(DoPush(Push(1, 0, 1.0f)).ok());
  const uint64_t after_step = shard_->Checksum();
  absl::Status late = DoPush(Push(1, 0, 1.0f));
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.message(), HasSubstr("finished"));
  EXPECT_EQ(shard_->Checksum(), after_step);
  StatusResponse status;
  shard_->FillStatus(StatusRequest(), &status);
  EXPECT_EQ(status.dropped_gradients(), 1);
}

TEST_F(ShardTest, SyncStepCompletesWhenAWorkerIsForgotten) {
  Start(ConsistencyMode::kSync, 2);
  HeartbeatRequest beat;
  beat.set_worker(1);
  HeartbeatResponse ignored;
  ASSERT_TRUE(shard_->Heartbeat(beat, &ignored).ok());
  ASSERT_TRUE(DoPush(Push(0, 0, 2.0f)).ok());
  EXPECT_EQ(Value().second, 0);
  shard_->Tick(absl::Now() + absl::Seconds(11));  // worker 1 timed out
  EXPECT_EQ(Value(), std::make_pair(0.0f, int64_t{1}));
}

TEST_F(ShardTest, AsyncAppliesEachGradientAndMeasuresStaleness) {
  Start(ConsistencyMode::kAsync, 2);
  PushResponse response;
  ASSERT_TRUE(shard_->Push(Push(0, 0, 1.0f), &response).ok());
  EXPECT_EQ(response.max_staleness(), 0);
  ASSERT_TRUE(shard_->Push(Push(1, 0, 1.0f), &response).ok());
  EXPECT_EQ(response.max_staleness(), 1);
  EXPECT_EQ(Value(), std::make_pair(0.0f, int64_t{2}));
  absl::Status future = DoPush(Push(0, 5, 1.0f));
  EXPECT_EQ(future.code(), absl::StatusCode::kOutOfRange);
}

TEST_F(ShardTest, StalenessBoundHoldsBackAWorkerTooFarAhead) {
  Start(ConsistencyMode::kAsync, 2, /*max_staleness=*/2);
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(DoPush(Push(0, step, 0.0f)).ok());
  }
  // Worker 0 has clock 3, worker 1 was never seen (clock 0): 3 > 0 + 2.
  EXPECT_FALSE(shard_->PullReady(Pull(0, 3, 0)));
  EXPECT_TRUE(shard_->PullReady(Pull(1, 0, 0)));
  ASSERT_TRUE(DoPush(Push(1, 3, 0.0f)).ok());  // worker 1 reaches clock 4
  EXPECT_TRUE(shard_->PullReady(Pull(0, 3, 0)));
}

TEST_F(ShardTest, RegisterIsIdempotentAndRejectsConflicts) {
  Start(ConsistencyMode::kAsync, 1);
  ASSERT_TRUE(DoPush(Push(0, 0, 1.0f)).ok());
  const uint64_t before = shard_->Checksum();
  RegisterRequest again;
  *again.add_tensors() = Spec("w", 1.0f);
  RegisterResponse response;
  ASSERT_TRUE(shard_->Register(again, &response).ok());
  EXPECT_EQ(response.partitions(0).version(), 1);
  EXPECT_EQ(shard_->Checksum(), before);

  RegisterRequest conflict;
  *conflict.add_tensors() = Spec("v", 0.0f);
  *conflict.add_tensors() = Spec("w", 2.0f);  // differs from the registered w
  absl::Status status = shard_->Register(conflict, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  PushRequest push_v = Push(0, 0, 1.0f);
  push_v.mutable_parts(0)->mutable_key()->set_tensor("v");
  EXPECT_EQ(DoPush(push_v).code(), absl::StatusCode::kNotFound);  // v not created
}

TEST_F(ShardTest, PullValidationNamesTheProblem) {
  Start(ConsistencyMode::kSync, 1);
  PullRequest unknown = Pull(0, 0, 0);
  unknown.mutable_parts(0)->set_tensor("nope");
  EXPECT_EQ(shard_->ValidatePull(unknown).code(), absl::StatusCode::kNotFound);
  PullRequest bad_partition = Pull(0, 0, 0);
  bad_partition.mutable_parts(0)->set_partition(3);
  EXPECT_EQ(shard_->ValidatePull(bad_partition).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(shard_->ValidatePull(Pull(7, 0, 0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard_->ValidatePull(Pull(0, 0, 5)).code(), absl::StatusCode::kOutOfRange);
  PullRequest empty;
  EXPECT_EQ(shard_->ValidatePull(empty).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::server
