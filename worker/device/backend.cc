#include "worker/device/backend.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardtrain::worker {
namespace {

absl::Status CheckNonNegative(const char* op, const char* what, int64_t v) {
  if (v < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " must be >= 0, got ", v));
  }
  return absl::OkStatus();
}

absl::Status CheckNotNull(const char* op, const char* what, const void* p) {
  if (p == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " is null"));
  }
  return absl::OkStatus();
}

// Checks [offset, offset + count) lies inside a buffer of `size` elements
// without overflowing.
absl::Status CheckRange(const char* op, size_t offset, size_t count,
                        size_t size) {
  if (offset > size || count > size - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": range [", offset, ", ", offset, "+", count,
                     ") is outside a buffer of ", size, " elements"));
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const char* op, int rows, int cols) {
  if (rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": shape [", rows, ", ", cols, "] has a negative dimension"));
  }
  return absl::OkStatus();
}

// A pin of nothing: empty spans, and memory a backend copies at full speed
// as it is.
class NoHostPin final : public HostPin {};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBuffer>> Backend::Allocate(size_t n) {
  return DoAllocate(n);
}

absl::StatusOr<std::unique_ptr<DeviceLabelBuffer>> Backend::AllocateLabels(
    size_t n) {
  return DoAllocateLabels(n);
}

absl::Status Backend::CopyFromHost(absl::Span<const float> src,
                                   DeviceBuffer* dst, size_t dst_offset) {
  RETURN_IF_ERROR(CheckNotNull("CopyFromHost", "dst", dst));
  RETURN_IF_ERROR(
      CheckRange("CopyFromHost", dst_offset, src.size(), dst->size()));
  if (src.empty()) return absl::OkStatus();
  return DoCopyFromHost(src.data(), src.size(), dst->data() + dst_offset);
}

absl::Status Backend::CopyLabelsFromHost(absl::Span<const int32_t> src,
                                         DeviceLabelBuffer* dst,
                                         size_t dst_offset) {
  RETURN_IF_ERROR(CheckNotNull("CopyLabelsFromHost", "dst", dst));
  RETURN_IF_ERROR(
      CheckRange("CopyLabelsFromHost", dst_offset, src.size(), dst->size()));
  if (src.empty()) return absl::OkStatus();
  return DoCopyLabelsFromHost(src.data(), src.size(), dst->data() + dst_offset);
}

absl::Status Backend::CopyToHost(const DeviceBuffer& src, size_t src_offset,
                                 absl::Span<float> dst) {
  RETURN_IF_ERROR(CheckRange("CopyToHost", src_offset, dst.size(), src.size()));
  if (dst.empty()) return absl::OkStatus();
  return DoCopyToHost(src.data() + src_offset, dst.size(), dst.data());
}

absl::StatusOr<std::unique_ptr<HostBuffer>> Backend::AllocateHost(size_t n) {
  return DoAllocateHost(n);
}

std::unique_ptr<HostPin> Backend::NoPin() { return std::make_unique<NoHostPin>(); }

absl::StatusOr<std::unique_ptr<HostPin>> Backend::PinHost(absl::Span<float> host) {
  if (host.empty()) return NoPin();
  return DoPinHost(host.data(), host.size());
}

absl::StatusOr<std::unique_ptr<Fence>> Backend::CopyToHostAsync(
    const DeviceBuffer& src, size_t src_offset, absl::Span<float> dst) {
  RETURN_IF_ERROR(
      CheckRange("CopyToHostAsync", src_offset, dst.size(), src.size()));
  if (dst.empty()) return std::make_unique<DoneFence>();
  return DoCopyToHostAsync(src.data() + src_offset, dst.size(), dst.data());
}

