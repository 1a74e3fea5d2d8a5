// Coordinator: a replicated shard's side of etcd (--replicas > 1).
//
// At start the shard takes a lease (ttl --lease_ttl_s) and puts its
// liveness key (chain/replication_keys.h) under it, only if no other
// process holds that key: it waits out a dead predecessor's lease (about a
// ttl) and refuses to start (ALREADY_EXISTS) when the key stays alive, so a
// second job on the same etcd with the same --job, or a shard started
// twice, cannot take a live shard's place. It then joins the chains
// of the groups it serves (chain::InitialGroupsOf):
//  - a group with no chain yet is formed by its initial head with the
//    initial members that are alive (it waits up to form_timeout for all),
//    at epoch 1: they all start from the same fresh state;
//  - a group whose chain lacks this shard (it restarted, or was drained and
//    undrained) and has fewer than R members is joined as the new tail by
//    compare-and-swap; the shard then copies the group's state from its
//    predecessor (Forwarder::FetchGroupState) before serving it.
// While running it watches the chains (feeding the ChainTable) and the
// liveness keys: when a member's key vanishes (its lease expired: the
// process died or hung) any live member removes it from every chain by
// compare-and-swap, one epoch later; the CAS makes exactly one of them
// succeed. A chain's last member is never removed: the group would have
// no copy left. A drained shard (/drained/<shard>, `psctl drain`) does not
// rejoin until the key is deleted.
//
// Heads go back (restore_order): after a failure and a rejoin a chain is
// out of the placement's order (chain::InitialChain), and a shard may head
// two groups. The head of a full chain out of order hands its place back,
// once the chain has been calm for 250 ms (no change, every member's
// lease alive, its own lease sound): it freezes the group (ChainTable::Freeze: new pushes are refused with
// UNAVAILABLE, the workers retry), waits until the tail has every
// operation it started, asks each other member (Status) that it is at the
// same epoch, not copying state, with exactly as many operations applied,
// and only then swaps in the reordered chain by compare-and-swap. Every
// member holds the same state at that moment, so no update is lost or
// applied twice; the workers follow the new epoch as after any change.
//
// A shard whose own liveness key is gone (its lease expired, as every
// lease may after an etcd outage) changes no chain until it holds a new
// lease: members would otherwise drop and re-add each other in a storm of
// state copies. A shard that is a group's tail treats all it holds of the
// group as committed (GroupReplica::CommitGroup), also what it applied as head
// before the chain dropped its successor.
//
// While etcd is unreachable nothing changes: the shard keeps serving its
// current chains (no member can change them) and catches up on events once
// etcd is back. A shard whose lease expired (it was paused or cut off)
// stops serving (ChainTable fencing), takes a new lease and rejoins as a
// tail.
//
//   ASSIGN_OR_RETURN(auto coordinator,
//                    Coordinator::Start(options, shard, &table, &forwarder, &metrics));
//
// Thread-safe; the destructor revokes the lease, so the other members
// reconfigure at once after a clean shutdown.
#ifndef SHARDTRAIN_SERVER_REPLICATION_COORDINATOR_H_
#define SHARDTRAIN_SERVER_REPLICATION_COORDINATOR_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <grpcpp/security/credentials.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "chain/chain_config.h"
#include "etcd/etcd_client.h"
#include "server/replication/chain_table.h"
#include "server/replication/forwarder.h"
#include "server/replication/replication_metrics.h"
#include "server/shard.h"

namespace shardtrain::server {

struct CoordinatorOptions {
  std::string etcd_endpoints;
  // Null: plaintext to etcd; else TLS (app/etcd_flags.h).
  std::shared_ptr<grpc::ChannelCredentials> etcd_credentials;
  std::string job = "shardtrain";
  absl::Duration lease_ttl = absl::Seconds(2);
  // Where the other shards reach this one.
  std::string advertise_address;
  int num_shards = 1;
  int replicas = 2;
  // A new group's head waits this long for every initial member to be up.
  absl::Duration form_timeout = absl::Seconds(30);
  // Heads hand their place back to the placement's order (file comment).
  bool restore_order = true;
  // A joining tail still copying a group's state whose predecessors all
  // lost their leases would be left the group's only member, with no
  // complete copy before it: it waits this long for one of them to come
  // back (a hung or cut-off process) before it serves what it holds.
  absl::Duration last_copy_wait = absl::Seconds(30);
  // A joining member's copy of a group's state may take this long as a
  // whole; each of its parts must come within max(10 s, 4 lease ttls).
  absl::Duration catchup_timeout = absl::Hours(1);
};

class Coordinator {
 public:
  // Connects to etcd, takes the lease and starts the threads; the chains
  // are joined in the background (the shard refuses their requests until
  // then). UNAVAILABLE when etcd cannot be reached; FAILED_PRECONDITION
  // when the job's chains keep another number of replicas; ALREADY_EXISTS
  // when another process is this shard of the job.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Start(
      const CoordinatorOptions& options, Shard* shard, ChainTable* table,
      Forwarder* forwarder, ReplicationMetrics* metrics);
  ~Coordinator();

