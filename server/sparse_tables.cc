#include "server/sparse_tables.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "server/table_spec.h"
#include "sparse/id_hash.h"
#include "sparse/id_positions.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "table ids and rows travel little-endian and are used in place");

namespace shardtrain::server {
namespace {

// bytes (little-endian Ts, a whole number of them) as Ts: in place where
// they are aligned for T, as protobuf's heap strings are, else copied into
// storage.
template <typename T>
absl::Span<const T> ViewOf(const std::string& bytes, std::vector<T>* storage) {
  const size_t n = bytes.size() / sizeof(T);
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(T) == 0) {
    return absl::MakeConstSpan(reinterpret_cast<const T*>(bytes.data()), n);
  }
  storage->resize(n);
  if (n > 0) std::memcpy(storage->data(), bytes.data(), n * sizeof(T));
  return absl::MakeConstSpan(*storage);
}

void Export(const sparse::TableCounters& now, sparse::TableCounters& last,
            const TableMetrics::Series& m) {
  auto add = [](prometheus::Counter* c, int64_t delta) {
    if (c != nullptr && delta > 0) c->Increment(static_cast<double>(delta));
  };
  add(m.lookups, now.lookups - last.lookups);
  add(m.created, now.created - last.created);
  add(m.rejected, now.rejected - last.rejected);
  add(m.full, now.full - last.full);
  add(m.applied, now.applied - last.applied);
  add(m.dropped, now.dropped - last.dropped);
  add(m.evicted_ttl, now.evicted_ttl - last.evicted_ttl);
  add(m.evicted_capacity, now.evicted_capacity - last.evicted_capacity);
  last = now;
}

}  // namespace

SparseTables::SparseTables(const ShardOptions& options, uint64_t incarnation,
                           ShardMetrics* metrics)
    : options_(options),
      incarnation_(incarnation),
      metrics_(metrics),
      push_logs_(static_cast<size_t>(options.num_workers)) {}

absl::Status SparseTables::CheckIncarnation(uint64_t shard_incarnation) const {
  if (shard_incarnation != 0 && shard_incarnation != incarnation_) {
    return absl::AbortedError(absl::StrFormat(
        "shard %d restarted (request names incarnation %d, shard is %d): re-register",
        options_.shard_index, shard_incarnation, incarnation_));
  }
  return absl::OkStatus();
}

absl::Status SparseTables::AddTable(const TableSpec& spec) {
  ASSIGN_OR_RETURN(sparse::TableConfig config, TableConfigFromSpec(spec, options_.limits));
  ASSIGN_OR_RETURN(std::unique_ptr<sparse::EmbeddingTable> rows,
                   sparse::EmbeddingTable::Create(config, TableLimitsOf(options_.limits)));
  auto table = std::make_unique<Table>();
  table->spec = spec;
  if (spec.sync()) {
    absl::MutexLock lock(&table->mu);
    table->step = std::make_unique<sparse::StepGradients>(spec.dim(), options_.num_workers);
  }
  if (metrics_ != nullptr) {
    table->metrics = metrics_->tables().ForTable(spec.name());
    table->metrics.capacity->Set(static_cast<double>(rows->capacity()));
  }
  {
    absl::MutexLock lock(&table->mu);
    table->rows = std::move(rows);
  }
  tables_[spec.name()] = std::move(table);
  return absl::OkStatus();
}

absl::Status SparseTables::Register(const RegisterTablesRequest& request) {
  if (options_.replicas != 1) {
    return absl::FailedPreconditionError(
        "sparse tables are not replicated yet: run the shards with --replicas=1");
  }
  absl::MutexLock lock(&mu_);
  int64_t fresh = 0;
  for (const TableSpec& spec : request.tables()) {
    auto it = tables_.find(spec.name());
    if (it != tables_.end()) {
      if (it->second->spec.SerializeAsString() != spec.SerializeAsString()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "table \"", spec.name(), "\" is registered with another spec"));
      }
      continue;
    }
    RETURN_IF_ERROR(TableConfigFromSpec(spec, options_.limits).status());
    ++fresh;
  }
  if (static_cast<int64_t>(tables_.size()) + fresh > options_.limits.max_tables) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "registering %d new tables would make %d on this shard; the limit is %d (--max_tables)",
        fresh, tables_.size() + fresh, options_.limits.max_tables));
  }
  for (const TableSpec& spec : request.tables()) {
    if (!tables_.contains(spec.name())) RETURN_IF_ERROR(AddTable(spec));
  }
  return absl::OkStatus();
}

