#include "tests/in_process_shards.h"

#include "common/status_macros.h"

namespace shardtrain::testutil {

absl::StatusOr<InProcessShards> StartInProcessShards(server::ShardOptions options,
                                                     int num_shards, bool data_port) {
  InProcessShards cluster;
  options.partitioning.num_shards = num_shards;
  for (int s = 0; s < num_shards; ++s) {
    server::PsServerOptions server_options;
    server_options.metrics_address = "";
    if (data_port) server_options.data_listen = "127.0.0.1:0";
    server_options.shard = options;
    server_options.shard.shard_index = s;
    ASSIGN_OR_RETURN(std::unique_ptr<server::PsServer> shard,
                     server::PsServer::Start(server_options));
    cluster.addresses.push_back("127.0.0.1:" + std::to_string(shard->port()));
    cluster.shards.push_back(std::move(shard));
  }
  return cluster;
}

}  // namespace shardtrain::testutil
