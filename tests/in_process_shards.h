// In-process shards for integration tests: a whole cluster's ps-servers in
// the test's own process, on 127.0.0.1 with ports picked by the kernel.
#ifndef SHARDTRAIN_TESTS_IN_PROCESS_SHARDS_H_
#define SHARDTRAIN_TESTS_IN_PROCESS_SHARDS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/ps_server.h"

namespace shardtrain::testutil {

struct InProcessShards {
  std::vector<std::unique_ptr<server::PsServer>> shards;
  // "127.0.0.1:port" in shard order, for PsClientOptions::servers.
  std::vector<std::string> addresses;
};

// Starts `num_shards` shards, each with `options` but its own index and
// options.partitioning.num_shards = num_shards; no /metrics HTTP server
// (nothing scrapes it in these tests). `data_port`: each opens a data port
// (server/data_port.h) too.
absl::StatusOr<InProcessShards> StartInProcessShards(server::ShardOptions options,
                                                     int num_shards, bool data_port = false);

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTS_IN_PROCESS_SHARDS_H_
