// Prometheus metrics of a replicated shard (--replicas > 1): its chains,
// forwarding, catch-up and etcd lease. Thread-safe.
//
//   ReplicationMetrics metrics(registry, /*replicas=*/2);
//   metrics.chain_epoch(group).Set(epoch);
#ifndef SHARDTRAIN_SERVER_REPLICATION_REPLICATION_METRICS_H_
#define SHARDTRAIN_SERVER_REPLICATION_REPLICATION_METRICS_H_

#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace shardtrain::server {

class ReplicationMetrics {
 public:
  // Registers the families in `registry`, which must outlive this.
  ReplicationMetrics(prometheus::Registry& registry, int replicas);

  prometheus::Gauge& chain_members(int group);
  prometheus::Gauge& chain_epoch(int group);
  // This shard's index in the group's chain (0 = head), -1 outside it.
  prometheus::Gauge& chain_position(int group);
  // reason: "member_lost", "member_joined", "head_restored" or "restored"
  // (a chain put back after etcd lost its data).
  prometheus::Counter& reconfigurations(const std::string& reason);
  prometheus::Histogram& lag() { return lag_; }
  prometheus::Gauge& inflight() { return inflight_; }
  prometheus::Counter& forwarded_bytes() { return forwarded_bytes_; }
  // Attempts to forward to a successor, as a frame on its data port or over
  // gRPC.
  prometheus::Counter& forwards(bool frames) { return frames ? forwards_frames_ : forwards_grpc_; }
  prometheus::Counter& late_forwards() { return late_forwards_; }
  // A forward that arrived before an operation it follows: "waited" for it
  // on a thread of its own, or "refused" (--max_waiting_forwards waiting).
  prometheus::Counter& early_forwards(bool waited) {
    return waited ? early_forwards_waited_ : early_forwards_refused_;
  }
  prometheus::Gauge& catchup_in_progress() { return catchup_in_progress_; }
  prometheus::Counter& catchup_bytes() { return catchup_bytes_; }
  prometheus::Gauge& catchup_last_seconds() { return catchup_last_seconds_; }
  prometheus::Counter& stale_epoch_refusals() { return stale_epoch_refusals_; }
  prometheus::Gauge& lease_alive() { return lease_alive_; }

 private:
  prometheus::Family<prometheus::Gauge>& members_;
  prometheus::Family<prometheus::Gauge>& epoch_;
  prometheus::Family<prometheus::Gauge>& position_;
  prometheus::Family<prometheus::Counter>& reconfigurations_;
  prometheus::Histogram& lag_;
  prometheus::Gauge& inflight_;
  prometheus::Counter& forwarded_bytes_;
  prometheus::Family<prometheus::Counter>& forwards_;
  prometheus::Counter& forwards_frames_;
  prometheus::Counter& forwards_grpc_;
  prometheus::Counter& late_forwards_;
  prometheus::Family<prometheus::Counter>& early_forwards_;
  prometheus::Counter& early_forwards_waited_;
  prometheus::Counter& early_forwards_refused_;
  prometheus::Gauge& catchup_in_progress_;
  prometheus::Counter& catchup_bytes_;
  prometheus::Gauge& catchup_last_seconds_;
  prometheus::Counter& stale_epoch_refusals_;
  prometheus::Gauge& lease_alive_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_REPLICATION_REPLICATION_METRICS_H_
