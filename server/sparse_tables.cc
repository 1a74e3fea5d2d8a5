#include "server/sparse_tables.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/payload.h"
#include "common/status_macros.h"
#include "server/request_checks.h"
#include "server/table_spec.h"
#include "sparse/id_hash.h"
#include "sparse/id_positions.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "table ids and rows travel little-endian and are used in place");

namespace shardtrain::server {
namespace {

// The smallest piece of an admission filter in a record (tests cut rows
// into records of a few bytes; a filter's 8 MiB would make a million).
constexpr int64_t kMinFilterPieceBytes = 64 << 10;

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

SparseTables::SparseTables(const ShardOptions& options, std::vector<int> groups,
                           uint64_t incarnation, ShardMetrics* metrics)
    : options_(options),
      groups_(std::move(groups)),
      incarnation_(incarnation),
      metrics_(metrics),
      push_logs_(groups_, options.num_workers) {}

absl::StatusOr<std::unique_ptr<SparseTables::Table>> SparseTables::NewTable(
    const TableSpec& spec, int group, TableSet* set) const {
  ASSIGN_OR_RETURN(sparse::TableConfig config, TableConfigFromSpec(spec, options_.limits));
  ASSIGN_OR_RETURN(std::unique_ptr<sparse::EmbeddingTable> rows,
                   sparse::EmbeddingTable::Create(config, TableLimitsOf(options_.limits)));
  auto table = std::make_unique<Table>();
  table->spec = spec;
  table->group = group;
  table->set = set;
  table->capacity.store(rows->capacity());
  absl::MutexLock lock(&table->mu);
  if (spec.sync()) {
    table->step = std::make_unique<sparse::StepGradients>(spec.dim(), options_.num_workers);
  }
  table->rows = std::move(rows);
  return table;
}

absl::Status SparseTables::AddTable(const TableSpec& spec) {
  auto set = std::make_unique<TableSet>();
  set->spec = spec;
  if (metrics_ != nullptr) set->metrics = metrics_->tables().ForTable(spec.name());
  int64_t capacity = 0;
  for (int group : groups_) {
    ASSIGN_OR_RETURN(std::unique_ptr<Table> table, NewTable(spec, group, set.get()));
    capacity += table->capacity.load();
    set->groups.push_back(std::move(table));
  }
  if (set->metrics.capacity != nullptr) {
    set->metrics.capacity->Set(static_cast<double>(capacity));
  }
  tables_[spec.name()] = std::move(set);
  return absl::OkStatus();
}

absl::StatusOr<SparseTables::TableSet*> SparseTables::FindOrAdd(const TableSpec& spec,
                                                                const char* what) {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(spec.name());
  if (it == tables_.end()) {
    RETURN_IF_ERROR(AddTable(spec));
    it = tables_.find(spec.name());
  } else if (it->second->spec.SerializeAsString() != spec.SerializeAsString()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " table \"", spec.name(), "\" has two different specs"));
  }
  return it->second.get();
}

absl::Status SparseTables::Register(const RegisterTablesRequest& request) {
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

absl::StatusOr<SparseTables::Table*> SparseTables::Find(const std::string& name,
                                                        int group) const {
  int slot = 0;
  if (options_.replicas > 1) {
    slot = SlotOf(group);
    if (slot < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "shard %d does not hold replica group %d", options_.shard_index, group));
    }
  }
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("no table \"", name, "\" on shard ",
                                            options_.shard_index, ": register it first"));
  }
  return it->second->groups[static_cast<size_t>(slot)].get();
}

