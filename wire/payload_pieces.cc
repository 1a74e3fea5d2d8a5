#include "wire/payload_pieces.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "common/payload.h"
#include "wire/element_load.h"

namespace shardtrain::wire {
namespace {

absl::Status UnknownDType(int dtype) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "payload dtype %s (%d) is not one of f32, f16, bf16", common::DTypeName(dtype),
      dtype));
}

// Calls `body.template operator()<kDType>()` for the payload's dtype.
// REQUIRES: DTypeSize(dtype) > 0.
template <typename Body>
void DispatchDType(int dtype, Body&& body) {
  switch (dtype) {
    case DTYPE_F32:
      body(std::integral_constant<int, DTYPE_F32>());
      return;
    case DTYPE_F16:
      body(std::integral_constant<int, DTYPE_F16>());
      return;
    default:
      body(std::integral_constant<int, DTYPE_BF16>());
      return;
  }
}

// Non-zero when some element of bytes[0, count) has an all-ones exponent
// (Inf or NaN). Adding one unit of the lowest exponent bit to the masked
// exponent carries into the sign bit exactly when the exponent is all ones,
// so OR-ing the sums and testing the sign bit finds one: three vector
// instructions per 16 bytes, no compare. Independent lanes (several vector
// accumulators) keep the OR chain from limiting the loop to one vector per
// cycle.
template <typename Bits, Bits kExponent, Bits kOne>
SHARDTRAIN_VECTOR_CLONES Bits AnyAllOnesExponent(const char* bytes, int64_t count) {
  constexpr int kLanes = 64 / sizeof(Bits);
  Bits lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      Bits bits;
      std::memcpy(&bits, bytes + (i + j) * sizeof(Bits), sizeof(bits));
      lanes[j] |= static_cast<Bits>((bits & kExponent) + kOne);
    }
  }
  Bits any = 0;
  for (; i < count; ++i) {
    Bits bits;
    std::memcpy(&bits, bytes + i * sizeof(Bits), sizeof(bits));
    any |= static_cast<Bits>((bits & kExponent) + kOne);
  }
  for (int j = 0; j < kLanes; ++j) any |= lanes[j];
  constexpr Bits kSign = static_cast<Bits>(Bits{1} << (8 * sizeof(Bits) - 1));
  return any & kSign;
}

template <int kDType>
bool AnyNonFinite(const char* bytes, int64_t count) {
  if constexpr (kDType == DTYPE_F32) {
    return AnyAllOnesExponent<uint32_t, 0x7f800000u, 0x00800000u>(bytes, count) != 0;
  } else if constexpr (kDType == DTYPE_F16) {
    return AnyAllOnesExponent<uint16_t, 0x7c00u, 0x0400u>(bytes, count) != 0;
  } else {
    return AnyAllOnesExponent<uint16_t, 0x7f80u, 0x0080u>(bytes, count) != 0;
  }
}

// out[i] += element i of bytes[0, n).
template <int kDType>
SHARDTRAIN_VECTOR_CLONES void AddLoop(const char* __restrict bytes, int64_t n,
                                      float* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] += LoadElement<kDType>(bytes, i);
}

// values[0, n) converted to a 16-bit kDType at `out`.
template <int kDType>
SHARDTRAIN_VECTOR_CLONES void EncodeLoop(const float* __restrict values, int64_t n,
                                         char* __restrict out) {
  for (int64_t i = 0; i < n; ++i) StoreElement<kDType>(out, i, values[i]);
}

// Reads consecutive elements of a ReceivedBytes, whatever its split.
class ElementCursor {
 public:
  explicit ElementCursor(const ReceivedBytes& bytes) : pieces_(bytes.pieces()) {}

  // Copies the next `n` bytes to `out`. REQUIRES: that many are left.
  void Read(char* out, size_t n) {
    while (n > 0) {
      const absl::string_view piece = pieces_[piece_];
      const size_t take = std::min(n, piece.size() - offset_);
      std::memcpy(out, piece.data() + offset_, take);
      out += take;
      n -= take;
      offset_ += take;
      if (offset_ == piece.size()) {
        ++piece_;
        offset_ = 0;
      }
    }
  }

 private:
  absl::Span<const absl::string_view> pieces_;
  size_t piece_ = 0;
  size_t offset_ = 0;
};

