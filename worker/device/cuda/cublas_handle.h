// CublasHandle: move-only owner of a cublasHandle_t bound to one stream.
// The destructor logs a failure and never throws.
//
// Thread-compatible: cuBLAS handles must not be used from two threads at once.
// Host-only header.
//
// Example:
//   ASSIGN_OR_RETURN(CublasHandle blas, CublasHandle::Create(stream.get()));
//   CUBLAS_RETURN_IF_ERROR(cublasSgemm(blas.get(), ...));
#ifndef SHARDTRAIN_WORKER_DEVICE_CUDA_CUBLAS_HANDLE_H_
#define SHARDTRAIN_WORKER_DEVICE_CUDA_CUBLAS_HANDLE_H_

#include <cublas_v2.h>

#include <utility>

#include "absl/status/statusor.h"

namespace shardtrain::worker::cuda {

class CublasHandle {
 public:
  // A handle on the current device whose calls go to `stream`, with host
  // pointer mode (alpha/beta read from host memory).
  static absl::StatusOr<CublasHandle> Create(cudaStream_t stream);

  CublasHandle() = default;  // Empty: get() is null.
  CublasHandle(CublasHandle&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& other) noexcept {
    CublasHandle(std::move(other)).Swap(*this);
    return *this;
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  ~CublasHandle();

  cublasHandle_t get() const { return handle_; }

 private:
  void Swap(CublasHandle& other) noexcept { std::swap(handle_, other.handle_); }

  cublasHandle_t handle_ = nullptr;  // Owned, unless null.
};

}  // namespace shardtrain::worker::cuda

#endif  // SHARDTRAIN_WORKER_DEVICE_CUDA_CUBLAS_HANDLE_H_
