// GroupReplica: a shard's side of chain replication for its dense
// partitions (--replicas > 1, server/replication/ drives it): the replica
// groups it holds and, for each, what a member of the group's chain does.
//
//  - Head: Shard::Push applies a worker's push and reports where each part
//    went (Applied: operation count and version after, per part); the
//    forwarded copy carries that.
//  - Follower: ApplyForwarded applies a forwarded push whole at the head's
//    operation counts and with the head's sync-step decisions (closes
//    included), so every member stays bit-identical; a forward sent again
//    changes nothing, and one from a chain this shard has left is refused.
//  - Commit marks: a version is committed once the tail holds it
//    (MarkCommitted as forwards are acknowledged, CommitGroup when this
//    shard is the tail); committed reads wait for it (PullReader).
//  - State transfer: Export gives a group's whole state (partitions with
//    their operation counts and step in flight, the push logs, the sparse
//    tables' rows) to a joining tail, which installs it with Import.
//  - Hooks: only the head decides when a sync step completes outside a
//    push (a worker departed), and its closes are forwarded (SetHooks).
//
// With --replicas 1 the shard holds its own group only and leads it.
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_GROUP_REPLICA_H_
#define SHARDTRAIN_SERVER_GROUP_REPLICA_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/shardtrain.pb.h"
#include "server/decoded_push.h"
#include "server/membership.h"
#include "server/optimizer.h"
#include "server/partition_updater.h"
#include "server/push_logs.h"
#include "server/shard_metrics.h"
#include "server/shard_options.h"
#include "server/sparse_tables.h"
#include "server/tensor_store.h"
#include "wire/message_views.h"

namespace shardtrain::server {

class GroupReplica {
 public:
  // Where a push was applied, for its forwarded copy: ops[i] for part i
  // of the request (PushRequest.replicated). Empty for a duplicate.
  struct Applied {
    std::vector<ReplicatedOp> ops;
    // The partition of ops[i]; null (or missing) for a step close, which
    // names its partition itself (ReplicatedOp.close).
    std::vector<Partition*> partitions;
  };

  struct Hooks {
    // True when this shard heads `group`'s chain (and may start operations
    // on it now). Each true is followed by exactly one on_closed call.
    std::function<bool(int group)> leads;
    // After a true leads(group): the sync steps the head closed outside a
    // push, possibly none; `closes` must be forwarded.
    std::function<void(int group, std::vector<ReplicatedOp> closes)> on_closed;
  };

  // The shard's parts the replica side reads and changes; none owned, all
  // must outlive it.
  struct ShardParts {
    TensorStore* store = nullptr;
    PartitionUpdater* updater = nullptr;
    PushLogs* push_logs = nullptr;
    Membership* membership = nullptr;
    SparseTables* tables = nullptr;
    const Optimizer* optimizer = nullptr;
    ShardMetrics* metrics = nullptr;
  };

  // `groups`: those held, the shard's own first. `notify` runs after
  // anything that may let a waiting pull proceed.
  GroupReplica(const ShardOptions& options, uint64_t incarnation, std::vector<int> groups,
               ShardParts parts, std::function<void()> notify);

  // The replica group all parts of a push (or pull) belong to, from the
  // placement alone (the tensor need not be registered here):
  // INVALID_ARGUMENT when they span groups or name none.
  absl::StatusOr<int> GroupOf(const wire::PushView& request) const;
  absl::StatusOr<int> GroupOf(const PullRequest& request) const;
  int GroupOf(const PartitionKey& key) const;
  const std::vector<int>& groups() const { return groups_; }

  // Applies a push forwarded down its group's chain: part i at operation
  // request.replicated[i].op of its partition, waiting up to `wait` (zero:
  // not at all) for the operations before it while `still_valid()` (this
  // shard still a member of the chain the forward came under) holds.
  // The parts are applied together, and only while `still_valid()` holds;
  // UNAVAILABLE, with none applied, otherwise. Parts already applied are
  // skipped. Trailing replicated entries with a `close` key close that
  // partition's sync step.
  absl::Status ApplyForwarded(const wire::PushView& request, absl::Duration wait,
                              const std::function<bool()>& still_valid,
                              PushResponse* response, Applied* applied = nullptr);

  // The chain's tail holds the versions `applied` produced: reads of them
  // may be answered. With `wake`, wakes waiting pulls (a head's).
  void MarkCommitted(const Applied& applied, bool wake);
  // This shard is `group`'s tail: everything it holds of the group is
  // committed. Wakes waiting pulls when that changed anything.
  void CommitGroup(int group);

  // The whole state of one group, for a joining tail.
  GroupStateResponse Export(int group) const;
  // Installs Export's answer in place of this shard's copy.
  absl::Status Import(int group, const GroupStateResponse& state);
  // Operations applied to `group`'s partitions and tables, summed.
  int64_t Ops(int group) const;

  // Set before serving; without hooks the shard leads every group.
  void SetHooks(Hooks hooks);
  // Whether this shard may close `group`'s sync steps now (hooks.leads).
  bool Leads(int group) const;
  // Reports the steps closed in a group Leads said yes to (hooks.on_closed).
  void Closed(int group, std::vector<ReplicatedOp> closes) const;

 private:
  // ApplyForwarded's parts (`parts`, decoded from `request`, at least one):
  // all applied, those already applied skipped, and the push recorded in
  // the worker's log; or none.
  absl::Status ApplyForwardedParts(const wire::PushView& request,
                                   const std::vector<DecodedPart>& parts, absl::Duration wait,
                                   const std::function<bool()>& still_valid,
                                   int64_t* max_staleness);
  // ApplyForwardedParts without waiting: `*reached` false, and nothing
  // applied, when a part's operation is not reached yet.
  absl::Status ApplyReachedParts(const wire::PushView& request,
                                 const std::vector<DecodedPart>& parts,
                                 const std::function<bool()>& still_valid,
                                 int64_t* max_staleness, bool* reached);
  // A follower's step for one part, `p` locked at the part's operation.
  absl::Status ApplyForwardedPart(Partition& p, const DecodedPart& part,
                                  const ReplicatedOp& op, uint32_t worker,
                                  int64_t* staleness) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Locks `p` once its operation count reaches `op` while `still_valid()`
  // holds (true, asked last with `p` held), or returns false (unlocked)
  // after `wait` or once `still_valid()` fails.
  static bool LockAtOp(Partition& p, int64_t op, absl::Duration wait,
                       const std::function<bool()>& still_valid)
      ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true, p.mu);

  const ShardOptions& options_;
  const uint64_t incarnation_;
  const std::vector<int> groups_;
  const ShardParts shard_;
  const std::function<void()> notify_;
  mutable absl::Mutex hooks_mu_;
  Hooks hooks_ ABSL_GUARDED_BY(hooks_mu_);
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_GROUP_REPLICA_H_
