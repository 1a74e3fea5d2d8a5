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

#include "server/membership.h"
#include "server/table_metrics.h"

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

  prometheus::Gauge& expected_workers() { return expected_workers_; }
  // kind: "first", "rejoin" (back after being forgotten) or "restart" (a new
  // worker incarnation).
  prometheus::Counter& worker_joins(const std::string& kind);
  // reason: "silent" (heartbeat timeout) or "never_joined" (join timeout).
  prometheus::Counter& worker_departures(const std::string& reason);
  // Counts `join` (if any) and shows membership's live workers and slowest
  // clock: what every request that may change membership ends with.
  void RecordMembership(const Membership& membership,
                        Membership::Join join = Membership::Join::kNone);
  prometheus::Counter& duplicate_pushes() { return duplicate_pushes_; }
  // limit: the ResourceLimits field (or "max_dims") a request went over.
  prometheus::Counter& requests_refused(const std::string& limit);
  prometheus::Counter& lost_updates() { return lost_updates_; }
  prometheus::Gauge& partition_version_min() { return version_min_; }
  prometheus::Gauge& partition_version_max() { return version_max_; }
  prometheus::Gauge& start_time() { return start_time_; }
  // The sparse tables' series.
  TableMetrics& tables() { return tables_; }

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
  prometheus::Gauge& expected_workers_;
  prometheus::Family<prometheus::Counter>& joins_;
  prometheus::Family<prometheus::Counter>& departures_;
  prometheus::Counter& duplicate_pushes_;
  prometheus::Family<prometheus::Counter>& refused_;
  prometheus::Counter& lost_updates_;
  prometheus::Gauge& version_min_;
  prometheus::Gauge& version_max_;
  prometheus::Gauge& start_time_;
  TableMetrics tables_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_SHARD_METRICS_H_
