// Reading a job's replication state from etcd: the chains of its replica
// groups, its shards' liveness keys and the drained markers (key layout:
// chain/replication_keys.h), in one consistent read. psctl, the tests and
// the benchmarks read chains through this.
//
//   ASSIGN_OR_RETURN(chain::ChainsView view, chain::ReadChains(*etcd, "mnist"));
//   for (const chain::ChainConfig& c : view.chains) ...
//
// Free functions; thread-safe as EtcdClient is.
#ifndef SHARDTRAIN_CHAIN_CHAIN_READER_H_
#define SHARDTRAIN_CHAIN_CHAIN_READER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chain/chain_config.h"
#include "etcd/etcd_client.h"

namespace shardtrain::chain {

// One job's replication state, from one consistent read of its keys.
struct ChainsView {
  std::string job;
  int64_t revision = 0;                     // etcd revision of the read
  std::vector<ChainConfig> chains;          // by group
  std::map<int, ChainConfig::Member> live;  // liveness keys, by shard
  std::map<int, std::string> drained;       // drained keys' values, by shard
  // Keys under the job's prefix that do not decode.
  struct BadKey {
    std::string key;
    std::string why;
  };
  std::vector<BadKey> bad_keys;
};

// Reads every key of `job`. INVALID_ARGUMENT for a bad job name; etcd's
// error when it cannot be read. Undecodable keys end up in `bad_keys`;
// `chains` is sorted by group.
absl::StatusOr<ChainsView> ReadChains(etcd::EtcdClient& etcd, absl::string_view job);

// The chain of `group` alone (one key): etcd's error, NOT_FOUND when the
// key is absent, or the decoding's error.
absl::StatusOr<ChainConfig> ReadChain(etcd::EtcdClient& etcd, absl::string_view job, int group);

// The chains of groups 0 .. num_groups - 1 of a job, by group:
// FAILED_PRECONDITION naming the first group whose chain is missing or does
// not decode.
absl::StatusOr<std::vector<ChainConfig>> ReadAllChains(etcd::EtcdClient& etcd,
                                                       absl::string_view job, int num_groups);

}  // namespace shardtrain::chain

#endif  // SHARDTRAIN_CHAIN_CHAIN_READER_H_
