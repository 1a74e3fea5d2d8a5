#include "sparse/row_initializer.h"

#include <cmath>

#include "sparse/id_hash.h"

namespace shardtrain::sparse {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

}  // namespace

RowInitializer::RowInitializer(const RowInit& init, absl::string_view table, int32_t dim)
    : kind_(init.kind),
      scale_(init.scale),
      key_(Mix64(init.seed ^ TableSalt(table))),
      dim_(dim) {}

void RowInitializer::Fill(uint64_t id, float* row) const {
  if (kind_ == RowInit::Kind::kZeros || scale_ == 0.0f) {
    for (int32_t j = 0; j < dim_; ++j) row[j] = 0.0f;
    return;
  }
  // A SplitMix64 stream keyed by (seed, table, id): element j's bits are
  // Mix64(base + (j + 1) * golden).
  const uint64_t base = Mix64(key_ ^ Mix64(id + kGolden));
  for (int32_t j = 0; j < dim_; ++j) {
    const uint64_t bits = Mix64(base + static_cast<uint64_t>(j + 1) * kGolden);
    if (kind_ == RowInit::Kind::kUniform) {
      row[j] = scale_ * (2.0f * UnitFloat(bits) - 1.0f);
    } else {
      // Box-Muller on the two 32-bit halves; u1 in (0, 1] keeps log finite.
      const double u1 = (static_cast<double>(bits >> 32) + 1.0) * (1.0 / 4294967296.0);
      const double u2 = static_cast<double>(bits & 0xffffffffULL) * (1.0 / 4294967296.0);
      row[j] = static_cast<float>(scale_ * std::sqrt(-2.0 * std::log(u1)) *
                                  std::cos(2.0 * M_PI * u2));
    }
  }
}

}  // namespace shardtrain::sparse