absl::Status Backend::Gemm(Trans trans_a, Trans trans_b, int m, int n, int k,
                           float alpha, const float* a, const float* b,
                           float beta, float* c) {
  RETURN_IF_ERROR(CheckNonNegative("Gemm", "m", m));
  RETURN_IF_ERROR(CheckNonNegative("Gemm", "n", n));
  RETURN_IF_ERROR(CheckNonNegative("Gemm", "k", k));
  if (m == 0 || n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull("Gemm", "c", c));
  if (k > 0) {
    RETURN_IF_ERROR(CheckNotNull("Gemm", "a", a));
    RETURN_IF_ERROR(CheckNotNull("Gemm", "b", b));
  }
  return DoGemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}

absl::Status Backend::Axpby(int64_t n, float alpha, const float* x, float beta,
                            float* y) {
  RETURN_IF_ERROR(CheckNonNegative("Axpby", "n", n));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull("Axpby", "x", x));
  RETURN_IF_ERROR(CheckNotNull("Axpby", "y", y));
  return DoAxpby(n, alpha, x, beta, y);
}

absl::Status Backend::AddBias(int rows, int cols, const float* bias, float* x) {
  RETURN_IF_ERROR(CheckShape("AddBias", rows, cols));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull("AddBias", "bias", bias));
  RETURN_IF_ERROR(CheckNotNull("AddBias", "x", x));
  return DoAddBias(rows, cols, bias, x);
}

absl::Status Backend::ColumnSum(int rows, int cols, const float* x,
                                float* out) {
  RETURN_IF_ERROR(CheckShape("ColumnSum", rows, cols));
  if (cols == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull("ColumnSum", "out", out));
  // rows == 0 still has output: a column of zeros.
  if (rows > 0) {
    RETURN_IF_ERROR(CheckNotNull("ColumnSum", "x", x));
  }
  return DoColumnSum(rows, cols, x, out);
}

absl::Status Backend::ReluForward(int64_t n, const float* x, float* y) {
  RETURN_IF_ERROR(CheckNonNegative("ReluForward", "n", n));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull("ReluForward", "x", x));
  RETURN_IF_ERROR(CheckNotNull("ReluForward", "y", y));
  return DoReluForward(n, x, y);
}

absl::Status Backend::ReluBackward(int64_t n, const float* y, const float* dy,
                                   float* dx) {
  RETURN_IF_ERROR(CheckNonNegative("ReluBackward", "n", n));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull("ReluBackward", "y", y));
  RETURN_IF_ERROR(CheckNotNull("ReluBackward", "dy", dy));
  RETURN_IF_ERROR(CheckNotNull("ReluBackward", "dx", dx));
  return DoReluBackward(n, y, dy, dx);
}

absl::StatusOr<float> Backend::SoftmaxCrossEntropy(int rows, int cols,
                                                   const float* logits,
                                                   const int32_t* labels,
                                                   float* dlogits) {
  if (rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SoftmaxCrossEntropy: shape [", rows, ", ", cols,
                     "] must have rows >= 1 and cols >= 1"));
  }
  RETURN_IF_ERROR(CheckNotNull("SoftmaxCrossEntropy", "logits", logits));
  RETURN_IF_ERROR(CheckNotNull("SoftmaxCrossEntropy", "labels", labels));
  RETURN_IF_ERROR(CheckNotNull("SoftmaxCrossEntropy", "dlogits", dlogits));
  return DoSoftmaxCrossEntropy(rows, cols, logits, labels, dlogits);
}

absl::StatusOr<int> Backend::ArgmaxCorrect(int rows, int cols,
                                           const float* logits,
                                           const int32_t* labels) {
  RETURN_IF_ERROR(CheckShape("ArgmaxCorrect", rows, cols));
  if (rows == 0) return 0;
  if (cols == 0) {
    return absl::InvalidArgumentError(
        "ArgmaxCorrect: rows without columns have no argmax");
  }
  RETURN_IF_ERROR(CheckNotNull("ArgmaxCorrect", "logits", logits));
  RETURN_IF_ERROR(CheckNotNull("ArgmaxCorrect", "labels", labels));
  return DoArgmaxCorrect(rows, cols, logits, labels);
}

}  // namespace shardtrain::worker
