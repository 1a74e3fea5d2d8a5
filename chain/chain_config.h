// The configuration of one replica group's chain, as coordination stores it.
//
// With --replicas R > 1 every partition of replica group g (its primary
// shard, common/partition.h) lives on the shards of g's chain (initially
// chain/placement.h's): pushes enter at the head and are forwarded member to
// member, pulls are answered by the tail. The chain is one etcd value
// (key: ChainKey in chain/replication_keys.h) that changes only by
// compare-and-swap, each change a pure transition here that returns a new
// config one epoch later:
//
//   ASSIGN_OR_RETURN(ChainConfig config, DecodeChainConfig(etcd_value));
//   // shard 2's liveness key expired:
//   ASSIGN_OR_RETURN(ChainConfig next, config.Remove(2));
//   // ... compare-and-swap EncodeChainConfig(next) in place of etcd_value.
//   // later, shard 2 restarted (new incarnation) and rejoins at the tail:
//   ASSIGN_OR_RETURN(next, next.AppendTail({2, "10.0.0.3:7000", incarnation}));
//
// A config that came from MakeChainConfig, a transition or the decoder is
// valid (ValidateChainConfig): 1..replicas members on distinct shards, each
// with an address (at most 512 bytes) and a non-zero incarnation, and
// epoch >= 1. Transitions of an invalid config fail with its
// INVALID_ARGUMENT; one at epoch INT64_MAX fails with OUT_OF_RANGE.
//
// Values, not objects: every function here is pure and thread-safe.
#ifndef SHARDTRAIN_CHAIN_CHAIN_CONFIG_H_
#define SHARDTRAIN_CHAIN_CHAIN_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardtrain::chain {

struct ChainConfig {
  // One shard process in the chain.
  struct Member {
    int shard = 0;             // shard index
    std::string address;       // host:port of its ParameterServer
    uint64_t incarnation = 0;  // its process's random non-zero id

    friend bool operator==(const Member& a, const Member& b) {
      return a.shard == b.shard && a.address == b.address &&
             a.incarnation == b.incarnation;
    }
  };

  int group = 0;      // the replica group: its primary shard index
  int64_t epoch = 1;  // +1 on every change; compare-and-swap orders them
  int replicas = 1;   // the target chain length R; members may be fewer
  std::vector<Member> members;  // head first, tail last

  // REQUIRES (for head and tail): !members.empty(), true of a valid config.
  const Member& head() const { return members.front(); }
  const Member& tail() const { return members.back(); }

  bool Contains(int shard) const { return IndexOf(shard).has_value(); }
  // The member's position, 0 = head; nullopt when `shard` is not a member.
  std::optional<size_t> IndexOf(int shard) const;
  // The member `shard` forwards pushes to; nullopt for the tail or a shard
  // that is not a member.
  std::optional<Member> Successor(int shard) const;
  // The member that forwards pushes to `shard` (and the one a new tail copies
  // its state from); nullopt for the head or a shard that is not a member.
  std::optional<Member> Predecessor(int shard) const;

  // The chain without `shard` (dead), one epoch later; its successor takes
  // its place, so removing the head promotes the next member and removing
  // the tail makes its predecessor the tail. NOT_FOUND when `shard` is not a
  // member or, with `incarnation`, when the member is another incarnation
  // (it already restarted and rejoined, so this death is old news).
  // FAILED_PRECONDITION when it is the last member: a group with no live
  // copy has lost data and needs an operator, not a config change.
  absl::StatusOr<ChainConfig> Remove(
      int shard, std::optional<uint64_t> incarnation = std::nullopt) const;

  // The chain with `member` as its new tail, one epoch later. ALREADY_EXISTS
  // when its shard is a member (a restarted member is removed first: its
  // state is gone); FAILED_PRECONDITION when the chain already has
  // `replicas` members; INVALID_ARGUMENT for a member without an address or
  // incarnation.
  absl::StatusOr<ChainConfig> AppendTail(const Member& member) const;

  // The same members ordered as in `preferred` (shard indices, head first;
  // members it does not name keep their order, after those it names), one
  // epoch later: after a failure and a rejoin, the placement's order
  // (InitialChain) back. The caller compares members: an unchanged order
  // is still a new epoch.
  absl::StatusOr<ChainConfig> Reorder(const std::vector<int>& preferred) const;

  friend bool operator==(const ChainConfig& a, const ChainConfig& b) {
    return a.group == b.group && a.epoch == b.epoch &&
           a.replicas == b.replicas && a.members == b.members;
  }
};

// A chain's first config: `members` head first, epoch 1. Errors as
// ValidateChainConfig.
absl::StatusOr<ChainConfig> MakeChainConfig(int group, int replicas,
                                            std::vector<ChainConfig::Member> members);

// OK for a well-formed config; INVALID_ARGUMENT naming the first problem.
absl::Status ValidateChainConfig(const ChainConfig& config);

// OK when `config` belongs to a job of `num_shards` shards: its group and
// every member are shard indices and its replicas fit. INVALID_ARGUMENT
// otherwise (a config from another job, or a job restarted with other flags).
absl::Status CheckChainFitsShards(const ChainConfig& config, int num_shards);

// The etcd value of a chain config: one line of protobuf text format
// (ChainConfigProto in proto/replication.proto), readable with etcdctl.
std::string EncodeChainConfig(const ChainConfig& config);
// Its inverse. INVALID_ARGUMENT for text that does not parse, is longer than
// kMaxEncodedChainConfigBytes or does not describe a valid config.
absl::StatusOr<ChainConfig> DecodeChainConfig(absl::string_view text);

// The value of a shard's liveness key (MemberKey): the member it would be in
// a chain, as ChainMemberProto text. Decode refuses garbage, an empty
// address, a zero incarnation or a negative shard with INVALID_ARGUMENT.
std::string EncodeChainMember(const ChainConfig::Member& member);
absl::StatusOr<ChainConfig::Member> DecodeChainMember(absl::string_view text);

// Far above any real config (3 members with 512-byte addresses are < 2 KiB);
// bounds the parser's work on a corrupt value.
inline constexpr size_t kMaxEncodedChainConfigBytes = 16 * 1024;

}  // namespace shardtrain::chain

#endif  // SHARDTRAIN_CHAIN_CHAIN_CONFIG_H_
