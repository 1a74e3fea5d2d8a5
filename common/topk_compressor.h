// TopKCompressor: top-k sparsification of gradients with error feedback.
//
// For each partition a worker sends only the k entries of largest magnitude
// of (gradient + residual), as a sparse payload (uint32 indices + values),
// and keeps everything it did not send -- the other entries and the
// rounding of the sent ones to the wire dtype -- as the partition's
// residual, added to the next step's gradient. Nothing is dropped, only
// delayed, which is what keeps SGD converging at 1-10% density (Stich et
// al., "Sparsified SGD with Memory", 2018; Lin et al., "Deep Gradient
// Compression", 2018). k = max(1, ceil(ratio * partition size)).
//
// Thread-safety: Encode calls for different partitions may run
// concurrently (each touches only its partition's residual); calls for the
// same partition must not.
//
// Example:
//   ASSIGN_OR_RETURN(TopKCompressor topk,
//                    TopKCompressor::Create(0.01, {16384, 16384, 300}));
//   Payload payload;
//   topk.Encode(/*partition=*/0, grad_of_partition_0, DTYPE_F32, &payload);
#ifndef SHARDTRAIN_COMMON_TOPK_COMPRESSOR_H_
#define SHARDTRAIN_COMMON_TOPK_COMPRESSOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::common {

class TopKCompressor {
 public:
  // INVALID_ARGUMENT unless 0 < ratio <= 1.
  static absl::StatusOr<TopKCompressor> Create(double ratio,
                                               const std::vector<int64_t>& partition_sizes);

  // Entries sent for a partition of `size` elements.
  int64_t KeptFor(int64_t size) const;

  // Writes the top-k of grad + residual[partition] into `out` (sparse, in
  // `dtype`, indices ascending) and keeps the rest as the new residual.
  // REQUIRES: partition < the number of partitions; grad.size() equals its
  // size; DTypeSize(dtype) > 0.
  void Encode(size_t partition, absl::Span<const float> grad, DType dtype, Payload* out);

  // What partition `partition` still owes (for tests and checkpoints).
  absl::Span<const float> residual(size_t partition) const { return residuals_[partition]; }

 private:
  TopKCompressor(double ratio, const std::vector<int64_t>& partition_sizes);
  // The k-th largest magnitude of the partition's residual (k >= 1), and in
  // *above how many are larger.
  float Threshold(size_t partition, size_t k, size_t* above);

  double ratio_;
  std::vector<std::vector<float>> residuals_;
  // Per partition, reused every step: magnitudes for the selection, the
  // indices and the values sent.
  std::vector<std::vector<float>> magnitudes_;
  std::vector<std::vector<uint32_t>> selected_;
  std::vector<std::vector<float>> values_;
};

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_TOPK_COMPRESSOR_H_
