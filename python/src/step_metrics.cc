#include "python/src/step_metrics.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "wire/buffer_pool_metrics.h"

namespace shardtrain::python {

absl::StatusOr<std::unique_ptr<ClientMetrics>> ClientMetrics::Create(int port) {
  const std::string address = port < 0 ? "" : absl::StrCat("0.0.0.0:", port);
  ASSIGN_OR_RETURN(std::unique_ptr<common::MetricsExposer> exposer,
                   common::MetricsExposer::Create(address));
  exposer->AddCollectable(
      std::make_shared<wire::BufferPoolMetrics>(&wire::BufferPool::Default()));
  const int bound = port < 0 ? -1 : exposer->port();
  return std::unique_ptr<ClientMetrics>(new ClientMetrics(std::move(exposer), bound));
}

ClientMetrics::ClientMetrics(std::unique_ptr<common::MetricsExposer> exposer, int port)
    : exposer_(std::move(exposer)),
      port_(port),
      rpc_(exposer_->registry(), "client"),
      faults_(exposer_->registry()),
      worker_(exposer_->registry()) {}

void ClientMetrics::RecordStep(const StepRecord& step) {
  const double rate = static_cast<double>(step.samples) / std::max(step.step_seconds, 1e-9);
  double smoothed;
  {
    absl::MutexLock lock(&mu_);
    smoothed_rate_ = smoothed_rate_ == 0 ? rate : 0.95 * smoothed_rate_ + 0.05 * rate;
    smoothed = smoothed_rate_;
  }
  worker_.compute_seconds().Observe(step.compute_seconds);
  worker_.push_seconds().Observe(step.push_seconds);
  worker_.pull_seconds().Observe(step.pull_seconds);
  worker_.wait_seconds().Observe(step.wait_seconds);
  worker_.step_seconds().Observe(step.step_seconds);
  worker_.staleness().Observe(static_cast<double>(step.staleness));
  worker_.steps().Increment();
  worker_.samples().Increment(static_cast<double>(step.samples));
  worker_.samples_per_second().Set(smoothed);
  worker_.loss().Set(step.loss);
}

void ClientMetrics::RecordEpoch(int64_t epoch, double test_accuracy,
                                double samples_per_second) {
  worker_.epoch().Set(static_cast<double>(epoch));
  if (test_accuracy >= 0) worker_.test_accuracy().Set(test_accuracy);
  if (samples_per_second >= 0) worker_.samples_per_second().Set(samples_per_second);
}

}  // namespace shardtrain::python
