#include "sparse/id_positions.h"

#include <algorithm>

#include "sparse/id_hash.h"

namespace shardtrain::sparse {

bool StrictlyIncreasing(absl::Span<const uint64_t> ids) {
  for (size_t i = 1; i < ids.size(); ++i) {
    if (ids[i] <= ids[i - 1]) return false;
  }
  return true;
}

void IdPositions::Reset(size_t max_ids) {
  size_t size = 16;
  while (size < 2 * max_ids) size *= 2;
  if (size > slots_.size()) {
    slots_.assign(size, Slot{0, 0, 0});
    stamp_ = 0;
  }
  mask_ = slots_.size() - 1;
  if (++stamp_ == 0) {  // wrapped: slots of 2^32 batches ago would look live
    for (Slot& slot : slots_) slot.stamp = 0;
    stamp_ = 1;
  }
}

std::pair<uint32_t, bool> IdPositions::Insert(uint64_t id, uint32_t position) {
  for (size_t i = Mix64(id) & mask_;; i = (i + 1) & mask_) {
    Slot& slot = slots_[i];
    if (slot.stamp != stamp_) {
      slot = Slot{id, position, stamp_};
      return {position, true};
    }
    if (slot.id == id) return {slot.position, false};
  }
}

}  // namespace shardtrain::sparse
