// CountingFilter: approximate per-id counts in 4 bits per counter (a
// count-min sketch with conservative update), so an admission threshold
// can keep rare ids from ever taking a row without storing anything per id.
// An id's estimate never undercounts it; ids that share all their counters
// are overcounted together. Counts saturate at 15. Not thread-safe: the
// owner serialises calls.
#ifndef SHARDTRAIN_SPARSE_COUNTING_FILTER_H_
#define SHARDTRAIN_SPARSE_COUNTING_FILTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardtrain::sparse {

class CountingFilter {
 public:
  static constexpr int kMaxCount = 15;

  // counters: rounded up to a power of two, >= 64. Uses counters / 2 bytes.
  explicit CountingFilter(int64_t counters);

  // Counts one more occurrence of id; returns its estimate after it.
  int Add(uint64_t id);
  int Estimate(uint64_t id) const;

  int64_t bytes() const { return static_cast<int64_t>(words_.size()) * 8; }

  // The counters as bytes() little-endian bytes, appended to out (for
  // checkpoints: a restarted shard goes on counting where it stopped).
  void Export(std::string* out) const;
  // Replaces the counters with Export's bytes. INVALID_ARGUMENT, with
  // nothing changed, when their size is not bytes().
  absl::Status Import(absl::string_view counters) {
    return ImportPiece(counters, 0, static_cast<int64_t>(counters.size()));
  }
  // Replaces the counters at [offset, offset + piece.size()) of Export's
  // `total` bytes with `piece`, so that a filter larger than a message can
  // travel in pieces. INVALID_ARGUMENT, with nothing changed, unless
  // PieceFits.
  absl::Status ImportPiece(absl::string_view piece, int64_t offset, int64_t total);
  // Whether `piece` bytes at `offset` of an export of `total` bytes fit
  // this filter: total is bytes() and the piece lies within it.
  bool PieceFits(int64_t piece, int64_t offset, int64_t total) const {
    return total == bytes() && offset >= 0 && piece >= 0 && offset <= total - piece;
  }

 private:
  static constexpr int kHashes = 3;

  void Positions(uint64_t id, uint64_t* pos) const;
  int Get(uint64_t pos) const;
  void Set(uint64_t pos, int value);

  uint64_t mask_;
  std::vector<uint64_t> words_;  // 16 counters per word
};

}  // namespace shardtrain::sparse

#endif  // SHARDTRAIN_SPARSE_COUNTING_FILTER_H_
