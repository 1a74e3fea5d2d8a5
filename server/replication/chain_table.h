// ChainTable: what a replicated shard knows of the chains of the replica
// groups it serves, and whether it may serve them now.
//
// The coordinator (server/replication/coordinator.h) feeds it every chain
// configuration etcd holds for these groups; requests are checked against
// it. A shard serves a group only as a member of its newest configuration
// (its own shard index AND incarnation), only in the role the request needs
// (pushes at the head, pulls at the tail, forwards at any member), only
// for the epoch the request names, and not while it still copies the
// group's state as a joining tail. Anything else is refused with
// UNAVAILABLE, which makes workers re-read the configuration and retry.
//
// Fencing (no split brain): a shard whose process was stopped (SIGSTOP, a
// long pause) cannot know whether its lease expired and the chains moved on
// without it meanwhile. The coordinator ticks the table every 100 ms; a
// request finding the last tick older than half the lease ttl, or the table
// fenced after such a pause until the lease is confirmed alive again, is
// refused. While etcd itself is unreachable the ticks go on and the shard
// keeps serving its current configuration: no other member can change it.
//
// Head admissions (handing the head over, server/replication/coordinator.h):
// every operation the head starts (a worker's push, a sync-step close it
// decides) is admitted here and released once the tail has it, or once it
// failed. Freeze stops admissions to a group and waits for those held to
// be released: then every member has applied exactly the same operations,
// and the chain can be reordered without losing or repeating one.
//
//   ChainTable table(/*shard=*/1, incarnation, {1, 0}, absl::Seconds(1), &metrics);
//   table.Update(config);
//   RETURN_IF_ERROR(table.Check(group, request_epoch, ChainTable::Role::kHead));
//
// Thread-safe.
#ifndef SHARDTRAIN_SERVER_REPLICATION_CHAIN_TABLE_H_
#define SHARDTRAIN_SERVER_REPLICATION_CHAIN_TABLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chain/chain_config.h"
#include "proto/shardtrain.pb.h"
#include "server/replication/replication_metrics.h"

namespace shardtrain::server {

class ChainTable {
 public:
  enum class Role { kHead, kTail, kMember };

  // `metrics` may be null; if not it must outlive the table.
  ChainTable(int shard, uint64_t incarnation, std::vector<int> groups,
             absl::Duration lease_ttl, ReplicationMetrics* metrics);

  int shard() const { return shard_; }
  uint64_t incarnation() const { return incarnation_; }
  const std::vector<int>& groups() const { return groups_; }
  bool Serves(int group) const;

  // Adopts `config` if it is for a served group and newer (by epoch) than
  // the one held. Returns whether it was adopted.
  bool Update(const chain::ChainConfig& config);
  // The newest configuration of `group`; nullopt before the first.
  std::optional<chain::ChainConfig> Get(int group) const;

  // OK when a request for `group` naming `epoch` may be served here in
  // `role` now (see the file comment); UNAVAILABLE saying why otherwise,
  // INVALID_ARGUMENT for a group this shard never holds.
  absl::Status Check(int group, uint64_t epoch, Role role) const;
  // Check(group, epoch, kHead), and not frozen: then one admission is held
  // until Release(group). A frozen group is refused with UNAVAILABLE.
  absl::Status AdmitHead(int group, uint64_t epoch);
  // True (holding one admission) when this shard heads `group` and it is
  // not frozen: it may close the group's sync steps itself.
  bool AdmitLead(int group);
  void Release(int group);
  // Stops admissions to `group` and waits up to `timeout` for those held to
  // be released. False on timeout; the group stays frozen until Unfreeze.
  bool Freeze(int group, absl::Duration timeout);
  void Unfreeze(int group);

  // True while this process (this incarnation) is a member of `group`'s
  // newest chain at `epoch`.
  bool MemberAt(int group, uint64_t epoch) const;
  // True when this process heads `group`'s newest chain.
  bool IsHead(int group) const;
  // This member's successor in `group`'s newest chain and that chain's
  // epoch: nullopt (with *is_member) when this shard is the tail.
  std::optional<chain::ChainConfig::Member> Successor(int group, int64_t* epoch,
                                                        bool* is_member) const;

  // A joining tail copies the group's state before it serves it.
  void SetCatchingUp(int group, bool catching_up);
  bool CatchingUp(int group) const;

  // The coordinator's liveness tick (see the file comment).
  void Tick(absl::Time now);
  // Refuse everything until Unfence (the lease is confirmed alive).
  void Fence(const std::string& why);
  void Unfence();
  bool Fenced() const;

  // The chains of the served groups for Status; `ops(group)` gives the
  // operations applied, acked(group) those the tail acknowledged.
  void Describe(const std::function<int64_t(int)>& ops,
                const std::function<int64_t(int)>& acked,
                google::protobuf::RepeatedPtrField<ChainState>* out) const;

 private:
  bool IsMember(const chain::ChainConfig& config) const;
  absl::Status CheckLocked(int group, uint64_t epoch, Role role) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsHeadLocked(int group) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Refuse(std::string message) const;
  void PublishLocked(int group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int shard_;
  const uint64_t incarnation_;
  const std::vector<int> groups_;
  const absl::Duration max_tick_gap_;
  ReplicationMetrics* const metrics_;

  mutable absl::Mutex mu_;
  std::map<int, chain::ChainConfig> configs_ ABSL_GUARDED_BY(mu_);
  std::map<int, bool> catching_up_ ABSL_GUARDED_BY(mu_);
  std::map<int, int64_t> admitted_ ABSL_GUARDED_BY(mu_);  // by group
  std::map<int, bool> frozen_ ABSL_GUARDED_BY(mu_);
  absl::Time last_tick_ ABSL_GUARDED_BY(mu_);
  std::string fenced_ ABSL_GUARDED_BY(mu_);  // why; empty when not fenced
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_REPLICATION_CHAIN_TABLE_H_
