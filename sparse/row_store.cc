#include "sparse/row_store.h"

#include <algorithm>
#include <functional>

namespace shardtrain::sparse {

RowStore::RowStore(int32_t record_words) : words_(record_words) {}

uint32_t RowStore::Allocate() {
  uint32_t row;
  if (!free_.empty()) {
    std::pop_heap(free_.begin(), free_.end(), std::greater<uint32_t>());
    row = free_.back();
    free_.pop_back();
  } else {
    row = end_++;
    if ((row >> kChunkBits) >= chunks_.size()) {
      // Default-initialised: pages are touched only as records are written.
      chunks_.emplace_back(new uint32_t[static_cast<size_t>(words_) << kChunkBits]);
    }
    if ((row >> 6) >= live_.size()) live_.push_back(0);
  }
  live_[row >> 6] |= uint64_t{1} << (row & 63);
  ++rows_;
  return row;
}

void RowStore::Free(uint32_t row) {
  live_[row >> 6] &= ~(uint64_t{1} << (row & 63));
  free_.push_back(row);
  std::push_heap(free_.begin(), free_.end(), std::greater<uint32_t>());
  --rows_;
}

int64_t RowStore::bytes() const {
  return static_cast<int64_t>(chunks_.size()) * (int64_t{words_} << kChunkBits) * 4 +
         static_cast<int64_t>(live_.capacity() * 8 + free_.capacity() * 4);
}

}  // namespace shardtrain::sparse
