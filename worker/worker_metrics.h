// Prometheus metrics of one worker: where step time goes (compute, push,
// pull, wait), throughput, loss, accuracy and the staleness it saw.
// Thread-safe.
#ifndef SHARDTRAIN_WORKER_WORKER_METRICS_H_
#define SHARDTRAIN_WORKER_WORKER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <string>

namespace shardtrain::worker {

class WorkerMetrics {
 public:
  // Registers the families in `registry`, which must outlive this.
  explicit WorkerMetrics(prometheus::Registry& registry);

  prometheus::Histogram& compute_seconds() { return compute_; }
  prometheus::Histogram& push_seconds() { return push_; }
  prometheus::Histogram& pull_seconds() { return pull_; }
  prometheus::Histogram& wait_seconds() { return wait_; }
  prometheus::Histogram& step_seconds() { return step_; }
  prometheus::Histogram& staleness() { return staleness_; }
  prometheus::Counter& steps() { return steps_; }
  prometheus::Counter& samples() { return samples_; }
  prometheus::Gauge& samples_per_second() { return samples_per_second_; }
  prometheus::Gauge& loss() { return loss_; }
  prometheus::Gauge& epoch_loss() { return epoch_loss_; }
  prometheus::Gauge& test_accuracy() { return test_accuracy_; }
  prometheus::Gauge& epoch() { return epoch_; }
  // Sync: times this worker was dropped (a late gradient) and rejoined.
  prometheus::Counter& rejoins() { return rejoins_; }

 private:
  prometheus::Family<prometheus::Histogram>& phases_;
  prometheus::Histogram& compute_;
  prometheus::Histogram& push_;
  prometheus::Histogram& pull_;
  prometheus::Histogram& wait_;
  prometheus::Histogram& step_;
  prometheus::Histogram& staleness_;
  prometheus::Counter& steps_;
  prometheus::Counter& samples_;
  prometheus::Gauge& samples_per_second_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& epoch_loss_;
  prometheus::Gauge& test_accuracy_;
  prometheus::Gauge& epoch_;
  prometheus::Counter& rejoins_;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_WORKER_METRICS_H_
