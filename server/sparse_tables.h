// SparseTables: the sparse embedding tables a shard holds, behind the
// RegisterTables, Lookup and PushSparse RPCs: every request checked (table
// known, sizes, finite gradients, unique ids, ids of the request's replica
// group, every limit) before anything changes, pushes applied at most once
// per (worker, worker_incarnation, sequence), TTL sweeps as the table's
// clock advances, and each table's rows in checkpoints as whole records.
//
// A table's consistency is its own (TableSpec.sync), whatever the shard's
// mode, so a sync shard can train its dense tensors in steps and its
// tables as pushes come (PERSIA's hybrid), or both in steps. An async
// table applies a push on arrival. A sync table collects a step's pushes,
// one per worker, in sparse::StepGradients and applies their mean when the
// last is in; a worker's training lookup waits (LookupWaits) until the
// step it pushed is applied, and a second push from a worker in the same
// step is refused (FAILED_PRECONDITION): a sync worker looks up before
// each push.
//
// Replication: a table's rows are kept per replica group (an id's group is
// its slot's, sparse/id_hash.h ShardOfId), one sparse::EmbeddingTable per
// group this shard holds, each with a count of the operations (training
// lookups and pushes) applied to it. At a chain's head, Lookup and
// PushSparse describe what they did as a SparseOp (the request, the
// group's operation count before it and the table clock used), which the
// chain's members apply with ApplyReplicated in operation order: every
// operation is deterministic in its inputs, so the members stay
// bit-identical. ExportGroup / ImportGroup hand a group's tables (rows,
// optimizer state, admission counters, open sync step, clocks, operation
// counts, push logs) to a joining member. With --replicas 1 the shard
// holds its own group only and a request's group is ignored.
//
// Thread-safe. Each (table, group) has its own lock; lookups of one run
// one at a time (a training lookup creates rows), so a shard serves tables
// in parallel with each other and with dense pushes and pulls. Lock order:
// a table's, then a push log's.
#ifndef SHARDTRAIN_SERVER_SPARSE_TABLES_H_
#define SHARDTRAIN_SERVER_SPARSE_TABLES_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/shardtrain.pb.h"
#include "server/push_logs.h"
#include "server/shard_metrics.h"
#include "server/shard_options.h"
#include "sparse/embedding_table.h"
#include "sparse/step_gradients.h"
#include "wire/message_encoder.h"

namespace shardtrain::server {

class SparseTables {
 public:
  // `groups`: the replica groups whose rows this shard holds (Shard::
  // groups()). `metrics` may be null (tests); otherwise it must outlive this.
  SparseTables(const ShardOptions& options, std::vector<int> groups, uint64_t incarnation,
               ShardMetrics* metrics);

  // Registers each table (idempotent for an identical spec); nothing is
  // registered when one is refused.
  absl::Status Register(const RegisterTablesRequest& request);
  // The rows go straight into the response's memory (REQUIRES: response
  // fresh). A training lookup describes itself in *op (if not null) for
  // the chain's other members.
  absl::Status Lookup(const LookupRequest& request, wire::LookupResponseBuilder* response,
                      SparseOp* op = nullptr);
  // *step_applied (if not null) is set when the push completed a sync
  // table's step, so that lookups waiting for it can be answered. A push
  // applied now (not a duplicate) describes itself in *op (if not null).
  absl::Status PushSparse(const PushSparseRequest& request, PushSparseResponse* response,
                          bool* step_applied = nullptr, SparseOp* op = nullptr);
  // Applies an operation of a chain's head (Lookup's or PushSparse's *op)
  // once the group has applied every earlier one, waiting up to `wait`
  // (zero: not at all) while still_valid() holds (UNAVAILABLE after that:
  // the chain changed, or an earlier forward is missing), and applied only
  // while it holds; an operation applied before is skipped. The request is
  // checked as at the head: a malformed operation is INVALID_ARGUMENT
  // (FAILED_PRECONDITION on an unreplicated shard) and changes nothing;
  // INTERNAL when the table refuses a well-formed push the head applied
  // (the replica diverged).
  absl::Status ApplyReplicated(const SparseOp& op, absl::Duration wait,
                               const std::function<bool()>& still_valid,
                               bool* step_applied = nullptr);
  // Operations applied to `group`'s tables (the chain compares members by
  // them).
  int64_t GroupOps(int group) const;
  // `group`'s tables and push logs, for a joining member: each table's rows
  // in records of at most `max_record_bytes` (at least one row each).
  void ExportGroup(int group, int64_t max_record_bytes, GroupStateResponse* state) const;
  // Replaces `group`'s tables (those named in `state`) and push logs with
  // ExportGroup's. An error when a record or log is malformed.
  absl::Status ImportGroup(int group, const GroupStateResponse& state);
  // Whether a Lookup must wait before it is answered: a training lookup of a
  // sync table by a worker whose push of the table's open step is in while
  // another worker's is not. False for a request Lookup refuses.
  bool LookupWaits(const LookupRequest& request) const;

