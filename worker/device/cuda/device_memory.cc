#include "worker/device/cuda/device_memory.h"

#include <cuda_runtime_api.h>
#include <glog/logging.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/device/cuda/cuda_status.h"

namespace shardtrain::worker::cuda {

absl::Status CheckedBytes(size_t count, size_t element_size, size_t* bytes) {
  if (element_size != 0 && count > SIZE_MAX / element_size) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cuda: ", count, " elements of ", element_size, " bytes overflow"));
  }
  *bytes = count * element_size;
  return absl::OkStatus();
}

absl::StatusOr<RawDeviceMemory> RawDeviceMemory::Create(size_t bytes) {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (bytes > free_bytes) {
    int device = -1;
    cudaGetDevice(&device);
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda: cannot allocate ", bytes, " bytes on device ",
                     device, ": only ", free_bytes, " of ", total_bytes,
                     " bytes are free"));
  }
  RawDeviceMemory memory;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&memory.data_, bytes));
  memory.bytes_ = bytes;
  return memory;
}

RawDeviceMemory::~RawDeviceMemory() {
  if (data_ == nullptr) return;
  // cudaFree waits for work using the memory, so no stream sync is needed.
  const cudaError_t code = cudaFree(data_);
  LOG_IF(ERROR, code != cudaSuccess)
      << "cudaFree of " << bytes_ << " bytes failed: " << cudaGetErrorString(code);
}

absl::StatusOr<RawPinnedMemory> RawPinnedMemory::Create(size_t bytes) {
  RawPinnedMemory memory;
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&memory.data_, bytes));
  memory.bytes_ = bytes;
  return memory;
}

RawPinnedMemory::~RawPinnedMemory() {
  if (data_ == nullptr) return;
  const cudaError_t code = cudaFreeHost(data_);
  LOG_IF(ERROR, code != cudaSuccess) << "cudaFreeHost of " << bytes_
                                     << " bytes failed: "
                                     << cudaGetErrorString(code);
}

absl::StatusOr<HostRegistration> HostRegistration::Create(void* data, size_t bytes) {
  CUDA_RETURN_IF_ERROR(cudaHostRegister(data, bytes, cudaHostRegisterPortable));
  HostRegistration registration;
  registration.data_ = data;
  registration.bytes_ = bytes;
  return registration;
}

HostRegistration::~HostRegistration() {
  if (data_ == nullptr) return;
  const cudaError_t code = cudaHostUnregister(data_);
  LOG_IF(ERROR, code != cudaSuccess) << "cudaHostUnregister of " << bytes_
                                     << " bytes failed: " << cudaGetErrorString(code);
}

}  // namespace shardtrain::worker::cuda
