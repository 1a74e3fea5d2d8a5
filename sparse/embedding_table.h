// EmbeddingTable: one sparse table's rows on one shard: each id's row
// (value, optimizer state and metadata in one record), created on first
// training lookup subject to admission, updated by its gradients, evicted by
// TTL or capacity, and exported or imported as whole records so a
// checkpoint or a replica never sees a value without its optimizer state.
//
// Every operation is deterministic in its inputs and the table's prior
// operations (initial values and admission draws are counter-based hashes,
// eviction order is (score, id)), so replicas applying the same operations
// in the same order stay bit-identical.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingTable> table,
//                    EmbeddingTable::Create(config, limits));
//   std::vector<float> rows(ids.size() * table->dim());
//   table->LookupForTraining(ids, step, rows.data());
//   ...
//   table->Apply(unique_ids, row_grads.data(), step, /*lr_scale=*/1.0f);
//
// Not thread-safe: the owner (the shard) serialises calls, but for
// LookupStoredForTraining, which may run beside readers.
#ifndef SHARDTRAIN_SPARSE_EMBEDDING_TABLE_H_
#define SHARDTRAIN_SPARSE_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "sparse/counting_filter.h"
#include "sparse/row_index.h"
#include "sparse/row_initializer.h"
#include "sparse/row_optimizer.h"
#include "sparse/row_store.h"
#include "sparse/table_config.h"

namespace shardtrain::sparse {

// Totals since the table was created (the shard exports them as metrics).
struct TableCounters {
  int64_t lookups = 0;            // ids looked up for training
  int64_t created = 0;            // rows created (admitted)
  int64_t rejected = 0;           // training lookups of unseen ids not admitted
  int64_t full = 0;               // ... refused because nothing could be evicted
  int64_t applied = 0;            // row gradients applied
  int64_t dropped = 0;            // row gradients for rows not stored
  int64_t evicted_ttl = 0;
  int64_t evicted_capacity = 0;
};

class EmbeddingTable {
 public:
  // INVALID_ARGUMENT for a config ValidateTableConfig refuses.
  static absl::StatusOr<std::unique_ptr<EmbeddingTable>> Create(const TableConfig& config,
                                                                const TableLimits& limits);

  const TableConfig& config() const { return config_; }
  int32_t dim() const { return config_.dim; }

  // Training: each id's row, created when unseen and admitted; an id not
  // admitted reads as its initial value and is not stored. Marks the rows
  // used at `now` (the table's clock: a step, or seconds with a TTL in
  // seconds). ids may repeat. Writes ids.size() * dim floats to out.
  void LookupForTraining(absl::Span<const uint64_t> ids, uint32_t now, float* out);

  // LookupForTraining in two halves, the first beside other lookups.
  // LookupStoredForTraining creates and evicts nothing: it writes the row
  // of each id that has one to out, marks those rows used at `now`, and
  // lists the indexes of the other ids in *misses, in order. rows is
  // scratch (its memory is kept). Unlike the rest of this class, it may
  // run beside other calls of itself and of the const methods but
  // ExportRecords and ReadRecord, which read the marks: the owner holds a
  // shared lock for these, an exclusive one for the others.
  void LookupStoredForTraining(absl::Span<const uint64_t> ids, uint32_t now, float* out,
                               std::vector<uint32_t>* rows, std::vector<uint32_t>* misses);
  // Then, when *misses is not empty, LookupMissesForTraining does the rest
  // for those ids (rows created, the table kept within its capacity; rows
  // another call created meanwhile are read and marked). Run one after
  // the other, the two change the table as one LookupForTraining does.
  void LookupMissesForTraining(absl::Span<const uint64_t> ids,
                               absl::Span<const uint32_t> misses, uint32_t now, float* out);

  // Evaluation: stored rows as they are, other ids as their initial value;
  // changes nothing. Returns the number of ids found.
  int64_t LookupReadOnly(absl::Span<const uint64_t> ids, float* out) const;

  // Applies each id's gradient (dim floats at grads + i * dim) to its row
  // and marks it used at `now`; gradients of ids not stored are dropped.
  // REQUIRES: ids unique; gradients finite. Returns the number applied.
  int64_t Apply(absl::Span<const uint64_t> ids, const float* grads, uint32_t now,
                float lr_scale);

  // Removes rows last used more than the TTL before `now` (no-op without a
  // TTL). Returns the number removed.
  int64_t EvictExpired(uint32_t now);

  int64_t rows() const { return store_.rows(); }
  // Capacity rows are evicted down from (the config's or the limit).
  int64_t capacity() const { return capacity_; }
  // Bytes the table holds: index, records, admission filter.
  int64_t bytes() const;
  TableCounters counters() const {
    TableCounters counters = counters_;
    counters.lookups += stored_lookups_.load(std::memory_order_relaxed);
    return counters;
  }

