// SparseTables: the sparse embedding tables a shard holds, behind the
// RegisterTables, Lookup and PushSparse RPCs: every request checked (table
// known, sizes, finite gradients, unique ids, ids of this shard, every
// limit) before anything changes, pushes applied at most once per (worker,
// worker_incarnation, sequence), TTL sweeps as the table's clock advances,
// and each table's rows in checkpoints as whole records.
//
// A table's consistency is its own (TableSpec.sync), whatever the shard's
// mode, so a sync shard can train its dense tensors in steps and its
// tables as pushes come (PERSIA's hybrid), or both in steps. An async
// table applies a push on arrival. A sync table collects a step's pushes,
// one per worker, in sparse::StepGradients and applies their mean when the
// last is in; a worker's training lookup waits (LookupWaits) until the
// step it pushed is applied, and a second push from a worker in the same
// step is refused (FAILED_PRECONDITION): a sync worker looks up before
// each push. Tables are not replicated yet: RegisterTables is refused
// (FAILED_PRECONDITION) with --replicas > 1, whose chains do not carry
// table rows.
//
// Thread-safe. Each table has its own lock; lookups of one table run one
// at a time (a training lookup creates rows), so a shard serves tables in
// parallel with each other and with dense pushes and pulls.
#ifndef SHARDTRAIN_SERVER_SPARSE_TABLES_H_
#define SHARDTRAIN_SERVER_SPARSE_TABLES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/shardtrain.pb.h"
#include "server/push_log.h"
#include "server/shard_metrics.h"
#include "server/shard_options.h"
#include "sparse/embedding_table.h"
#include "sparse/step_gradients.h"
#include "wire/message_encoder.h"

namespace shardtrain::server {

class SparseTables {
 public:
  // `metrics` may be null (tests); otherwise it must outlive this.
  SparseTables(const ShardOptions& options, uint64_t incarnation, ShardMetrics* metrics);

  // Registers each table (idempotent for an identical spec); nothing is
  // registered when one is refused.
  absl::Status Register(const RegisterTablesRequest& request);
  // The rows go straight into the response's memory (REQUIRES: response
  // fresh).
  absl::Status Lookup(const LookupRequest& request, wire::LookupResponseBuilder* response);
  // *step_applied (if not null) is set when the push completed a sync
  // table's step, so that lookups waiting for it can be answered.
  absl::Status PushSparse(const PushSparseRequest& request, PushSparseResponse* response,
                          bool* step_applied = nullptr);
  // Whether a Lookup must wait before it is answered: a training lookup of a
  // sync table by a worker whose push of the table's open step is in while
  // another worker's is not. False for a request Lookup refuses.
  bool LookupWaits(const LookupRequest& request) const;

  void FillStatus(StatusResponse* response) const;

  // Checkpoint records of every table: its spec and whole rows, at most
  // max_record_bytes of rows per record, and in the first its admission
  // filter's counters. Each table's rows and counters are copied under its
  // lock, so a record never mixes a row's value and state of different
  // moments.
  void Snapshot(int64_t max_record_bytes, std::vector<CheckpointRecord>* records) const;
  // Loads a record written by Snapshot (registering its table).
  absl::Status Restore(const CheckpointRecord& record);

  int64_t num_tables() const;

 private:
  struct Table {
    TableSpec spec;
    mutable absl::Mutex mu;
    std::unique_ptr<sparse::EmbeddingTable> rows ABSL_GUARDED_BY(mu);
    // The clock of the last TTL sweep.
    uint32_t swept ABSL_GUARDED_BY(mu) = 0;
    // The newest worker clock of a training lookup or push.
    int64_t newest_clock ABSL_GUARDED_BY(mu) = 0;
    // What counters() said when last exported to the metrics.
    sparse::TableCounters exported ABSL_GUARDED_BY(mu);
    // Sync tables: the steps applied, and the open step's pushes (null for
    // an async table).
    int64_t steps ABSL_GUARDED_BY(mu) = 0;
    std::unique_ptr<sparse::StepGradients> step ABSL_GUARDED_BY(mu);
    TableMetrics::Series metrics{};
  };

  absl::StatusOr<Table*> Find(const std::string& name) const;
  // The ids of a request, checked: a whole number, within the limit, and
  // every one this shard's.
  absl::StatusOr<absl::Span<const uint64_t>> CheckIds(const std::string& ids,
                                                      std::vector<uint64_t>* storage) const;
  absl::Status CheckIncarnation(uint64_t shard_incarnation) const;
  // The dtype of a request's rows or grads (`what`): unspecified is f32;
  // INVALID_ARGUMENT for one that is not f32, bf16 or f16.
  static absl::StatusOr<DType> WireDType(int dtype, const char* what);
  // A request's worker clock as a step in [0, 2^32).
  static int64_t StepOf(int64_t clock);
  // The table's clock for a request at worker clock `clock`: steps, or Unix
  // seconds for a TTL in seconds.
  static uint32_t Now(const Table& table, int64_t clock);
  void AfterChange(Table& table, uint32_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu);
  // Applies a checked push to `table` (async: now; sync: into its step, and
  // the step's mean once complete). Returns the gradients dropped (of ids
  // without a row; a sync step's, by the push that completes it), or an
  // error with nothing changed.
  absl::StatusOr<int64_t> ApplyPush(Table& table, uint32_t worker,
                                    absl::Span<const uint64_t> ids, const float* grads,
                                    uint32_t now, bool* step_applied)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu);
  absl::Status AddTable(const TableSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShardOptions options_;
  const uint64_t incarnation_;
  ShardMetrics* const metrics_;

  mutable absl::Mutex mu_;
  // Tables are never removed: a Table* stays valid.
  absl::flat_hash_map<std::string, std::unique_ptr<Table>> tables_ ABSL_GUARDED_BY(mu_);
  // PushSparse sequences applied, per worker.
  std::vector<PushLog> push_logs_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_SPARSE_TABLES_H_