absl::StatusOr<SparseTables::Table*> SparseTables::Find(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("no table \"", name, "\" on shard ",
                                            options_.shard_index, ": register it first"));
  }
  return it->second.get();
}

absl::StatusOr<absl::Span<const uint64_t>> SparseTables::CheckIds(
    const std::string& ids, std::vector<uint64_t>* storage) const {
  if (ids.size() % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids.size(), " bytes of ids is not a whole number of uint64"));
  }
  const int64_t n = static_cast<int64_t>(ids.size() / 8);
  if (n > options_.limits.max_table_ids_per_request) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d ids in one request; the limit is %d (--max_table_ids_per_request)", n,
        options_.limits.max_table_ids_per_request));
  }
  const absl::Span<const uint64_t> view = ViewOf<uint64_t>(ids, storage);
  const int num_shards = options_.partitioning.num_shards;
  for (uint64_t id : view) {
    const int owner = sparse::ShardOfId(id, num_shards);
    if (owner != options_.shard_index) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "id %d belongs to shard %d of %d, not shard %d", id, owner, num_shards,
          options_.shard_index));
    }
  }
  return view;
}

absl::StatusOr<DType> SparseTables::WireDType(int dtype, const char* what) {
  if (common::DTypeSize(common::PayloadDType(dtype)) == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s dtype %d is not one of DTYPE_F32, DTYPE_BF16, DTYPE_F16", what, dtype));
  }
  return common::PayloadDType(dtype);
}

int64_t SparseTables::StepOf(int64_t clock) { return std::clamp<int64_t>(clock, 0, UINT32_MAX); }

uint32_t SparseTables::Now(const Table& table, int64_t clock) {
  if (table.spec.ttl_in_seconds()) {
    return static_cast<uint32_t>(absl::ToUnixSeconds(absl::Now()));
  }
  return static_cast<uint32_t>(StepOf(clock));
}

void SparseTables::AfterChange(Table& table, uint32_t now) {
  const int64_t ttl = table.spec.ttl();
  // Sweep when the clock has moved by an eighth of the TTL: a row lives at
  // most 9/8 of its TTL unused.
  if (ttl > 0 && now > table.swept && now - table.swept >= std::max<int64_t>(1, ttl / 8)) {
    table.rows->EvictExpired(now);
    table.swept = now;
  }
  if (metrics_ == nullptr) return;
  Export(table.rows->counters(), table.exported, table.metrics);
  if (table.step != nullptr) {
    table.metrics.sync_steps->Set(static_cast<double>(table.steps));
    table.metrics.step_arrivals->Set(table.step->arrivals());
  }
  const int64_t rows = table.rows->rows();
  table.metrics.rows->Set(static_cast<double>(rows));
  table.metrics.bytes_per_row->Set(
      rows == 0 ? 0.0 : static_cast<double>(table.rows->bytes()) / static_cast<double>(rows));
}

absl::Status SparseTables::Lookup(const LookupRequest& request,
                                  wire::LookupResponseBuilder* response) {
  RETURN_IF_ERROR(CheckIncarnation(request.shard_incarnation()));
  ASSIGN_OR_RETURN(Table * table, Find(request.table()));
  std::vector<uint64_t> storage;
  ASSIGN_OR_RETURN(absl::Span<const uint64_t> ids, CheckIds(request.ids(), &storage));
  ASSIGN_OR_RETURN(const DType dtype, WireDType(request.dtype(), "rows"));
  const size_t dim = static_cast<size_t>(table->spec.dim());
  const size_t row_bytes = static_cast<size_t>(common::DTypeSize(dtype)) * dim;
  if (ids.size() * row_bytes > static_cast<size_t>(options_.limits.max_response_bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d rows of %d bytes would exceed the %d-byte response limit (--max_message_mb)",
        ids.size(), row_bytes, options_.limits.max_response_bytes));
  }
  if (request.train() && table->spec.sync() &&
      request.worker() >= static_cast<uint32_t>(options_.num_workers)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "worker %d is not in [0, %d)", request.worker(), options_.num_workers));
  }
  char* rows = response->Rows(ids.size() * row_bytes);
  response->set_incarnation(incarnation_);
  // f32 rows are written where they are sent; others through f32 scratch.
  thread_local std::vector<float> scratch;
  float* out = reinterpret_cast<float*>(rows);
  if (dtype != DTYPE_F32) {
    scratch.resize(ids.size() * dim);
    out = scratch.data();
  }
  if (request.train()) {
    absl::MutexLock lock(&table->mu);
    const uint32_t now = Now(*table, request.clock());
    table->newest_clock = std::max(table->newest_clock, StepOf(request.clock()));
    table->rows->LookupForTraining(ids, now, out);
    AfterChange(*table, now);
  } else {
    absl::ReaderMutexLock lock(&table->mu);
    table->rows->LookupReadOnly(ids, out);
  }
  if (dtype != DTYPE_F32) {
    common::EncodeDenseInto(absl::MakeConstSpan(scratch.data(), ids.size() * dim), dtype, rows);
  }
  return absl::OkStatus();
}

