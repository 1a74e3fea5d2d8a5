#include "worker/device/cuda/cuda_stream.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "worker/device/cuda/cuda_status.h"

namespace shardtrain::worker::cuda {

absl::StatusOr<CudaStream> CudaStream::Create() {
  CudaStream stream;
  CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream.stream_, cudaStreamNonBlocking));
  return stream;
}

CudaStream::~CudaStream() {
  if (stream_ == nullptr) return;
  // cudaStreamDestroy returns at once; queued work still completes.
  const cudaError_t code = cudaStreamDestroy(stream_);
  LOG_IF(ERROR, code != cudaSuccess)
      << "cudaStreamDestroy failed: " << cudaGetErrorString(code);
}

absl::Status CudaStream::Synchronize() const {
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaStream::Wait(const CudaEvent& event) const {
  if (event.get() == nullptr) {
    return absl::FailedPreconditionError("CudaStream::Wait: empty event");
  }
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, event.get(), 0));
  return absl::OkStatus();
}

absl::StatusOr<CudaEvent> CudaEvent::Create(bool timing) {
  CudaEvent event;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(
      &event.event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  return event;
}

absl::StatusOr<CudaEvent> CudaEvent::CreateBlocking() {
  CudaEvent event;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(
      &event.event_, cudaEventDisableTiming | cudaEventBlockingSync));
  return event;
}

CudaEvent::~CudaEvent() {
  if (event_ == nullptr) return;
  const cudaError_t code = cudaEventDestroy(event_);
  LOG_IF(ERROR, code != cudaSuccess)
      << "cudaEventDestroy failed: " << cudaGetErrorString(code);
}

absl::Status CudaEvent::Record(cudaStream_t stream) const {
  if (event_ == nullptr) {
    return absl::FailedPreconditionError("CudaEvent::Record: empty event");
  }
  CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  return absl::OkStatus();
}

absl::Status CudaEvent::Synchronize() const {
  if (event_ == nullptr) {
    return absl::FailedPreconditionError("CudaEvent::Synchronize: empty event");
  }
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return absl::OkStatus();
}

absl::StatusOr<float> CudaEvent::ElapsedMsSince(const CudaEvent& start) const {
  if (event_ == nullptr || start.event_ == nullptr) {
    return absl::FailedPreconditionError("CudaEvent::ElapsedMsSince: empty event");
  }
  float ms = 0.0f;
  CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

}  // namespace shardtrain::worker::cuda
