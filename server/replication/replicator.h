// Replicator: the chain-replication steps of a replicated shard's RPCs
// (--replicas > 1), between the gRPC service (server/parameter_server_service.h) and the
// Shard.
//
//  - A worker's push: refused unless this shard heads the group's chain at
//    the request's epoch; applied (Shard::Push, which says where each part
//    went); forwarded with those ops to the successor (Forwarder); answered
//    once the tail has applied it. A retry of a push whose forward is still
//    under way is refused with UNAVAILABLE (it is answered as a duplicate
//    once that forward ends), so no worker hears OK before the tail has it.
//    The head never gives up such a forward while it heads the chain and
//    the successor is in it (every later operation waits for this one at
//    the successor); a push not at the tail after forward_timeout is
//    answered UNAVAILABLE while its forward goes on.
//  - A forwarded push (Replicate): refused unless this shard is a member at
//    the request's epoch and has its state; applied at the head's
//    operations (GroupReplica::ApplyForwarded); forwarded on; answered as above.
//    Forwards may overtake each other on the way (two head threads send to
//    one successor), so one may come before an operation it follows: it
//    waits for that one on a thread of its own (ElasticThreadPool), never
//    on the thread that received it, which may be the only reader of the
//    connection the missing one is coming on.
//  - A pull: refused unless this shard is the group's tail at the epoch.
//    The tail holds exactly the updates every member has applied, so a pull
//    never sees one that a failover could lose, and a worker's own
//    acknowledged pushes are always in it (acknowledged = at the tail).
//  - A PushPull goes to the head, which saves the worker a round trip: the
//    push half as above, then the pull half is answered by the head with a
//    committed read. The head's state may hold updates the tail does not
//    have yet (applied, still being forwarded), so the parameters it reads
//    are sent only once every version read is committed (GroupReplica::
//    MarkCommitted, as forwards are acknowledged; PullReader::Committed):
//    what a worker sees is what the tail holds, as with a pull at the tail.
//  - A sparse table's training lookup or push (SparseTables) goes to the
//    head of its ids' group: admitted and applied there as a dense push
//    is, described as a SparseOp (the request, the group's operation count
//    before it, the table clock used) and forwarded alone; every member
//    applies it in operation order (SparseTables::ApplyReplicated); the
//    answer (rows, or the push's OK) goes out once the tail has it, so a
//    row a worker read, or a push it was told is in, survives a head's
//    death.
//  - Sync steps the head closes outside a push (a worker departed) are
//    forwarded as close ops (GroupReplica::Hooks).
//  - Every operation the head starts is admitted by the ChainTable and
//    released once the tail has it (or it failed), so a head handing its
//    place over (Coordinator) can wait until the members agree.
//
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_REPLICATION_REPLICATOR_H_
#define SHARDTRAIN_SERVER_REPLICATION_REPLICATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/elastic_thread_pool.h"
#include "proto/shardtrain.pb.h"
#include "server/replication/chain_table.h"
#include "server/replication/forwarder.h"
#include "server/replication/replication_metrics.h"
#include "server/shard.h"
#include "wire/message_views.h"

namespace shardtrain::server {

class Replicator {
 public:
  using Done = std::function<void(absl::Status, const PushResponse&)>;

  // Not owned; all must outlive the replicator. Installs the shard's
  // replication hooks.
  // `max_waiting_forwards` (--max_waiting_forwards): forwards that may
  // wait at once for the operations before them (Replicate).
  Replicator(Shard* shard, ChainTable* table, Forwarder* forwarder,
             ReplicationMetrics* metrics, absl::Duration forward_timeout,
             int max_waiting_forwards = 64);
  // Waits for the forwards waiting (Stop first ends their waits).
  ~Replicator();

