// Reading tensor payloads where they lie in received slices.
//
// A dense payload of n elements of a dtype is n * DTypeSize(dtype) bytes in
// any number of pieces, split at arbitrary bytes and at arbitrary
// alignment. These helpers check a payload and hand its elements to a
// consumer in runs of whole elements, so the consumer (an optimizer
// update, a copy into a model tensor) makes one pass over the bytes as
// received. Elements are little-endian and may be unaligned: consumers load
// them with memcpy (wire/element_load.h), which compiles to plain
// (vector) loads. All functions are thread-safe.
//
//   RETURN_IF_ERROR(CheckDense(part.grad, n));
//   RETURN_IF_ERROR(CheckFinite(part.grad));
//   ForEachRun(part.grad.data, 4, [&](int64_t first, const char* bytes,
//                                     int64_t count) { ... });
#ifndef SHARDTRAIN_WIRE_PAYLOAD_PIECES_H_
#define SHARDTRAIN_WIRE_PAYLOAD_PIECES_H_

#include <cstdint>
#include <cstring>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "wire/message_views.h"

namespace shardtrain::wire {

// OK when `payload` is a dense payload of exactly `elements` elements of a
// known dtype (no indices); INVALID_ARGUMENT naming the difference.
absl::Status CheckDense(const PayloadView& payload, int64_t elements);

// Calls `run(first, bytes, count)` for consecutive runs of whole elements of
// `data`, `element_size` bytes each, in order: `first` is the index of the
// run's first element, `bytes` its (possibly unaligned) encoded elements.
// An element split across two pieces is passed as a run of one from a
// small buffer. REQUIRES: data.size() % element_size == 0.
void ForEachRun(const ReceivedBytes& data, int element_size,
                absl::FunctionRef<void(int64_t first, const char* bytes,
                                       int64_t count)> run);

// INVALID_ARGUMENT naming the first NaN or Inf among the elements of a
// dense payload (REQUIRES: CheckDense ok). One vectorised read.
absl::Status CheckFinite(const PayloadView& dense);

// Decodes `payload` (dense or sparse, any dtype) into `out` in one pass
// over its bytes; elements a sparse payload does not name become zero and
// a sparse index named twice gets the sum of its values. Checks every size
// and index first: on error `out` is unchanged.
absl::Status DecodeInto(const PayloadView& payload, absl::Span<float> out);

// out[i] += element i of a dense payload (a sync step's accumulator), in
// one vectorised pass. REQUIRES: CheckDense(dense, out.size()) ok.
void AddInto(const PayloadView& dense, absl::Span<float> out);

// Writes `values` converted to `dtype` to `out` (values.size() *
// DTypeSize(dtype) bytes, any alignment), as common::EncodeDense would.
// REQUIRES: DTypeSize(dtype) > 0.
void EncodeElements(absl::Span<const float> values, int dtype, char* out);

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_PAYLOAD_PIECES_H_
