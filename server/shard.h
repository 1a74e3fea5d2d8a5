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
// Pulls that cannot be answered yet are not blocked on here: PullReady says
// whether one can, and the progress callback fires whenever the answer may
// have changed (see server/service.h).
//
// Replicated shards (options().replicas > 1, server/replication/): the
// shard holds the partitions of several replica groups. As a chain's head
// it applies a push as above and reports where each part was applied
// (Applied); its successors apply the forwarded copy with ApplyReplicated
// at the same per-partition operation count and with the head's step
// decisions, so every member stays bit-identical. A joining tail installs
// the group's state with ImportGroup from its predecessor's ExportGroup.
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
#include "server/membership.h"
#include "server/optimizer.h"
#include "server/partition_updater.h"
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

  // Where a push was applied, for its forwarded copy: ops[i] for part i
  // of the request (PushRequest.replicated). Empty for a duplicate.
  struct Applied {
    std::vector<ReplicatedOp> ops;
    // The partition of ops[i]; null (or missing) for a step close, which
    // names its partition itself (ReplicatedOp.close).
    std::vector<Partition*> partitions;
  };

  // The replica group all parts of a push (or pull) belong to, from the
  // placement alone (the tensor need not be registered here):
  // INVALID_ARGUMENT when they span groups (a replicated request names one
  // group) or name none.
  absl::StatusOr<int> GroupOf(const wire::PushView& request) const;
  absl::StatusOr<int> GroupOf(const PullRequest& request) const;
  int GroupOf(const PartitionKey& key) const;
  // Push with the request's group already known (GroupOf(request)), which
  // also reports where each part was applied (`applied` may be null).
  absl::Status Push(const wire::PushView& request, int group, PushResponse* response,
                    Applied* applied);

  // Applies a push forwarded down `request`'s group chain: part i at
  // operation request.replicated[i].op of its partition, waiting up to
  // `wait` for the operations before it while `still_valid()` holds
  // (UNAVAILABLE otherwise); parts already applied are skipped, so a
  // forward sent again changes nothing. Trailing replicated entries with a
  // `close` key close that partition's sync step.
  absl::Status ApplyReplicated(const wire::PushView& request, absl::Duration wait,
                               const std::function<bool()>& still_valid,
                               PushResponse* response, Applied* applied = nullptr);
  // The chain's tail holds the versions `applied` produced (their forward
  // was acknowledged, or this shard is the tail): reads of them may be
  // answered by PullCommitted. With `wake`, wakes waiting pulls (only a
  // head has reads waiting for this).
  void MarkCommitted(const Applied& applied, bool wake);
  // This shard is `group`'s tail (it may have just become it, with
  // versions applied whose forward failed): everything it holds of the
  // group is committed. Wakes waiting pulls when that changed anything.
  void CommitGroup(int group);
  // The whole state of one group (partitions with their operation counts,
  // sync accumulators, and the group's push logs), for a joining tail.
  GroupStateResponse ExportGroup(int group) const;
  // Installs ExportGroup's answer in place of this shard's copy.
  absl::Status ImportGroup(int group, const GroupStateResponse& state);
  // Operations applied to `group`'s partitions, summed.
  int64_t GroupOps(int group) const;
  // The groups held here (the shard's own group first).
  const std::vector<int>& groups() const { return groups_; }

  struct ReplicationHooks {
    // True when this shard heads `group`'s chain (and may start operations
    // on it now): only the head decides when a sync step completes; a
    // follower closes steps only as told. Each true is followed by exactly
    // one on_closed(group, ...) call.
    std::function<bool(int group)> leads;
    // After a true leads(group): the sync steps the head closed outside a
    // push (a departed worker), possibly none; `closes` must be forwarded
    // (PushRequest.replicated close entries).
    std::function<void(int group, std::vector<ReplicatedOp> closes)> on_closed;
  };
  // Set before serving; without hooks the shard leads every group.
  void SetReplicationHooks(ReplicationHooks hooks);

  // Checks a pull without answering it: the keys exist here, the worker is
  // known, the version asked for is reachable.
  absl::Status ValidatePull(const PullRequest& request) const;
  // Sync: a pull of a worker that rejoined after being dropped tells the
  // shard from which step on it takes part; steps before it no longer wait
  // for its gradient (they may complete now).
  // REQUIRES: ValidatePull(request).ok().
  void NotePull(const PullRequest& request);
  // True when `request` may be answered now.
  // REQUIRES: ValidatePull(request).ok().
  bool PullReady(const PullRequest& request) const;
  // Writes the current parameters of the requested partitions, converted to
  // the requested dtype, into `builder`: each partition once, under its
  // lock, straight into the memory that is sent.
  // REQUIRES: ValidatePull(request).ok().
  // `versions` (if not null) gets the version written of each part, in
  // request order.
  void FillPull(const PullRequest& request, wire::PullResponseBuilder* builder,
                std::vector<int64_t>* versions = nullptr) const;
  // True when every part of `request` is committed at least up to the
  // version FillPull wrote of it (`versions`): the chain's tail holds it.
  // REQUIRES: ValidatePull(request).ok().
  bool PullCommitted(const PullRequest& request, absl::Span<const int64_t> versions) const;
  // The same as a stock message (tests, in-process callers): encoded as
  // above and parsed back, wait_seconds 0.
  // REQUIRES: ValidatePull(request).ok().
  void FillPull(const PullRequest& request, PullResponse* response) const;

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
  // for a checkpoint; each partition is copied under its lock. Pending sync
  // accumulators are not included: their step restarts after a restore.
  std::vector<CheckpointRecord> Snapshot() const;
  // Appends the sparse tables' records (each table's rows copied under its
  // lock): Snapshot() includes them, and a sync shard's step checkpoints
  // add them to the step's partition copies (tables are async).
  void SnapshotTables(std::vector<CheckpointRecord>* records) const;
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

  absl::Status CheckWorker(uint32_t worker) const;
  absl::Status CheckIncarnation(uint64_t shard_incarnation) const;
  // Counts a refusal for going over `limit` and returns `status`.
  absl::Status Refuse(const char* limit, absl::Status status) const;
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
                           PushResponse* response, Applied* applied);
  // Checks and applies a push (no duplicate check); the caller notifies
  // progress.
  absl::Status ApplyPush(const wire::PushView& request, PushResponse* response,
                         Applied* applied);
  // A follower's step of ApplyReplicated for one part, `p` locked at the
  // part's operation.
  absl::Status ApplyForwardedPart(Partition& p, const DecodedPart& part,
                                  const ReplicatedOp& op, uint32_t worker,
                                  int64_t* staleness)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Locks `p` once its operation count reaches `op` (true), or returns
  // false (unlocked) after `wait` or when `still_valid()` fails.
  static bool LockAtOp(Partition& p, int64_t op, absl::Duration wait,
                       const std::function<bool()>& still_valid)
      ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true, p.mu);
  bool Leads(int group) const;
  // Closes the sync steps of the groups this shard leads that have all the
  // gradients they now need (workers departed or rejoined); reports the
  // closes through the hooks. True if any closed.
  bool FinishSteps();
  void NotifyProgress();
  void UpdateMembershipMetrics();
  void CountJoin(Membership::Join join);

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
  mutable absl::Mutex hooks_mu_;
  ReplicationHooks hooks_ ABSL_GUARDED_BY(hooks_mu_);
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
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_SHARD_H_
