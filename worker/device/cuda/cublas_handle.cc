#include "worker/device/cuda/cublas_handle.h"

#include <glog/logging.h>

#include "worker/device/cuda/cuda_status.h"

namespace shardtrain::worker::cuda {

absl::StatusOr<CublasHandle> CublasHandle::Create(cudaStream_t stream) {
  CublasHandle handle;
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle.handle_));
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle.handle_, stream));
  CUBLAS_RETURN_IF_ERROR(
      cublasSetPointerMode(handle.handle_, CUBLAS_POINTER_MODE_HOST));
  return handle;
}

CublasHandle::~CublasHandle() {
  if (handle_ == nullptr) return;
  const cublasStatus_t code = cublasDestroy(handle_);
  LOG_IF(ERROR, code != CUBLAS_STATUS_SUCCESS)
      << "cublasDestroy failed: " << cublasGetStatusString(code);
}

}  // namespace shardtrain::worker::cuda
