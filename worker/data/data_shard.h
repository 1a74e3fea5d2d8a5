// DataShard: one worker's share of a dataset, and its batches.
//
// All workers derive the same global permutation of the N examples from a
// shared seed; worker i of W takes the i-th contiguous block of it (block
// sizes differ by at most one, blocks are disjoint and cover all N). Each
// epoch the worker shuffles its own block again, deterministically from
// (seed, epoch, worker index), so a restarted worker replays the same order.
// Every worker runs StepsPerEpoch(batch) steps, computed from floor(N / W),
// so synchronous workers agree on the number of steps even when their blocks
// differ in size; the few examples left over in an epoch are skipped.
//
// The permutations use std::mt19937_64 (whose output the C++ standard fixes)
// and a hand-written Fisher-Yates shuffle, not std::shuffle or absl::random,
// whose results may differ between standard libraries or Abseil releases;
// workers built differently must still agree on the blocks.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<DataShard> shard,
//                    DataShard::Create(train.num_examples, rank, world, seed));
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     shard->BeginEpoch(epoch);
//     for (int s = 0; s < shard->StepsPerEpoch(batch); ++s)
//       RETURN_IF_ERROR(shard->NextBatch(train, batch, x, labels));
//   }
#ifndef SHARDTRAIN_WORKER_DATA_DATA_SHARD_H_
#define SHARDTRAIN_WORKER_DATA_DATA_SHARD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace shardtrain::worker {

// Thread-compatible.
class DataShard {
 public:
  // INVALID_ARGUMENT unless num_examples >= 0, num_workers >= 1 and
  // 0 <= worker_index < num_workers.
  static absl::StatusOr<std::unique_ptr<DataShard>> Create(int num_examples,
                                                           int worker_index,
                                                           int num_workers,
                                                           uint64_t seed);

  // floor(floor(num_examples / num_workers) / batch): the same for every
  // worker. Returns 0 if batch < 1.
  int StepsPerEpoch(int batch) const;

  // Starts epoch `epoch`: reorders this worker's examples as a function of
  // (seed, epoch, worker index) only, and rewinds to the first batch.
  void BeginEpoch(int epoch);

  // Moves to the `batch_index`-th batch of `batch` examples of the current
  // epoch, where a run that never stopped would be after batch_index calls
  // to NextBatch(..., batch, ...). FAILED_PRECONDITION before the first
  // BeginEpoch; INVALID_ARGUMENT if batch < 1 or batch_index < 0;
  // OUT_OF_RANGE past the end of this worker's block.
  absl::Status Seek(int batch_index, int batch);

  // Copies the next `batch` examples of this epoch into x (batch *
  // dataset.feature_dim floats) and labels (batch values).
  // FAILED_PRECONDITION before the first BeginEpoch; INVALID_ARGUMENT if
  // batch < 1, a pointer is null or dataset.num_examples differs from
  // num_examples(); OUT_OF_RANGE when fewer than `batch` examples are left in
  // this epoch.
  absl::Status NextBatch(const Dataset& dataset, int batch, float* x,
                         int32_t* labels);

  int num_examples() const { return num_examples_; }
  int worker_index() const { return worker_index_; }
  int num_workers() const { return num_workers_; }
  // The examples this worker owns, in the current epoch's order (before the
  // first BeginEpoch: in global-permutation order).
  const std::vector<int>& indices() const { return order_; }

 private:
  DataShard(int num_examples, int worker_index, int num_workers, uint64_t seed,
            std::vector<int> block);

  const int num_examples_;
  const int worker_index_;
  const int num_workers_;
  const uint64_t seed_;
  const std::vector<int> block_;  // This worker's block of the permutation.
  std::vector<int> order_;        // block_, shuffled for the current epoch.
  bool epoch_started_ = false;
  size_t cursor_ = 0;  // Next position in order_.
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DATA_DATA_SHARD_H_
