// CUDA_RETURN_IF_ERROR, CUBLAS_RETURN_IF_ERROR: turn CUDA runtime and cuBLAS
// result codes into absl::Status (NCCL_RETURN_IF_ERROR lives in nccl_comm.h so
// this header does not need NCCL).
//
// The message names the failed expression, the library's own error string and
// the source location. The canonical code is the most specific one we can
// tell: RESOURCE_EXHAUSTED for out-of-memory, FAILED_PRECONDITION for "no
// device / no driver", INVALID_ARGUMENT for bad values, INTERNAL otherwise.
//
// Host-only: includes no kernel code and builds with a plain C++ compiler.
//
// Example:
//   absl::Status Upload(const float* host, float* dev, size_t n, cudaStream_t s) {
//     CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, host, n * sizeof(float),
//                                          cudaMemcpyHostToDevice, s));
//     return absl::OkStatus();
//   }
#ifndef SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_STATUS_H_
#define SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace shardtrain::worker::cuda {

// Ok for cudaSuccess, otherwise an error whose message holds `expr`,
// cudaGetErrorName/String and file:line. Clears the thread's last-error
// state, so a handled failure (say, an allocation) does not resurface as
// the error of a later kernel launch.
absl::Status CudaStatus(cudaError_t code, const char* expr, const char* file,
                        int line);
// Ok for CUBLAS_STATUS_SUCCESS, otherwise as above with cuBLAS's strings.
absl::Status CublasStatus(cublasStatus_t code, const char* expr,
                          const char* file, int line);

}  // namespace shardtrain::worker::cuda

#define CUDA_RETURN_IF_ERROR(expr)                                     \
  do {                                                                 \
    const cudaError_t shardtrain_cuda_code_ = (expr);                  \
    if (shardtrain_cuda_code_ != cudaSuccess) {                        \
      return ::shardtrain::worker::cuda::CudaStatus(                   \
          shardtrain_cuda_code_, #expr, __FILE__, __LINE__);           \
    }                                                                  \
  } while (0)

#define CUBLAS_RETURN_IF_ERROR(expr)                                   \
  do {                                                                 \
    const cublasStatus_t shardtrain_cublas_code_ = (expr);             \
    if (shardtrain_cublas_code_ != CUBLAS_STATUS_SUCCESS) {            \
      return ::shardtrain::worker::cuda::CublasStatus(                 \
          shardtrain_cublas_code_, #expr, __FILE__, __LINE__);         \
    }                                                                  \
  } while (0)

#endif  // SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_STATUS_H_
