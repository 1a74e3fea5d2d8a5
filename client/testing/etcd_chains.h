// EtcdChains: a real etcd (testing/etcd_process.h) holding the
// chain configurations of one test job, written the way the shards write
// them (a put for the first config, compare-and-swap for each change), for
// the tests of the client's chain routing.
//
//   if (!testutil::EtcdProcess::Available()) GTEST_SKIP() << ...;
//   ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdChains> chains, EtcdChains::Start("job"));
//   ASSERT_OK(chains->Put(/*group=*/0, /*shards=*/{0, 1}).status());   // epoch 1
//   ASSERT_OK_AND_ASSIGN(chain::ChainConfig next, chains->Change(0, {1}));  // epoch 2
//
// Not thread-safe: one test thread drives it (Change may be called from a
// test server's handler while the test thread waits).
#ifndef SHARDTRAIN_CLIENT_TESTING_ETCD_CHAINS_H_
#define SHARDTRAIN_CLIENT_TESTING_ETCD_CHAINS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "chain/chain_config.h"
#include "chain/replication_keys.h"
#include "common/status_macros.h"
#include "etcd/etcd_client.h"
#include "testing/etcd_process.h"

namespace shardtrain::client::testing {

class EtcdChains {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdChains>> Start(std::string job) {
    ASSIGN_OR_RETURN(std::unique_ptr<testutil::EtcdProcess> process,
                     testutil::EtcdProcess::Start());
    etcd::EtcdClient::Options options;
    options.endpoints = process->endpoint();
    options.rpc_timeout = absl::Seconds(2);
    options.max_reconnect_backoff = absl::Milliseconds(300);
    ASSIGN_OR_RETURN(std::unique_ptr<etcd::EtcdClient> client, etcd::EtcdClient::Create(options));
    return std::unique_ptr<EtcdChains>(
        new EtcdChains(std::move(job), std::move(process), std::move(client)));
  }

  // A config of `group` with `shards` as members, head first.
  static absl::StatusOr<chain::ChainConfig> Config(int group, int64_t epoch,
                                                    const std::vector<int>& shards,
                                                    int replicas = 2) {
    std::vector<chain::ChainConfig::Member> members;
    for (int shard : shards) {
      members.push_back({shard, absl::StrCat("shard-", shard, ":7000"),
                         static_cast<uint64_t>(1000 + shard)});
    }
    ASSIGN_OR_RETURN(chain::ChainConfig config,
                     chain::MakeChainConfig(group, replicas, std::move(members)));
    config.epoch = epoch;
    return config;
  }

  // Puts `group`'s chain at `epoch`, whatever was there.
  absl::StatusOr<chain::ChainConfig> Put(int group, const std::vector<int>& shards,
                                          int64_t epoch = 1, int replicas = 2) {
    ASSIGN_OR_RETURN(chain::ChainConfig config, Config(group, epoch, shards, replicas));
    RETURN_IF_ERROR(
        client_->Put(chain::ChainKey(job_, group), chain::EncodeChainConfig(config))
            .status());
    return config;
  }

  // Changes `group`'s chain to `shards`, one epoch later, by
  // compare-and-swap on what is there.
  absl::StatusOr<chain::ChainConfig> Change(int group, const std::vector<int>& shards) {
    const std::string key = chain::ChainKey(job_, group);
    ASSIGN_OR_RETURN(const etcd::KeyValue kv, client_->Get(key));
    ASSIGN_OR_RETURN(const chain::ChainConfig now, chain::DecodeChainConfig(kv.value));
    ASSIGN_OR_RETURN(chain::ChainConfig next,
                     Config(group, now.epoch + 1, shards, now.replicas));
    ASSIGN_OR_RETURN(const etcd::CasResult cas,
                     client_->CompareAndSwap(key, kv.mod_revision,
                                             chain::EncodeChainConfig(next)));
    if (!cas.succeeded) return absl::AbortedError(absl::StrCat(key, " changed meanwhile"));
    return next;
  }

  const std::string& job() const { return job_; }
  std::string endpoint() const { return process_->endpoint(); }
  etcd::EtcdClient& client() { return *client_; }
  testutil::EtcdProcess& process() { return *process_; }

 private:
  EtcdChains(std::string job, std::unique_ptr<testutil::EtcdProcess> process,
             std::unique_ptr<etcd::EtcdClient> client)
      : job_(std::move(job)), process_(std::move(process)), client_(std::move(client)) {}

  const std::string job_;
  std::unique_ptr<testutil::EtcdProcess> process_;
  std::unique_ptr<etcd::EtcdClient> client_;
};

}  // namespace shardtrain::client::testing

#endif  // SHARDTRAIN_CLIENT_TESTING_ETCD_CHAINS_H_
