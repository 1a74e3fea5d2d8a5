// What psctl reads and changes in etcd for a replicated job (--replicas > 1):
// the chains of its replica groups, its shards' liveness keys and the
// drained markers (key layout: chain/replication_keys.h).
//
//   ASSIGN_OR_RETURN(auto etcd, etcd::EtcdClient::Create(options));
//   ASSIGN_OR_RETURN(ChainsView view, ReadChains(*etcd, "mnist"));
//   std::cout << FormatChains(view);
//   // Take shard 2 out of every chain; it stays out until undrained.
//   ASSIGN_OR_RETURN(DrainResult drained, DrainShard(*etcd, "mnist", 2, {}));
//   ASSIGN_OR_RETURN(bool was_drained, UndrainShard(*etcd, "mnist", 2));
//
// Chains change only by compare-and-swap on their mod_revision, one epoch at
// a time (chain/chain_config.h), so a drain races safely with the shards,
// which change the same chains when members die or rejoin.
//
// Free functions; thread-safe as EtcdClient is.
#ifndef SHARDTRAIN_CTL_CHAIN_ADMIN_H_
#define SHARDTRAIN_CTL_CHAIN_ADMIN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chain/chain_config.h"
#include "chain/chain_reader.h"
#include "etcd/etcd_client.h"

namespace shardtrain::ctl {

using chain::ChainsView;
using chain::ReadChains;

// Whether the chain has fewer members than its target length.
bool Degraded(const chain::ChainConfig& chain);

// Whether the chain has all its members but not in the placement's order
// (chain::InitialChain(group, num_shards, replicas)): a shard that
// restarted or was undrained rejoined as tail and its group's head has not
// handed it its place back yet (the head does so once the chain is calm,
// unless the shards run with --restore_chain_order=false). Such a chain is
// safe; its shards just carry an uneven share of the work.
bool OutOfPlacementOrder(const chain::ChainConfig& chain, int num_shards);

// What psctl chains prints: one line per group (epoch, members / replicas,
// state: ok, DEGRADED or "reordered" (OutOfPlacementOrder; the number of
// shards is the number of groups), members head..tail as
// shard@address/incarnation), one line per shard (live, drained, its place
// in each chain) and the bad keys.
std::string FormatChains(const ChainsView& view);

struct DrainOptions {
  // The drained key's value: who drained the shard, when and why.
  std::string note = "drained";
  // Compare-and-swap attempts per chain before giving up with ABORTED.
  int max_attempts_per_chain = 16;
  // Test hook, called before each compare-and-swap of group `group`'s chain
  // (attempt 0, 1, ...), e.g. to change the chain under the drain.
  std::function<void(int group, int attempt)> before_cas;
};

// One chain a drain changed.
struct ChainChange {
  chain::ChainConfig before;
  chain::ChainConfig after;
};

struct DrainResult {
  bool already_drained = false;     // the drained key existed before
  std::vector<ChainChange> changes;  // by group
  int cas_conflicts = 0;            // compare-and-swaps lost to another writer
};

// Marks `shard` drained (its drained key, value options.note; an existing
// key is kept as it is), then removes it from every chain that holds it,
// one compare-and-swap per chain, re-reading and retrying a chain that
// changed meanwhile. Errors:
//  - INVALID_ARGUMENT: bad job name or negative shard;
//  - NOT_FOUND: the job has no chains, or none of its keys names `shard`;
//  - FAILED_PRECONDITION: a chain key that does not decode, or `shard` is the
//    last member of a group's chain: then nothing changes when that is so
//    at the first read; when it became so during the drain, the chains
//    already changed stay changed, and in both cases a drained key this call
//    made is deleted again (the shard rejoins as tail by itself);
//  - ABORTED: a chain changed under every attempt;
//  - etcd's error otherwise. After a failure past the first chain change the
//    drained key stays, so that the same drain can be run again to finish.
absl::StatusOr<DrainResult> DrainShard(etcd::EtcdClient& etcd, absl::string_view job,
                                       int shard, const DrainOptions& options);

// Deletes `shard`'s drained key; returns whether it existed. The shard then
// rejoins its groups as tail by itself. INVALID_ARGUMENT for a bad job name
// or a negative shard.
absl::StatusOr<bool> UndrainShard(etcd::EtcdClient& etcd, absl::string_view job,
                                  int shard);

// "0@10.0.0.1:7000/1a2b3c4d": shard, address, the incarnation's first 8
// hex digits.
std::string FormatMember(const chain::ChainConfig::Member& member);

}  // namespace shardtrain::ctl

#endif  // SHARDTRAIN_CTL_CHAIN_ADMIN_H_