  void FillStatus(StatusResponse* response) const;

  // Checkpoint records of every table and group, by name and group: its
  // spec and whole rows,
  // at most max_record_bytes of rows per record, and in the first its
  // admission filter's counters, steps and clocks. Each group's rows and
  // counters are copied under its lock, so a record never mixes a row's
  // value and state of different moments.
  void Snapshot(int64_t max_record_bytes, std::vector<CheckpointRecord>* records) const;
  // Loads a record written by Snapshot (registering its table) into the
  // record's group (with --replicas 1, the shard's own).
  absl::Status Restore(const CheckpointRecord& record);

  int64_t num_tables() const;

 private:
  struct TableSet;
  // One table's rows of one replica group.
  struct Table {
    TableSpec spec;
    int group = 0;
    TableSet* set = nullptr;  // the table's groups
    mutable absl::Mutex mu;
    std::unique_ptr<sparse::EmbeddingTable> rows ABSL_GUARDED_BY(mu);
    // Operations (training lookups, pushes) applied, under the exclusive
    // lock (every one of a replicated table's).
    int64_t ops ABSL_GUARDED_BY(mu) = 0;
    // ... and training lookups of stored rows under the shared lock
    // (--replicas 1). ops + stored_ops are the table's operations.
    std::atomic<int64_t> stored_ops{0};
    // The clock of the last TTL sweep.
    uint32_t swept ABSL_GUARDED_BY(mu) = 0;
    // The newest worker clock of a training lookup or push (raised by
    // RaiseNewestClock, also under the shared lock).
    std::atomic<int64_t> newest_clock{0};
    // What counters() said when last exported to the metrics.
    mutable absl::Mutex export_mu ABSL_ACQUIRED_AFTER(mu);
    sparse::TableCounters exported ABSL_GUARDED_BY(export_mu);
    // Sync tables: the steps applied, and the open step's pushes (null for
    // an async table).
    int64_t steps ABSL_GUARDED_BY(mu) = 0;
    std::unique_ptr<sparse::StepGradients> step ABSL_GUARDED_BY(mu);
    // Rows and bytes as last exported, for the table's gauges (a sum over
    // its groups).
    std::atomic<int64_t> rows_now{0};
    std::atomic<int64_t> bytes_now{0};
    std::atomic<int64_t> capacity{0};
  };
  // A table: its spec, metrics and one Table per group held, by slot.
  struct TableSet {
    TableSpec spec;
    TableMetrics::Series metrics{};
    std::vector<std::unique_ptr<Table>> groups;
  };
  // A push's checked ids and gradients (f32), as PushSparse and
  // ApplyReplicated need them.
  struct CheckedPush {
    Table* table = nullptr;
    absl::Span<const uint64_t> ids;
    absl::Span<const float> grads;
    std::vector<uint64_t> id_storage;
    std::vector<float> grad_storage;
  };

