#include "worker/device/cuda/cuda_backend.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "worker/device/cuda/cuda_status.h"
#include "worker/device/cuda/internal/kernels.h"

namespace shardtrain::worker {
namespace {

// A Backend buffer: backend-neutral interface over a cuda::DeviceMemory.
template <typename T>
class CudaBuffer final : public TypedDeviceBuffer<T> {
 public:
  CudaBuffer(cuda::DeviceMemory<T> memory, size_t size)
      : memory_(std::move(memory)), size_(size) {}

  T* data() override { return memory_.data(); }
  const T* data() const override { return memory_.data(); }
  size_t size() const override { return size_; }

 private:
  cuda::DeviceMemory<T> memory_;  // At least one element, so data() is valid.
  const size_t size_;
};

// Page-locked host memory behind the backend-neutral HostBuffer.
class PinnedHostBuffer final : public HostBuffer {
 public:
  PinnedHostBuffer(cuda::PinnedBuffer<float> memory, size_t size)
      : memory_(std::move(memory)), size_(size) {}

  float* data() override { return memory_.data(); }
  const float* data() const override { return memory_.data(); }
  size_t size() const override { return size_; }

 private:
  cuda::PinnedBuffer<float> memory_;  // At least one element.
  const size_t size_;
};

// Passes when the work captured by an event has finished. Any thread may
// wait: it first makes the event's device current, so the runtime does not
// set up a context on device 0 for a thread that never chose one. The first
// answer is kept, so a later, unrelated failure cannot change it.
// Host memory of the caller's, page-locked while this lives.
class RegisteredHostPin final : public HostPin {
 public:
  explicit RegisteredHostPin(cuda::HostRegistration registration)
      : registration_(std::move(registration)) {}

 private:
  cuda::HostRegistration registration_;
};

class EventFence final : public Fence {
 public:
  EventFence(cuda::CudaEvent event, int device) : event_(std::move(event)), device_(device) {}
  absl::Status Wait() override {
    absl::MutexLock lock(&mu_);
    if (!waited_) {
      const cudaError_t selected = cudaSetDevice(device_);
      status_ = selected == cudaSuccess
                    ? event_.Synchronize()
                    : cuda::CudaStatus(selected, "cudaSetDevice", __FILE__, __LINE__);
      waited_ = true;
    }
    return status_;
  }

 private:
  const cuda::CudaEvent event_;
  const int device_;
  absl::Mutex mu_;
  bool waited_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

cublasComputeType_t ComputeType(GemmPrecision precision) {
  switch (precision) {
    case GemmPrecision::kTf32:
      return CUBLAS_COMPUTE_32F_FAST_TF32;
    case GemmPrecision::kBf16:
      return CUBLAS_COMPUTE_32F_FAST_16BF;
    case GemmPrecision::kFp32:
      break;
  }
  return CUBLAS_COMPUTE_32F;
}

}  // namespace

bool CudaDeviceAvailable() {
  // Cached: cudaGetDeviceCount initialises the runtime, which is slow and
  // its answer does not change within a process.
  static const bool available = [] {
    int count = 0;
    const cudaError_t code = cudaGetDeviceCount(&count);
    if (code != cudaSuccess) {
      VLOG(1) << "no CUDA device: " << cudaGetErrorString(code);
      // Not a sticky error: clear it so later cudaGetLastError calls do not
      // report it.
      cudaGetLastError();
      return false;
    }
    return count > 0;
  }();
  return available;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    const CudaBackendOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                   CudaBackend::Create(options));
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options) {
  if (!CudaDeviceAvailable()) {
    return absl::FailedPreconditionError(
        "cuda backend: no CUDA device is present (or no driver is loaded)");
  }
  int count = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda backend: device ", options.device,
                     " does not exist; this machine has ", count));
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(options));
  RETURN_IF_ERROR(backend->Activate());
  ASSIGN_OR_RETURN(backend->stream_, cuda::CudaStream::Create());
  ASSIGN_OR_RETURN(backend->copy_stream_, cuda::CudaStream::Create());
  ASSIGN_OR_RETURN(backend->blas_,
                   cuda::CublasHandle::Create(backend->stream_.get()));
  ASSIGN_OR_RETURN(backend->compute_mark_, cuda::CudaEvent::Create());
  ASSIGN_OR_RETURN(backend->counters_, cuda::DeviceMemory<int32_t>::Create(2));
  ASSIGN_OR_RETURN(backend->host_counters_,
                   cuda::PinnedBuffer<int32_t>::Create(2));
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device));
  LOG(INFO) << "cuda backend on device " << options.device << " (" << prop.name
            << ", sm_" << prop.major << prop.minor << ")";
  return backend;
}

