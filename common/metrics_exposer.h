// MetricsExposer: serves a Prometheus registry over HTTP (/metrics) on a
// port of its own, as every shardtrain process does.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<MetricsExposer> exposer,
//                    MetricsExposer::Create("0.0.0.0:9100"));
//   RpcMetrics rpc(exposer->registry(), "server");  // common/rpc_metrics.h
//
// Thread-safe.
#ifndef SHARDTRAIN_COMMON_METRICS_EXPOSER_H_
#define SHARDTRAIN_COMMON_METRICS_EXPOSER_H_

#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace shardtrain::common {

class MetricsExposer {
 public:
  // Binds `address` ("host:port", port 0 picks a free one) and serves the
  // returned registry. UNAVAILABLE if the address cannot be bound. An empty
  // address keeps the registry without serving it (in-process tests).
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Create(
      const std::string& address);

  // Stops serving within milliseconds (see metrics_exposer.cc).
  ~MetricsExposer();

  // The port actually bound; 0 when not serving.
  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }
  // Serves `collectable` beside the registry (read at every scrape) and
  // keeps it alive as long as this.
  void AddCollectable(std::shared_ptr<prometheus::Collectable> collectable);

 private:
  MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer,
                 std::shared_ptr<prometheus::Registry> registry, int port);

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  const int port_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_METRICS_EXPOSER_H_