absl::StatusOr<absl::Span<const uint64_t>> SparseTables::CheckIds(
    const Table& table, const std::string& ids, std::vector<uint64_t>* storage) const {
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
    if (owner != table.group) {
      return absl::InvalidArgumentError(
          options_.replicas > 1
              ? absl::StrFormat("id %d belongs to replica group %d of %d, not group %d", id,
                                owner, num_shards, table.group)
              : absl::StrFormat("id %d belongs to shard %d of %d, not shard %d", id, owner,
                                num_shards, options_.shard_index));
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

bool SparseTables::SweepDue(const Table& table, uint32_t now) {
  const int64_t ttl = table.spec.ttl();
  // Sweep when the clock has moved by an eighth of the TTL: a row lives at
  // most 9/8 of its TTL unused.
  return ttl > 0 && now > table.swept && now - table.swept >= std::max<int64_t>(1, ttl / 8);
}

void SparseTables::ExportCounters(Table& table) {
  if (metrics_ == nullptr) return;
  absl::MutexLock lock(&table.export_mu);
  Export(table.rows->counters(), table.exported, table.set->metrics);
}

void SparseTables::RaiseNewestClock(Table& table, int64_t clock) {
  int64_t newest = table.newest_clock.load(std::memory_order_relaxed);
  while (newest < clock &&
         !table.newest_clock.compare_exchange_weak(newest, clock, std::memory_order_relaxed)) {
  }
}

void SparseTables::AfterChange(Table& table, uint32_t now) {
  if (SweepDue(table, now)) {
    table.rows->EvictExpired(now);
    table.swept = now;
  }
  table.rows_now.store(table.rows->rows(), std::memory_order_relaxed);
  table.bytes_now.store(table.rows->bytes(), std::memory_order_relaxed);
  if (metrics_ == nullptr) return;
  const TableMetrics::Series& m = table.set->metrics;
  ExportCounters(table);
  // The shard's own group's step (the first held).
  if (table.step != nullptr && table.group == groups_.front()) {
    m.sync_steps->Set(static_cast<double>(table.steps));
    m.step_arrivals->Set(table.step->arrivals());
  }
  int64_t rows = 0;
  int64_t bytes = 0;
  for (const std::unique_ptr<Table>& group : table.set->groups) {
    rows += group->rows_now.load(std::memory_order_relaxed);
    bytes += group->bytes_now.load(std::memory_order_relaxed);
  }
  m.rows->Set(static_cast<double>(rows));
  m.bytes_per_row->Set(rows == 0 ? 0.0 : static_cast<double>(bytes) / static_cast<double>(rows));
}

void SparseTables::TrainLookup(Table& table, absl::Span<const uint64_t> ids, int64_t clock,
                               uint32_t now, float* out) {
  RaiseNewestClock(table, StepOf(clock));
  table.rows->LookupForTraining(ids, now, out);
  ++table.ops;
  AfterChange(table, now);
}

bool SparseTables::TrainLookupInHalves(Table& table, absl::Span<const uint64_t> ids,
                                       int64_t clock, float* out) {
  thread_local std::vector<uint32_t> rows;
  thread_local std::vector<uint32_t> misses;
  uint32_t now;
  {
    absl::ReaderMutexLock lock(&table.mu);
    now = Now(table, clock);
    if (SweepDue(table, now)) return false;
    table.rows->LookupStoredForTraining(ids, now, out, &rows, &misses);
    RaiseNewestClock(table, StepOf(clock));
    if (misses.empty()) {
      table.stored_ops.fetch_add(1, std::memory_order_relaxed);
      // Nothing else AfterChange keeps changed: no row came or went.
      ExportCounters(table);
      return true;
    }
  }
  // Only the ids without a row are probed again: another lookup may have
  // created some of them meanwhile.
  absl::MutexLock lock(&table.mu);
  table.rows->LookupMissesForTraining(ids, misses, now, out);
  ++table.ops;
  AfterChange(table, now);
  return true;
}

absl::Status SparseTables::Lookup(const LookupRequest& request,
                                  wire::LookupResponseBuilder* response, SparseOp* op) {
  RETURN_IF_ERROR(CheckIncarnation(options_, incarnation_, request.shard_incarnation()));
  ASSIGN_OR_RETURN(Table * table, Find(request.table(), request.group()));
  std::vector<uint64_t> storage;
  ASSIGN_OR_RETURN(absl::Span<const uint64_t> ids, CheckIds(*table, request.ids(), &storage));
  ASSIGN_OR_RETURN(const DType dtype, WireDType(request.dtype(), "rows"));
  const size_t dim = static_cast<size_t>(table->spec.dim());
  const size_t row_bytes = static_cast<size_t>(common::DTypeSize(dtype)) * dim;
  if (ids.size() * row_bytes > static_cast<size_t>(options_.limits.max_response_bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d rows of %d bytes would exceed the %d-byte response limit (--max_message_mb)",
        ids.size(), row_bytes, options_.limits.max_response_bytes));
  }
  if (request.train() && table->spec.sync()) {
    RETURN_IF_ERROR(CheckWorker(options_, request.worker()));
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
  const absl::Time begin = absl::Now();
  if (!request.train()) {
    absl::ReaderMutexLock lock(&table->mu);
    table->rows->LookupReadOnly(ids, out);
  } else if (op != nullptr || !TrainLookupInHalves(*table, ids, request.clock(), out)) {
    // A lookup the chain orders (forwarded as one operation, applied the
    // same at every member), or one due for the TTL sweep.
    absl::MutexLock lock(&table->mu);
    const uint32_t now = Now(*table, request.clock());
    if (op != nullptr) {
      op->set_group(table->group);
      op->set_op(table->ops);
      op->set_now(now);
      LookupRequest& forwarded = *op->mutable_lookup();
      forwarded.set_table(request.table());
      forwarded.set_ids(request.ids());
      forwarded.set_train(true);
      forwarded.set_worker(request.worker());
      forwarded.set_clock(request.clock());
      forwarded.set_group(table->group);
    }
    TrainLookup(*table, ids, request.clock(), now, out);
  }
  if (request.train() && table->set->metrics.lookup_ids != nullptr) {
    table->set->metrics.lookup_ids->Observe(static_cast<double>(ids.size()));
    table->set->metrics.lookup_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - begin));
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
  absl::StatusOr<Table*> table = Find(request.table(), request.group());
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

absl::Status SparseTables::CheckPush(const PushSparseRequest& request,
                                     CheckedPush* push) const {
  RETURN_IF_ERROR(CheckWorker(options_, request.worker()));
  ASSIGN_OR_RETURN(push->table, Find(request.table(), request.group()));
  ASSIGN_OR_RETURN(push->ids, CheckIds(*push->table, request.ids(), &push->id_storage));
  const absl::Span<const uint64_t> ids = push->ids;
  const size_t dim = static_cast<size_t>(push->table->spec.dim());
  ASSIGN_OR_RETURN(const DType dtype, WireDType(request.dtype(), "grads"));
  const size_t width = static_cast<size_t>(common::DTypeSize(dtype));
  if (request.grads().size() != ids.size() * dim * width) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "table \"%s\" has dim %d: %d ids need %d bytes of %s gradients, got %d",
        request.table(), dim, ids.size(), ids.size() * dim * width, common::DTypeName(dtype),
        request.grads().size()));
  }
  if (dtype == DTYPE_F32) {
    push->grads = ViewOf<float>(request.grads(), &push->grad_storage);
  } else {
    push->grad_storage.resize(ids.size() * dim);
    RETURN_IF_ERROR(
        common::DecodeDense(dtype, request.grads(), absl::MakeSpan(push->grad_storage)));
    push->grads = absl::MakeConstSpan(push->grad_storage);
  }
  const absl::Span<const float> grads = push->grads;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!std::isfinite(grads[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the gradient of id %d holds a NaN or Inf", ids[i / dim]));
    }
  }
  if (sparse::StrictlyIncreasing(ids)) return absl::OkStatus();  // no id twice
  thread_local sparse::IdPositions seen;
  seen.Reset(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!seen.Insert(ids[i], static_cast<uint32_t>(i)).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "id %d appears twice in one push: sum its gradients into one row", ids[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status SparseTables::PushSparse(const PushSparseRequest& request,
                                      PushSparseResponse* response, bool* step_applied,
                                      SparseOp* op) {
  RETURN_IF_ERROR(CheckIncarnation(options_, incarnation_, request.shard_incarnation()));
  CheckedPush push;
  RETURN_IF_ERROR(CheckPush(request, &push));
  Table* const table = push.table;
  response->set_incarnation(incarnation_);
  const absl::Time begin = absl::Now();
  absl::MutexLock lock(&table->mu);
  PushLog& log = push_logs_.Of(table->group, request.worker());
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
  const uint32_t now = Now(*table, request.clock());
  ASSIGN_OR_RETURN(const int64_t dropped, ApplyPush(*table, request.worker(), push.ids,
                                                    push.grads.data(), now, step_applied));
  response->set_dropped(dropped);
  if (op != nullptr) {
    op->set_group(table->group);
    op->set_op(table->ops);
    op->set_now(now);
    PushSparseRequest& forwarded = *op->mutable_push();
    forwarded = request;
    forwarded.set_group(table->group);
    forwarded.clear_shard_incarnation();
    forwarded.clear_chain_epoch();
  }
  ++table->ops;
  if (request.sequence() != 0) log.Record(request.worker_incarnation(), request.sequence(), 0);
  RaiseNewestClock(*table, StepOf(request.clock()));
  if (table->set->metrics.unique_ids != nullptr) {
    table->set->metrics.unique_ids->Observe(static_cast<double>(push.ids.size()));
    table->set->metrics.staleness->Observe(
        static_cast<double>(table->newest_clock.load(std::memory_order_relaxed) -
                            StepOf(request.clock())));
    table->set->metrics.push_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - begin));
  }
  AfterChange(*table, now);
  return absl::OkStatus();
}

