#include "sparse/row_store.h"

#include <algorithm>
#include <functional>

namespace shardtrain::sparse {

namespace {

// log2 of the records per chunk: the fewest that fill whole 2 MiB pages
// (2 MiB x the odd part of the record's words, e.g. 10 MiB of 80-byte
// records), so that no chunk ends in a huge page it only partly uses; for
// records whose odd part is large (chunks over 512 MiB) about 64 MiB a
// chunk, where the last page's padding is at most 3%.
int ChunkBits(int32_t words) {
  const uint32_t w = static_cast<uint32_t>(words);
  const int exact = 19 - std::min(__builtin_ctz(w), 19);
  if ((uint64_t{w} * 4 << exact) <= (uint64_t{512} << 20)) return exact;
  int bits = 0;
  while ((uint64_t{w} * 4 << bits) < (uint64_t{64} << 20)) ++bits;
  return bits;
}

}  // namespace

RowStore::RowStore(int32_t record_words)
    : words_(record_words),
      chunk_bits_(ChunkBits(record_words)),
      chunk_mask_((uint32_t{1} << chunk_bits_) - 1) {}

uint32_t RowStore::Allocate() {
  uint32_t row;
  if (!free_.empty()) {
    std::pop_heap(free_.begin(), free_.end(), std::greater<uint32_t>());
    row = free_.back();
    free_.pop_back();
  } else {
    row = end_++;
    if ((row >> chunk_bits_) >= chunks_.size()) {
      // Address space: pages are touched only as records are written.
      chunks_.emplace_back(static_cast<size_t>(words_) * 4 << chunk_bits_);
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
  return int64_t{end_} * words_ * 4 +
         static_cast<int64_t>(live_.capacity() * 8 + free_.capacity() * 4);
}

}  // namespace shardtrain::sparse