CudaBackend::~CudaBackend() {
  // Let queued work finish before the members it uses are released.
  if (stream_.get() != nullptr) {
    cudaSetDevice(options_.device);
    const cudaError_t a = cudaStreamSynchronize(stream_.get());
    const cudaError_t b = cudaStreamSynchronize(copy_stream_.get());
    LOG_IF(ERROR, a != cudaSuccess || b != cudaSuccess)
        << "cuda backend: work failed before shutdown: "
        << cudaGetErrorString(a != cudaSuccess ? a : b);
  }
}

absl::Status CudaBackend::Activate() const {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device));
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<std::unique_ptr<TypedDeviceBuffer<T>>>
CudaBackend::AllocateZeroed(size_t n) {
  RETURN_IF_ERROR(Activate());
  ASSIGN_OR_RETURN(cuda::DeviceMemory<T> memory,
                   cuda::DeviceMemory<T>::Create(std::max<size_t>(n, 1)));
  CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(memory.data(), 0, memory.bytes(), stream_.get()));
  return std::unique_ptr<TypedDeviceBuffer<T>>(
      new CudaBuffer<T>(std::move(memory), n));
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CudaBackend::DoAllocate(
    size_t n) {
  return AllocateZeroed<float>(n);
}

absl::StatusOr<std::unique_ptr<DeviceLabelBuffer>>
CudaBackend::DoAllocateLabels(size_t n) {
  return AllocateZeroed<int32_t>(n);
}

absl::Status CudaBackend::DoCopyFromHost(const float* src, size_t n,
                                         float* dst) {
  RETURN_IF_ERROR(Activate());
  // From pageable memory the runtime stages the data before returning, so
  // the caller may reuse src at once. From page-locked memory the copy is
  // truly asynchronous: wait for it to keep that promise.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n * sizeof(float),
                                       cudaMemcpyHostToDevice, stream_.get()));
  cudaPointerAttributes attributes{};
  CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attributes, src));
  if (attributes.type == cudaMemoryTypeHost) return stream_.Synchronize();
  return absl::OkStatus();
}

absl::Status CudaBackend::DoCopyLabelsFromHost(const int32_t* src, size_t n,
                                               int32_t* dst) {
  RETURN_IF_ERROR(Activate());
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoCopyToHost(const float* src, size_t n,
                                       float* dst) {
  RETURN_IF_ERROR(Activate());
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_.get()));
  return stream_.Synchronize();
}

absl::StatusOr<std::unique_ptr<HostBuffer>> CudaBackend::DoAllocateHost(
    size_t n) {
  RETURN_IF_ERROR(Activate());
  ASSIGN_OR_RETURN(cuda::PinnedBuffer<float> memory,
                   cuda::PinnedBuffer<float>::Create(std::max<size_t>(n, 1)));
  std::memset(memory.data(), 0, memory.bytes());
  return std::unique_ptr<HostBuffer>(new PinnedHostBuffer(std::move(memory), n));
}

absl::StatusOr<std::unique_ptr<HostPin>> CudaBackend::DoPinHost(float* host, size_t n) {
  RETURN_IF_ERROR(Activate());
  size_t bytes = 0;
  RETURN_IF_ERROR(cuda::CheckedBytes(n, sizeof(float), &bytes));
  ASSIGN_OR_RETURN(cuda::HostRegistration registration,
                   cuda::HostRegistration::Create(host, bytes));
  return std::unique_ptr<HostPin>(new RegisteredHostPin(std::move(registration)));
}

absl::StatusOr<std::unique_ptr<Fence>> CudaBackend::DoCopyToHostAsync(
    const float* src, size_t n, float* dst) {
  RETURN_IF_ERROR(Activate());
  // Another thread waits on it: let that thread sleep rather than spin.
  ASSIGN_OR_RETURN(cuda::CudaEvent copied, cuda::CudaEvent::CreateBlocking());
  RETURN_IF_ERROR(compute_mark_.Record(stream_.get()));
  RETURN_IF_ERROR(copy_stream_.Wait(compute_mark_));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n * sizeof(float),
                                       cudaMemcpyDeviceToHost,
                                       copy_stream_.get()));
  RETURN_IF_ERROR(copied.Record(copy_stream_.get()));
  return std::unique_ptr<Fence>(new EventFence(std::move(copied), options_.device));
}

absl::Status CudaBackend::DoSynchronize() {
  RETURN_IF_ERROR(Activate());
  RETURN_IF_ERROR(stream_.Synchronize());
  return copy_stream_.Synchronize();
}