namespace {

struct TableOpWait {
  const int64_t* ops;
  int64_t op;
};

// Read under the table's mutex by absl::Condition.
bool ReachedTableOp(TableOpWait* wait) { return *wait->ops >= wait->op; }

}  // namespace

bool SparseTables::AwaitOp(Table& table, int64_t op, absl::Duration wait,
                           const std::function<bool()>& still_valid) {
  const absl::Time deadline = absl::Now() + wait;
  TableOpWait condition{&table.ops, op};
  while (!ReachedTableOp(&condition)) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration() || !still_valid()) return false;
    table.mu.AwaitWithTimeout(absl::Condition(&ReachedTableOp, &condition),
                              std::min(left, absl::Milliseconds(20)));
  }
  // Reached, but perhaps by an operation of the chain that replaced this
  // one, whose head applied a worker's retry at this number
  // (GroupReplica::ApplyForwardedParts): asked under the table's lock, which
  // the head's operations take too.
  return still_valid();
}

absl::Status SparseTables::ApplyReplicated(const SparseOp& op, absl::Duration wait,
                                           const std::function<bool()>& still_valid,
                                           bool* step_applied) {
  if (options_.replicas <= 1) {
    return absl::FailedPreconditionError("this shard is not replicated");
  }
  const bool is_push = op.has_push();
  if (is_push == op.has_lookup() || op.op() < 0) {
    return absl::InvalidArgumentError(
        "a forwarded table operation is one lookup or one push, at an operation >= 0");
  }
  CheckedPush push;
  std::vector<uint64_t> id_storage;
  absl::Span<const uint64_t> lookup_ids;
  Table* table;
  if (is_push) {
    if (op.push().group() != op.group()) {
      return absl::InvalidArgumentError("a forwarded push names two groups");
    }
    RETURN_IF_ERROR(CheckPush(op.push(), &push));
    table = push.table;
  } else {
    if (op.lookup().group() != op.group() || !op.lookup().train()) {
      return absl::InvalidArgumentError(
          "a forwarded lookup is a training lookup of the op's group");
    }
    ASSIGN_OR_RETURN(table, Find(op.lookup().table(), op.group()));
    ASSIGN_OR_RETURN(lookup_ids, CheckIds(*table, op.lookup().ids(), &id_storage));
  }
  absl::MutexLock lock(&table->mu);
  if (!AwaitOp(*table, op.op(), wait, still_valid)) {
    return absl::UnavailableError(absl::StrFormat(
        "table \"%s\" group %d: operation %d is not next here (the chain changed, or an "
        "earlier forward is missing); retry",
        table->spec.name(), op.group(), op.op()));
  }
  if (table->ops > op.op()) return absl::OkStatus();  // an earlier copy applied it
  if (!is_push) {
    thread_local std::vector<float> scratch;
    scratch.resize(lookup_ids.size() * static_cast<size_t>(table->spec.dim()));
    TrainLookup(*table, lookup_ids, op.lookup().clock(), op.now(), scratch.data());
    return absl::OkStatus();
  }
  const PushSparseRequest& request = op.push();
  PushLog& log = push_logs_.Of(table->group, request.worker());
  absl::MutexLock log_lock(&log.mu());
  absl::StatusOr<int64_t> dropped = ApplyPush(*table, request.worker(), push.ids,
                                              push.grads.data(), op.now(), step_applied);
  if (!dropped.ok()) {
    return absl::InternalError(absl::StrCat("table \"", table->spec.name(), "\" group ",
                                            op.group(), ": replica diverged: the head applied ",
                                            "a push this replica refuses: ",
                                            dropped.status().message()));
  }
  ++table->ops;
  if (request.sequence() != 0) log.Record(request.worker_incarnation(), request.sequence(), 0);
  RaiseNewestClock(*table, StepOf(request.clock()));
  AfterChange(*table, op.now());
  return absl::OkStatus();
}

