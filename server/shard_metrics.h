// Prometheus metrics of one shard: updates, staleness, drops, membership and
// partition versions. Thread-safe (prometheus-cpp metrics are atomic).
#ifndef SHARDTRAIN_SERVER_SHARD_METRICS_H_
#define SHARDTRAIN_SERVER_SHARD_METRICS_H_

#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace shardtrain::server {

class ShardMetrics {
 public:
  // Registers the shard's families in `registry`, which must outlive this.
  explicit ShardMetrics(prometheus::Registry& registry);

  prometheus::Counter& updates_applied() { return updates_applied_; }
  prometheus::Counter& gradients_received() { return gradients_received_; }
  prometheus::Histogram& staleness() { return staleness_; }
  // reason: "late" (a push for a finished sync step).
  prometheus::Counter& dropped(const std::string& reason);
  prometheus::Gauge& live_workers() { return live_workers_; }
  prometheus::Gauge& slowest_clock() { return slowest_clock_; }
  prometheus::Gauge& parameters() { return parameters_; }
  prometheus::Gauge& waiting_pulls() { return waiting_pulls_; }
  prometheus::Gauge& PartitionVersion(const std::string& tensor, int64_t index);
  // result: "ok" or "error".
  prometheus::Counter& checkpoints(const std::string& result);
  prometheus::Gauge& last_checkpoint_timestamp() { return last_checkpoint_; }

 private:
  prometheus::Counter& updates_applied_;
  prometheus::Counter& gradients_received_;
  prometheus::Histogram& staleness_;
  prometheus::Family<prometheus::Counter>& dropped_;
  prometheus::Gauge& live_workers_;
  prometheus::Gauge& slowest_clock_;
  prometheus::Gauge& parameters_;
  prometheus::Gauge& waiting_pulls_;
  prometheus::Family<prometheus::Gauge>& versions_;
  prometheus::Family<prometheus::Counter>& checkpoints_;
  prometheus::Gauge& last_checkpoint_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_SHARD_METRICS_H_
