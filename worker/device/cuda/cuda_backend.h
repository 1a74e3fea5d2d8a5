// CudaBackend: the Backend of backend.h on one NVIDIA GPU.
//
// GEMMs go to cuBLAS (row-major C = A·B is issued as the column-major
// Cᵀ = Bᵀ·Aᵀ, so no data is transposed), the elementwise and reduction ops to
// the kernels in kernels.cu. Every GPU call is queued on the backend's own
// non-blocking stream, so calls are asynchronous: a method returns once its
// work is queued, except those documented in backend.h as blocking
// (CopyToHost, SoftmaxCrossEntropy, ArgmaxCorrect, Synchronize). Host memory
// passed to CopyFromHost may be reused as soon as the call returns.
// CopyToHostAsync runs on a second stream, so gradient copies to pinned host
// memory overlap the backward kernels queued after them.
//
// GEMM precision is an option: exact fp32 (the default, which matches the CPU
// backend to ~1e-6 relative), TF32 tensor cores, or BF16 tensor cores with fp32
// accumulation. Data stays fp32 in memory in every mode.
//
// Thread-compatible, like every Backend. The backend sets its device as the
// calling thread's current device at each call, so backends on different GPUs
// may be driven from one thread in turn. Host-only header.
//
// Example:
//   if (!CudaDeviceAvailable()) return MakeCpuBackend();
//   ASSIGN_OR_RETURN(std::unique_ptr<Backend> gpu, MakeCudaBackend({}));
#ifndef SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_BACKEND_H_
#define SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/device/backend.h"
#include "worker/device/cuda/cublas_handle.h"
#include "worker/device/cuda/cuda_stream.h"
#include "worker/device/cuda/device_memory.h"
#include "worker/device/device_options.h"

namespace shardtrain::worker {

struct CudaBackendOptions {
  // CUDA device ordinal the backend runs on.
  int device = 0;
  // Precision of Gemm. kFp32 keeps results within tolerance of the CPU backend.
  GemmPrecision gemm_precision = GemmPrecision::kFp32;
};

// Whether this process can see at least one CUDA device (a driver is loaded
// and cudaGetDeviceCount reports a device). Never fails; cheap after the
// first call.
bool CudaDeviceAvailable();

// FAILED_PRECONDITION when no device is present or options.device is not a
// valid ordinal; errors from creating the stream or cuBLAS handle otherwise.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    const CudaBackendOptions& options);

class CudaBackend final : public Backend {
 public:
  // As MakeCudaBackend, with the concrete type for callers that need the
  // streams below.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      const CudaBackendOptions& options);
  ~CudaBackend() override;

  absl::string_view Name() const override { return "cuda"; }
  const CudaBackendOptions& options() const { return options_; }

  // The stream all of this backend's work is queued on. Code that queues
  // its own work (e.g. NCCL) must order it against this stream with events.
  cudaStream_t stream() const { return stream_.get(); }

 protected:
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> DoAllocate(size_t n) override;
  absl::StatusOr<std::unique_ptr<DeviceLabelBuffer>> DoAllocateLabels(
      size_t n) override;
  absl::Status DoCopyFromHost(const float* src, size_t n, float* dst) override;
  absl::Status DoCopyLabelsFromHost(const int32_t* src, size_t n,
                                    int32_t* dst) override;
  absl::Status DoCopyToHost(const float* src, size_t n, float* dst) override;
  // Page-locked memory (cudaMallocHost), so copies into it are truly
  // asynchronous.
  absl::StatusOr<std::unique_ptr<HostBuffer>> DoAllocateHost(
      size_t n) override;
  // cudaHostRegister (cuda::HostRegistration).
  absl::StatusOr<std::unique_ptr<HostPin>> DoPinHost(float* host, size_t n) override;
  // Queued on copy_stream_ behind an event recorded on stream_, so the copy
  // waits for the work that wrote src and overlaps whatever is queued on
  // stream_ afterwards; the fence is an event recorded after the copy.
  absl::StatusOr<std::unique_ptr<Fence>> DoCopyToHostAsync(
      const float* src, size_t n, float* dst) override;
  absl::Status DoSynchronize() override;
  absl::Status DoGemm(Trans trans_a, Trans trans_b, int m, int n, int k,
                      float alpha, const float* a, const float* b, float beta,
                      float* c) override;
  absl::Status DoAxpby(int64_t n, float alpha, const float* x, float beta,
                       float* y) override;
  absl::Status DoAddBias(int rows, int cols, const float* bias,
                         float* x) override;
  absl::Status DoColumnSum(int rows, int cols, const float* x,
                           float* out) override;
  absl::Status DoReluForward(int64_t n, const float* x, float* y) override;
  absl::Status DoReluBackward(int64_t n, const float* y, const float* dy,
                              float* dx) override;
  // Labels are checked on the device: a bad label gives INVALID_ARGUMENT, but
  // dlogits may already have been written (backend.h allows this).
  absl::StatusOr<float> DoSoftmaxCrossEntropy(int rows, int cols,
                                              const float* logits,
                                              const int32_t* labels,
                                              float* dlogits) override;
  absl::StatusOr<int> DoArgmaxCorrect(int rows, int cols, const float* logits,
                                      const int32_t* labels) override;

 private:
  explicit CudaBackend(const CudaBackendOptions& options)
      : options_(options) {}

  // Makes options_.device current on the calling thread.
  absl::Status Activate() const;
  // Grows the per-row loss scratch buffers to at least `rows`.
  absl::Status ReserveRows(int rows);
  template <typename T>
  absl::StatusOr<std::unique_ptr<TypedDeviceBuffer<T>>> AllocateZeroed(
      size_t n);

  const CudaBackendOptions options_;
  // Declared before everything that queues work on them, so they are
  // destroyed last.
  cuda::CudaStream stream_;
  cuda::CudaStream copy_stream_;              // CopyToHostAsync's copies.
  cuda::CublasHandle blas_;                    // Bound to stream_.
  cuda::CudaEvent compute_mark_;               // Orders copy_stream_ after stream_.
  cuda::DeviceMemory<float> row_loss_;         // SoftmaxCrossEntropy per-row loss.
  cuda::PinnedBuffer<float> host_row_loss_;    // Same size as row_loss_.
  cuda::DeviceMemory<int32_t> counters_;       // [0] bad label, [1] correct.
  cuda::PinnedBuffer<int32_t> host_counters_;  // Same size as counters_.
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DEVICE_CUDA_CUDA_BACKEND_H_
