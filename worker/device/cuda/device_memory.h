// DeviceMemory<T> and PinnedBuffer<T>: move-only owners of GPU memory
// (cudaMalloc) and page-locked host memory (cudaMallocHost); HostRegistration:
// the page lock of host memory someone else owns (cudaHostRegister).
//
// Memory is released in the destructor, which logs a failure and never
// throws. Copying is possible only through explicit cudaMemcpy* calls on a
// stream. DeviceMemory never uses managed memory, and refuses with
// RESOURCE_EXHAUSTED a request larger than the device's free memory rather
// than letting the driver fail (or, on some systems, oversubscribe).
//
// (worker::DeviceBuffer is the backend-neutral buffer of backend.h; these are
// the CUDA-specific owners a CudaBackend keeps inside its buffers.)
//
// Thread-compatible. Host-only header.
//
// Example:
//   ASSIGN_OR_RETURN(DeviceMemory<float> d, DeviceMemory<float>::Create(n));
//   ASSIGN_OR_RETURN(PinnedBuffer<float> h, PinnedBuffer<float>::Create(n));
//   CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h.data(), d.data(), d.bytes(),
//                                        cudaMemcpyDeviceToHost, stream));
#ifndef SHARDTRAIN_WORKER_DEVICE_CUDA_DEVICE_MEMORY_H_
#define SHARDTRAIN_WORKER_DEVICE_CUDA_DEVICE_MEMORY_H_

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"

namespace shardtrain::worker::cuda {

// Untyped owners; DeviceMemory<T> / PinnedBuffer<T> below are the typed API.
class RawDeviceMemory {
 public:
  // Allocates `bytes` (> 0) on the current device. RESOURCE_EXHAUSTED when
  // more than the device's free memory is asked for or cudaMalloc fails.
  static absl::StatusOr<RawDeviceMemory> Create(size_t bytes);

  RawDeviceMemory() = default;
  RawDeviceMemory(RawDeviceMemory&& other) noexcept { Swap(other); }
  RawDeviceMemory& operator=(RawDeviceMemory&& other) noexcept {
    RawDeviceMemory(std::move(other)).Swap(*this);
    return *this;
  }
  RawDeviceMemory(const RawDeviceMemory&) = delete;
  RawDeviceMemory& operator=(const RawDeviceMemory&) = delete;
  ~RawDeviceMemory();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void Swap(RawDeviceMemory& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
  }

  void* data_ = nullptr;  // Owned; from cudaMalloc, or null when empty.
  size_t bytes_ = 0;
};

class RawPinnedMemory {
 public:
  // Allocates `bytes` (> 0) of page-locked host memory.
  static absl::StatusOr<RawPinnedMemory> Create(size_t bytes);

  RawPinnedMemory() = default;
  RawPinnedMemory(RawPinnedMemory&& other) noexcept { Swap(other); }
  RawPinnedMemory& operator=(RawPinnedMemory&& other) noexcept {
    RawPinnedMemory(std::move(other)).Swap(*this);
    return *this;
  }
  RawPinnedMemory(const RawPinnedMemory&) = delete;
  RawPinnedMemory& operator=(const RawPinnedMemory&) = delete;
  ~RawPinnedMemory();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void Swap(RawPinnedMemory& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
  }

  void* data_ = nullptr;  // Owned; from cudaMallocHost, or null when empty.
  size_t bytes_ = 0;
};

// Page-locks `bytes` of host memory at `data`, which the caller owns and
// must keep until this goes (cudaHostRegister, portable: every device's
// copies see it locked); the destructor unlocks it (cudaHostUnregister).
class HostRegistration {
 public:
  // RESOURCE_EXHAUSTED when the memory cannot be locked, INVALID_ARGUMENT
  // when part of it is locked already.
  // REQUIRES: bytes > 0.
  static absl::StatusOr<HostRegistration> Create(void* data, size_t bytes);

  HostRegistration() = default;
  HostRegistration(HostRegistration&& other) noexcept { Swap(other); }
  HostRegistration& operator=(HostRegistration&& other) noexcept {
    HostRegistration(std::move(other)).Swap(*this);
    return *this;
  }
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void Swap(HostRegistration& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
  }

  void* data_ = nullptr;  // Locked here; null when empty. Not owned.
  size_t bytes_ = 0;
};

// Shared by DeviceMemory and PinnedBuffer: `count` elements of T in a Raw
// owner. A default-constructed or moved-from object is empty (data() null).
template <typename T, typename Raw>
class TypedMemory {
 public:
  // count may be 0: the result is empty. RESOURCE_EXHAUSTED if count * sizeof(T)
  // overflows or the allocation fails.
  static absl::StatusOr<TypedMemory> Create(size_t count);

  TypedMemory() = default;
  TypedMemory(TypedMemory&& other) noexcept
      : raw_(std::move(other.raw_)), size_(std::exchange(other.size_, 0)) {}
  TypedMemory& operator=(TypedMemory&& other) noexcept {
    raw_ = std::move(other.raw_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }

  T* data() const { return static_cast<T*>(raw_.data()); }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }

 private:
  TypedMemory(Raw raw, size_t size) : raw_(std::move(raw)), size_(size) {}

  Raw raw_;
  size_t size_ = 0;
};

// Defined in device_memory.cc so this header needs no CUDA headers.
absl::Status CheckedBytes(size_t count, size_t element_size, size_t* bytes);

template <typename T, typename Raw>
absl::StatusOr<TypedMemory<T, Raw>> TypedMemory<T, Raw>::Create(size_t count) {
  if (count == 0) return TypedMemory();
  size_t bytes = 0;
  if (absl::Status s = CheckedBytes(count, sizeof(T), &bytes); !s.ok()) {
    return s;
  }
  absl::StatusOr<Raw> raw = Raw::Create(bytes);
  if (!raw.ok()) return raw.status();
  return TypedMemory(*std::move(raw), count);
}

template <typename T>
using DeviceMemory = TypedMemory<T, RawDeviceMemory>;
template <typename T>
using PinnedBuffer = TypedMemory<T, RawPinnedMemory>;

}  // namespace shardtrain::worker::cuda

#endif  // SHARDTRAIN_WORKER_DEVICE_CUDA_DEVICE_MEMORY_H_
