// Loads one little-endian element of a wire dtype from possibly unaligned
// memory as a float. memcpy keeps unaligned loads defined behaviour and
// compiles to a plain load, so loops over these vectorise.
//
//   for (int64_t i = 0; i < n; ++i) sum += LoadElement<DTYPE_F32>(bytes, i);
#ifndef SHARDTRAIN_COMMON_WIRE_ELEMENT_LOAD_H_
#define SHARDTRAIN_COMMON_WIRE_ELEMENT_LOAD_H_

#include <cstdint>
#include <cstring>

#include "common/payload.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::wire {

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
    if constexpr (kDType == DTYPE_F16) return common::HalfToFloat(bits);
    return common::Bfloat16ToFloat(bits);
  }
}

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_COMMON_WIRE_ELEMENT_LOAD_H_