bool SparseTables::LookupWaits(const LookupRequest& request) const {
  if (!request.train() || request.worker() >= static_cast<uint32_t>(options_.num_workers)) {
    return false;
  }
  absl::StatusOr<Table*> table = Find(request.table());
  if (!table.ok() || !(*table)->spec.sync()) return false;
  absl::ReaderMutexLock lock(&(*table)->mu);
  return (*table)->step->arrived(static_cast<int>(request.worker()));
}

absl::StatusOr<int64_t> SparseTables::ApplyPush(Table& table, uint32_t worker,
                                                absl::Span<const uint64_t> ids,
                                                const float* grads, uint32_t now,
                                                bool* step_applied) {
  if (table.step == nullptr) {
    return static_cast<int64_t>(ids.size()) - table.rows->Apply(ids, grads, now, 1.0f);
  }
  sparse::StepGradients& step = *table.step;
  if (step.arrived(static_cast<int>(worker))) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "worker %d pushed sync table \"%s\" twice in step %d (%d of %d workers are in): a "
        "sync worker pushes once per step, after its lookup",
        worker, table.spec.name(), table.steps, step.arrivals(), step.num_workers()));
  }
  step.Add(static_cast<int>(worker), ids, grads);
  if (!step.complete()) return 0;
  std::vector<uint64_t> step_ids;
  std::vector<float> step_grads;
  step.TakeMean(&step_ids, &step_grads);
  ++table.steps;
  if (step_applied != nullptr) *step_applied = true;
  return static_cast<int64_t>(step_ids.size()) -
         table.rows->Apply(step_ids, step_grads.data(), now, 1.0f);
}

absl::Status SparseTables::PushSparse(const PushSparseRequest& request,
                                      PushSparseResponse* response, bool* step_applied) {
  RETURN_IF_ERROR(CheckIncarnation(request.shard_incarnation()));
  if (request.worker() >= static_cast<uint32_t>(options_.num_workers)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "worker %d is not in [0, %d)", request.worker(), options_.num_workers));
  }
  ASSIGN_OR_RETURN(Table * table, Find(request.table()));
  std::vector<uint64_t> storage;
  ASSIGN_OR_RETURN(absl::Span<const uint64_t> ids, CheckIds(request.ids(), &storage));
  const size_t dim = static_cast<size_t>(table->spec.dim());
  ASSIGN_OR_RETURN(const DType dtype, WireDType(request.dtype(), "grads"));
  const size_t width = static_cast<size_t>(common::DTypeSize(dtype));
  if (request.grads().size() != ids.size() * dim * width) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "table \"%s\" has dim %d: %d ids need %d bytes of %s gradients, got %d",
        request.table(), dim, ids.size(), ids.size() * dim * width, common::DTypeName(dtype),
        request.grads().size()));
  }
  std::vector<float> grads_storage;
  absl::Span<const float> grads;
  if (dtype == DTYPE_F32) {
    grads = ViewOf<float>(request.grads(), &grads_storage);
  } else {
    grads_storage.resize(ids.size() * dim);
    RETURN_IF_ERROR(common::DecodeDense(dtype, request.grads(), absl::MakeSpan(grads_storage)));
    grads = absl::MakeConstSpan(grads_storage);
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!std::isfinite(grads[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the gradient of id %d holds a NaN or Inf", ids[i / dim]));
    }
  }
  {
    thread_local sparse::IdPositions seen;
    seen.Reset(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!seen.Insert(ids[i], static_cast<uint32_t>(i)).second) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "id %d appears twice in one push: sum its gradients into one row", ids[i]));
      }
    }
  }
  response->set_incarnation(incarnation_);
  PushLog& log = push_logs_[request.worker()];
  absl::MutexLock log_lock(&log.mu());
  if (request.sequence() != 0) {
    ASSIGN_OR_RETURN(std::optional<int64_t> seen,
                     log.Find(request.worker_incarnation(), request.sequence()));
    if (seen.has_value()) {
      response->set_duplicate(true);
      if (metrics_ != nullptr) metrics_->duplicate_pushes().Increment();
      return absl::OkStatus();
    }
  }
  absl::MutexLock lock(&table->mu);
  const uint32_t now = Now(*table, request.clock());
  ASSIGN_OR_RETURN(const int64_t dropped,
                   ApplyPush(*table, request.worker(), ids, grads.data(), now, step_applied));
  response->set_dropped(dropped);
  if (request.sequence() != 0) log.Record(request.worker_incarnation(), request.sequence(), 0);
  table->newest_clock = std::max(table->newest_clock, StepOf(request.clock()));
  if (table->metrics.unique_ids != nullptr) {
    table->metrics.unique_ids->Observe(static_cast<double>(ids.size()));
    table->metrics.staleness->Observe(
        static_cast<double>(table->newest_clock - StepOf(request.clock())));
  }
  AfterChange(*table, now);
  return absl::OkStatus();
}

