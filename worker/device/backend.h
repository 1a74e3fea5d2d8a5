// Backend: the device interface that the worker's numerical core runs on.
//
// A Backend owns device memory (DeviceBuffer, DeviceLabelBuffer) and runs the
// handful of kernels an MLP needs: GEMM, bias add, column sum, ReLU, softmax
// cross-entropy and an argmax accuracy count. The CPU implementation lives in
// worker/device/cpu/, the CUDA one in worker/device/cuda/. This header stays
// host-only so code that never touches kernels builds without nvcc.
//
// Matrices are dense and row-major with no padding between rows. Every raw
// pointer passed to a kernel points into memory of *this* backend (from
// Allocate / AllocateLabels, possibly offset); the caller keeps ownership and
// must keep it alive until the call returns (or, for asynchronous backends,
// until Synchronize() or a blocking CopyToHost returns).
//
// The public methods validate their arguments once, here, and forward to the
// protected Do* hooks, so an implementation only ever sees well-formed calls.
//
// Example: C [2x2] = A [2x3] * B [3x2] (MakeCpuBackend is in
// worker/device/cpu/cpu_backend.h):
//   const int m = 2, k = 3, n = 2;
//   const std::vector<float> host_a = {1, 2, 3, 4, 5, 6};
//   const std::vector<float> host_b = {1, 0, 0, 1, 1, 1};
//   std::vector<float> host_c(m * n);
//   std::unique_ptr<Backend> backend = MakeCpuBackend();
//   ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> a, backend->Allocate(m * k));
//   ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> b, backend->Allocate(k * n));
//   ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> c, backend->Allocate(m * n));
//   RETURN_IF_ERROR(backend->CopyFromHost(host_a, a.get(), 0));
//   RETURN_IF_ERROR(backend->CopyFromHost(host_b, b.get(), 0));
//   RETURN_IF_ERROR(backend->Gemm(Trans::kNo, Trans::kNo, m, n, k, 1.0f,
//                                 a->data(), b->data(), 0.0f, c->data()));
//   RETURN_IF_ERROR(backend->CopyToHost(*c, 0, absl::MakeSpan(host_c)));
//   // host_c == {4, 5, 10, 11}
#ifndef SHARDTRAIN_WORKER_DEVICE_BACKEND_H_
#define SHARDTRAIN_WORKER_DEVICE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/device/fence.h"
#include "worker/device/host_pin.h"

namespace shardtrain::worker {

// Move-only owner of size() elements of T in backend memory; the memory is
// released by the destructor. Copying is only possible through the explicit
// Backend::Copy* calls. Thread-compatible.
template <typename T>
class TypedDeviceBuffer {
 public:
  virtual ~TypedDeviceBuffer() = default;
  TypedDeviceBuffer(const TypedDeviceBuffer&) = delete;
  TypedDeviceBuffer& operator=(const TypedDeviceBuffer&) = delete;

  // Backend memory; dereference it only through the owning Backend.
  virtual T* data() = 0;
  virtual const T* data() const = 0;
  virtual size_t size() const = 0;

 protected:
  TypedDeviceBuffer() = default;
};

// Activations, parameters and gradients.
using DeviceBuffer = TypedDeviceBuffer<float>;
// Class labels; kept as int32 rather than float so labels above 2^24 and
// "is this an integer" never become questions.
using DeviceLabelBuffer = TypedDeviceBuffer<int32_t>;

// Host memory that a backend copies into without holding up the host thread:
// page-locked on a GPU, plain memory on the CPU. Move-only owner; released by
// the destructor. Thread-compatible.
class HostBuffer {
 public:
  virtual ~HostBuffer() = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  virtual float* data() = 0;
  virtual const float* data() const = 0;
  virtual size_t size() const = 0;

 protected:
  HostBuffer() = default;
};

// Whether a GEMM operand is used as stored or transposed.
enum class Trans { kNo, kYes };

// Thread-compatible: one Backend per thread; a Backend and its buffers must not
// be used from two threads at once. Buffers must not outlive their Backend.
class Backend {
 public:
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // Short human-readable name, e.g. "cpu".
  virtual absl::string_view Name() const = 0;

  // Returns a zero-filled buffer of n floats (n may be 0), or
  // RESOURCE_EXHAUSTED.
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t n);
  absl::StatusOr<std::unique_ptr<DeviceLabelBuffer>> AllocateLabels(size_t n);

  // Copies src into dst[dst_offset, dst_offset + src.size()).
  // INVALID_ARGUMENT if that range is not inside dst.
  absl::Status CopyFromHost(absl::Span<const float> src, DeviceBuffer* dst,
                            size_t dst_offset);
  absl::Status CopyLabelsFromHost(absl::Span<const int32_t> src,
                                  DeviceLabelBuffer* dst, size_t dst_offset);
  // Copies src[src_offset, src_offset + dst.size()) into dst and blocks until
  // the data is on the host. INVALID_ARGUMENT if the range is not inside src.
  absl::Status CopyToHost(const DeviceBuffer& src, size_t src_offset,
                          absl::Span<float> dst);

  // Host memory of n floats (zero-filled) for CopyToHostAsync, or
  // RESOURCE_EXHAUSTED.
  absl::StatusOr<std::unique_ptr<HostBuffer>> AllocateHost(size_t n);

  // Starts copying src[src_offset, src_offset + dst.size()) into dst behind
  // all work queued so far and returns at once; the fence passes when dst
  // holds the data. Work queued after the call may run while the copy does
  // (a GPU backend copies on a stream of its own). For that, dst must lie in
  // a HostBuffer from AllocateHost; other host memory is still correct but
  // makes a GPU copy synchronous. INVALID_ARGUMENT if the range is not inside
  // src. REQUIRES: src is not written, and src and dst stay alive, until the
  // fence's Wait has returned.
  absl::StatusOr<std::unique_ptr<Fence>> CopyToHostAsync(
      const DeviceBuffer& src, size_t src_offset, absl::Span<float> dst);

