#include "sparse/counting_filter.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

#include "sparse/id_hash.h"

namespace shardtrain::sparse {

CountingFilter::CountingFilter(int64_t counters) {
  uint64_t n = 64;
  while (n < static_cast<uint64_t>(counters)) n <<= 1;
  mask_ = n - 1;
  words_.assign(n / 16, 0);
}

void CountingFilter::Positions(uint64_t id, uint64_t* pos) const {
  // Kirsch-Mitzenmacher: k positions from two halves of one mixed hash.
  const uint64_t h = Mix64(id ^ 0x5bd1e9955bd1e995ULL);
  const uint64_t h1 = h & 0xffffffffULL;
  const uint64_t h2 = (h >> 32) | 1;
  for (int i = 0; i < kHashes; ++i) pos[i] = (h1 + i * h2 * 0x9e3779b1ULL) & mask_;
}

int CountingFilter::Get(uint64_t pos) const {
  return static_cast<int>((words_[pos >> 4] >> ((pos & 15) * 4)) & 15);
}

void CountingFilter::Set(uint64_t pos, int value) {
  const int shift = static_cast<int>((pos & 15) * 4);
  uint64_t& w = words_[pos >> 4];
  w = (w & ~(uint64_t{15} << shift)) | (static_cast<uint64_t>(value) << shift);
}

int CountingFilter::Add(uint64_t id) {
  uint64_t pos[kHashes];
  Positions(id, pos);
  int low = kMaxCount;
  for (uint64_t p : pos) low = std::min(low, Get(p));
  if (low == kMaxCount) return low;
  // Conservative update: only the counters at the minimum grow.
  for (uint64_t p : pos) {
    if (Get(p) == low) Set(p, low + 1);
  }
  return low + 1;
}

int CountingFilter::Estimate(uint64_t id) const {
  uint64_t pos[kHashes];
  Positions(id, pos);
  int low = kMaxCount;
  for (uint64_t p : pos) low = std::min(low, Get(p));
  return low;
}

void CountingFilter::Export(std::string* out) const {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "counters are stored little-endian");
  out->append(reinterpret_cast<const char*>(words_.data()), words_.size() * 8);
}

absl::Status CountingFilter::ImportPiece(absl::string_view piece, int64_t offset,
                                         int64_t total) {
  const int64_t size = static_cast<int64_t>(piece.size());
  if (!PieceFits(size, offset, total)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an admission filter of ", total, " bytes (a piece of ", size, " at ", offset,
        "); this table's has ", bytes()));
  }
  std::memcpy(reinterpret_cast<char*>(words_.data()) + offset, piece.data(), piece.size());
  return absl::OkStatus();
}

}  // namespace shardtrain::sparse
