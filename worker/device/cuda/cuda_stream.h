// CudaStream and CudaEvent: move-only owners of a cudaStream_t and a
// cudaEvent_t. Destructors log failures and never throw.
//
// Thread-compatible (the CUDA objects they hold are themselves thread-safe,
// but an owner must not be moved or destroyed while another thread uses it).
// Host-only header.
//
// Example:
//   ASSIGN_OR_RETURN(CudaStream compute, CudaStream::Create());
//   ASSIGN_OR_RETURN(CudaStream copy, CudaStream::Create());
//   ASSIGN_OR_RETURN(CudaEvent ready, CudaEvent::Create());
//   RETURN_IF_ERROR(ready.Record(compute.get()));
//   RETURN_IF_ERROR(copy.Wait(ready));  // copy now runs after compute's work
#ifndef SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_STREAM_H_
#define SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_STREAM_H_

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardtrain::worker::cuda {

class CudaEvent;

class CudaStream {
 public:
  // A non-blocking stream on the current device: it does not synchronise with
  // the legacy default stream.
  static absl::StatusOr<CudaStream> Create();

  CudaStream() = default;  // Empty: get() is null (the legacy default stream).
  CudaStream(CudaStream&& other) noexcept
      : stream_(std::exchange(other.stream_, nullptr)) {}
  CudaStream& operator=(CudaStream&& other) noexcept {
    CudaStream(std::move(other)).Swap(*this);
    return *this;
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();

  cudaStream_t get() const { return stream_; }

  // Blocks until all work queued on the stream has finished.
  absl::Status Synchronize() const;
  // Makes work queued on this stream after the call wait for `event`.
  absl::Status Wait(const CudaEvent& event) const;

 private:
  void Swap(CudaStream& other) noexcept { std::swap(stream_, other.stream_); }

  cudaStream_t stream_ = nullptr;  // Owned, unless null.
};

class CudaEvent {
 public:
  // timing: whether ElapsedMs works; events without timing are cheaper to
  // record and wait on.
  static absl::StatusOr<CudaEvent> Create(bool timing = false);
  // Without timing, and a host thread in Synchronize() sleeps until the
  // event passes instead of spinning (cudaEventBlockingSync): for events a
  // thread that has other work to share the CPU with waits on.
  static absl::StatusOr<CudaEvent> CreateBlocking();

  CudaEvent() = default;  // Empty: not usable until assigned from Create().
  CudaEvent(CudaEvent&& other) noexcept
      : event_(std::exchange(other.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& other) noexcept {
    CudaEvent(std::move(other)).Swap(*this);
    return *this;
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();

  cudaEvent_t get() const { return event_; }

  // Captures the work queued on `stream` so far.
  absl::Status Record(cudaStream_t stream) const;
  // Blocks until the recorded work has finished.
  absl::Status Synchronize() const;
  // Milliseconds between `start` and this event; both created with timing and
  // recorded, and this one finished.
  absl::StatusOr<float> ElapsedMsSince(const CudaEvent& start) const;

 private:
  void Swap(CudaEvent& other) noexcept { std::swap(event_, other.event_); }

  cudaEvent_t event_ = nullptr;  // Owned, unless null.
};

}  // namespace shardtrain::worker::cuda

#endif  // SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_STREAM_H_
