#include "common/payload.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"

namespace shardtrain::common {
namespace {

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

float BitsFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace

int DTypeSize(int dtype) {
  switch (dtype) {
    case DTYPE_F32:
      return 4;
    case DTYPE_F16:
    case DTYPE_BF16:
      return 2;
    default:
      return 0;
  }
}

absl::StatusOr<DType> ParseDTypeName(absl::string_view name) {
  for (DType dtype : {DTYPE_F32, DTYPE_F16, DTYPE_BF16}) {
    if (name == DTypeName(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(absl::StrFormat("must be f32, f16 or bf16, got %s", name));
}

const char* DTypeName(int dtype) {
  switch (dtype) {
    case DTYPE_F32:
      return "f32";
    case DTYPE_F16:
      return "f16";
    case DTYPE_BF16:
      return "bf16";
    case DTYPE_UNSPECIFIED:
      return "unspecified";
    default:
      return "unknown";
  }
}

uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (abs < 0x38800000u) {  // subnormal half or zero
    const float magnitude = BitsFloat(abs);
    // 2^-24 is the smallest half subnormal; round to nearest even.
    const float scaled = magnitude * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  uint32_t mantissa = abs & 0x7fffffu;
  uint32_t exponent = (abs >> 23) - 112;  // rebias 127 -> 15
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) / 16777216.0f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t FloatToBfloat16(float f) {
  uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

float Bfloat16ToFloat(uint16_t b) {
  return BitsFloat(static_cast<uint32_t>(b) << 16);
}

void EncodeDense(absl::Span<const float> values, DType dtype, std::string* out) {
  const size_t n = values.size();
  if (dtype == DTYPE_F32) {
    // assign, not resize + memcpy: resize would first zero-fill a cleared
    // (recycled) string.
    out->assign(reinterpret_cast<const char*>(values.data()), n * sizeof(float));
    return;
  }
  out->resize(n * static_cast<size_t>(DTypeSize(dtype)));
  EncodeDenseInto(values, dtype, out->data());
}

void EncodeDenseInto(absl::Span<const float> values, DType dtype, char* out) {
  const size_t n = values.size();
  if (dtype == DTYPE_F32) {
    if (n > 0) std::memcpy(out, values.data(), n * sizeof(float));
    return;
  }
  const float* __restrict src = values.data();
  if (dtype == DTYPE_F16) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t half = FloatToHalf(src[i]);
      std::memcpy(out + 2 * i, &half, sizeof(half));
    }
    return;
  }
  // FloatToBfloat16, branch-free and inline so that the loop vectorizes.
  for (size_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, src + i, sizeof(x));
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (x >> 16) | 0x40u;
    const uint16_t b =
        static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
    std::memcpy(out + 2 * i, &b, sizeof(b));
  }
}

void DecodeDenseFrom(DType dtype, const char* data, absl::Span<float> out) {
  float* __restrict dst = out.data();
  const size_t n = out.size();
  if (dtype == DTYPE_F32) {
    if (n > 0) std::memcpy(dst, data, n * sizeof(float));
    return;
  }
  if (dtype == DTYPE_F16) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t raw;
      std::memcpy(&raw, data + 2 * i, sizeof(raw));
      dst[i] = HalfToFloat(raw);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t raw;
    std::memcpy(&raw, data + 2 * i, sizeof(raw));
    const uint32_t bits = static_cast<uint32_t>(raw) << 16;
    std::memcpy(dst + i, &bits, sizeof(bits));
  }
}

absl::Status DecodeDense(int dtype, absl::string_view data,
                         absl::Span<float> out) {
  const int width = DTypeSize(dtype);
  if (width == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload dtype %s (%d) is not one of f32, f16, bf16", DTypeName(dtype), dtype));
  }
  const size_t expected = out.size() * static_cast<size_t>(width);
  if (data.size() != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload has %d bytes; %d elements of %s need %d", data.size(),
        out.size(), DTypeName(dtype), expected));
  }
  DecodeDenseFrom(static_cast<DType>(dtype), data.data(), out);
  return absl::OkStatus();
}

absl::Status DecodePayload(const Payload& payload, absl::Span<float> out) {
  if (payload.encoding() == ENCODING_DENSE) {
    if (!payload.indices().empty()) {
      return absl::InvalidArgumentError("a dense payload must not carry indices");
    }
    return DecodeDense(payload.dtype(), payload.data(), out);
  }
  if (payload.encoding() != ENCODING_SPARSE) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown payload encoding %d", payload.encoding()));
  }
  const int width = DTypeSize(payload.dtype());
  if (width == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload dtype %s (%d) is not one of f32, f16, bf16",
        DTypeName(payload.dtype()), payload.dtype()));
  }
  const std::string& indices = payload.indices();
  if (indices.size() % sizeof(uint32_t) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sparse indices have %d bytes, not a multiple of 4", indices.size()));
  }
  const size_t count = indices.size() / sizeof(uint32_t);
  if (count > out.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sparse payload names %d elements of a %d-element partition", count,
        out.size()));
  }
  if (payload.data().size() != count * static_cast<size_t>(width)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sparse payload has %d value bytes for %d indices of %s",
        payload.data().size(), count, DTypeName(payload.dtype())));
  }
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t i = 0; i < count; ++i) {
    uint32_t index;
    std::memcpy(&index, indices.data() + 4 * i, sizeof(index));
    if (index >= out.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sparse index %d is outside the %d-element partition", index, out.size()));
    }
    float value;
    if (width == 4) {
      std::memcpy(&value, payload.data().data() + 4 * i, sizeof(value));
    } else {
      uint16_t raw;
      std::memcpy(&raw, payload.data().data() + 2 * i, sizeof(raw));
      value = payload.dtype() == DTYPE_F16 ? HalfToFloat(raw) : Bfloat16ToFloat(raw);
    }
    out[index] += value;
  }
  return absl::OkStatus();
}

absl::Status CheckFinite(absl::Span<const float> values) {
  // Summing x*0 is branch-free and NaN-propagating: it is 0 unless some x is
  // NaN or Inf. Eight independent sums let GCC vectorise it without
  // -ffast-math; a single sum is a chain of dependent scalar adds (~5x slower).
  constexpr size_t kLanes = 8;
  float lanes[kLanes] = {};
  size_t head = 0;
  for (; head + kLanes <= values.size(); head += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] += values[head + j] * 0.0f;
  }
  float probe = 0.0f;
  for (; head < values.size(); ++head) probe += values[head] * 0.0f;
  for (float lane : lanes) probe += lane;
  if (probe == 0.0f) return absl::OkStatus();
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "gradient element %d is %f; NaN and Inf are rejected", i, values[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardtrain::common