void SparseTables::FillStatus(StatusResponse* response) const {
  absl::MutexLock lock(&mu_);
  std::vector<const Table*> sorted;
  for (const auto& [name, table] : tables_) sorted.push_back(table.get());
  std::sort(sorted.begin(), sorted.end(),
            [](const Table* a, const Table* b) { return a->spec.name() < b->spec.name(); });
  for (const Table* table : sorted) {
    absl::ReaderMutexLock table_lock(&table->mu);
    TableState* state = response->add_tables();
    state->set_name(table->spec.name());
    state->set_dim(table->spec.dim());
    state->set_optimizer(table->spec.optimizer().empty() ? "sgd" : table->spec.optimizer());
    state->set_rows(table->rows->rows());
    state->set_capacity(table->rows->capacity());
    state->set_bytes(table->rows->bytes());
    state->set_sync(table->spec.sync());
    state->set_steps(table->steps);
  }
}

int64_t SparseTables::num_tables() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(tables_.size());
}

void SparseTables::Snapshot(int64_t max_record_bytes,
                            std::vector<CheckpointRecord>* records) const {
  std::vector<const Table*> tables;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, table] : tables_) tables.push_back(table.get());
  }
  for (const Table* table : tables) {
    std::string rows, filter;
    int32_t record_bytes;
    int64_t steps;
    {
      absl::ReaderMutexLock lock(&table->mu);
      table->rows->ExportRecords(&rows);
      table->rows->ExportFilter(&filter);
      record_bytes = table->rows->record_bytes();
      steps = table->steps;
    }
    // Whole rows per checkpoint record; one record for an empty table, so
    // that its registration survives.
    const size_t per_record = static_cast<size_t>(
        std::max<int64_t>(1, max_record_bytes / record_bytes) * record_bytes);
    size_t offset = 0;
    do {
      CheckpointRecord& record = records->emplace_back();
      *record.mutable_table() = table->spec;
      if (offset == 0) {
        record.set_table_filter(std::move(filter));
        record.set_table_steps(steps);
      }
      const size_t take = std::min(per_record, rows.size() - offset);
      record.set_table_rows(rows.substr(offset, take));
      offset += take;
    } while (offset < rows.size());
  }
}

absl::Status SparseTables::Restore(const CheckpointRecord& record) {
  Table* table;
  {
    absl::MutexLock lock(&mu_);
    auto it = tables_.find(record.table().name());
    if (it == tables_.end()) {
      RETURN_IF_ERROR(AddTable(record.table()));
      it = tables_.find(record.table().name());
    } else if (it->second->spec.SerializeAsString() != record.table().SerializeAsString()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint table \"", record.table().name(), "\" has two different specs"));
    }
    table = it->second.get();
  }
  absl::MutexLock lock(&table->mu);
  // Checked first, so that a bad record changes nothing.
  if (!record.table_filter().empty() && !table->rows->FilterFits(record.table_filter())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint table \"", record.table().name(), "\" has an admission filter of ",
        record.table_filter().size(), " bytes that its spec does not give"));
  }
  if (record.table_steps() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint table \"", record.table().name(), "\" is at step ", record.table_steps()));
  }
  RETURN_IF_ERROR(table->rows->ImportRecords(record.table_rows()));
  if (!record.table_filter().empty()) {
    RETURN_IF_ERROR(table->rows->ImportFilter(record.table_filter()));
  }
  if (record.table_steps() > 0) table->steps = record.table_steps();
  AfterChange(*table, table->swept);
  return absl::OkStatus();
}

}  // namespace shardtrain::server
