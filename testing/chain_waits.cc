#include "testing/chain_waits.h"

#include <vector>

#include "absl/time/clock.h"
#include "chain/chain_reader.h"
#include "chain/placement.h"

namespace shardtrain::testutil {

bool WaitForChains(etcd::EtcdClient& etcd, const std::string& job, int num_groups,
                   const ChainPredicate& ok, absl::Duration timeout, absl::Duration poll) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    bool all = true;
    for (int g = 0; g < num_groups && all; ++g) {
      absl::StatusOr<chain::ChainConfig> chain = chain::ReadChain(etcd, job, g);
      all = chain.ok() && ok(*chain);
    }
    if (all) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(poll);
  }
}

ChainPredicate HasMembers(int members) {
  return [members](const chain::ChainConfig& chain) {
    return static_cast<int>(chain.members.size()) == members;
  };
}

ChainPredicate InPlacementOrder(int num_shards, int replicas) {
  return [num_shards, replicas](const chain::ChainConfig& chain) {
    const std::vector<int> initial = chain::InitialChain(chain.group, num_shards, replicas);
    if (chain.members.size() != initial.size()) return false;
    for (size_t i = 0; i < initial.size(); ++i) {
      if (chain.members[i].shard != initial[i]) return false;
    }
    return true;
  };
}

}  // namespace shardtrain::testutil
