#include "client/ps_client_metrics.h"

namespace shardtrain::client {

PsClientMetrics::PsClientMetrics(prometheus::Registry& registry)
    : retries_(prometheus::BuildCounter()
                   .Name("shardtrain_worker_rpc_retries_total")
                   .Help("RPC attempts retried because a shard was unreachable "
                         "or had restarted, by method")
                   .Register(registry)),
      shard_restarts_(prometheus::BuildCounter()
                          .Name("shardtrain_worker_shard_restarts_total")
                          .Help("Shard restarts this worker noticed (a new "
                                "shard incarnation), by shard")
                          .Register(registry)),
      lost_updates_(prometheus::BuildCounter()
                        .Name("shardtrain_worker_lost_updates_total")
                        .Help("Partition updates this worker had seen that a "
                              "restarted shard no longer has (not in its "
                              "checkpoint), by shard")
                        .Register(registry)),
      chain_changes_(prometheus::BuildCounter()
                         .Name("shardtrain_worker_chain_changes_total")
                         .Help("Changes of a replica group's chain (members died "
                               "or joined) this worker saw in etcd and routed "
                               "by, by group")
                         .Register(registry)) {}

prometheus::Counter& PsClientMetrics::retries(const std::string& method) {
  return retries_.Add({{"method", method}});
}

prometheus::Counter& PsClientMetrics::shard_restarts(int shard) {
  return shard_restarts_.Add({{"shard", std::to_string(shard)}});
}

prometheus::Counter& PsClientMetrics::lost_updates(int shard) {
  return lost_updates_.Add({{"shard", std::to_string(shard)}});
}

prometheus::Counter& PsClientMetrics::chain_changes(int group) {
  return chain_changes_.Add({{"group", std::to_string(group)}});
}

}  // namespace shardtrain::client
