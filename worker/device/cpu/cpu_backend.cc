#include "worker/device/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace shardtrain::worker {
namespace {

// Cache-line alignment lets the vectorised loops use aligned loads on the
// common case of buffers used from their start.
constexpr std::align_val_t kAlignment{64};

template <typename T>
class CpuBuffer final : public TypedDeviceBuffer<T> {
 public:
  CpuBuffer(T* data, size_t size) : data_(data), size_(size) {}
  ~CpuBuffer() override { ::operator delete(data_, kAlignment); }

  T* data() override { return data_; }
  const T* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  T* const data_;  // Owned; allocated with kAlignment.
  const size_t size_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<TypedDeviceBuffer<T>>> AllocateZeroed(size_t n) {
  // Always allocate at least one element so data() is never null.
  const size_t count = std::max<size_t>(n, 1);
  if (count > SIZE_MAX / sizeof(T)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cpu: cannot allocate ", n, " elements"));
  }
  void* p = ::operator new(count * sizeof(T), kAlignment, std::nothrow);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cpu: out of memory allocating ", count * sizeof(T), " bytes"));
  }
  std::memset(p, 0, count * sizeof(T));
  return std::make_unique<CpuBuffer<T>>(static_cast<T*>(p), n);
}

void ReluInPlace(int64_t n, float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void ReluOutOfPlace(int64_t n, const float* __restrict x, float* __restrict y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

// The gradient is loaded whatever the sign: a load only where y > 0 is
// one the compiler may not make unconditionally, so the loop stayed scalar,
// with a branch per element that random signs mispredict half the time
// (13 cycles an element).
void ReluGradInPlace(int64_t n, const float* __restrict y,
                     float* __restrict d) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = d[i];
    d[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

void ReluGradOutOfPlace(int64_t n, const float* __restrict y,
                        const float* __restrict dy, float* __restrict dx) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

// On the CPU, host memory for asynchronous copies is ordinary memory.
class CpuHostBuffer final : public HostBuffer {
 public:
  explicit CpuHostBuffer(std::unique_ptr<DeviceBuffer> memory)
      : memory_(std::move(memory)) {}

  float* data() override { return memory_->data(); }
  const float* data() const override { return memory_->data(); }
  size_t size() const override { return memory_->size(); }

 private:
  std::unique_ptr<DeviceBuffer> memory_;
};

class CpuBackend final : public Backend {
 public:
  absl::string_view Name() const override { return "cpu"; }

 protected:
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> DoAllocate(size_t n) override {
    return AllocateZeroed<float>(n);
  }
  absl::StatusOr<std::unique_ptr<DeviceLabelBuffer>> DoAllocateLabels(
      size_t n) override {
    return AllocateZeroed<int32_t>(n);
  }

  absl::Status DoCopyFromHost(const float* src, size_t n, float* dst) override {
    std::memmove(dst, src, n * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status DoCopyLabelsFromHost(const int32_t* src, size_t n,
                                    int32_t* dst) override {
    std::memmove(dst, src, n * sizeof(int32_t));
    return absl::OkStatus();
  }
  absl::Status DoCopyToHost(const float* src, size_t n, float* dst) override {
    std::memmove(dst, src, n * sizeof(float));
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<HostBuffer>> DoAllocateHost(
      size_t n) override {
    absl::StatusOr<std::unique_ptr<DeviceBuffer>> memory =
        AllocateZeroed<float>(n);
    if (!memory.ok()) return memory.status();
    return std::make_unique<CpuHostBuffer>(std::move(memory).value());
  }
  // Plain memory is what the CPU copies fastest.
  absl::StatusOr<std::unique_ptr<HostPin>> DoPinHost(float*, size_t) override {
    return NoPin();
  }
  // CPU work is done by the time a call returns, so the copy is too.
  absl::StatusOr<std::unique_ptr<Fence>> DoCopyToHostAsync(
      const float* src, size_t n, float* dst) override {
    std::memmove(dst, src, n * sizeof(float));
    return std::make_unique<DoneFence>();
  }
  absl::Status DoSynchronize() override { return absl::OkStatus(); }

  absl::Status DoGemm(Trans trans_a, Trans trans_b, int m, int n, int k,
                      float alpha, const float* a, const float* b, float beta,
                      float* c) override;
  absl::Status DoAxpby(int64_t n, float alpha, const float* x, float beta,
                       float* y) override {
    if (beta == 0.0f) {
      for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i];
    } else {
      for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i] + beta * y[i];
    }
    return absl::OkStatus();
  }
  absl::Status DoAddBias(int rows, int cols, const float* bias,
                         float* x) override;
  absl::Status DoColumnSum(int rows, int cols, const float* x,
                           float* out) override;

  absl::Status DoReluForward(int64_t n, const float* x, float* y) override {
    if (x == y) {
      ReluInPlace(n, y);
    } else {
      ReluOutOfPlace(n, x, y);
    }
    return absl::OkStatus();
  }
  absl::Status DoReluBackward(int64_t n, const float* y, const float* dy,
                              float* dx) override {
    if (dx == dy) {
      ReluGradInPlace(n, y, dx);
    } else {
      ReluGradOutOfPlace(n, y, dy, dx);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<float> DoSoftmaxCrossEntropy(int rows, int cols,
                                              const float* logits,
                                              const int32_t* labels,
                                              float* dlogits) override;
  absl::StatusOr<int> DoArgmaxCorrect(int rows, int cols, const float* logits,
                                      const int32_t* labels) override;
};

absl::Status CpuBackend::DoGemm(Trans trans_a, Trans trans_b, int m, int n,
                                int k, float alpha, const float* a,
                                const float* b, float beta, float* c) {
  if (k == 0) {
    // op(A)·op(B) is empty; BLAS would reject the zero leading dimension of
    // a [m,0] operand, and the result is just the scaled C.
    const int64_t size = int64_t{m} * n;
    for (int64_t i = 0; i < size; ++i) c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return absl::OkStatus();
  }
  const bool ta = trans_a == Trans::kYes;
  const bool tb = trans_b == Trans::kYes;
  // Row-major leading dimension = number of stored columns.
  const int lda = ta ? m : k;
  const int ldb = tb ? k : n;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
              beta, c, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoAddBias(int rows, int cols,
                                   const float* __restrict bias,
                                   float* __restrict x) {
  for (int r = 0; r < rows; ++r) {
    float* __restrict row = x + int64_t{r} * cols;
    for (int c = 0; c < cols; ++c) row[c] += bias[c];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::DoColumnSum(int rows, int cols,
                                     const float* __restrict x,
                                     float* __restrict out) {
  // Row-by-row keeps the inner loop contiguous so it vectorises.
  std::fill(out, out + cols, 0.0f);
  for (int r = 0; r < rows; ++r) {
    const float* __restrict row = x + int64_t{r} * cols;
    for (int c = 0; c < cols; ++c) out[c] += row[c];
  }
  return absl::OkStatus();
}

absl::StatusOr<float> CpuBackend::DoSoftmaxCrossEntropy(int rows, int cols,
                                                        const float* logits,
                                                        const int32_t* labels,
                                                        float* dlogits) {
  // Validate every label before writing, so a bad batch leaves dlogits alone.
  for (int r = 0; r < rows; ++r) {
    if (labels[r] < 0 || labels[r] >= cols) {
      return absl::InvalidArgumentError(
          absl::StrCat("SoftmaxCrossEntropy: label ", labels[r], " at row ", r,
                       " is outside [0, ", cols, ")"));
    }
  }
  const float inv_rows = 1.0f / static_cast<float>(rows);
  double total = 0.0;  // double: summing many per-row losses in float drifts.
  for (int r = 0; r < rows; ++r) {
    const float* in = logits + int64_t{r} * cols;
    float* out = dlogits + int64_t{r} * cols;
    // Subtracting the row max keeps exp() from overflowing.
    const float max = *std::max_element(in, in + cols);
    // Read before the loop below may overwrite it (dlogits may equal logits).
    const float label_logit = in[labels[r]];
    float sum = 0.0f;
    for (int c = 0; c < cols; ++c) {
      out[c] = std::exp(in[c] - max);
      sum += out[c];
    }
    total += static_cast<double>(max) + std::log(static_cast<double>(sum)) -
             label_logit;
    const float scale = inv_rows / sum;
    for (int c = 0; c < cols; ++c) out[c] *= scale;
    out[labels[r]] -= inv_rows;
  }
  return static_cast<float>(total / rows);
}

absl::StatusOr<int> CpuBackend::DoArgmaxCorrect(int rows, int cols,
                                                const float* logits,
                                                const int32_t* labels) {
  int correct = 0;
  for (int r = 0; r < rows; ++r) {
    const float* in = logits + int64_t{r} * cols;
    // max_element returns the first maximum, matching the documented ties.
    const int64_t argmax = std::max_element(in, in + cols) - in;
    if (argmax == labels[r]) ++correct;
  }
  return correct;
}

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() {
  return std::make_unique<CpuBackend>();
}

void SetCpuMathThreads(int threads) { openblas_set_num_threads(threads); }

std::string CpuMathKernels() {
  const char* core = openblas_get_corename();
  return core == nullptr ? "unknown" : std::string(absl::StripAsciiWhitespace(core));
}

}  // namespace shardtrain::worker