int64_t SparseTables::GroupOps(int group) const {
  const int slot = SlotOf(group);
  if (slot < 0) return 0;
  std::vector<const Table*> tables;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, set] : tables_) tables.push_back(set->groups[slot].get());
  }
  int64_t ops = 0;
  for (const Table* table : tables) {
    absl::ReaderMutexLock lock(&table->mu);
    ops += table->ops + table->stored_ops.load(std::memory_order_relaxed);
  }
  return ops;
}

void SparseTables::ExportGroup(int group, int64_t max_record_bytes,
                               GroupStateResponse* state) const {
  const int slot = SlotOf(group);
  if (slot < 0) return;
  std::vector<const Table*> tables;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, set] : tables_) tables.push_back(set->groups[slot].get());
  }
  std::sort(tables.begin(), tables.end(),
            [](const Table* a, const Table* b) { return a->spec.name() < b->spec.name(); });
  std::vector<CheckpointRecord> records;
  for (const Table* table : tables) {
    WriteRecords(*table, max_record_bytes, /*replica=*/true, &records);
  }
  for (CheckpointRecord& record : records) *state->add_records() = std::move(record);
  // After the tables: a push applied in between is in the log (and its
  // forward, already applied, is skipped), never applied without its
  // sequence.
  push_logs_.Export(group, state->mutable_table_push_logs());
}

