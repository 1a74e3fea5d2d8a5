#include "worker/device/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace shardtrain::worker::cuda {
namespace {

absl::StatusCode CodeFor(cudaError_t code) {
  switch (code) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorHostMemoryAlreadyRegistered:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusCode CodeFor(cublasStatus_t code) {
  switch (code) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::StatusCode::kResourceExhausted;
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::StatusCode::kFailedPrecondition;
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status CudaStatus(cudaError_t code, const char* expr, const char* file,
                        int line) {
  if (code == cudaSuccess) return absl::OkStatus();
  // The runtime also keeps the error as the thread's "last error", which the
  // next kernel launch's cudaGetLastError() would report as its own. The
  // error is handled here, so clear it (sticky errors stay regardless).
  cudaGetLastError();
  return absl::Status(
      CodeFor(code),
      absl::StrCat(expr, " failed: ", cudaGetErrorName(code), " (",
                   cudaGetErrorString(code), ") at ", file, ":", line));
}

absl::Status CublasStatus(cublasStatus_t code, const char* expr,
                          const char* file, int line) {
  if (code == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::Status(
      CodeFor(code),
      absl::StrCat(expr, " failed: ", cublasGetStatusName(code), " (",
                   cublasGetStatusString(code), ") at ", file, ":", line));
}

}  // namespace shardtrain::worker::cuda
