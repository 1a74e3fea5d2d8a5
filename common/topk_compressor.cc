#include "common/topk_compressor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/payload.h"

namespace shardtrain::common {
namespace {

// The value the shard will decode from `v` sent as `dtype`.
float RoundTrip(float v, DType dtype) {
  switch (dtype) {
    case DTYPE_F16:
      return HalfToFloat(FloatToHalf(v));
    case DTYPE_BF16:
      return Bfloat16ToFloat(FloatToBfloat16(v));
    default:
      return v;
  }
}

// |v|, with NaN as the largest of all: it is sent (and refused by the shard,
// loudly) rather than breaking the ordering the selection relies on.
float Magnitude(float v) {
  return std::isnan(v) ? std::numeric_limits<float>::infinity() : std::fabs(v);
}

// The k-th largest of scratch (reordered), and how many are above it.
float KthLargest(std::vector<float>& scratch, size_t k, size_t* above) {
  std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(),
                   std::greater<float>());
  const float kth = scratch[k - 1];
  *above = 0;
  for (size_t i = 0; i + 1 < k; ++i) *above += scratch[i] > kth ? 1 : 0;
  return kth;
}

}  // namespace

absl::StatusOr<TopKCompressor> TopKCompressor::Create(
    double ratio, const std::vector<int64_t>& partition_sizes) {
  if (!(ratio > 0.0 && ratio <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the top-k ratio must be in (0, 1], got ", ratio));
  }
  return TopKCompressor(ratio, partition_sizes);
}

TopKCompressor::TopKCompressor(double ratio, const std::vector<int64_t>& partition_sizes)
    : ratio_(ratio),
      residuals_(partition_sizes.size()),
      magnitudes_(partition_sizes.size()),
      selected_(partition_sizes.size()),
      values_(partition_sizes.size()) {
  for (size_t p = 0; p < partition_sizes.size(); ++p) {
    residuals_[p].assign(partition_sizes[p], 0.0f);
    magnitudes_[p].reserve(partition_sizes[p]);
  }
}

int64_t TopKCompressor::KeptFor(int64_t size) const {
  // ceil(ratio * size), without letting a product like 0.07 * 100 =
  // 7.000000000000001 round up to 8.
  const double exact = ratio_ * static_cast<double>(size);
  const auto k = static_cast<int64_t>(std::ceil(exact - 1e-9 * std::max(1.0, exact)));
  return std::clamp<int64_t>(k, std::min<int64_t>(1, size), size);
}

float TopKCompressor::Threshold(size_t partition, size_t k, size_t* above) {
  const std::vector<float>& residual = residuals_[partition];
  std::vector<float>& scratch = magnitudes_[partition];
  const size_t n = residual.size();
  // Large partitions with a small k: estimate a threshold a little below the
  // k-th largest from an evenly spaced sample of ~kSample magnitudes, keep
  // only the entries above it, and select exactly among those (about 2k).
  constexpr size_t kSample = 1024;
  if (n >= 4 * kSample && 8 * k <= n) {
    const size_t stride = n / kSample;
    scratch.clear();
    for (size_t i = stride / 2; i < n; i += stride) scratch.push_back(Magnitude(residual[i]));
    // The rank in the sample of twice the wanted fraction, plus slack.
    const size_t rank = std::min(scratch.size() - 1, 2 * k * scratch.size() / n + 4);
    std::nth_element(scratch.begin(), scratch.begin() + rank, scratch.end(),
                     std::greater<float>());
    const float low = scratch[rank];
    // Branch-free compaction: write every magnitude, keep those above.
    scratch.resize(n + 1);
    size_t count = 0;
    for (size_t i = 0; i < n; ++i) {
      const float m = Magnitude(residual[i]);
      scratch[count] = m;
      count += m >= low ? 1 : 0;
    }
    scratch.resize(count);
    // Every entry above `low` is among the candidates, so if there are at
    // least k of them, the k-th largest candidate is the k-th largest entry.
    if (scratch.size() >= k) return KthLargest(scratch, k, above);
  }
  scratch.resize(n);
  for (size_t i = 0; i < n; ++i) scratch[i] = Magnitude(residual[i]);
  return KthLargest(scratch, k, above);
}

void TopKCompressor::Encode(size_t partition, absl::Span<const float> grad, DType dtype,
                            Payload* out) {
  std::vector<float>& residual = residuals_[partition];
  const size_t n = residual.size();
  // residual becomes everything owed: the old residual plus this gradient.
  for (size_t i = 0; i < n; ++i) residual[i] += grad[i];
  const auto k = static_cast<size_t>(KeptFor(static_cast<int64_t>(n)));
  // Every entry above the threshold, then ties at it from the lowest index:
  // exactly k entries, in index order, deterministically.
  size_t above = 0;
  const float threshold = k > 0 ? Threshold(partition, k, &above) : 0.0f;
  size_t ties = k - above;

  // Branch-free: every index is written, and j advances past the taken
  // ones (the slot after the last is scratch).
  std::vector<uint32_t>& selected = selected_[partition];
  selected.resize(k + 1);
  size_t j = 0;
  for (size_t i = 0; i < n; ++i) {
    const float m = Magnitude(residual[i]);
    const bool tie = m == threshold && ties > 0;
    ties -= tie ? 1 : 0;
    selected[j] = static_cast<uint32_t>(i);
    j += (m > threshold || tie) ? 1 : 0;
  }
  std::vector<float>& values = values_[partition];
  values.resize(k);
  std::string* indices = out->mutable_indices();
  indices->resize(k * sizeof(uint32_t));
  std::memcpy(indices->data(), selected.data(), k * sizeof(uint32_t));
  for (j = 0; j < k; ++j) {
    const uint32_t i = selected[j];
    values[j] = residual[i];
    // What the shard will add; the rounding stays owed.
    residual[i] -= RoundTrip(values[j], dtype);
  }
  out->set_dtype(dtype);
  out->set_encoding(ENCODING_SPARSE);
  EncodeDense(values, dtype, out->mutable_data());
}

}  // namespace shardtrain::common