  // Records: the id (8 bytes), the value (dim f32, or dim bf16 padded to
  // whole words), the optimizer state (state words of
  // sparse/row_optimizer.h) and the metadata (the last use; with LFU
  // eviction also the use count), all little-endian, record_bytes() each,
  // no framing: the whole row in one piece. Dim 16 with row-wise Adagrad
  // and LRU: 80 bytes, 48 with bf16 values.
  int32_t record_bytes() const { return 4 * store_.record_words(); }
  // Appends every stored row's record to out, in row order; with a filter,
  // only rows whose id it accepts.
  void ExportRecords(std::string* out, bool (*filter)(uint64_t id, const void* arg) = nullptr,
                     const void* arg = nullptr) const;
  // Stores the rows of records (replacing rows of the same ids).
  // INVALID_ARGUMENT, with nothing changed, for a size that is not a
  // multiple of record_bytes(), a non-finite value or state, or more rows
  // than the capacity allows.
  absl::Status ImportRecords(absl::string_view records);
  // The admission filter's counters (count admission; nothing otherwise),
  // appended to out: with the records, all a checkpoint needs, so that ids
  // counted before a restart do not start counting again.
  void ExportFilter(std::string* out) const;
  // Replaces the filter's counters with ExportFilter's bytes. INVALID_ARGUMENT,
  // with nothing changed, for bytes of another size (or any bytes for a
  // table without a filter).
  absl::Status ImportFilter(absl::string_view counters) {
    return ImportFilterPiece(counters, 0, static_cast<int64_t>(counters.size()));
  }
  // The same for the bytes at [offset, offset + piece.size()) of an
  // ExportFilter of `total` bytes (a filter spread over several records).
  absl::Status ImportFilterPiece(absl::string_view piece, int64_t offset, int64_t total);
  // Whether ImportFilterPiece would take such a piece (checks sizes only).
  bool FilterPieceFits(int64_t piece, int64_t offset, int64_t total) const;
  // id's record, or nullopt when it is not stored.
  std::optional<std::string> ReadRecord(uint64_t id) const;

 private:
  EmbeddingTable(const TableConfig& config, int64_t capacity);

  uint64_t Hash(uint64_t id) const;
  uint64_t IdOf(uint32_t row) const;
  // The row's value words: dim f32, or dim bf16 (config_.storage).
  uint32_t* Value(uint32_t row) { return store_.Record(row) + 2; }
  const uint32_t* Value(uint32_t row) const { return store_.Record(row) + 2; }
  // The row's value as f32 into out[0, dim).
  void ReadValue(uint32_t row, float* out) const;
  // Stores `value` (dim f32) as the row's; bf16 storage rounds each
  // element stochastically with draws keyed by (id, draw, element).
  void WriteValue(uint32_t row, const float* value, uint64_t id, uint64_t draw);
  uint32_t* State(uint32_t row) { return store_.Record(row) + 2 + value_words_; }
  uint32_t* Meta(uint32_t row) { return State(row) + state_words_; }
  const uint32_t* Meta(uint32_t row) const {
    return store_.Record(row) + 2 + value_words_ + state_words_;
  }
  uint32_t Find(uint64_t id, uint64_t hash) const;
  // LookupForTraining's ids at indexes `misses`, which had no row when
  // probed: each read, created or given its initial value.
  void CreateMissing(absl::Span<const uint64_t> ids, absl::Span<const uint32_t> misses,
                     uint32_t now, float* out);
  // Finds each id's row (kNone when absent) and calls on_row(i, row), in
  // order, with the index slots and then the records of later ids
  // prefetched: at 10^7 rows nearly every probe misses the cache, and the
  // pipeline overlaps those misses.
  template <typename OnRow>
  void ProbeAll(absl::Span<const uint64_t> ids, const OnRow& on_row) const;
  void Touch(uint32_t row, uint32_t now);
  // Touch, beside other calls of itself (atomic).
  void TouchShared(uint32_t row, uint32_t now);
  bool Admit(uint64_t id);
  uint32_t CreateRow(uint64_t id, uint64_t hash, uint32_t now);
  void EraseRow(uint32_t row);
  // Makes room for `incoming` new rows; rows used at `now` stay. Returns how
  // many of them may be created.
  int64_t MakeRoom(int64_t incoming, uint32_t now);

  const TableConfig config_;
  const int64_t capacity_;
  const int32_t value_words_;
  const int32_t state_words_;
  const bool bf16_;
  // bf16 storage: one row's value as f32 while it is updated or created.
  std::vector<float> scratch_;
  const bool lfu_;
  const uint64_t salt_;
  const RowInitializer init_;
  const RowOptimizer optimizer_;
  std::unique_ptr<CountingFilter> filter_;  // Admission::kCount only
  uint64_t admission_draws_ = 0;
  RowIndex index_;
  RowStore store_;
  TableCounters counters_;
  // LookupStoredForTraining's ids (counters() adds them to lookups).
  std::atomic<int64_t> stored_lookups_{0};
};

}  // namespace shardtrain::sparse

#endif  // SHARDTRAIN_SPARSE_EMBEDDING_TABLE_H_
