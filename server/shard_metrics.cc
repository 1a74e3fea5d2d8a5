#include "server/shard_metrics.h"

#include <optional>

namespace shardtrain::server {

ShardMetrics::ShardMetrics(prometheus::Registry& registry)
    : updates_applied_(prometheus::BuildCounter()
                           .Name("shardtrain_updates_applied_total")
                           .Help("Optimizer updates applied to partitions")
                           .Register(registry)
                           .Add({})),
      gradients_received_(prometheus::BuildCounter()
                              .Name("shardtrain_gradients_received_total")
                              .Help("Partition gradients accepted from workers")
                              .Register(registry)
                              .Add({})),
      staleness_(prometheus::BuildHistogram()
                     .Name("shardtrain_gradient_staleness")
                     .Help("Partition version now minus the version a "
                           "gradient was computed from, at apply time")
                     .Register(registry)
                     .Add({}, prometheus::Histogram::BucketBoundaries{
                                  0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64})),
      dropped_(prometheus::BuildCounter()
                   .Name("shardtrain_dropped_gradients_total")
                   .Help("Gradients dropped, by reason")
                   .Register(registry)),
      live_workers_(prometheus::BuildGauge()
                        .Name("shardtrain_live_workers")
                        .Help("Workers heard from within the heartbeat timeout "
                              "and not done")
                        .Register(registry)
                        .Add({})),
      slowest_clock_(prometheus::BuildGauge()
                         .Name("shardtrain_slowest_worker_clock")
                         .Help("Smallest clock (steps done) of an active worker")
                         .Register(registry)
                         .Add({})),
      parameters_(prometheus::BuildGauge()
                      .Name("shardtrain_shard_parameters")
                      .Help("Parameter elements held by this shard")
                      .Register(registry)
                      .Add({})),
      waiting_pulls_(prometheus::BuildGauge()
                         .Name("shardtrain_waiting_pulls")
                         .Help("Pulls parked until a step completes or the "
                               "staleness bound allows them")
                         .Register(registry)
                         .Add({})),
      versions_(prometheus::BuildGauge()
                    .Name("shardtrain_partition_version")
                    .Help("Updates applied to a partition")
                    .Register(registry)),
      checkpoints_(prometheus::BuildCounter()
                       .Name("shardtrain_checkpoints_total")
                       .Help("Checkpoints written, by result")
                       .Register(registry)),
      last_checkpoint_(prometheus::BuildGauge()
                           .Name("shardtrain_last_checkpoint_timestamp_seconds")
                           .Help("Unix time of the last successful checkpoint "
                                 "(written or restored); 0 before the first")
                           .Register(registry)
                           .Add({})),
      expected_workers_(prometheus::BuildGauge()
                            .Name("shardtrain_expected_workers")
                            .Help("Workers the shard expects (--num_workers)")
                            .Register(registry)
                            .Add({})),
      joins_(prometheus::BuildCounter()
                 .Name("shardtrain_worker_joins_total")
                 .Help("Workers heard from: first time, back after being "
                       "forgotten (rejoin), or with a new incarnation (restart)")
                 .Register(registry)),
      departures_(prometheus::BuildCounter()
                      .Name("shardtrain_worker_departures_total")
                      .Help("Workers dropped: silent past the heartbeat timeout, "
                            "or never joined within the join timeout")
                      .Register(registry)),
      duplicate_pushes_(prometheus::BuildCounter()
                            .Name("shardtrain_duplicate_pushes_total")
                            .Help("Pushes answered as duplicates of one already "
                                  "applied (a retry); nothing applied again")
                            .Register(registry)
                            .Add({})),
      refused_(prometheus::BuildCounter()
                   .Name("shardtrain_requests_refused_total")
                   .Help("Requests refused for going over a resource limit")
                   .Register(registry)),
      lost_updates_(prometheus::BuildCounter()
                        .Name("shardtrain_lost_updates_total")
                        .Help("sync: steps skipped when a partition restored "
                              "from an older checkpoint fast-forwarded to the "
                              "job's step")
                        .Register(registry)
                        .Add({})),
      version_min_(prometheus::BuildGauge()
                       .Name("shardtrain_partition_version_min")
                       .Help("Smallest version over this shard's partitions")
                       .Register(registry)
                       .Add({})),
      version_max_(prometheus::BuildGauge()
                       .Name("shardtrain_partition_version_max")
                       .Help("Largest version over this shard's partitions")
                       .Register(registry)
                       .Add({})),
      start_time_(prometheus::BuildGauge()
                      .Name("shardtrain_shard_start_time_seconds")
                      .Help("Unix time this shard incarnation started")
                      .Register(registry)
                      .Add({})),
      tables_(registry) {
  // Create the common series up front so dashboards see zeros, not gaps.
  dropped("late");
  checkpoints("ok");
  checkpoints("error");
  for (const char* kind : {"first", "rejoin", "restart"}) worker_joins(kind);
  for (const char* reason : {"silent", "never_joined"}) worker_departures(reason);
}

prometheus::Counter& ShardMetrics::worker_joins(const std::string& kind) {
  return joins_.Add({{"kind", kind}});
}

prometheus::Counter& ShardMetrics::worker_departures(const std::string& reason) {
  return departures_.Add({{"reason", reason}});
}

void ShardMetrics::RecordMembership(const Membership& membership, Membership::Join join) {
  switch (join) {
    case Membership::Join::kNone:
      break;
    case Membership::Join::kFirst:
      worker_joins("first").Increment();
      break;
    case Membership::Join::kRejoin:
      worker_joins("rejoin").Increment();
      break;
    case Membership::Join::kRestart:
      worker_joins("restart").Increment();
      break;
  }
  live_workers_.Set(membership.LiveCount());
  const std::optional<int64_t> slowest = membership.SlowestActiveClock();
  if (slowest) slowest_clock_.Set(static_cast<double>(*slowest));
}

prometheus::Counter& ShardMetrics::requests_refused(const std::string& limit) {
  return refused_.Add({{"limit", limit}});
}

prometheus::Counter& ShardMetrics::checkpoints(const std::string& result) {
  return checkpoints_.Add({{"result", result}});
}

prometheus::Counter& ShardMetrics::dropped(const std::string& reason) {
  return dropped_.Add({{"reason", reason}});
}

prometheus::Gauge& ShardMetrics::PartitionVersion(const std::string& tensor,
                                                  int64_t index) {
  return versions_.Add({{"tensor", tensor}, {"partition", std::to_string(index)}});
}

}  // namespace shardtrain::server
