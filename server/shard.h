// Shard: the state machine of one parameter-server shard.
//
// It owns the tensor store, the optimizer and membership, and implements the
// semantics of every RPC independent of gRPC, so tests can drive it
// directly. A push is checked in full (server/decoded_push.h) and its parts
// applied in the job's mode (server/partition_updater.h: sync steps
// averaged once every worker's gradient is in, async updates on arrival).
// Every request is validated in full, resource limits included, before any
// state changes, so a rejected request leaves the shard exactly as it was.
//
// Each Shard has an incarnation, a random non-zero id; requests naming
// another one are refused with ABORTED (the shard restarted). Pushes are
// applied at most once per (worker, worker_incarnation, sequence): a retry
// of one already applied answers OK with duplicate = true (PushLog,
// server/push_log.h). Checkpoints, step snapshots and group state carry
// each partition as server/partition_record.h writes and reads it.
//
// Pulls are answered by the PullReader (server/pull_reader.h), which reads
// the store and membership; one that cannot be answered yet is not blocked
// on here: the progress callback fires whenever the answer may have
// changed (see server/parameter_server_service.h).
//
// Replicated shards (options().replicas > 1, server/replication/): the
// shard holds the partitions of several replica groups. As a chain's head
// it applies a push as above and reports where each part was applied
// (GroupReplica::Applied); what its successors do with the forwarded copy,
// commit marks and state transfer are the GroupReplica's
// (server/group_replica.h).
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_SHARD_H_
#define SHARDTRAIN_SERVER_SHARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/shardtrain.pb.h"
#include "server/group_replica.h"
#include "server/membership.h"
#include "server/optimizer.h"
#include "server/partition_updater.h"
#include "server/pull_reader.h"
#include "server/push_logs.h"
#include "server/shard_metrics.h"
#include "server/shard_options.h"
#include "server/sparse_tables.h"
#include "server/step_snapshot.h"
#include "server/tensor_store.h"
#include "wire/message_encoder.h"
#include "wire/message_views.h"

namespace shardtrain::server {

class Shard {
 public:
  // `metrics` is not owned and must outlive the shard.
  static absl::StatusOr<std::unique_ptr<Shard>> Create(
      const ShardOptions& options, ShardMetrics* metrics);

  absl::Status Register(const RegisterRequest& request,
                        RegisterResponse* response);
  // Applies the gradients of a push as received: dense payloads of any
  // dtype are checked (sizes, NaN/Inf) and then applied straight from the
  // received bytes, without a copy; `request` is only read during the call.
  absl::Status Push(const wire::PushView& request, PushResponse* response);
  // The same for a stock message (tests, in-process callers).
  absl::Status Push(const PushRequest& request, PushResponse* response);

  // Push with the request's group already known (replica().GroupOf), which
  // also reports where each part was applied (`applied` may be null): a
  // chain's head forwards that.
  absl::Status Push(const wire::PushView& request, int group, PushResponse* response,
                    GroupReplica::Applied* applied);

  // Answers pulls (checks, readiness, the parameters; server/pull_reader.h).
  const PullReader& pulls() const { return pulls_; }
  // Sync: a pull of a worker that rejoined after being dropped tells the
  // shard from which step on it takes part; steps before it no longer wait
  // for its gradient (they may complete now).
  // REQUIRES: pulls().Validate(request).ok().
  void NotePull(const PullRequest& request);

  // The replica groups held and the chain side of them: forwarded pushes,
  // commit marks, state transfer (server/group_replica.h).
  GroupReplica& replica() { return replica_; }
  const GroupReplica& replica() const { return replica_; }

  absl::Status Heartbeat(const HeartbeatRequest& request,
                         HeartbeatResponse* response);
  // Lists at most request.max_partitions partitions (0: 100) and summarises
  // all of them.
  void FillStatus(const StatusRequest& request, StatusResponse* response) const;

  // Forgets silent workers; completes sync steps they were holding up.
  void Tick(absl::Time now);

  // `callback` runs (on the calling thread, with no shard lock held)
  // after anything that may let a waiting pull proceed.
  void SetProgressCallback(std::function<void()> callback);