absl::Status DecodeSparse(const PayloadView& payload, absl::Span<float> out) {
  const int width = common::DTypeSize(payload.dtype);
  if (width == 0) return UnknownDType(payload.dtype);
  const size_t index_bytes = payload.indices.size();
  if (index_bytes % sizeof(uint32_t) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sparse indices have %d bytes, not a multiple of 4", index_bytes));
  }
  const size_t count = index_bytes / sizeof(uint32_t);
  if (count > out.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sparse payload names %d elements of a %d-element partition", count,
        out.size()));
  }
  if (payload.data.size() != count * static_cast<size_t>(width)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sparse payload has %d value bytes for %d indices of %s",
                        payload.data.size(), count, common::DTypeName(payload.dtype)));
  }
  // Every index is checked before anything is written. A partition of
  // 2^32 elements or more holds every uint32 index.
  bool out_of_range = false;
  uint32_t bad = 0;
  const uint32_t size = static_cast<uint32_t>(out.size());
  if (out.size() <= UINT32_MAX) ForEachRun(payload.indices, sizeof(uint32_t),
             [&](int64_t, const char* bytes, int64_t n) {
               if (out_of_range) return;
               uint32_t any = 0;
               for (int64_t i = 0; i < n; ++i) {
                 uint32_t index;
                 std::memcpy(&index, bytes + 4 * i, sizeof(index));
                 any |= index >= size;
               }
               if (any == 0) return;
               for (int64_t i = 0; i < n; ++i) {
                 std::memcpy(&bad, bytes + 4 * i, sizeof(bad));
                 if (bad >= size) break;
               }
               out_of_range = true;
             });
  if (out_of_range) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sparse index %d is outside the %d-element partition", bad, out.size()));
  }
  std::fill(out.begin(), out.end(), 0.0f);
  ElementCursor values(payload.data);
  DispatchDType(payload.dtype, [&](auto dtype) {
    constexpr int kDType = decltype(dtype)::value;
    ForEachRun(payload.indices, sizeof(uint32_t),
               [&](int64_t, const char* bytes, int64_t n) {
                 for (int64_t i = 0; i < n; ++i) {
                   uint32_t index;
                   std::memcpy(&index, bytes + 4 * i, sizeof(index));
                   char value[4];
                   values.Read(value, static_cast<size_t>(width));
                   out[index] += LoadElement<kDType>(value, 0);
                 }
               });
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDense(const PayloadView& payload, int64_t elements) {
  if (payload.encoding != ENCODING_DENSE) {
    if (payload.encoding == ENCODING_SPARSE) {
      return absl::InvalidArgumentError("payload is sparse; a dense one is needed here");
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown payload encoding %d", payload.encoding));
  }
  if (!payload.indices.empty()) {
    return absl::InvalidArgumentError("a dense payload must not carry indices");
  }
  const int width = common::DTypeSize(payload.dtype);
  if (width == 0) return UnknownDType(payload.dtype);
  const uint64_t expected = static_cast<uint64_t>(elements) * static_cast<uint64_t>(width);
  if (elements < 0 || payload.data.size() != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload has %d bytes; %d elements of %s need %d", payload.data.size(),
        elements, common::DTypeName(payload.dtype), expected));
  }
  return absl::OkStatus();
}

void ForEachRun(const ReceivedBytes& data, int element_size,
                absl::FunctionRef<void(int64_t first, const char* bytes,
                                       int64_t count)> run) {
  const size_t width = static_cast<size_t>(element_size);
  char carry[8];
  size_t carried = 0;  // bytes of a split element gathered in `carry`
  int64_t index = 0;
  for (absl::string_view piece : data.pieces()) {
    const char* bytes = piece.data();
    size_t left = piece.size();
    if (carried > 0) {
      const size_t take = std::min(left, width - carried);
      std::memcpy(carry + carried, bytes, take);
      carried += take;
      bytes += take;
      left -= take;
      if (carried < width) continue;
      run(index, carry, 1);
      ++index;
      carried = 0;
    }
    const size_t count = left / width;
    if (count > 0) {
      run(index, bytes, static_cast<int64_t>(count));
      index += static_cast<int64_t>(count);
      bytes += count * width;
      left -= count * width;
    }
    if (left > 0) {
      std::memcpy(carry, bytes, left);
      carried = left;
    }
  }
}

absl::Status CheckFinite(const PayloadView& dense) {
  const int width = common::DTypeSize(dense.dtype);
  absl::Status status;
  DispatchDType(dense.dtype, [&](auto dtype) {
    constexpr int kDType = decltype(dtype)::value;
    ForEachRun(dense.data, width, [&](int64_t first, const char* bytes, int64_t count) {
      if (!status.ok() || !AnyNonFinite<kDType>(bytes, count)) return;
      // Only now, with a bad element known to be in this run: which one.
      for (int64_t i = 0; i < count; ++i) {
        const float value = LoadElement<kDType>(bytes, i);
        if (!std::isfinite(value)) {
          status = absl::InvalidArgumentError(absl::StrFormat(
              "gradient element %d is %f; NaN and Inf are rejected", first + i, value));
          return;
        }
      }
    });
  });
  return status;
}

absl::Status DecodeInto(const PayloadView& payload, absl::Span<float> out) {
  if (payload.encoding == ENCODING_SPARSE) return DecodeSparse(payload, out);
  const absl::Status dense = CheckDense(payload, static_cast<int64_t>(out.size()));
  if (!dense.ok()) return dense;
  DispatchDType(payload.dtype, [&](auto dtype) {
    constexpr int kDType = decltype(dtype)::value;
    ForEachRun(payload.data, common::DTypeSize(kDType),
               [&](int64_t first, const char* bytes, int64_t count) {
                 float* __restrict dst = out.data() + first;
                 if constexpr (kDType == DTYPE_F32) {
                   std::memcpy(dst, bytes, static_cast<size_t>(count) * sizeof(float));
                 } else {
                   for (int64_t i = 0; i < count; ++i) {
                     dst[i] = LoadElement<kDType>(bytes, i);
                   }
                 }
               });
  });
  return absl::OkStatus();
}

void AddInto(const PayloadView& dense, absl::Span<float> out) {
  DispatchDType(dense.dtype, [&](auto dtype) {
    constexpr int kDType = decltype(dtype)::value;
    ForEachRun(dense.data, common::DTypeSize(kDType),
               [&](int64_t first, const char* bytes, int64_t count) {
                 AddLoop<kDType>(bytes, count, out.data() + first);
               });
  });
}

void EncodeElements(absl::Span<const float> values, int dtype, char* out) {
  DispatchDType(dtype, [&](auto type) {
    constexpr int kDType = decltype(type)::value;
    if constexpr (kDType == DTYPE_F32) {
      std::memcpy(out, values.data(), values.size() * sizeof(float));
    } else {
      EncodeLoop<kDType>(values.data(), static_cast<int64_t>(values.size()), out);
    }
  });
}

}  // namespace shardtrain::wire
