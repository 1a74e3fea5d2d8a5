#include "sparse/row_index.h"

#include <utility>

namespace shardtrain::sparse {

size_t RowIndex::SlotsFor(size_t entries) {
  const size_t slots = entries + entries / 7 + 1;  // entries <= 7/8 slots
  return slots < 16 ? 16 : slots;
}

RowIndex::RowIndex(size_t expected)
    : buffer_(SlotsFor(expected) * sizeof(uint64_t)), slot_count_(SlotsFor(expected)) {}

void RowIndex::Place(uint64_t slot) {
  size_t i = Home(static_cast<uint32_t>(slot >> 32));
  while (slots()[i] != 0) i = Next(i);
  slots()[i] = slot;
}

void RowIndex::Insert(uint64_t hash, uint32_t row) {
  if ((size_ + 1) * 8 > slot_count_ * 7) Grow();
  Place((hash & 0xffffffff00000000ULL) | (static_cast<uint64_t>(row) + 1));
  ++size_;
}

void RowIndex::EraseAt(size_t i) {
  // Backward shift: pull later entries of the run into the hole unless
  // their home lies cyclically in (hole, their slot].
  size_t hole = i;
  for (size_t j = Next(i);; j = Next(j)) {
    const uint64_t s = slots()[j];
    if (s == 0) break;
    const size_t home = Home(static_cast<uint32_t>(s >> 32));
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    slots()[hole] = s;
    hole = j;
  }
  slots()[hole] = 0;
  --size_;
}

void RowIndex::Grow() {
  HugePageBuffer old = std::exchange(buffer_, HugePageBuffer(slot_count_ * 2 * sizeof(uint64_t)));
  const size_t old_count = std::exchange(slot_count_, slot_count_ * 2);
  const uint64_t* from = old.as<uint64_t>();
  for (size_t i = 0; i < old_count; ++i) {
    if (from[i] != 0) Place(from[i]);
  }
}

}  // namespace shardtrain::sparse