  // Makes copies between `host` and this backend's buffers run at the bus's
  // speed: a GPU backend page-locks the memory (cudaHostRegister), so
  // CopyFromHost and CopyToHost no longer stage it through a bounce buffer;
  // the CPU backend does nothing. For host memory the caller keeps and
  // copies every step (a worker's parameters). An empty span gets a pin that
  // does nothing. RESOURCE_EXHAUSTED when the memory cannot be locked,
  // INVALID_ARGUMENT when part of it is pinned already; copies stay correct
  // without a pin, only slower.
  absl::StatusOr<std::unique_ptr<HostPin>> PinHost(absl::Span<float> host);

  // Blocks until all work queued on this backend has finished.
  absl::Status Synchronize() { return DoSynchronize(); }

  // C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C. A is stored as
  // [m,k] (or [k,m] when trans_a is kYes), B as [k,n] (or [n,k]). With
  // beta == 0, C is overwritten even if it held NaNs.
  // REQUIRES: c does not overlap a or b.
  absl::Status Gemm(Trans trans_a, Trans trans_b, int m, int n, int k,
                    float alpha, const float* a, const float* b, float beta,
                    float* c);

  // y = alpha * x + beta * y elementwise over n values, in fp32 on every
  // backend whatever the GEMM precision. With beta == 0, y is overwritten
  // even if it held NaNs. REQUIRES: x and y are the same or do not overlap.
  absl::Status Axpby(int64_t n, float alpha, const float* x, float beta,
                     float* y);

  // x[r,c] += bias[c] for x of shape [rows, cols].
  absl::Status AddBias(int rows, int cols, const float* bias, float* x);

  // out[c] = sum_r x[r,c] (overwrites out): the gradient of a bias.
  absl::Status ColumnSum(int rows, int cols, const float* x, float* out);

  // y = max(x, 0) elementwise over n values. y may equal x.
  absl::Status ReluForward(int64_t n, const float* x, float* y);

  // dx = dy where y > 0, else 0; y is the ReLU *output*. dx may equal dy.
  absl::Status ReluBackward(int64_t n, const float* y, const float* dy,
                            float* dx);

  // For logits [rows, cols] and one label per row, returns the mean over rows
  // of -log softmax(logits)[label] and writes
  // dlogits = (softmax(logits) - onehot(label)) / rows, i.e. the gradient of
  // that mean. Blocks until the loss is on the host. dlogits may equal logits.
  // INVALID_ARGUMENT if rows < 1 or cols < 1: the mean would be undefined.
  // REQUIRES: 0 <= labels[r] < cols (a backend may return INVALID_ARGUMENT).
  absl::StatusOr<float> SoftmaxCrossEntropy(int rows, int cols,
                                            const float* logits,
                                            const int32_t* labels,
                                            float* dlogits);

  // Number of rows whose argmax (first one on ties) equals the label. Blocks
  // until the count is on the host.
  absl::StatusOr<int> ArgmaxCorrect(int rows, int cols, const float* logits,
                                    const int32_t* labels);

 protected:
  Backend() = default;

  // A pin that does nothing, for DoPinHost of a backend whose copies need none.
  static std::unique_ptr<HostPin> NoPin();

  // Hooks called by the methods above after argument validation: sizes and
  // shapes are non-negative, copy ranges are in bounds, pointers are non-null
  // whenever the call touches at least one element, and no hook is called for
  // work with no output element (the public method returns early instead).
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> DoAllocate(
      size_t n) = 0;
  virtual absl::StatusOr<std::unique_ptr<DeviceLabelBuffer>> DoAllocateLabels(
      size_t n) = 0;
  virtual absl::Status DoCopyFromHost(const float* src, size_t n,
                                      float* dst) = 0;
  virtual absl::Status DoCopyLabelsFromHost(const int32_t* src, size_t n,
                                            int32_t* dst) = 0;
  virtual absl::Status DoCopyToHost(const float* src, size_t n, float* dst) = 0;
  virtual absl::StatusOr<std::unique_ptr<HostBuffer>> DoAllocateHost(
      size_t n) = 0;
  virtual absl::StatusOr<std::unique_ptr<Fence>> DoCopyToHostAsync(
      const float* src, size_t n, float* dst) = 0;
  virtual absl::StatusOr<std::unique_ptr<HostPin>> DoPinHost(float* host, size_t n) = 0;
  virtual absl::Status DoSynchronize() = 0;
  virtual absl::Status DoGemm(Trans trans_a, Trans trans_b, int m, int n, int k,
                              float alpha, const float* a, const float* b,
                              float beta, float* c) = 0;
  virtual absl::Status DoAxpby(int64_t n, float alpha, const float* x,
                               float beta, float* y) = 0;
  virtual absl::Status DoAddBias(int rows, int cols, const float* bias,
                                 float* x) = 0;
  virtual absl::Status DoColumnSum(int rows, int cols, const float* x,
                                   float* out) = 0;
  virtual absl::Status DoReluForward(int64_t n, const float* x, float* y) = 0;
  virtual absl::Status DoReluBackward(int64_t n, const float* y,
                                      const float* dy, float* dx) = 0;
  virtual absl::StatusOr<float> DoSoftmaxCrossEntropy(int rows, int cols,
                                                      const float* logits,
                                                      const int32_t* labels,
                                                      float* dlogits) = 0;
  virtual absl::StatusOr<int> DoArgmaxCorrect(int rows, int cols,
                                              const float* logits,
                                              const int32_t* labels) = 0;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DEVICE_BACKEND_H_
