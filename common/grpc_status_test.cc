#include "common/grpc_status.h"

#include "gtest/gtest.h"

namespace shardtrain::common {
namespace {

TEST(GrpcStatusTest, EveryCanonicalCodeRoundTrips) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), "why");
    const grpc::Status grpc_status = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(grpc_status.error_code()), code);
    if (code != 0) {
      EXPECT_EQ(grpc_status.error_message(), "why");
    }
    EXPECT_EQ(FromGrpcStatus(grpc_status), status);
  }
}

TEST(GrpcStatusTest, GrpcToAbslKeepsTheMessage) {
  const grpc::Status grpc_status(grpc::StatusCode::RESOURCE_EXHAUSTED, "too big");
  const absl::Status status = FromGrpcStatus(grpc_status);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "too big");
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

}  // namespace
}  // namespace shardtrain::common
