// Waiting for a replicated job's chains (chain/, as etcd holds them) to
// reach a state: formed, a dead shard dropped, a restarted one back, the
// heads back in the placement's order.
//
//   ASSERT_TRUE(WaitForChains(etcd, job, num_groups, HasMembers(2), absl::Seconds(30)));
//   ASSERT_TRUE(WaitForChains(etcd, job, num_groups, InPlacementOrder(num_shards, 2),
//                             absl::Seconds(30)));
//
// Thread-safe as far as the EtcdClient is.
#ifndef SHARDTRAIN_TESTING_CHAIN_WAITS_H_
#define SHARDTRAIN_TESTING_CHAIN_WAITS_H_

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "chain/chain_config.h"
#include "etcd/etcd_client.h"

namespace shardtrain::testutil {

using ChainPredicate = std::function<bool(const chain::ChainConfig&)>;

// Waits up to `timeout` until the chain of every replica group 0 ..
// num_groups - 1 of `job` satisfies `ok`, reading them from etcd every
// `poll` (a chain that cannot be read does not satisfy it); false when
// they do not by then.
bool WaitForChains(etcd::EtcdClient& etcd, const std::string& job, int num_groups,
                   const ChainPredicate& ok, absl::Duration timeout,
                   absl::Duration poll = absl::Milliseconds(100));

// A chain of exactly `members` members.
ChainPredicate HasMembers(int members);

// A chain of `replicas` members in the placement's order
// (chain::InitialChain over `num_shards` shards): its head is back where it
// started.
ChainPredicate InPlacementOrder(int num_shards, int replicas);

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTING_CHAIN_WAITS_H_
