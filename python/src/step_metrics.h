// ClientMetrics: the Prometheus metrics of a Python worker, the same
// families as ps-worker's (common::RpcMetrics "client", PsClientMetrics,
// worker::WorkerMetrics), served at 0.0.0.0:port when a port is given.
// The client library records RPCs and faults; the training loop reports
// its steps and epochs (RecordStep, RecordEpoch) as worker/trainer.cc does.
//
//   ASSIGN_OR_RETURN(auto metrics, ClientMetrics::Create(/*port=*/0));
//   PsClient::Create(options, &metrics->rpc(), &metrics->faults());
//   metrics->RecordStep(step);
//
// Thread-safe.
#ifndef SHARDTRAIN_PYTHON_SRC_STEP_METRICS_H_
#define SHARDTRAIN_PYTHON_SRC_STEP_METRICS_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/ps_client_metrics.h"
#include "common/metrics_exposer.h"
#include "common/rpc_metrics.h"
#include "worker/worker_metrics.h"

namespace shardtrain::python {

// One training step, in seconds, as the trainer splits it.
struct StepRecord {
  double compute_seconds = 0;
  double push_seconds = 0;
  double pull_seconds = 0;  // transfer, without the wait
  double wait_seconds = 0;  // held by the shards (sync step, staleness bound)
  double step_seconds = 0;
  int64_t samples = 0;
  double loss = 0;
  int64_t staleness = 0;
};

class ClientMetrics {
 public:
  // `port` < 0: the metrics are kept but not served; 0 picks a free port.
  // UNAVAILABLE if the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<ClientMetrics>> Create(int port);

  // The bound port, or -1 when not serving.
  int port() const { return port_; }
  common::RpcMetrics& rpc() { return rpc_; }
  client::PsClientMetrics& faults() { return faults_; }

  void RecordStep(const StepRecord& step);
  // A negative or NaN `test_accuracy` (a worker that does not evaluate) or
  // `samples_per_second` leaves that gauge as it is.
  void RecordEpoch(int64_t epoch, double test_accuracy, double samples_per_second);

 private:
  ClientMetrics(std::unique_ptr<common::MetricsExposer> exposer, int port);

  const std::unique_ptr<common::MetricsExposer> exposer_;
  const int port_;
  common::RpcMetrics rpc_;
  client::PsClientMetrics faults_;
  worker::WorkerMetrics worker_;
  absl::Mutex mu_;
  // Samples per second, smoothed over steps as the trainer does.
  double smoothed_rate_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardtrain::python

#endif  // SHARDTRAIN_PYTHON_SRC_STEP_METRICS_H_