absl::Status SparseTables::ImportGroup(int group, const GroupStateResponse& state) {
  const int slot = SlotOf(group);
  if (slot < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shard %d does not hold replica group %d", options_.shard_index, group));
  }
  absl::flat_hash_map<std::string, bool> started;
  for (const CheckpointRecord& record : state.records()) {
    if (!record.has_table()) continue;
    if (record.table_group() != group) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "group %d's state holds rows of table \"%s\" group %d", group,
          record.table().name(), record.table_group()));
    }
    ASSIGN_OR_RETURN(TableSet * set, FindOrAdd(record.table(), "group state"));
    Table& table = *set->groups[slot];
    const bool first = started.emplace(record.table().name(), true).second;
    if (first) {
      // The joining member's copy starts from nothing but the head's.
      ASSIGN_OR_RETURN(std::unique_ptr<Table> fresh, NewTable(set->spec, group, set));
      absl::MutexLock lock(&table.mu);
      absl::MutexLock fresh_lock(&fresh->mu);
      table.rows = std::move(fresh->rows);
      table.step = std::move(fresh->step);
      table.ops = 0;
      table.stored_ops = 0;
      table.swept = 0;
      table.newest_clock = 0;
      table.steps = 0;
    }
    absl::MutexLock lock(&table.mu);
    RETURN_IF_ERROR(ReadRecord(record, first, table));
  }
  RETURN_IF_ERROR(push_logs_.Import(group, state.table_push_logs(), "table push log"));
  return absl::OkStatus();
}

