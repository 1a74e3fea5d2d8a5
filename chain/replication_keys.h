// Where a replicated job keeps its coordination state in etcd.
//
//   /shardtrain/<job>/chains/<group>  the chain of replica group <group>:
//                                     EncodeChainConfig text, changed by
//                                     compare-and-swap (chain/chain_config.h)
//   /shardtrain/<job>/shards/<shard>  shard <shard>'s liveness key: its
//                                     EncodeChainMember text, bound to a lease
//                                     the shard keeps alive; it vanishes when
//                                     the shard dies
//   /shardtrain/<job>/drained/<shard> present while an operator has drained
//                                     shard <shard> (`psctl drain`): it is
//                                     removed from its chains and does not
//                                     rejoin them until the key is deleted
//
// Indices are plain decimal. A job name is 1 to 64 of [A-Za-z0-9._-], so no
// job's keys fall under another job's prefixes. For example:
//
//   RETURN_IF_ERROR(ValidateJobName("mnist"));
//   ChainKey("mnist", 2);      // "/shardtrain/mnist/chains/2"
//   MembersPrefix("mnist");    // "/shardtrain/mnist/shards/": watch it
//   ASSIGN_OR_RETURN(int dead, ShardFromMemberKey("mnist", deleted_key));
//
// Pure functions, thread-safe.
#ifndef SHARDTRAIN_CHAIN_REPLICATION_KEYS_H_
#define SHARDTRAIN_CHAIN_REPLICATION_KEYS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardtrain::chain {

inline constexpr size_t kMaxJobNameBytes = 64;

// OK for a usable job name; INVALID_ARGUMENT saying what is wrong otherwise.
absl::Status ValidateJobName(absl::string_view job);

// REQUIRES (for all below): ValidateJobName(job).ok(); group, shard >= 0.
std::string JobPrefix(absl::string_view job);      // "/shardtrain/<job>/"
std::string ChainsPrefix(absl::string_view job);   // ".../chains/"
std::string MembersPrefix(absl::string_view job);  // ".../shards/"
std::string ChainKey(absl::string_view job, int group);
std::string MemberKey(absl::string_view job, int shard);
std::string DrainedPrefix(absl::string_view job);  // ".../drained/"
std::string DrainedKey(absl::string_view job, int shard);

// The index a key names: the inverse of ChainKey / MemberKey for `job`.
// INVALID_ARGUMENT for any other key, including a non-canonical index
// ("02", "+2") or one beyond int.
absl::StatusOr<int> GroupFromChainKey(absl::string_view job,
                                      absl::string_view key);
absl::StatusOr<int> ShardFromMemberKey(absl::string_view job,
                                       absl::string_view key);

}  // namespace shardtrain::chain

#endif  // SHARDTRAIN_CHAIN_REPLICATION_KEYS_H_
