// Deterministic parameter initialisation.
//
// Element i of a tensor gets a value that depends only on (seed, tensor name,
// i), from a counter-based generator. A shard can therefore initialise just
// the partitions it holds, and any number of shards produce the same tensor
// as a single process would. Thread-safe.
#ifndef SHARDTRAIN_COMMON_INITIALIZER_H_
#define SHARDTRAIN_COMMON_INITIALIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::common {

// INVALID_ARGUMENT unless `spec` names a tensor with a positive shape, a
// known dtype and an initialiser that fits the shape.
absl::Status ValidateTensorSpec(const TensorSpec& spec);

// Number of elements of a validated spec.
int64_t NumElements(const TensorSpec& spec);

// Writes elements [offset, offset + out.size()) of the initialised tensor.
// REQUIRES: ValidateTensorSpec(spec).ok().
void FillInitialValues(const TensorSpec& spec, int64_t offset,
                       absl::Span<float> out);

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_INITIALIZER_H_