 private:
  Coordinator(const CoordinatorOptions& options, Shard* shard, ChainTable* table,
              Forwarder* forwarder, ReplicationMetrics* metrics);
  absl::Status TakeLease();
  // FAILED_PRECONDITION when the job's chains in etcd are of another layout
  // than this shard was started for: another number of replicas, or members
  // that --num_shards never places in their group (a restart with another
  // --replicas or --num_shards, or another job's --job). Checked before it
  // takes part.
  absl::Status CheckLayout();
  // Puts this shard's liveness key under a new lease, returned, once no
  // other process holds the key (see the file comment); ALREADY_EXISTS
  // naming the holder when one keeps it alive.
  absl::StatusOr<etcd::Lease> ClaimMemberKey();
  void OnLeaseLost(absl::Status why);
  void Ticker();
  // After a pause (ChainTable fencing): serve again once a lease refresh
  // sent after it succeeded.
  void LiftPauseFence() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();
  // One pass over every served group; errors (etcd down) are logged.
  void Reconcile();
  // `live`: the liveness keys read this pass, by shard.
  // `may_change`: this shard's own liveness key was among them.
  void ReconcileGroup(int group, const std::map<int, chain::ChainConfig::Member>& live,
                      bool drained, bool may_change,
                      std::optional<etcd::KeyValue> chain);
  // Whether every member of `chain` says it is still copying `group`'s
  // state (false when one does not answer).
  bool StillCopying(int group, const chain::ChainConfig& chain);
  // Whether this shard, still copying `group`'s state, may drop `gone` (the
  // chain becoming `next`): at once when a member before this one in `next`
  // has the whole state (it says it is not copying); otherwise `gone` may
  // hold the only complete copy (or, restarted, drop itself and take the
  // group over with its checkpoint), and only once it stayed away
  // last_copy_wait.
  bool LastCopyWaitOver(int group, const chain::ChainConfig& next,
                        const chain::ChainConfig::Member& gone);
  // etcd may have lost `group`'s chain (absent, or older than `known`, the
  // newest this shard holds): the first member of `known` whose lease is
  // alive reads it again and, if so, puts it back without the others, an
  // epoch after both.
  void RestoreChain(int group, const chain::ChainConfig& known,
                    const std::map<int, chain::ChainConfig::Member>& live);
  // Compare-and-swap of `group`'s chain from `kv` (nullopt: absent) to
  // `next`; adopts it on success.
  bool Swap(int group, const std::optional<etcd::KeyValue>& kv,
            const chain::ChainConfig& next, const char* reason);
  void CatchUp(int group, const chain::ChainConfig& config);
  // At the head of `config` (etcd's value `kv`): the hand-over above, if
  // the chain is full and out of order.
  // `live`: the liveness keys read this pass, by shard.
  void RestoreOrder(int group, const etcd::KeyValue& kv, const chain::ChainConfig& config,
                    const std::map<int, chain::ChainConfig::Member>& live);
  // Empty when every other member of `config` is at its epoch and
  // position, not copying state, with exactly `ops` operations of `group`
  // if given; what is not so else.
  std::string MembersBehind(int group, const chain::ChainConfig& config,
                            std::optional<int64_t> ops);
  // table_->Update, and on a newer chain the forwards in flight to a
  // successor it dropped are sent again (Forwarder::AbandonDeparted).
  bool Adopt(const chain::ChainConfig& config);
  void Wake();
  // The chain and liveness watches (again, after they ended).
  void StartWatches();

  const CoordinatorOptions options_;
  Shard* const shard_;
  ChainTable* const table_;
  Forwarder* const forwarder_;
  ReplicationMetrics* const metrics_;
  const absl::Time start_;
  std::unique_ptr<etcd::EtcdClient> etcd_;

  absl::Mutex mu_;
  etcd::Lease lease_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<etcd::LeaseKeeper> keeper_ ABSL_GUARDED_BY(mu_);
  // What the keeper last reported: nothing, an expired lease (rejoin as a
  // tail) or etcd unreachable (keep the lease, refresh once etcd is back).
  enum class LeaseProblem { kNone, kExpired, kUnreachable };
  LeaseProblem lease_problem_ ABSL_GUARDED_BY(mu_) = LeaseProblem::kNone;
  // True at start: the first pass runs at once (a restarted shard rejoins
  // its chains without waiting a period; its own liveness key was written
  // before the watches started, so nothing else would wake it).
  bool wake_ ABSL_GUARDED_BY(mu_) = true;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // A watch ended for good: the loop starts both again.
  bool watches_ended_ ABSL_GUARDED_BY(mu_) = false;
  // A head hand-over waits for its chain to catch up, or a lost chain for
  // its members' new leases: the next pass comes sooner.
  bool hand_over_pending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration hand_over_retry_ ABSL_GUARDED_BY(mu_);  // the next wait then
  // Fenced after a pause at this many lease refreshes.
  int64_t fenced_at_refreshes_ ABSL_GUARDED_BY(mu_) = -1;

  // Hand-overs that failed after pausing pushes, by group: not tried again
  // at that epoch before not_before. Used by the loop thread only.
  struct HandOverBackoff {
    int64_t epoch = 0;
    absl::Time not_before;
    absl::Duration delay;
  };
  std::map<int, HandOverBackoff> hand_over_backoff_;
  // When this shard first saw each group's current chain epoch. Loop
  // thread only.
  struct ChainSeen {
    int64_t epoch = 0;
    absl::Time since;
  };
  std::map<int, ChainSeen> chain_seen_;
  // When this shard, first of its chain, found each group's chain lost in
  // etcd (RestoreChain). Loop thread only.
  std::map<int, absl::Time> lost_since_;
  // When this shard, still copying each group's state, found every member
  // before it gone (CoordinatorOptions::last_copy_wait). Loop thread only.
  std::map<int, absl::Time> orphaned_since_;

  // Replaced by the loop thread only (and reset by the destructor after it).
  std::unique_ptr<etcd::Watcher> chain_watch_;
  std::unique_ptr<etcd::Watcher> member_watch_;
  std::thread ticker_;
  std::thread loop_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_REPLICATION_COORDINATOR_H_
