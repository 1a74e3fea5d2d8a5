#include "sparse/row_index.h"

#include <utility>

namespace shardtrain::sparse {

size_t RowIndex::SlotsFor(size_t entries) {
  const size_t slots = entries + entries / 7 + 1;  // entries <= 7/8 slots
  return slots < 16 ? 16 : slots;
}

RowIndex::RowIndex(size_t expected) : slots_(SlotsFor(expected), 0) {}

void RowIndex::Place(uint64_t slot) {
  size_t i = Home(static_cast<uint32_t>(slot >> 32));
  while (slots_[i] != 0) i = Next(i);
  slots_[i] = slot;
}

void RowIndex::Insert(uint64_t hash, uint32_t row) {
  if ((size_ + 1) * 8 > slots_.size() * 7) Grow();
  Place((hash & 0xffffffff00000000ULL) | (static_cast<uint64_t>(row) + 1));
  ++size_;
}

void RowIndex::EraseAt(size_t i) {
  // Backward shift: pull later entries of the run into the hole unless
  // their home lies cyclically in (hole, their slot].
  size_t hole = i;
  for (size_t j = Next(i);; j = Next(j)) {
    const uint64_t s = slots_[j];
    if (s == 0) break;
    const size_t home = Home(static_cast<uint32_t>(s >> 32));
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    slots_[hole] = s;
    hole = j;
  }
  slots_[hole] = 0;
  --size_;
}

void RowIndex::Grow() {
  std::vector<uint64_t> old(slots_.size() * 2, 0);
  std::swap(old, slots_);
  for (uint64_t s : old) {
    if (s != 0) Place(s);
  }
}

}  // namespace shardtrain::sparse