  // A worker's push (`view` parsed from `request`); `done` may run before
  // this returns. `view` is only read during the call.
  void Push(const grpc::ByteBuffer& request, const wire::PushView& view, Done done);
  // A sparse table's training lookup or push at the head of `group`, the
  // request naming chain `epoch`: `apply` runs it here, describing what it
  // changed in *op or setting *duplicate (a push applied before); `done`
  // gets its status once the tail has it. A push (`sequence` != 0, with
  // its worker and incarnation) whose forward is still under way when
  // retried is UNAVAILABLE, as a dense push's. `apply` runs before this
  // returns; `done` may.
  using SparseApply = std::function<absl::Status(SparseOp* op, bool* duplicate)>;
  void Sparse(int group, uint64_t epoch, uint32_t worker, uint64_t worker_incarnation,
              uint64_t sequence, const SparseApply& apply, std::function<void(absl::Status)> done);
  // A push forwarded by this shard's predecessor (`view` parsed from
  // `request`, which must stay alive until `done` runs). Applied on the
  // calling thread when its operations are next here, as they usually are.
  // One that came before an operation it follows waits for it (up to
  // forward_timeout/2) on a thread of its own, and the caller goes on at
  // once; with max_waiting_forwards waiting already, it is UNAVAILABLE at
  // once (the predecessor sends it again). `done` may run before this
  // returns.
  void Replicate(const grpc::ByteBuffer& request, const wire::PushView& view, Done done);
  // Shutdown: forwards waiting give up (UNAVAILABLE) and no more wait.
  void Stop();
  // OK when this shard may answer `pull` (the group's tail at its epoch).
  absl::Status CheckPull(const PullRequest& pull) const;
  // OK when this shard may answer the pull half of a PushPull whose push is
  // `push`: both name the same group, and this shard heads it at the
  // pull's epoch (also checked again before the answer is read).
  absl::Status CheckHeadPull(const PullRequest& pull) const;
  absl::Status CheckPushPull(const wire::PushView& push, const PullRequest& pull) const;
  // For a joining successor: this group's state, once this shard knows the
  // configuration (request.chain_epoch) in which it has that successor.
  absl::StatusOr<GroupStateResponse> GroupState(const GroupStateRequest& request) const;
  // Operations of `group` the tail has acknowledged (for Status).
  int64_t Acked(int group) const;

  ChainTable& table() { return *table_; }

 private:
  // (group, worker, worker_incarnation, sequence); a sparse push's group
  // is -1 - group (its sequences are a space of their own).
  using PushKey = std::tuple<int, uint32_t, uint64_t, uint64_t>;
  // Forwards `request` plus `ops` (if any) and calls `done` with `response`.
  // Once the successor acknowledges, what `committed` applied is marked
  // committed here; then an `admitted` head operation is released
  // (ChainTable::AdmitHead).
  void ForwardAndAnswer(int group, grpc::ByteBuffer request, int64_t ops,
                        std::optional<PushKey> key, bool admitted, absl::Time applied,
                        GroupReplica::Applied committed, PushResponse response, Done done);
  void ForwardCloses(int group, std::vector<ReplicatedOp> closes);
  // Replicate's work, waiting up to `wait` for the operations before the
  // forward's. With `wait` zero, false when one had not arrived (`done`
  // not run; the parts that were next are applied, and skipped when it is
  // run again); otherwise true, `done` run or passed on.
  bool ApplyAndForward(const grpc::ByteBuffer& request, const wire::PushView& view,
                       absl::Duration wait, const Done& done);
  struct Answer;

  Shard* const shard_;
  ChainTable* const table_;
  Forwarder* const forwarder_;
  ReplicationMetrics* const metrics_;
  const absl::Duration forward_timeout_;

  mutable absl::Mutex mu_;
  // Pushes applied here and forwarded, not yet acknowledged by the tail.
  std::set<PushKey> in_flight_ ABSL_GUARDED_BY(mu_);
  // By group: operations forwarded and not yet acknowledged.
  std::map<int, int64_t> pending_ops_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopped_{false};
  // Last: its tasks end before anything else here goes.
  common::ElasticThreadPool waiting_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_REPLICATION_REPLICATOR_H_