void SparseTables::FillStatus(StatusResponse* response) const {
  absl::MutexLock lock(&mu_);
  std::vector<const TableSet*> sorted;
  for (const auto& [name, set] : tables_) sorted.push_back(set.get());
  std::sort(sorted.begin(), sorted.end(),
            [](const TableSet* a, const TableSet* b) { return a->spec.name() < b->spec.name(); });
  for (const TableSet* set : sorted) {
    TableState* state = response->add_tables();
    state->set_name(set->spec.name());
    state->set_dim(set->spec.dim());
    state->set_optimizer(set->spec.optimizer().empty() ? "sgd" : set->spec.optimizer());
    state->set_sync(set->spec.sync());
    int64_t rows = 0, capacity = 0, bytes = 0;
    for (const std::unique_ptr<Table>& table : set->groups) {
      absl::ReaderMutexLock table_lock(&table->mu);
      TableGroupRows* group = state->add_groups();
      group->set_group(table->group);
      group->set_rows(table->rows->rows());
      rows += table->rows->rows();
      capacity += table->rows->capacity();
      bytes += table->rows->bytes();
      // The shard's own group's steps.
      if (table->group == groups_.front()) state->set_steps(table->steps);
    }
    state->set_rows(rows);
    state->set_capacity(capacity);
    state->set_bytes(bytes);
  }
}

int64_t SparseTables::num_tables() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(tables_.size());
}

void SparseTables::WriteRecords(const Table& table, int64_t max_record_bytes, bool replica,
                                std::vector<CheckpointRecord>* records) const {
  std::string rows, filter, step;
  std::vector<uint32_t> arrived;
  int32_t record_bytes;
  int64_t steps, ops, newest_clock;
  uint32_t swept;
  {
    // Exclusive: training lookups under the shared lock mark the records'
    // last use (EmbeddingTable::LookupStoredForTraining).
    absl::MutexLock lock(&table.mu);
    table.rows->ExportRecords(&rows);
    table.rows->ExportFilter(&filter);
    record_bytes = table.rows->record_bytes();
    steps = table.steps;
    ops = table.ops + table.stored_ops.load(std::memory_order_relaxed);
    swept = table.swept;
    newest_clock = table.newest_clock.load(std::memory_order_relaxed);
    if (replica && table.step != nullptr) table.step->Export(&step, &arrived);
  }
  // Whole rows per record, and the admission filter in pieces of at most
  // as many bytes (its counters, like the rows, can outgrow a message); one
  // record for an empty table, so that its registration survives.
  const size_t per_record = static_cast<size_t>(
      std::max<int64_t>(1, max_record_bytes / record_bytes) * record_bytes);
  const size_t filter_piece =
      static_cast<size_t>(std::max<int64_t>(kMinFilterPieceBytes, max_record_bytes));
  const size_t filter_bytes = filter.size();
  size_t offset = 0;
  size_t filter_offset = 0;
  do {
    CheckpointRecord& record = records->emplace_back();
    *record.mutable_table() = table.spec;
    record.set_table_group(table.group);
    if (filter_offset < filter_bytes) {
      // A filter that fits in one piece (the default's 8 MiB does) is moved.
      record.set_table_filter(filter_bytes <= filter_piece
                                  ? std::move(filter)
                                  : filter.substr(filter_offset, filter_piece));
      record.set_table_filter_offset(static_cast<int64_t>(filter_offset));
      record.set_table_filter_bytes(static_cast<int64_t>(filter_bytes));
      filter_offset += filter_piece;
    }
    if (offset == 0) {
      record.set_table_steps(steps);
      record.set_table_swept(swept);
      record.set_table_clock(newest_clock);
      if (replica) {
        record.set_ops(ops);
        record.set_accum(std::move(step));
        record.mutable_contributors()->Add(arrived.begin(), arrived.end());
      }
    }
    const size_t take = std::min(per_record, rows.size() - offset);
    record.set_table_rows(rows.substr(offset, take));
    offset += take;
  } while (offset < rows.size() || filter_offset < filter_bytes);
}