  // A copy of every partition (spec, version, parameters, optimizer slots)
  // and every sparse table's rows for a checkpoint; each partition and
  // table is copied under its lock. Pending sync accumulators are not
  // included: their step restarts after a restore. (A sync shard's step
  // checkpoints are its step_snapshot()'s, the tables copied with them.)
  std::vector<CheckpointRecord> Snapshot() const;
  // Loads records written by Snapshot() into this (fresh) shard.
  // FAILED_PRECONDITION if they do not fit its tensors or optimizer.
  absl::Status Restore(const std::vector<CheckpointRecord>& records);

  // A hash of every partition's parameters, slots, accumulator and version;
  // tests compare it before and after a rejected request.
  uint64_t Checksum() const;

  const ShardOptions& options() const { return options_; }

  // The random non-zero id of this shard process.
  uint64_t incarnation() const { return incarnation_; }
  // The sparse tables this shard holds (in its checkpoints with its
  // partitions).
  SparseTables& tables() { return tables_; }
  const SparseTables& tables() const { return tables_; }

  // The clock membership has recorded for each worker index, and what the
  // staleness bound adds to it (Membership::StalenessClock), for a
  // checkpoint; RestoreWorkerClocks seeds them back (a worker not seen yet
  // counts with its restored clock and offset, and Register returns the
  // clock).
  std::vector<int64_t> WorkerClocks() const;
  std::vector<int64_t> WorkerClockOffsets() const;
  void RestoreWorkerClocks(const std::vector<int64_t>& clocks,
                           const std::vector<int64_t>& offsets = {});

  // Pushes that went at most this far below a worker's highest applied
  // sequence can still be recognised as duplicates.
  static constexpr int64_t kPushWindow = PushLog::kWindow;

  // Sync mode: the copies of each partition at every
  // options().checkpoint_every_steps-th step (server/step_snapshot.h).
  StepSnapshot& step_snapshot() { return step_snapshot_; }

 private:
  Shard(const ShardOptions& options, std::unique_ptr<Optimizer> optimizer,
        ShardMetrics* metrics);

  absl::Status CheckRegisterLimits(const RegisterRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(register_mu_);
  // KIND_VALUES: only worker 0's values create partitions. UNAVAILABLE for
  // another worker's spec that would create some here (it retries until
  // worker 0 has registered), INVALID_ARGUMENT for worker 0's without
  // values.
  absl::Status CheckInitialValues(const RegisterRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(register_mu_);
  // Applies a push with a sequence at most once (see PushLog).
  absl::Status DedupedPush(const wire::PushView& request, int group,
                           PushResponse* response, GroupReplica::Applied* applied);
  // Checks and applies a push (no duplicate check); the caller notifies
  // progress.
  absl::Status ApplyPush(const wire::PushView& request, PushResponse* response,
                         GroupReplica::Applied* applied);
  // Closes the sync steps of the groups this shard leads that have all the
  // gradients they now need (workers departed or rejoined); reports the
  // closes through the hooks. True if any closed.
  bool FinishSteps();
  void NotifyProgress();

  const ShardOptions options_;
  const std::unique_ptr<Optimizer> optimizer_;
  ShardMetrics* const metrics_;
  const uint64_t incarnation_;
  const absl::Time start_time_;
  TensorStore store_;
  Membership membership_;

  // Held across the limit checks and the registration of a Register.
  absl::Mutex register_mu_;
  // The replica groups held (the shard's own first).
  const std::vector<int> groups_;
  // Push sequences applied, per group held and worker; a log is locked
  // before any partition.
  PushLogs push_logs_{groups_, options_.num_workers};
  std::atomic<int64_t> duplicate_pushes_{0};
  std::atomic<int64_t> dropped_gradients_{0};
  std::atomic<int64_t> max_staleness_seen_{0};

  mutable absl::Mutex callback_mu_;
  std::function<void()> progress_callback_ ABSL_GUARDED_BY(callback_mu_);

  // Filled by the updater's sync steps; emptied by the checkpoint writer.
  StepSnapshot step_snapshot_{options_.checkpoint_every_steps};
  PartitionUpdater updater_{options_, optimizer_.get(), &membership_, metrics_,
                            &step_snapshot_};
  SparseTables tables_{options_, groups_, incarnation_, metrics_};
  PullReader pulls_{options_, incarnation_, &store_, &membership_, metrics_};
  GroupReplica replica_{options_, incarnation_, groups_,
                        {&store_, &updater_, &push_logs_, &membership_, &tables_,
                         optimizer_.get(), metrics_},
                        [this] { NotifyProgress(); }};
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_SHARD_H_
