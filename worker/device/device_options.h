// DeviceKind and GemmPrecision: which device a model runs on and how its
// GEMMs multiply, as typed options, with the parsers and names that binaries
// use for their flags.
//
// The enums are plain values; the functions are thread-safe. Parse errors
// are INVALID_ARGUMENT with a message that lists the choices and reads well
// after a flag name ("--device must be cpu or cuda, got tpu").
//
// Example:
//   ASSIGN_OR_RETURN(DeviceKind device, ParseDeviceKind("cuda"));
//   ASSIGN_OR_RETURN(GemmPrecision precision, ParseGemmPrecision("tf32"));
//   DeviceKindName(device);         // "cuda"
//   GemmPrecisionName(precision);   // "tf32"
#ifndef SHARDTRAIN_WORKER_DEVICE_DEVICE_OPTIONS_H_
#define SHARDTRAIN_WORKER_DEVICE_DEVICE_OPTIONS_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardtrain::worker {

// The kind of device a Backend computes on.
enum class DeviceKind {
  kCpu,   // The host, with OpenBLAS (device/cpu/).
  kCuda,  // An NVIDIA GPU, with cuBLAS (device/cuda/; CUDA builds only).
};

// How GEMMs multiply; accumulation is fp32 in every mode. Only the cuda
// device offers more than kFp32.
enum class GemmPrecision {
  kFp32,  // IEEE fp32 multiplies (CUBLAS_COMPUTE_32F).
  kTf32,  // TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32), ~1e-3 relative.
  kBf16,  // BF16 tensor cores (CUBLAS_COMPUTE_32F_FAST_16BF), ~1e-2 relative.
};

// "cpu" or "cuda".
absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view text);
absl::string_view DeviceKindName(DeviceKind kind);

// "fp32", "tf32" or "bf16".
absl::StatusOr<GemmPrecision> ParseGemmPrecision(absl::string_view text);
absl::string_view GemmPrecisionName(GemmPrecision precision);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DEVICE_DEVICE_OPTIONS_H_
