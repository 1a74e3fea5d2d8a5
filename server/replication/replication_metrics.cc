#include "server/replication/replication_metrics.h"

#include "absl/strings/str_cat.h"

namespace shardtrain::server {
namespace {

prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry,
                                                   const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

prometheus::Gauge& SimpleGauge(prometheus::Registry& registry, const char* name,
                               const char* help) {
  return GaugeFamily(registry, name, help).Add({});
}

prometheus::Counter& SimpleCounter(prometheus::Registry& registry, const char* name,
                                   const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

}  // namespace

ReplicationMetrics::ReplicationMetrics(prometheus::Registry& registry, int replicas)
    : members_(GaugeFamily(registry, "shardtrain_chain_members",
                           "Members in the current chain of each replica group this "
                           "shard serves")),
      epoch_(GaugeFamily(registry, "shardtrain_chain_epoch",
                         "Epoch of each group's chain configuration as this shard "
                         "last saw it")),
      position_(GaugeFamily(registry, "shardtrain_chain_position",
                            "This shard's index in each group's chain (0 = head); "
                            "-1 when it is not a member")),
      reconfigurations_(prometheus::BuildCounter()
                            .Name("shardtrain_chain_reconfigurations_total")
                            .Help("Chain configuration changes this shard made by "
                                  "compare-and-swap in etcd")
                            .Register(registry)),
      lag_(prometheus::BuildHistogram()
               .Name("shardtrain_replication_lag_seconds")
               .Help("At a chain head: from applying a push to the tail's "
                     "acknowledgement")
               .Register(registry)
               .Add({}, prometheus::Histogram::BucketBoundaries{
                            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                            0.25, 0.5, 1, 2.5, 5})),
      inflight_(SimpleGauge(registry, "shardtrain_replication_inflight",
                            "Pushes applied here as head, not yet acknowledged by "
                            "the tail")),
      forwarded_bytes_(SimpleCounter(registry,
                                     "shardtrain_replication_forwarded_bytes_total",
                                     "Request bytes forwarded to chain successors")),
      forwards_(prometheus::BuildCounter()
                    .Name("shardtrain_replication_forwards_total")
                    .Help("Attempts to forward an update to a chain successor, by "
                          "transport: frames on its data port, or gRPC (before its port "
                          "is known, without one, or after it did not take a call)")
                    .Register(registry)),
      forwards_frames_(forwards_.Add({{"transport", "frames"}})),
      forwards_grpc_(forwards_.Add({{"transport", "grpc"}})),
      late_forwards_(SimpleCounter(
          registry, "shardtrain_replication_late_forwards_total",
          "Updates this head applied that had not reached the tail after "
          "--forward_timeout_s: the requester was told to retry while the "
          "forward went on")),
      early_forwards_(prometheus::BuildCounter()
                          .Name("shardtrain_replication_early_forwards_total")
                          .Help("Forwards that arrived at this member before an operation "
                                "they follow: waited for it on a thread of their own, or "
                                "refused with --max_waiting_forwards already waiting")
                          .Register(registry)),
      early_forwards_waited_(early_forwards_.Add({{"outcome", "waited"}})),
      early_forwards_refused_(early_forwards_.Add({{"outcome", "refused"}})),
      catchup_in_progress_(SimpleGauge(registry, "shardtrain_catchup_in_progress",
                                       "1 while this shard copies a group's state as a "
                                       "joining tail")),
      catchup_bytes_(SimpleCounter(registry, "shardtrain_catchup_bytes_total",
                                   "State-transfer bytes received as a joining tail")),
      catchup_last_seconds_(SimpleGauge(registry, "shardtrain_catchup_last_seconds",
                                        "Duration of the last completed catch-up")),
      stale_epoch_refusals_(SimpleCounter(
          registry, "shardtrain_stale_epoch_refusals_total",
          "Requests refused for naming another chain epoch or the wrong member")),
      lease_alive_(SimpleGauge(registry, "shardtrain_etcd_lease_alive",
                               "1 while this shard's etcd lease is kept alive")) {
  SimpleGauge(registry, "shardtrain_chain_replicas",
              "Target chain length of every replica group (--replicas)")
      .Set(replicas);
}

prometheus::Gauge& ReplicationMetrics::chain_members(int group) {
  return members_.Add({{"group", absl::StrCat(group)}});
}

prometheus::Gauge& ReplicationMetrics::chain_epoch(int group) {
  return epoch_.Add({{"group", absl::StrCat(group)}});
}

prometheus::Gauge& ReplicationMetrics::chain_position(int group) {
  return position_.Add({{"group", absl::StrCat(group)}});
}

prometheus::Counter& ReplicationMetrics::reconfigurations(const std::string& reason) {
  return reconfigurations_.Add({{"reason", reason}});
}

}  // namespace shardtrain::server
