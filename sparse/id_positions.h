// IdPositions: the first position of each id in a batch of ids, for
// deduplicating a batch (the client: unique ids and an inverse index) and
// for refusing a push that names an id twice (the shard). An
// open-addressing table of (id, position) that keeps its memory from batch
// to batch and forgets a batch by bumping a stamp, so a batch costs neither
// an allocation nor a clear: what a fresh hash map per batch pays in page
// faults on a 64k-id batch.
//
//   IdPositions positions;
//   positions.Reset(ids.size());
//   for (size_t i = 0; i < ids.size(); ++i) {
//     auto [first, fresh] = positions.Insert(ids[i], unique.size());
//     if (fresh) unique.push_back(ids[i]);
//     inverse[i] = first;
//   }
//
// Memory: 16 bytes per slot, at least twice the largest batch's ids.
// Thread-compatible.
#ifndef SHARDTRAIN_SPARSE_ID_POSITIONS_H_
#define SHARDTRAIN_SPARSE_ID_POSITIONS_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace shardtrain::sparse {

// Whether ids[i] < ids[i + 1] for every i: then no id repeats, and a batch
// needs no IdPositions (sorted unique batches, as torch.unique makes them,
// are checked in one sequential pass).
bool StrictlyIncreasing(absl::Span<const uint64_t> ids);

class IdPositions {
 public:
  // Starts a batch of at most max_ids Inserts.
  void Reset(size_t max_ids);

  // The position given with id's first Insert since Reset, and whether this
  // is that first Insert (then `position` is recorded).
  std::pair<uint32_t, bool> Insert(uint64_t id, uint32_t position);

 private:
  struct Slot {
    uint64_t id;
    uint32_t position;
    uint32_t stamp;  // the batch that wrote it; other batches' are empty
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  uint32_t stamp_ = 0;
};

}  // namespace shardtrain::sparse

#endif  // SHARDTRAIN_SPARSE_ID_POSITIONS_H_
