#include "chain/placement.h"

#include "absl/strings/str_cat.h"

namespace shardtrain::chain {

absl::Status ValidateReplicas(int num_shards, int replicas) {
  if (num_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("number of shards must be at least 1, got ", num_shards));
  }
  if (replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas must be at least 1, got ", replicas));
  }
  if (replicas > kMaxReplicas) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replicas ", replicas, " is not supported: at most ", kMaxReplicas));
  }
  if (replicas > num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replicas ", replicas, " needs at least as many shards, but there are ",
        num_shards, ": each replica of a partition lives on a distinct shard"));
  }
  return absl::OkStatus();
}

std::vector<int> InitialChain(int group, int num_shards, int replicas) {
  std::vector<int> chain;
  chain.reserve(replicas);
  for (int i = 0; i < replicas; ++i) chain.push_back((group + i) % num_shards);
  return chain;
}

std::vector<int> InitialGroupsOf(int shard, int num_shards, int replicas) {
  std::vector<int> groups;
  groups.reserve(replicas);
  for (int i = 0; i < replicas; ++i) {
    groups.push_back((shard - i + num_shards) % num_shards);
  }
  return groups;
}

}  // namespace shardtrain::chain
