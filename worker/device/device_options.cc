#include "worker/device/device_options.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::worker {

absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view text) {
  if (text == "cpu") return DeviceKind::kCpu;
  if (text == "cuda") return DeviceKind::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("must be cpu or cuda, got ", text));
}

absl::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

absl::StatusOr<GemmPrecision> ParseGemmPrecision(absl::string_view text) {
  if (text == "fp32") return GemmPrecision::kFp32;
  if (text == "tf32") return GemmPrecision::kTf32;
  if (text == "bf16") return GemmPrecision::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("must be fp32, tf32 or bf16, got ", text));
}

absl::string_view GemmPrecisionName(GemmPrecision precision) {
  switch (precision) {
    case GemmPrecision::kFp32:
      return "fp32";
    case GemmPrecision::kTf32:
      return "tf32";
    case GemmPrecision::kBf16:
      return "bf16";
  }
  return "unknown";
}

}  // namespace shardtrain::worker