absl::Status CudaBackend::DoGemm(Trans trans_a, Trans trans_b, int m, int n,
                                 int k, float alpha, const float* a,
                                 const float* b, float beta, float* c) {
  RETURN_IF_ERROR(Activate());
  if (k == 0) {
    // op(A)·op(B) is empty, and cuBLAS rejects the zero leading dimension of
    // a [m,0] operand: the result is just the scaled C.
    CUDA_RETURN_IF_ERROR(cuda::internal::LaunchScale(
        int64_t{m} * n, beta, c, stream_.get()));
    return absl::OkStatus();
  }
  const bool ta = trans_a == Trans::kYes;
  const bool tb = trans_b == Trans::kYes;
  // A row-major [r, c] matrix is a column-major [c, r] one with ld = c, so
  // row-major C[m,n] = op(A)·op(B) is column-major Cᵀ[n,m] = op(B)ᵀ·op(A)ᵀ:
  // swap the operands and keep each one's transpose flag.
  const int lda = ta ? m : k;
  const int ldb = tb ? k : n;
  CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      blas_.get(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
      n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta, c,
      CUDA_R_32F, n, ComputeType(options_.gemm_precision),
      CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoAxpby(int64_t n, float alpha, const float* x,
                                  float beta, float* y) {
  RETURN_IF_ERROR(Activate());
  CUDA_RETURN_IF_ERROR(
      cuda::internal::LaunchAxpby(n, alpha, x, beta, y, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoAddBias(int rows, int cols, const float* bias,
                                    float* x) {
  RETURN_IF_ERROR(Activate());
  CUDA_RETURN_IF_ERROR(
      cuda::internal::LaunchAddBias(rows, cols, bias, x, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoColumnSum(int rows, int cols, const float* x,
                                      float* out) {
  RETURN_IF_ERROR(Activate());
  CUDA_RETURN_IF_ERROR(
      cuda::internal::LaunchColumnSum(rows, cols, x, out, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoReluForward(int64_t n, const float* x, float* y) {
  RETURN_IF_ERROR(Activate());
  CUDA_RETURN_IF_ERROR(
      cuda::internal::LaunchReluForward(n, x, y, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::DoReluBackward(int64_t n, const float* y,
                                         const float* dy, float* dx) {
  RETURN_IF_ERROR(Activate());
  CUDA_RETURN_IF_ERROR(
      cuda::internal::LaunchReluBackward(n, y, dy, dx, stream_.get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::ReserveRows(int rows) {
  if (row_loss_.size() >= static_cast<size_t>(rows)) return absl::OkStatus();
  // Grow geometrically so a slowly rising batch does not reallocate each time.
  const size_t size = std::max<size_t>(rows, 2 * row_loss_.size());
  // The old buffers may still be read by queued work.
  RETURN_IF_ERROR(stream_.Synchronize());
  // Both or neither: the two must stay the same size.
  ASSIGN_OR_RETURN(cuda::DeviceMemory<float> device,
                   cuda::DeviceMemory<float>::Create(size));
  ASSIGN_OR_RETURN(cuda::PinnedBuffer<float> host,
                   cuda::PinnedBuffer<float>::Create(size));
  row_loss_ = std::move(device);
  host_row_loss_ = std::move(host);
  return absl::OkStatus();
}

absl::StatusOr<float> CudaBackend::DoSoftmaxCrossEntropy(int rows, int cols,
                                                         const float* logits,
                                                         const int32_t* labels,
                                                         float* dlogits) {
  RETURN_IF_ERROR(Activate());
  RETURN_IF_ERROR(ReserveRows(rows));
  cudaStream_t s = stream_.get();
  CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(counters_.data(), 0, counters_.bytes(), s));
  CUDA_RETURN_IF_ERROR(cuda::internal::LaunchSoftmaxCrossEntropy(
      rows, cols, 1.0f / static_cast<float>(rows), logits, labels, dlogits,
      row_loss_.data(), counters_.data(), s));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_row_loss_.data(), row_loss_.data(),
                                       rows * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_counters_.data(), counters_.data(),
                                       sizeof(int32_t), cudaMemcpyDeviceToHost,
                                       s));
  RETURN_IF_ERROR(stream_.Synchronize());
  if (host_counters_.data()[0] != 0) {
    for (int r = 0; r < rows; ++r) {
      if (host_row_loss_.data()[r] != host_row_loss_.data()[r]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "SoftmaxCrossEntropy: the label at row ", r, " is outside [0, ",
            cols, ")"));
      }
    }
  }
  // Summed on the host in double, as the CPU backend does: the per-row losses
  // are few (one per example) and float summation would drift.
  double total = 0.0;
  for (int r = 0; r < rows; ++r) total += host_row_loss_.data()[r];
  return static_cast<float>(total / rows);
}

absl::StatusOr<int> CudaBackend::DoArgmaxCorrect(int rows, int cols,
                                                 const float* logits,
                                                 const int32_t* labels) {
  RETURN_IF_ERROR(Activate());
  cudaStream_t s = stream_.get();
  int32_t* correct = counters_.data() + 1;
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(correct, 0, sizeof(int32_t), s));
  CUDA_RETURN_IF_ERROR(cuda::internal::LaunchArgmaxCorrect(
      rows, cols, logits, labels, correct, s));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_counters_.data() + 1, correct,
                                       sizeof(int32_t), cudaMemcpyDeviceToHost,
                                       s));
  RETURN_IF_ERROR(stream_.Synchronize());
  return host_counters_.data()[1];
}

}  // namespace shardtrain::worker
