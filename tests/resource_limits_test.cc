// ResourceLimits: hostile requests to a real ps-server — huge tensor shapes
// in a few bytes, one partition named thousands of times, a million tiny
// tensors — are refused quickly, with the right code and a message naming
// the flag, before the shard allocates anything; and Status stays small.
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/metrics_scrape.h"
#include "testing/shard_process.h"

namespace shardtrain {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMaxGrowthBytes = int64_t{64} << 20;
constexpr absl::Duration kQuick = absl::Seconds(2);

TensorSpec Spec(const std::string& name, std::vector<int64_t> shape) {
  TensorSpec spec;
  spec.set_name(name);
  for (int64_t dim : shape) spec.add_shape(dim);
  spec.set_dtype(DTYPE_F32);
  return spec;
}

class ResourceLimits : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(shard_
                    .Start(SHARDTRAIN_BIN_DIR,
                           {"--num_workers=2", "--max_stored_elements=10000000",
                            "--max_tensors=20000", "--max_tensors_per_request=10000",
                            "--max_parts_per_request=65536", "--max_partition_metrics=64",
                            "--optimizer=adam"})
                    .ok());
    RegisterRequest request;
    *request.add_tensors() = Spec("w", {1000});
    RegisterResponse response;
    ASSERT_TRUE(Call(&ParameterServer::Stub::Register, request, &response).ok());
    baseline_rss_ = shard_.Rss();
    ASSERT_GT(baseline_rss_, 0);
  }

  template <typename Method, typename Request, typename Response>
  grpc::Status Call(Method method, const Request& request, Response* response) {
    return shard_.Call(method, request, response, absl::Seconds(30));
  }

  // Sends `request`, expects `code` with `message` within kQuick, and no
  // more than kMaxGrowthBytes of new resident memory.
  template <typename Method, typename Request, typename Response>
  void ExpectRefused(Method method, const Request& request, Response* response,
                     grpc::StatusCode code, const std::string& message) {
    const absl::Time start = absl::Now();
    const grpc::Status status = Call(method, request, response);
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(message));
    EXPECT_LT(took, kQuick) << "refusal took " << took;
    ExpectSmallGrowth();
  }

  void ExpectSmallGrowth() {
    // The request's memory is released when the call is done, just after
    // the client has its answer.
    int64_t growth = shard_.Rss() - baseline_rss_;
    for (int i = 0; i < 20 && growth >= kMaxGrowthBytes; ++i) {
      absl::SleepFor(absl::Milliseconds(50));
      growth = shard_.Rss() - baseline_rss_;
    }
    EXPECT_LT(growth, kMaxGrowthBytes) << "resident memory grew by " << growth
                                       << " bytes\n" << shard_.log();
  }

  void ExpectStatusStaysSmall() {
    StatusResponse status;
    ASSERT_TRUE(Call(&ParameterServer::Stub::Status, StatusRequest(), &status).ok());
    EXPECT_LT(status.ByteSizeLong(), size_t{4} << 20);
    EXPECT_GE(status.num_tensors(), 1);
  }

  testutil::ShardProcess shard_;
  int64_t baseline_rss_ = 0;
};

TEST_F(ResourceLimits, HugeShapesInATinyRegister) {
  RegisterResponse response;
  for (int64_t side : {16384, 65536}) {
    RegisterRequest request;
    *request.add_tensors() = Spec("m", {side, side});
    EXPECT_LT(request.ByteSizeLong(), 32u);
    ExpectRefused(&ParameterServer::Stub::Register, request, &response,
                  grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_stored_elements");
  }
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {0}, {-3}, {int64_t{1} << 62, 8}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}}) {
    RegisterRequest request;
    *request.add_tensors() = Spec("m", shape);
    ExpectRefused(&ParameterServer::Stub::Register, request, &response,
                  grpc::StatusCode::INVALID_ARGUMENT, "tensor m");
  }
  ExpectStatusStaysSmall();
}

TEST_F(ResourceLimits, OnePartitionPulledThousandsOfTimes) {
  PullRequest pull;
  for (int i = 0; i < 8000; ++i) pull.add_parts()->set_tensor("w");
  PullResponse response;
  ExpectRefused(&ParameterServer::Stub::Pull, pull, &response,
                grpc::StatusCode::INVALID_ARGUMENT, "appears twice in one pull");
  for (int i = 8000; i < 70000; ++i) pull.add_parts()->set_tensor("w");
  ExpectRefused(&ParameterServer::Stub::Pull, pull, &response,
                grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_parts_per_request");
  ExpectStatusStaysSmall();
}

TEST_F(ResourceLimits, TwentyThousandSparsePartsForOnePartition) {
  PushRequest push;
  GradientPart part;
  part.mutable_key()->set_tensor("w");
  part.mutable_grad()->set_dtype(DTYPE_F32);
  part.mutable_grad()->set_encoding(ENCODING_SPARSE);
  for (int i = 0; i < 20000; ++i) *push.add_parts() = part;
  PushResponse response;
  ExpectRefused(&ParameterServer::Stub::Push, push, &response,
                grpc::StatusCode::INVALID_ARGUMENT, "appears twice in one push");
  ExpectStatusStaysSmall();
}

TEST_F(ResourceLimits, AMillionTinyTensorsInOneRequest) {
  RegisterRequest request;
  for (int i = 0; i < 1000000; ++i) *request.add_tensors() = Spec(absl::StrCat("t", i), {1});
  RegisterResponse response;
  ExpectRefused(&ParameterServer::Stub::Register, request, &response,
                grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_tensors_per_request");
  ExpectStatusStaysSmall();
}

TEST_F(ResourceLimits, AMillionTinyTensorsInBatches) {
  int accepted = 0;
  grpc::Status refused;
  for (int batch = 0; batch < 100 && refused.ok(); ++batch) {
    RegisterRequest request;
    for (int i = 0; i < 10000; ++i) {
      *request.add_tensors() = Spec(absl::StrCat("t", batch * 10000 + i), {1});
    }
    RegisterResponse response;
    const absl::Time start = absl::Now();
    refused = Call(&ParameterServer::Stub::Register, request, &response);
    EXPECT_LT(absl::Now() - start, kQuick);
    if (refused.ok()) ++accepted;
  }
  // "w" and one batch make 10001 tensors; a second batch would make 20001,
  // over --max_tensors=20000.
  EXPECT_EQ(accepted, 1);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_tensors)"));
  ExpectSmallGrowth();
  StatusResponse status;
  ASSERT_TRUE(Call(&ParameterServer::Stub::Status, StatusRequest(), &status).ok());
  EXPECT_LT(status.ByteSizeLong(), size_t{4} << 20);
  EXPECT_EQ(status.num_tensors(), 10001);
  EXPECT_EQ(status.partitions_size(), 100);
  EXPECT_TRUE(status.partitions_truncated());
  // /metrics stays bounded too: 64 partition series, not 10001.
  absl::StatusOr<std::string> metrics = testutil::HttpGet(shard_.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_LT(metrics->size(), size_t{1} << 20);
  EXPECT_EQ(testutil::SumByName(*metrics)["shardtrain_requests_refused_total"], 1);
}

}  // namespace
}  // namespace shardtrain
