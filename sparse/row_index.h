// RowIndex: the map from a table's ids to the rows that hold them, an open
// addressing table of 8-byte slots: the top 32 bits of the id's hash (its
// fingerprint) beside the row number. The row's record holds the id itself,
// so a fingerprint match is confirmed by the caller's id_of(row). Linear
// probing with backward-shift deletion (no tombstones); a slot's home is
// computed from its fingerprint alone, so growing and deleting never reread
// a record. Any slot count works (Lemire's multiply-shift reduction), so the
// index can be sized to a table's capacity exactly: 8 / 0.875 = 9.1 bytes
// per row at the highest load. The slots live on huge pages
// (sparse/huge_page_buffer.h): a probe at 10^7 rows is a cache miss, and
// should not also be a TLB miss.
//
// Lookups in batches should Prefetch(hash) a few ids ahead: at 10^7 rows
// nearly every probe is a cache miss, and the prefetches overlap them.
// Not thread-safe: the owner serialises calls.
#ifndef SHARDTRAIN_SPARSE_ROW_INDEX_H_
#define SHARDTRAIN_SPARSE_ROW_INDEX_H_

#include <cstddef>
#include <cstdint>

#include "sparse/huge_page_buffer.h"

namespace shardtrain::sparse {

class RowIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  // Slots for at least `expected` entries at the highest load.
  explicit RowIndex(size_t expected = 0);

  void Prefetch(uint64_t hash) const { __builtin_prefetch(&slots()[Home(hash >> 32)]); }

  // The row of id (hash: its hash), or kNone. id_of(row) returns the id
  // that row holds.
  template <typename IdOf>
  uint32_t Find(uint64_t id, uint64_t hash, const IdOf& id_of) const {
    const uint32_t fp = static_cast<uint32_t>(hash >> 32);
    size_t i = Home(fp);
    for (;;) {
      const uint64_t s = slots()[i];
      if (s == 0) return kNone;
      if (static_cast<uint32_t>(s >> 32) == fp) {
        const uint32_t row = static_cast<uint32_t>(s) - 1;
        if (id_of(row) == id) return row;
      }
      i = Next(i);
    }
  }

  // The row of the first entry whose fingerprint matches hash, unconfirmed
  // (kNone when none): what a batch prefetches the record of before Find.
  uint32_t Candidate(uint64_t hash) const {
    const uint32_t fp = static_cast<uint32_t>(hash >> 32);
    for (size_t i = Home(fp);; i = Next(i)) {
      const uint64_t s = slots()[i];
      if (s == 0) return kNone;
      if (static_cast<uint32_t>(s >> 32) == fp) return static_cast<uint32_t>(s) - 1;
    }
  }

  // REQUIRES: the id of hash is not in the index; row < kNone.
  void Insert(uint64_t hash, uint32_t row);

  // Removes id's entry; false when absent.
  template <typename IdOf>
  bool Erase(uint64_t id, uint64_t hash, const IdOf& id_of) {
    const uint32_t fp = static_cast<uint32_t>(hash >> 32);
    for (size_t i = Home(fp);; i = Next(i)) {
      const uint64_t s = slots()[i];
      if (s == 0) return false;
      if (static_cast<uint32_t>(s >> 32) == fp && id_of(static_cast<uint32_t>(s) - 1) == id) {
        EraseAt(i);
        return true;
      }
    }
  }

  size_t size() const { return size_; }
  size_t slot_count() const { return slot_count_; }
  int64_t bytes() const { return static_cast<int64_t>(slot_count_ * sizeof(uint64_t)); }

 private:
  // Highest load: 7/8 of the slots.
  static size_t SlotsFor(size_t entries);

  size_t Home(uint32_t fp) const {
    return static_cast<size_t>((static_cast<uint64_t>(fp) * slot_count_) >> 32);
  }
  size_t Next(size_t i) const { return i + 1 == slot_count_ ? 0 : i + 1; }
  uint64_t* slots() { return buffer_.as<uint64_t>(); }
  const uint64_t* slots() const { return buffer_.as<uint64_t>(); }
  void Place(uint64_t slot);
  void EraseAt(size_t i);
  void Grow();

  // slot_count_ slots, each 0 (empty) or fingerprint << 32 | row + 1.
  HugePageBuffer buffer_;
  size_t slot_count_ = 0;
  size_t size_ = 0;
};

}  // namespace shardtrain::sparse

#endif  // SHARDTRAIN_SPARSE_ROW_INDEX_H_
