#include "wire/buffer_pool_metrics.h"

#include <string>
#include <utility>

#include <prometheus/client_metric.h>
#include <prometheus/metric_type.h>

namespace shardtrain::wire {
namespace {

prometheus::ClientMetric Gauge(double value) {
  prometheus::ClientMetric metric;
  metric.gauge.value = value;
  return metric;
}

prometheus::ClientMetric Counter(double value, std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric metric;
  metric.counter.value = value;
  metric.label = std::move(labels);
  return metric;
}

prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type,
                                std::vector<prometheus::ClientMetric> metrics) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  family.metric = std::move(metrics);
  return family;
}

}  // namespace

std::vector<prometheus::MetricFamily> BufferPoolMetrics::Collect() const {
  const BufferPool::Stats stats = pool_->stats();
  std::vector<prometheus::MetricFamily> families;
  families.push_back(Family("shardtrain_buffer_pool_kept_bytes",
                            "Bytes of released message buffers and frame bodies kept for reuse",
                            prometheus::MetricType::Gauge,
                            {Gauge(static_cast<double>(stats.kept_bytes))}));
  families.push_back(Family("shardtrain_buffer_pool_max_kept_bytes",
                            "The most bytes the buffer pool keeps (--buffer_pool_mb)",
                            prometheus::MetricType::Gauge,
                            {Gauge(static_cast<double>(pool_->max_kept_bytes()))}));
  families.push_back(Family(
      "shardtrain_buffer_pool_allocations_total",
      "Buffers handed out by the buffer pool: allocated fresh, or reused from its free lists",
      prometheus::MetricType::Counter,
      {Counter(static_cast<double>(stats.allocated), {{"served", "fresh"}}),
       Counter(static_cast<double>(stats.reused), {{"served", "reused"}})}));
  families.push_back(Family("shardtrain_buffer_pool_freed_total",
                            "Released buffers freed instead of kept (the pool at its bound, or "
                            "a buffer too large to keep)",
                            prometheus::MetricType::Counter,
                            {Counter(static_cast<double>(stats.freed))}));
  return families;
}

}  // namespace shardtrain::wire