absl::Status SparseTables::ReadRecord(const CheckpointRecord& record, bool first,
                                      Table& table) {
  const std::string& name = record.table().name();
  // Checked first, so that a bad record changes nothing.
  const int64_t filter_piece = static_cast<int64_t>(record.table_filter().size());
  const int64_t filter_bytes =
      record.table_filter_bytes() == 0 ? filter_piece : record.table_filter_bytes();
  if (!record.table_filter().empty() &&
      !table.rows->FilterPieceFits(filter_piece, record.table_filter_offset(), filter_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table \"", name, "\" has an admission filter of ", filter_bytes, " bytes (",
        filter_piece, " at ", record.table_filter_offset(),
        " in this record) that its spec does not give"));
  }
  if (record.table_steps() < 0 || record.table_clock() < 0 || record.ops() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("table \"", name, "\" is at step ",
                                                   record.table_steps(), ", clock ",
                                                   record.table_clock(), ", op ", record.ops()));
  }
  if (first && (!record.accum().empty() || record.contributors_size() > 0)) {
    if (table.step == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("async table \"", name, "\" has a sync step in its record"));
    }
    RETURN_IF_ERROR(table.step->Import(record.accum(), record.contributors()));
  }
  RETURN_IF_ERROR(table.rows->ImportRecords(record.table_rows()));
  if (!record.table_filter().empty()) {
    RETURN_IF_ERROR(table.rows->ImportFilterPiece(record.table_filter(),
                                                  record.table_filter_offset(), filter_bytes));
  }
  if (first) {
    if (record.table_steps() > 0) table.steps = record.table_steps();
    if (record.ops() > 0) {
      table.ops = record.ops();
      table.stored_ops = 0;
    }
    table.swept = std::max(table.swept, record.table_swept());
    RaiseNewestClock(table, record.table_clock());
  }
  AfterChange(table, table.swept);
  return absl::OkStatus();
}

void SparseTables::Snapshot(int64_t max_record_bytes,
                            std::vector<CheckpointRecord>* records) const {
  // By name, then group: the same tables give the same records in the same
  // order (a hash map's order differs from one map to another).
  std::vector<const Table*> tables;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, set] : tables_) {
      for (const std::unique_ptr<Table>& table : set->groups) tables.push_back(table.get());
    }
  }
  std::sort(tables.begin(), tables.end(), [](const Table* a, const Table* b) {
    return std::tie(a->spec.name(), a->group) < std::tie(b->spec.name(), b->group);
  });
  for (const Table* table : tables) {
    WriteRecords(*table, max_record_bytes, /*replica=*/false, records);
  }
}

absl::Status SparseTables::Restore(const CheckpointRecord& record) {
  ASSIGN_OR_RETURN(TableSet * set, FindOrAdd(record.table(), "checkpoint"));
  int slot = 0;
  if (options_.replicas > 1) {
    slot = SlotOf(record.table_group());
    if (slot < 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "checkpoint table \"%s\" holds rows of replica group %d, which shard %d does not "
          "hold",
          record.table().name(), record.table_group(), options_.shard_index));
    }
  }
  Table& table = *set->groups[static_cast<size_t>(slot)];
  absl::MutexLock lock(&table.mu);
  // A checkpoint's records carry no sync step; their other fields only
  // raise the table's.
  return ReadRecord(record, /*first=*/true, table);
}

}  // namespace shardtrain::server
