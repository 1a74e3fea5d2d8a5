#include "sparse/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sparse/id_hash.h"

namespace shardtrain::sparse {
namespace {

// How far ahead of the current id its index slot, then its record, are
// prefetched; kRing holds the hashes in between. With the table on huge
// pages a miss no longer waits for a page walk, so more of them can be in
// flight: 32/16 gave 4.0-4.8x the plain map's lookups and 5.0-6.3x its
// applies at 10^7 rows, where 16/8 gave 3.2-3.7x and 4.3-4.7x, 12/4 2.5x and
// 3.6x, and 48/24 or 64/32 no more (sparse_table_bench, AMD EPYC).
constexpr size_t kSlotAhead = 32;
constexpr size_t kRecordAhead = 16;
constexpr size_t kRing = 64;
static_assert(kRing > kSlotAhead && kSlotAhead > kRecordAhead);
constexpr uint32_t kNone = RowIndex::kNone;

int32_t RecordWords(const TableConfig& config) {
  const int32_t meta = config.eviction.policy == Eviction::Policy::kLfu ? 2 : 1;
  return 2 + ValueWords(config.storage, config.dim) +
         OptimizerStateWords(config.optimizer.kind, config.dim) + meta;
}

// bf16 element j of a row's value words.
uint16_t Bf16At(const uint32_t* words, int32_t j) {
  const uint32_t w = words[j >> 1];
  return static_cast<uint16_t>((j & 1) != 0 ? w >> 16 : w & 0xffff);
}

float WidenBf16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// `f` rounded to bf16 up (in magnitude) with the probability of the 16 bits
// it loses, given 16 random bits: unbiased, E[widened] = f. Finite values
// stay finite (a carry into the largest exponent rounds down instead).
uint16_t RoundBf16(float f, uint32_t random16) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t up = bits + (random16 & 0xffff);
  constexpr uint32_t kExponent = 0x7f800000u;
  // Inf and NaN as they are, and no carry into the largest exponent.
  const bool keep = (bits & kExponent) == kExponent || (up & kExponent) == kExponent;
  return static_cast<uint16_t>((keep ? bits : up) >> 16);
}

bool FiniteBf16(uint16_t b) { return ((b >> 7) & 0xff) != 0xff; }

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(
    const TableConfig& config, const TableLimits& limits) {
  if (absl::Status s = ValidateTableConfig(config, limits); !s.ok()) return s;
  const int64_t capacity = config.eviction.capacity > 0 ? config.eviction.capacity
                                                        : limits.max_rows;
  return std::unique_ptr<EmbeddingTable>(new EmbeddingTable(config, capacity));
}

EmbeddingTable::EmbeddingTable(const TableConfig& config, int64_t capacity)
    : config_(config),
      capacity_(capacity),
      value_words_(ValueWords(config.storage, config.dim)),
      state_words_(OptimizerStateWords(config.optimizer.kind, config.dim)),
      bf16_(config.storage == RowStorage::kBf16),
      scratch_(bf16_ ? static_cast<size_t>(config.dim) : 0),
      lfu_(config.eviction.policy == Eviction::Policy::kLfu),
      salt_(TableSalt(config.name)),
      init_(config.init, config.name, config.dim),
      optimizer_(config.optimizer, config.dim),
      // Sized for the configured capacity, so a full table's index sits at
      // the highest load and never grows.
      index_(config.eviction.capacity > 0 ? static_cast<size_t>(config.eviction.capacity) : 0),
      store_(RecordWords(config)) {
  if (config.admission.kind == Admission::Kind::kCount) {
    filter_ = std::make_unique<CountingFilter>(config.admission.filter_counters);
  }
}

uint64_t EmbeddingTable::Hash(uint64_t id) const { return Mix64(id ^ salt_); }

uint64_t EmbeddingTable::IdOf(uint32_t row) const {
  const uint32_t* r = store_.Record(row);
  return static_cast<uint64_t>(r[0]) | (static_cast<uint64_t>(r[1]) << 32);
}

uint32_t EmbeddingTable::Find(uint64_t id, uint64_t hash) const {
  return index_.Find(id, hash, [this](uint32_t row) { return IdOf(row); });
}

template <typename OnRow>
void EmbeddingTable::ProbeAll(absl::Span<const uint64_t> ids, const OnRow& on_row) const {
  const size_t n = ids.size();
  // A ring of the hashes of ids [i, i + kSlotAhead].
  uint64_t hashes[kRing];
  for (size_t i = 0; i < std::min(n, kSlotAhead); ++i) {
    hashes[i % kRing] = Hash(ids[i]);
    index_.Prefetch(hashes[i % kRing]);
  }
  for (size_t i = 0; i < n; ++i) {
    if (i + kSlotAhead < n) {
      const uint64_t h = Hash(ids[i + kSlotAhead]);
      hashes[(i + kSlotAhead) % kRing] = h;
      index_.Prefetch(h);
    }
    if (i + kRecordAhead < n) {
      const uint32_t candidate = index_.Candidate(hashes[(i + kRecordAhead) % kRing]);
      if (candidate != kNone) store_.Prefetch(candidate);
    }
    on_row(i, Find(ids[i], hashes[i % kRing]));
  }
}

void EmbeddingTable::ReadValue(uint32_t row, float* out) const {
  const uint32_t* words = Value(row);
  const int32_t d = config_.dim;
  if (!bf16_) {
    std::memcpy(out, words, sizeof(float) * d);
    return;
  }
  // Element 2k is word k's low half, 2k+1 its high half (little-endian
  // bf16 pairs); widening is a shift.
  const int32_t pairs = d / 2;
  for (int32_t k = 0; k < pairs; ++k) {
    const uint32_t lo = words[k] << 16;
    const uint32_t hi = words[k] & 0xffff0000u;
    std::memcpy(out + 2 * k, &lo, sizeof(lo));
    std::memcpy(out + 2 * k + 1, &hi, sizeof(hi));
  }
  if (d % 2 != 0) out[d - 1] = WidenBf16(Bf16At(words, d - 1));
}

void EmbeddingTable::WriteValue(uint32_t row, const float* value, uint64_t id, uint64_t draw) {
  uint32_t* words = Value(row);
  const int32_t d = config_.dim;
  if (!bf16_) {
    std::memcpy(words, value, sizeof(float) * d);
    return;
  }
  // Four 16-bit draws per 64-bit hash, the hashes independent of each other.
  const uint64_t key = Mix64(salt_ ^ id ^ Mix64(draw));
  const int32_t pairs = d / 2;
  int32_t k = 0;
  for (; k + 1 < pairs; k += 2) {
    const uint64_t random = Mix64(key + static_cast<uint64_t>(k));
    const uint32_t a = RoundBf16(value[2 * k], static_cast<uint32_t>(random));
    const uint32_t b = RoundBf16(value[2 * k + 1], static_cast<uint32_t>(random >> 16));
    const uint32_t c = RoundBf16(value[2 * k + 2], static_cast<uint32_t>(random >> 32));
    const uint32_t e = RoundBf16(value[2 * k + 3], static_cast<uint32_t>(random >> 48));
    words[k] = a | (b << 16);
    words[k + 1] = c | (e << 16);
  }
  const uint64_t random = Mix64(key + static_cast<uint64_t>(k));
  if (k < pairs) {
    words[k] = RoundBf16(value[2 * k], static_cast<uint32_t>(random)) |
               (static_cast<uint32_t>(RoundBf16(value[2 * k + 1],
                                                static_cast<uint32_t>(random >> 16)))
                << 16);
  }
  if (d % 2 != 0) {
    words[pairs] = RoundBf16(value[d - 1], static_cast<uint32_t>(random >> 32));
  }
}

void EmbeddingTable::Touch(uint32_t row, uint32_t now) {
  uint32_t* meta = Meta(row);
  meta[0] = now;
  if (lfu_ && meta[1] != UINT32_MAX) ++meta[1];
}

void EmbeddingTable::TouchShared(uint32_t row, uint32_t now) {
  uint32_t* meta = Meta(row);
  __atomic_store_n(&meta[0], now, __ATOMIC_RELAXED);
  if (!lfu_) return;
  uint32_t count = __atomic_load_n(&meta[1], __ATOMIC_RELAXED);
  while (count != UINT32_MAX &&
         !__atomic_compare_exchange_n(&meta[1], &count, count + 1, /*weak=*/true,
                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

bool EmbeddingTable::Admit(uint64_t id) {
  switch (config_.admission.kind) {
    case Admission::Kind::kNone:
      return true;
    case Admission::Kind::kProbability:
      return UnitFloat(Mix64(salt_ ^ Mix64(id) ^ Mix64(++admission_draws_))) <
             config_.admission.probability;
    case Admission::Kind::kCount:
      return filter_->Add(id) >= config_.admission.count;
  }
  return true;
}

uint32_t EmbeddingTable::CreateRow(uint64_t id, uint64_t hash, uint32_t now) {
  const uint32_t row = store_.Allocate();
  uint32_t* r = store_.Record(row);
  r[0] = static_cast<uint32_t>(id);
  r[1] = static_cast<uint32_t>(id >> 32);
  if (bf16_) {
    init_.Fill(id, scratch_.data());
    WriteValue(row, scratch_.data(), id, /*draw=*/0);
  } else {
    init_.Fill(id, reinterpret_cast<float*>(Value(row)));
  }
  optimizer_.InitState(State(row));
  uint32_t* meta = Meta(row);
  meta[0] = now;
  if (lfu_) meta[1] = 1;
  index_.Insert(hash, row);
  ++counters_.created;
  return row;
}

void EmbeddingTable::EraseRow(uint32_t row) {
  const uint64_t id = IdOf(row);
  index_.Erase(id, Hash(id), [this](uint32_t r) { return IdOf(r); });
  store_.Free(row);
}

int64_t EmbeddingTable::MakeRoom(int64_t incoming, uint32_t now) {
  const int64_t rows = store_.rows();
  if (rows + incoming <= capacity_) return incoming;
  if (config_.eviction.capacity == 0) return std::max<int64_t>(0, capacity_ - rows);
  const int64_t need = rows + incoming - capacity_;
  // Score: last use (LRU) or use count (LFU); rows used at `now` stay.
  auto score = [this](uint32_t row) { return Meta(row)[lfu_ ? 1 : 0]; };
  auto eligible = [this, now](uint32_t row) { return Meta(row)[0] != now; };
  std::vector<uint32_t> scores;
  scores.reserve(static_cast<size_t>(rows));
  for (uint32_t row = 0; row < store_.end(); ++row) {
    if (store_.InUse(row) && eligible(row)) scores.push_back(score(row));
  }
  const int64_t k = std::min<int64_t>(std::max<int64_t>(need, capacity_ / 64),
                                      static_cast<int64_t>(scores.size()));
  if (k > 0) {
    // The k lowest (score, id): every row below the k-th score, then the
    // lowest ids at that score.
    std::nth_element(scores.begin(), scores.begin() + (k - 1), scores.end());
    const uint32_t threshold = scores[k - 1];
    const int64_t below =
        std::count_if(scores.begin(), scores.end(), [&](uint32_t s) { return s < threshold; });
    std::vector<uint64_t> tied;
    for (uint32_t row = 0; row < store_.end(); ++row) {
      if (store_.InUse(row) && eligible(row) && score(row) == threshold) {
        tied.push_back(IdOf(row));
      }
    }
    const int64_t from_tied = k - below;
    std::nth_element(tied.begin(), tied.begin() + (from_tied - 1), tied.end());
    const uint64_t last_id = tied[from_tied - 1];
    for (uint32_t row = 0; row < store_.end(); ++row) {
      if (!store_.InUse(row) || !eligible(row)) continue;
      const uint32_t s = score(row);
      if (s < threshold || (s == threshold && IdOf(row) <= last_id)) {
        EraseRow(row);
        ++counters_.evicted_capacity;
      }
    }
  }
  return std::min<int64_t>(incoming, std::max<int64_t>(0, capacity_ - store_.rows()));
}

void EmbeddingTable::LookupForTraining(absl::Span<const uint64_t> ids, uint32_t now,
                                       float* out) {
  const int32_t d = config_.dim;
  counters_.lookups += static_cast<int64_t>(ids.size());
  std::vector<uint32_t> misses;
  ProbeAll(ids, [&](size_t i, uint32_t row) {
    if (row == kNone) {
      misses.push_back(static_cast<uint32_t>(i));
      return;
    }
    Touch(row, now);
    ReadValue(row, out + i * d);
  });
  CreateMissing(ids, misses, now, out);
}

void EmbeddingTable::CreateMissing(absl::Span<const uint64_t> ids,
                                   absl::Span<const uint32_t> misses, uint32_t now,
                                   float* out) {
  if (misses.empty()) return;
  const int32_t d = config_.dim;
  int64_t room = MakeRoom(static_cast<int64_t>(misses.size()), now);
  for (uint32_t i : misses) {
    const uint64_t hash = Hash(ids[i]);
    // An earlier occurrence in this batch (or, after LookupStoredForTraining,
    // another call) may have created it.
    uint32_t row = Find(ids[i], hash);
    if (row != kNone) {
      Touch(row, now);
    } else if (!Admit(ids[i])) {
      ++counters_.rejected;
    } else if (room == 0) {
      ++counters_.full;
    } else {
      row = CreateRow(ids[i], hash, now);
      --room;
    }
    if (row != kNone) {
      ReadValue(row, out + i * d);
    } else {
      init_.Fill(ids[i], out + i * d);
    }
  }
}

void EmbeddingTable::LookupStoredForTraining(absl::Span<const uint64_t> ids, uint32_t now,
                                             float* out, std::vector<uint32_t>* rows,
                                             std::vector<uint32_t>* misses) {
  const int32_t d = config_.dim;
  rows->resize(ids.size());
  misses->clear();
  ProbeAll(ids, [&](size_t i, uint32_t row) {
    (*rows)[i] = row;
    if (row == kNone) {
      misses->push_back(static_cast<uint32_t>(i));
      return;
    }
    ReadValue(row, out + i * d);
  });
  const size_t n = rows->size();
  for (size_t i = 0; i < n; ++i) {
    if (i + kRecordAhead < n && (*rows)[i + kRecordAhead] != kNone) {
      store_.Prefetch((*rows)[i + kRecordAhead]);
    }
    if ((*rows)[i] != kNone) TouchShared((*rows)[i], now);
  }
  stored_lookups_.fetch_add(static_cast<int64_t>(n - misses->size()),
                            std::memory_order_relaxed);
}

void EmbeddingTable::LookupMissesForTraining(absl::Span<const uint64_t> ids,
                                             absl::Span<const uint32_t> misses, uint32_t now,
                                             float* out) {
  counters_.lookups += static_cast<int64_t>(misses.size());
  CreateMissing(ids, misses, now, out);
}

int64_t EmbeddingTable::LookupReadOnly(absl::Span<const uint64_t> ids, float* out) const {
  const int32_t d = config_.dim;
  int64_t found = 0;
  ProbeAll(ids, [&](size_t i, uint32_t row) {
    if (row == kNone) {
      init_.Fill(ids[i], out + i * d);
    } else {
      ReadValue(row, out + i * d);
      ++found;
    }
  });
  return found;
}

int64_t EmbeddingTable::Apply(absl::Span<const uint64_t> ids, const float* grads, uint32_t now,
                              float lr_scale) {
  const int32_t d = config_.dim;
  int64_t applied = 0;
  float* value = scratch_.data();
  ProbeAll(ids, [&](size_t i, uint32_t row) {
    if (row == kNone) return;
    if (bf16_) {
      // The draws depend on the row's value before the update and the
      // clock: fresh for every update, and the same on every replica that
      // holds the same row (state copies included), with no counter to keep.
      const uint32_t* words = Value(row);
      uint64_t fold = now;
      for (int32_t w = 0; w + 1 < value_words_; w += 2) {
        // A different odd multiplier per pair, so equal pairs do not cancel.
        fold ^= (static_cast<uint64_t>(words[w + 1]) << 32 | words[w]) *
                (0x9e3779b97f4a7c15ull + 2 * static_cast<uint64_t>(w));
      }
      if (value_words_ % 2 != 0) fold ^= words[value_words_ - 1];
      const uint64_t draw = fold;
      ReadValue(row, value);
      optimizer_.Apply(value, State(row), grads + i * d, lr_scale);
      WriteValue(row, value, ids[i], draw);
    } else {
      optimizer_.Apply(reinterpret_cast<float*>(Value(row)), State(row), grads + i * d,
                       lr_scale);
    }
    Touch(row, now);
    ++applied;
  });
  counters_.applied += applied;
  counters_.dropped += static_cast<int64_t>(ids.size()) - applied;
  return applied;
}

int64_t EmbeddingTable::EvictExpired(uint32_t now) {
  const int64_t ttl = config_.eviction.ttl;
  if (ttl == 0) return 0;
  int64_t removed = 0;
  for (uint32_t row = 0; row < store_.end(); ++row) {
    if (!store_.InUse(row)) continue;
    const uint32_t last = Meta(row)[0];
    if (now > last && static_cast<int64_t>(now - last) > ttl) {
      EraseRow(row);
      ++removed;
    }
  }
  counters_.evicted_ttl += removed;
  return removed;
}

int64_t EmbeddingTable::bytes() const {
  return index_.bytes() + store_.bytes() + (filter_ ? filter_->bytes() : 0);
}

void EmbeddingTable::ExportRecords(std::string* out, bool (*filter)(uint64_t, const void*),
                                   const void* arg) const {
  const size_t rb = static_cast<size_t>(record_bytes());
  for (uint32_t row = 0; row < store_.end(); ++row) {
    if (!store_.InUse(row)) continue;
    if (filter != nullptr && !filter(IdOf(row), arg)) continue;
    out->append(reinterpret_cast<const char*>(store_.Record(row)), rb);
  }
}

void EmbeddingTable::ExportFilter(std::string* out) const {
  if (filter_ != nullptr) filter_->Export(out);
}

bool EmbeddingTable::FilterPieceFits(int64_t piece, int64_t offset, int64_t total) const {
  return filter_ != nullptr && filter_->PieceFits(piece, offset, total);
}

absl::Status EmbeddingTable::ImportFilterPiece(absl::string_view piece, int64_t offset,
                                               int64_t total) {
  if (filter_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table \"", config_.name, "\" has no admission filter to load counters into"));
  }
  return filter_->ImportPiece(piece, offset, total);
}

absl::Status EmbeddingTable::ImportRecords(absl::string_view records) {
  const size_t rb = static_cast<size_t>(record_bytes());
  if (records.size() % rb != 0) {
    return absl::InvalidArgumentError(absl::StrCat("table \"", config_.name, "\": ",
                                                   records.size(),
                                                   " record bytes is not a multiple of ", rb));
  }
  const size_t count = records.size() / rb;
  const int32_t d = config_.dim;
  // Adam's last state word is the row's step count, not a float.
  const int32_t float_state =
      config_.optimizer.kind == SparseOptimizerKind::kAdam ? state_words_ - 1 : state_words_;
  std::vector<uint32_t> words(rb / 4);
  int64_t fresh = 0;
  for (size_t i = 0; i < count; ++i) {
    std::memcpy(words.data(), records.data() + i * rb, rb);
    bool finite = true;
    if (bf16_) {
      for (int32_t j = 0; j < d; ++j) finite = finite && FiniteBf16(Bf16At(words.data() + 2, j));
    } else {
      const float* values = reinterpret_cast<const float*>(words.data() + 2);
      for (int32_t j = 0; j < d; ++j) finite = finite && std::isfinite(values[j]);
    }
    const float* state = reinterpret_cast<const float*>(words.data() + 2 + value_words_);
    for (int32_t j = 0; j < float_state; ++j) finite = finite && std::isfinite(state[j]);
    if (!finite) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table \"", config_.name, "\": record ", i, " holds a non-finite value or state"));
    }
    const uint64_t id = static_cast<uint64_t>(words[0]) | (static_cast<uint64_t>(words[1]) << 32);
    if (Find(id, Hash(id)) == kNone) ++fresh;
  }
  if (store_.rows() + fresh > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("table \"", config_.name, "\": ",
                                                   store_.rows() + fresh,
                                                   " rows would exceed its capacity of ",
                                                   capacity_));
  }
  for (size_t i = 0; i < count; ++i) {
    const char* src = records.data() + i * rb;
    uint32_t id_words[2];
    std::memcpy(id_words, src, 8);
    const uint64_t id = static_cast<uint64_t>(id_words[0]) | (static_cast<uint64_t>(id_words[1]) << 32);
    const uint64_t hash = Hash(id);
    uint32_t row = Find(id, hash);
    if (row == kNone) {
      row = store_.Allocate();
      std::memcpy(store_.Record(row), src, rb);
      index_.Insert(hash, row);
    } else {
      std::memcpy(store_.Record(row), src, rb);
    }
  }
  return absl::OkStatus();
}

std::optional<std::string> EmbeddingTable::ReadRecord(uint64_t id) const {
  const uint32_t row = Find(id, Hash(id));
  if (row == kNone) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(store_.Record(row)),
                     static_cast<size_t>(record_bytes()));
}

}  // namespace shardtrain::sparse
