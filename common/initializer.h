// Deterministic parameter initialisation.
//
// Element i of a tensor gets a value that depends only on (seed, tensor name,
// i), from a counter-based generator. A shard can therefore initialise just
// the partitions it holds, and any number of shards produce the same tensor
// as a single process would. KIND_VALUES takes element i from the spec's
// `values` (the model's own initialisation, sent by worker 0). Thread-safe.
//
//   RETURN_IF_ERROR(ValidateTensorSpec(spec));
//   FillInitialValues(spec, range.offset, absl::MakeSpan(params));
#ifndef SHARDTRAIN_COMMON_INITIALIZER_H_
#define SHARDTRAIN_COMMON_INITIALIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::common {

// INVALID_ARGUMENT unless `spec` names a tensor with a positive shape, a
// known dtype and an initialiser that fits the shape. `values` must be empty
// unless the kind is KIND_VALUES, and then empty or exactly the tensor's
// f32 bytes, all finite (empty: the values come from elsewhere, see
// FillInitialValues).
absl::Status ValidateTensorSpec(const TensorSpec& spec);

// True if `a` and `b` describe the same tensor: equal in every field but
// `values` (which a store does not keep).
bool SameTensorSpec(const TensorSpec& a, const TensorSpec& b);

// `spec` without its `values`, copied without touching them.
TensorSpec WithoutValues(const TensorSpec& spec);

// Number of elements of a validated spec.
int64_t NumElements(const TensorSpec& spec);

// Writes elements [offset, offset + out.size()) of the initialised tensor.
// KIND_VALUES with empty `values` writes zeros (for partitions whose state
// is restored right after, from a checkpoint or a chain peer).
// REQUIRES: ValidateTensorSpec(spec).ok().
void FillInitialValues(const TensorSpec& spec, int64_t offset,
                       absl::Span<float> out);

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_INITIALIZER_H_
