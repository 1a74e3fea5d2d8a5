// RowStore: the records of a table's rows, fixed-size arrays of 32-bit
// words in chunks of a power of two records, each chunk a whole number of
// 2 MiB huge pages (sparse/huge_page_buffer.h; growing never moves a record
// and pages are touched only as rows arrive), with a free list for evicted
// rows and a bitmap of the rows in use. Row numbers are dense and reused lowest-freed
// first, so replicas that apply the same operations in the same order hold
// every row at the same number. Not thread-safe: the owner serialises calls.
#ifndef SHARDTRAIN_SPARSE_ROW_STORE_H_
#define SHARDTRAIN_SPARSE_ROW_STORE_H_

#include <cstdint>
#include <vector>

#include "sparse/huge_page_buffer.h"

namespace shardtrain::sparse {

class RowStore {
 public:
  explicit RowStore(int32_t record_words);

  // A free record's row number (its words are unspecified).
  uint32_t Allocate();
  void Free(uint32_t row);

  uint32_t* Record(uint32_t row) {
    return chunks_[row >> chunk_bits_].as<uint32_t>() +
           static_cast<size_t>(row & chunk_mask_) * words_;
  }
  const uint32_t* Record(uint32_t row) const {
    return chunks_[row >> chunk_bits_].as<uint32_t>() +
           static_cast<size_t>(row & chunk_mask_) * words_;
  }
  // Both cache lines a record may span (80 bytes at dim 16, f32).
  void Prefetch(uint32_t row) const {
    const uint32_t* record = Record(row);
    __builtin_prefetch(record);
    __builtin_prefetch(record + words_ - 1);
  }

  bool InUse(uint32_t row) const {
    return row < end_ && ((live_[row >> 6] >> (row & 63)) & 1) != 0;
  }
  // Rows in use lie below end().
  uint32_t end() const { return end_; }
  int64_t rows() const { return rows_; }
  int32_t record_words() const { return words_; }
  // Records per chunk.
  uint32_t chunk_records() const { return chunk_mask_ + 1; }
  // Bytes in use: the records up to end(), the bitmap and the free list.
  // The chunks' pages past end() are address space only, but for the rest
  // of the huge page (at most 2 MiB) end() is in.
  int64_t bytes() const;

 private:
  int32_t words_;
  int chunk_bits_;
  uint32_t chunk_mask_;
  std::vector<HugePageBuffer> chunks_;
  std::vector<uint64_t> live_;
  std::vector<uint32_t> free_;  // a min-heap: lowest row first
  uint32_t end_ = 0;
  int64_t rows_ = 0;
};

}  // namespace shardtrain::sparse

#endif  // SHARDTRAIN_SPARSE_ROW_STORE_H_
