// The initial members of the replica groups' chains.
//
// With R replicas (--replicas) every partition's primary shard g
// (common::ReplicaGroupFor, common/partition.h) names its replica group, and
// group g's initial chain is the R consecutive shards [g, g+1, ..., g+R-1]
// mod S, head first, so every shard heads one chain, is second in one, ...
// With S = 4, R = 2:
//
//   int g = common::ReplicaGroupFor("fc0.weight", 3, 4);  // 3, as ShardFor
//   std::vector<int> chain = InitialChain(g, 4, 2);       // {3, 0}: head 3, tail 0
//
// The live chain of a group changes when members die or join; it is kept in
// etcd (chain/chain_config.h), not computed here.
//
// Everything here is a pure function and thread-safe.
#ifndef SHARDTRAIN_CHAIN_PLACEMENT_H_
#define SHARDTRAIN_CHAIN_PLACEMENT_H_

#include <vector>

#include "absl/status/status.h"

namespace shardtrain::chain {

// The most replicas a partition may have: chains longer than this add
// latency to every push for no protection a job of this size needs.
inline constexpr int kMaxReplicas = 3;

// OK when `replicas` copies of every partition fit on `num_shards` distinct
// shards: 1 <= replicas <= min(num_shards, kMaxReplicas). INVALID_ARGUMENT
// saying which bound was broken otherwise.
absl::Status ValidateReplicas(int num_shards, int replicas);

// The initial chain of replica group `group`, head first: `replicas`
// distinct shards [group, group + 1, ..., group + replicas - 1] mod
// num_shards.
// REQUIRES: 0 <= group < num_shards, ValidateReplicas(num_shards, replicas).
std::vector<int> InitialChain(int group, int num_shards, int replicas);

// The groups whose initial chain holds `shard`, by its position there: the
// group it heads first, then the one it is second in, ... :
// [shard, shard - 1, ..., shard - replicas + 1] mod num_shards. These are
// the chains a (re)starting shard joins.
// REQUIRES: 0 <= shard < num_shards, ValidateReplicas(num_shards, replicas).
std::vector<int> InitialGroupsOf(int shard, int num_shards, int replicas);

}  // namespace shardtrain::chain

#endif  // SHARDTRAIN_CHAIN_PLACEMENT_H_
