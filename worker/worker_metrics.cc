#include "worker/worker_metrics.h"

#include "common/rpc_metrics.h"

namespace shardtrain::worker {
namespace {

prometheus::Gauge& Gauge(prometheus::Registry& registry, const char* name,
                         const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Counter& Counter(prometheus::Registry& registry, const char* name,
                             const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry)
    : phases_(prometheus::BuildHistogram()
                  .Name("shardtrain_worker_phase_seconds")
                  .Help("Time of each phase of a training step: compute "
                        "(forward+backward), push, pull (transfer) and wait "
                        "(held by the server for a sync step or the "
                        "staleness bound)")
                  .Register(registry)),
      compute_(phases_.Add({{"phase", "compute"}}, common::LatencyBuckets())),
      push_(phases_.Add({{"phase", "push"}}, common::LatencyBuckets())),
      pull_(phases_.Add({{"phase", "pull"}}, common::LatencyBuckets())),
      wait_(phases_.Add({{"phase", "wait"}}, common::LatencyBuckets())),
      step_(prometheus::BuildHistogram()
                .Name("shardtrain_worker_step_seconds")
                .Help("Wall time of a whole training step")
                .Register(registry)
                .Add({}, common::LatencyBuckets())),
      staleness_(prometheus::BuildHistogram()
                     .Name("shardtrain_worker_push_staleness")
                     .Help("Largest staleness the shards measured per push")
                     .Register(registry)
                     .Add({}, prometheus::Histogram::BucketBoundaries{
                                  0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64})),
      steps_(Counter(registry, "shardtrain_worker_steps_total",
                     "Training steps finished")),
      samples_(Counter(registry, "shardtrain_worker_samples_total",
                       "Training examples processed")),
      samples_per_second_(Gauge(registry, "shardtrain_worker_samples_per_second",
                                "Training examples per second, smoothed")),
      loss_(Gauge(registry, "shardtrain_worker_loss",
                  "Training loss of the latest step")),
      epoch_loss_(Gauge(registry, "shardtrain_worker_epoch_loss",
                        "Mean training loss of the latest finished epoch (0 before the "
                        "first one ends)")),
      test_accuracy_(Gauge(registry, "shardtrain_worker_test_accuracy",
                           "Test accuracy at the latest evaluation")),
      epoch_(Gauge(registry, "shardtrain_worker_epoch", "Current epoch")),
      rejoins_(Counter(registry, "shardtrain_worker_rejoins_total",
                       "Sync: times this worker's gradient came late (it had "
                       "been dropped) and it rejoined at the current step")) {}

}  // namespace shardtrain::worker
