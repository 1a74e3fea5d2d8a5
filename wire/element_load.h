// Loads and stores single little-endian elements of a wire dtype in
// possibly unaligned memory, as floats. memcpy keeps unaligned access
// defined behaviour and compiles to a plain load or store; the conversions
// are inline and branch-free, so loops over these vectorise (a loop that
// called common::HalfToFloat, defined in another file, could not).
// Results are bit for bit those of common::HalfToFloat, Bfloat16ToFloat,
// FloatToHalf and FloatToBfloat16 (common/payload.h).
//
//   for (int64_t i = 0; i < n; ++i) sum += LoadElement<DTYPE_F32>(bytes, i);
//   StoreElement<DTYPE_BF16>(out, i, value);
#ifndef SHARDTRAIN_WIRE_ELEMENT_LOAD_H_
#define SHARDTRAIN_WIRE_ELEMENT_LOAD_H_

#include <cstdint>
#include <cstring>

#include "common/payload.h"
#include "proto/shardtrain.pb.h"

// Marks a loop-heavy function to be compiled twice, for AVX2 and for
// baseline x86-64, the better one picked when the program loads (GCC on
// x86-64 Linux; elsewhere nothing). AVX2 without FMA: the compiler cannot
// contract a*b+c, so both versions compute bit-identical results.
// SHARDTRAIN_DIVIDING_VECTOR_CLONES adds an AVX-512F version, for loops
// bound by divisions and square roots (Adam, Adagrad), which 16 lanes
// instead of 8 run 1.3-1.6x as fast on an AVX-512 CPU
// (bench/results/apply_avx512_cpu.txt); loops bound by memory (SGD,
// momentum, conversions) gain nothing from it. AVX-512F has FMA, so a file
// that uses it must be compiled with -ffp-contract=off (the server's library
// is), or its results differ from the other versions' in the last bit:
// OptimizerTest and ShardWireTest compare them bit for bit.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && \
    !defined(__clang__)
#define SHARDTRAIN_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#define SHARDTRAIN_DIVIDING_VECTOR_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SHARDTRAIN_VECTOR_CLONES
#define SHARDTRAIN_DIVIDING_VECTOR_CLONES
#endif

namespace shardtrain::wire {

namespace element_internal {

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t FloatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// IEEE half to float. The exponent is rebiased by adding to the shifted
// bits; Inf/NaN get the rest of the float exponent range; a subnormal (or
// zero) is built as 2^-14 * (1 + m/1024) and 2^-14 subtracted, which is
// exactly m * 2^-24 (the float result is normal, so flush-to-zero modes do
// not change it). Every case is computed and selected, without branches.
//
// The selects are written as masks, not `?:`: GCC would otherwise turn them
// into branches, move the subtraction into one, and then refuse to
// vectorise a loop with a floating-point operation under a condition.
inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t shifted = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exponent = shifted & 0x0f800000u;
  const uint32_t inf_or_nan = 0u - static_cast<uint32_t>(exponent == 0x0f800000u);
  const uint32_t subnormal = 0u - static_cast<uint32_t>(exponent == 0);
  const uint32_t bits = shifted + (112u << 23) + (inf_or_nan & (112u << 23));
  const uint32_t small =
      FloatToBits(BitsToFloat(bits + (1u << 23)) - BitsToFloat(113u << 23));
  const uint32_t magnitude = (small & subnormal) | (bits & ~subnormal);
  return BitsToFloat(magnitude | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

// Float to IEEE half, rounding to nearest even, as common::FloatToHalf:
// NaN becomes the quiet NaN 0x7e00 (sign kept), values from 65520 up Inf.
// A result that is subnormal (or zero) comes from adding 0.5, whose ulp is
// the half subnormal step 2^-24, so the float adder rounds; a normal one
// from rebiasing the exponent and rounding the 13 dropped mantissa bits by
// hand. All cases are computed and selected with masks (see above).
inline uint16_t FloatToHalfBits(float f) {
  const uint32_t x = FloatToBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  // Normal: exponent rebiased (127 -> 15), 0xfff + the lowest kept bit
  // added so the shift rounds to nearest even; may carry into Inf.
  const uint32_t normal = (abs - (112u << 23) + 0xfffu + ((abs >> 13) & 1u)) >> 13;
  // Subnormal or zero: 0.5 + |f| (|f| < 2^-14) rounds |f| to a multiple of
  // 2^-24; the bits above 0.5's are the half's.
  const uint32_t small =
      FloatToBits(BitsToFloat(abs) + BitsToFloat(126u << 23)) - (126u << 23);
  const uint32_t special = abs > 0x7f800000u ? 0x7e00u : 0x7c00u;  // NaN, Inf
  const uint32_t is_small = 0u - static_cast<uint32_t>(abs < (113u << 23));
  const uint32_t is_special = 0u - static_cast<uint32_t>(abs >= (143u << 23));
  const uint32_t finite = (small & is_small) | (normal & ~is_small);
  return static_cast<uint16_t>(sign | (special & is_special) | (finite & ~is_special));
}

// Float to bfloat16, rounding to nearest even; NaN stays a (quiet) NaN.
inline uint16_t FloatToBfloat16Bits(float f) {
  const uint32_t x = FloatToBits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace element_internal

// Element i of `bytes` (kDType elements) as a float.
template <int kDType>
inline float LoadElement(const char* bytes, int64_t i) {
  if constexpr (kDType == DTYPE_F32) {
    float value;
    std::memcpy(&value, bytes + i * 4, sizeof(value));
    return value;
  } else {
    static_assert(kDType == DTYPE_F16 || kDType == DTYPE_BF16);
    uint16_t bits;
    std::memcpy(&bits, bytes + i * 2, sizeof(bits));
    if constexpr (kDType == DTYPE_F16) {
      return element_internal::HalfBitsToFloat(bits);
    } else {
      return element_internal::BitsToFloat(static_cast<uint32_t>(bits) << 16);
    }
  }
}

// Writes `value` converted to kDType as element i of `bytes`.
template <int kDType>
inline void StoreElement(char* bytes, int64_t i, float value) {
  if constexpr (kDType == DTYPE_F32) {
    std::memcpy(bytes + i * 4, &value, sizeof(value));
  } else {
    static_assert(kDType == DTYPE_F16 || kDType == DTYPE_BF16);
    uint16_t bits;
    if constexpr (kDType == DTYPE_F16) {
      bits = element_internal::FloatToHalfBits(value);
    } else {
      bits = element_internal::FloatToBfloat16Bits(value);
    }
    std::memcpy(bytes + i * 2, &bits, sizeof(bits));
  }
}

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_ELEMENT_LOAD_H_
