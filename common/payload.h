// Encoding and decoding of tensor payloads on the wire.
//
// A payload is raw little-endian bytes with a dtype (f32, f16, bf16) and an
// encoding (dense, or sparse: uint32 indices plus values). Decoding checks
// every size and index before it writes, and reports bad input as
// INVALID_ARGUMENT with a message that names what was wrong. All functions
// are thread-safe.
//
//   std::string bytes;
//   EncodeDense(values, DTYPE_F32, &bytes);
//   RETURN_IF_ERROR(DecodeDense(DTYPE_F32, bytes, absl::MakeSpan(out)));
#ifndef SHARDTRAIN_COMMON_PAYLOAD_H_
#define SHARDTRAIN_COMMON_PAYLOAD_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::common {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "payloads are little-endian; big-endian hosts need byte swaps");

// Bytes per element, or 0 for an unknown or unspecified dtype.
int DTypeSize(int dtype);

// A request's dtype field as its payload's dtype: unspecified (0) is f32;
// others as they are (DTypeSize says whether they are known).
inline DType PayloadDType(int dtype) {
  return dtype == DTYPE_UNSPECIFIED ? DTYPE_F32 : static_cast<DType>(dtype);
}
const char* DTypeName(int dtype);

// The dtype named "f32", "f16" or "bf16" (as DTypeName names them);
// INVALID_ARGUMENT "must be f32, f16 or bf16, got <name>" otherwise.
absl::StatusOr<DType> ParseDTypeName(absl::string_view name);

// Writes `values` converted to `dtype` into `*out`, reusing its capacity.
// REQUIRES: DTypeSize(dtype) > 0.
void EncodeDense(absl::Span<const float> values, DType dtype, std::string* out);

// The same into out[0, values.size() * DTypeSize(dtype)) (any alignment).
// REQUIRES: DTypeSize(dtype) > 0.
void EncodeDenseInto(absl::Span<const float> values, DType dtype, char* out);

// Decodes a dense payload of exactly out.size() elements into `out`.
absl::Status DecodeDense(int dtype, absl::string_view data,
                         absl::Span<float> out);
// The same, unchecked: data (any alignment) holds out.size() values of
// dtype. REQUIRES: DTypeSize(dtype) > 0.
void DecodeDenseFrom(DType dtype, const char* data, absl::Span<float> out);

// Decodes `payload` (dense or sparse) into `out`, which must be the full
// partition; elements a sparse payload does not name become zero. Fails
// without a partial result visible to the caller's state: callers decode
// into scratch memory, never into parameters.
absl::Status DecodePayload(const Payload& payload, absl::Span<float> out);

// INVALID_ARGUMENT naming the first NaN or Inf in `values`, else OK.
absl::Status CheckFinite(absl::Span<const float> values);

// Conversions used by the codec, exposed for tests and device code.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBfloat16(float f);
float Bfloat16ToFloat(uint16_t b);

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_PAYLOAD_H_