  // The table `name`'s rows of `group` (with --replicas 1, this shard's
  // own whatever `group` says).
  absl::StatusOr<Table*> Find(const std::string& name, int group) const;
  // The ids of a request, checked: a whole number, within the limit, and
  // every one of `table`'s group.
  absl::StatusOr<absl::Span<const uint64_t>> CheckIds(const Table& table,
                                                      const std::string& ids,
                                                      std::vector<uint64_t>* storage) const;
  // Every check of a push but its incarnation and sequence.
  absl::Status CheckPush(const PushSparseRequest& request, CheckedPush* push) const;
  // The dtype of a request's rows or grads (`what`): unspecified is f32;
  // INVALID_ARGUMENT for one that is not f32, bf16 or f16.
  static absl::StatusOr<DType> WireDType(int dtype, const char* what);
  // A request's worker clock as a step in [0, 2^32).
  static int64_t StepOf(int64_t clock);
  // The table's clock for a request at worker clock `clock`: steps, or Unix
  // seconds for a TTL in seconds.
  static uint32_t Now(const Table& table, int64_t clock);
  void AfterChange(Table& table, uint32_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu);
  // Whether AfterChange at `now` sweeps the rows past their TTL.
  static bool SweepDue(const Table& table, uint32_t now) ABSL_SHARED_LOCKS_REQUIRED(table.mu);
  // The table's counters into its metrics.
  void ExportCounters(Table& table) ABSL_SHARED_LOCKS_REQUIRED(table.mu)
      ABSL_LOCKS_EXCLUDED(table.export_mu);
  static void RaiseNewestClock(Table& table, int64_t clock);
  // A training lookup's changes to `table` at `now` (rows into out).
  void TrainLookup(Table& table, absl::Span<const uint64_t> ids, int64_t clock, uint32_t now,
                   float* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu);
  // TrainLookup in two halves (--replicas 1): first, under the shared lock
  // and beside other lookups, the ids that have rows
  // (EmbeddingTable::LookupStoredForTraining); then, under the exclusive
  // lock, only if some had none, those (LookupMissesForTraining). False,
  // with nothing changed, when the rows are due for their TTL sweep: the
  // caller then calls TrainLookup.
  bool TrainLookupInHalves(Table& table, absl::Span<const uint64_t> ids, int64_t clock,
                           float* out) ABSL_LOCKS_EXCLUDED(table.mu);
  // Applies a checked push to `table` (async: now; sync: into its step, and
  // the step's mean once complete). Returns the gradients dropped (of ids
  // without a row; a sync step's, by the push that completes it), or an
  // error with nothing changed.
  absl::StatusOr<int64_t> ApplyPush(Table& table, uint32_t worker,
                                    absl::Span<const uint64_t> ids, const float* grads,
                                    uint32_t now, bool* step_applied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu);
  // Waits until the group has applied `op` operations while still_valid()
  // holds (true, asked last), or returns false after `wait` or once
  // still_valid() fails.
  static bool AwaitOp(Table& table, int64_t op, absl::Duration wait,
                      const std::function<bool()>& still_valid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu);
  // A fresh Table of `spec` for `group`.
  absl::StatusOr<std::unique_ptr<Table>> NewTable(const TableSpec& spec, int group,
                                                  TableSet* set) const;
  absl::Status AddTable(const TableSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The set of `spec`'s table, registered when new; an error when another
  // spec has its name.
  absl::StatusOr<TableSet*> FindOrAdd(const TableSpec& spec, const char* what);
  // Whole-row records of `table` (at most max_record_bytes of rows each);
  // with `replica`, also what a joining member needs (operations, the open
  // sync step).
  void WriteRecords(const Table& table, int64_t max_record_bytes, bool replica,
                    std::vector<CheckpointRecord>* records) const;
  // Reads one of WriteRecords' records into `table`; `first` for the first
  // of the table's records.
  absl::Status ReadRecord(const CheckpointRecord& record, bool first, Table& table)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu);
  int SlotOf(int group) const { return push_logs_.SlotOf(group); }

  const ShardOptions options_;
  const std::vector<int> groups_;
  const uint64_t incarnation_;
  ShardMetrics* const metrics_;

  mutable absl::Mutex mu_;
  // Tables are never removed: a TableSet* and its Table*s stay valid.
  absl::flat_hash_map<std::string, std::unique_ptr<TableSet>> tables_ ABSL_GUARDED_BY(mu_);
  // PushSparse sequences applied, per group held and worker.
  PushLogs push_logs_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_SPARSE_TABLES_H_
