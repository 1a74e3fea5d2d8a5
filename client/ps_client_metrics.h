// PsClientMetrics: the fault metrics of a parameter-server client
// (client/ps_client.h): retried attempts, shard restarts it noticed, the
// updates those restarts lost and, with replicated shards, the chain
// changes it routed by. Thread-safe.
//
//   prometheus::Registry registry;
//   client::PsClientMetrics metrics(registry);
//   ASSIGN_OR_RETURN(auto ps, client::PsClient::Create(options, nullptr, &metrics));
#ifndef SHARDTRAIN_CLIENT_PS_CLIENT_METRICS_H_
#define SHARDTRAIN_CLIENT_PS_CLIENT_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include <string>

namespace shardtrain::client {

class PsClientMetrics {
 public:
  // Registers the families in `registry`, which must outlive this.
  explicit PsClientMetrics(prometheus::Registry& registry);

  // Attempts of `method` retried (shard unreachable, or restarted).
  prometheus::Counter& retries(const std::string& method);
  // Times `shard` was found restarted (a new incarnation).
  prometheus::Counter& shard_restarts(int shard);
  // Updates this worker knew of that `shard` lost in a restart.
  prometheus::Counter& lost_updates(int shard);
  // Times replica group `group`'s chain changed members (head, tail or
  // order) while this worker routed by it.
  prometheus::Counter& chain_changes(int group);

 private:
  prometheus::Family<prometheus::Counter>& retries_;
  prometheus::Family<prometheus::Counter>& shard_restarts_;
  prometheus::Family<prometheus::Counter>& lost_updates_;
  prometheus::Family<prometheus::Counter>& chain_changes_;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_PS_CLIENT_METRICS_H_
