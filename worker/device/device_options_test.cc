#include "worker/device/device_options.h"

#include <string>

#include "gtest/gtest.h"

namespace shardtrain::worker {
namespace {

TEST(DeviceOptionsTest, DeviceKindRoundTripsThroughItsName) {
  for (DeviceKind kind : {DeviceKind::kCpu, DeviceKind::kCuda}) {
    absl::StatusOr<DeviceKind> parsed = ParseDeviceKind(DeviceKindName(kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_EQ(DeviceKindName(DeviceKind::kCuda), "cuda");
}

TEST(DeviceOptionsTest, GemmPrecisionRoundTripsThroughItsName) {
  for (GemmPrecision precision :
       {GemmPrecision::kFp32, GemmPrecision::kTf32, GemmPrecision::kBf16}) {
    absl::StatusOr<GemmPrecision> parsed =
        ParseGemmPrecision(GemmPrecisionName(precision));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, precision);
  }
  EXPECT_EQ(GemmPrecisionName(GemmPrecision::kBf16), "bf16");
}

TEST(DeviceOptionsTest, UnknownValuesListTheChoices) {
  absl::StatusOr<DeviceKind> device = ParseDeviceKind("tpu");
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device.status().message(), "must be cpu or cuda, got tpu");
  absl::StatusOr<GemmPrecision> precision = ParseGemmPrecision("fp16");
  EXPECT_EQ(precision.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(precision.status().message(),
            "must be fp32, tf32 or bf16, got fp16");
  // Exact spellings only.
  EXPECT_FALSE(ParseDeviceKind("CPU").ok());
  EXPECT_FALSE(ParseDeviceKind("").ok());
  EXPECT_FALSE(ParseGemmPrecision("FP32").ok());
}

}  // namespace
}  // namespace shardtrain::worker
