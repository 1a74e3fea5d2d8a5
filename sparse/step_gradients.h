// StepGradients: one step of a sync table on one shard: the row gradients
// every worker pushed for the step, summed per id, and which workers have
// pushed. When the last worker's push arrives, TakeMean gives the step's
// ids in increasing order with the mean of their gradients over the
// workers, which the table applies once: so N sync workers update a row
// as one process does on the union of their batches (a row named by one
// worker only gets its gradient / N, as a mean over the union would).
//
//   StepGradients step(/*dim=*/16, /*num_workers=*/2);
//   step.Add(0, ids0, grads0);
//   step.Add(1, ids1, grads1);
//   if (step.complete()) step.TakeMean(&ids, &grads);  // and a new step
//
// Memory: one id and dim floats per distinct id pushed in the step (no
// more than the pushes themselves hold). Thread-compatible.
#ifndef SHARDTRAIN_SPARSE_STEP_GRADIENTS_H_
#define SHARDTRAIN_SPARSE_STEP_GRADIENTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shardtrain::sparse {

class StepGradients {
 public:
  // REQUIRES: dim >= 1, num_workers >= 1.
  StepGradients(int32_t dim, int num_workers);

  int num_workers() const { return num_workers_; }
  // Whether `worker` (in [0, num_workers)) has pushed this step.
  bool arrived(int worker) const { return arrived_[static_cast<size_t>(worker)]; }
  int arrivals() const { return arrivals_; }
  bool complete() const { return arrivals_ == num_workers_; }
  // Distinct ids pushed so far in this step.
  int64_t rows() const { return static_cast<int64_t>(ids_.size()); }

  // Adds `worker`'s push: dim gradient floats per id at grads.
  // REQUIRES: !arrived(worker); ids unique.
  void Add(int worker, absl::Span<const uint64_t> ids, const float* grads);

  // The step's ids, increasing, and the mean of each one's gradients over
  // num_workers (dim floats per id); then starts the next step, empty.
  void TakeMean(std::vector<uint64_t>* ids, std::vector<float>* grads);

  // Forgets the step's pushes.
  void Clear();

  // The step so far, for a joining replica: its ids (8 bytes each) then
  // their sums (dim floats each), little-endian, in the order they came,
  // and the workers that pushed, increasing. Import of Export's output
  // gives a step that sums on bit for bit.
  void Export(std::string* ids_and_sums, std::vector<uint32_t>* arrived) const;
  // Replaces the step with an exported one. INVALID_ARGUMENT, with nothing
  // changed, for bytes that are not whole (id, sums) entries, a repeated
  // id, a non-finite sum, or a worker outside [0, num_workers) or named
  // twice.
  absl::Status Import(absl::string_view ids_and_sums, absl::Span<const uint32_t> arrived);

 private:
  const int32_t dim_;
  const int num_workers_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;  // id -> position in ids_
  std::vector<uint64_t> ids_;
  std::vector<float> sums_;  // dim per id of ids_
  std::vector<bool> arrived_;
  int arrivals_ = 0;
};

}  // namespace shardtrain::sparse

#endif  // SHARDTRAIN_SPARSE_STEP_GRADIENTS_H_
