// Prometheus plumbing shared by every shardtrain process.
//
// MetricsExposer serves a registry over HTTP (/metrics) on its own port.
// RpcMetrics records, per RPC method, request counts by status code, bytes
// in each direction and a latency histogram. Both are thread-safe.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<MetricsExposer> exposer,
//                    MetricsExposer::Create("0.0.0.0:9100"));
//   RpcMetrics rpc(exposer->registry(), "server");
//   rpc.Record("Push", grpc::StatusCode::OK, received_bytes, sent_bytes, secs);
#ifndef SHARDTRAIN_COMMON_METRICS_H_
#define SHARDTRAIN_COMMON_METRICS_H_

#include <map>
#include <memory>
#include <string>

#include <grpcpp/support/status.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

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

  // Stops serving within milliseconds (see metrics.cc).
  ~MetricsExposer();

  // The port actually bound; 0 when not serving.
  int port() const { return port_; }
  prometheus::Registry& registry() { return *registry_; }

 private:
  MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer,
                 std::shared_ptr<prometheus::Registry> registry, int port);

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  const int port_;
};

// Latency buckets in seconds, from 50 us to 30 s.
prometheus::Histogram::BucketBoundaries LatencyBuckets();

class RpcMetrics {
 public:
  // `side` is "server" or "client"; it prefixes nothing but is a label, so
  // a process that is both can tell its two halves apart.
  RpcMetrics(prometheus::Registry& registry, const std::string& side);

  // Bytes as this process counts them: a server receives a request and
  // sends its answer, a client the other way round.
  void Record(const std::string& method, grpc::StatusCode code,
              size_t received_bytes, size_t sent_bytes, double seconds);

 private:
  struct PerMethod {
    prometheus::Counter* received_bytes;
    prometheus::Counter* sent_bytes;
    prometheus::Histogram* latency;
  };
  PerMethod& MethodMetrics(const std::string& method)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string side_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& received_bytes_;
  prometheus::Family<prometheus::Counter>& sent_bytes_;
  prometheus::Family<prometheus::Histogram>& latency_;

  absl::Mutex mu_;
  std::map<std::string, PerMethod> methods_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, prometheus::Counter*> requests_by_code_
      ABSL_GUARDED_BY(mu_);
};

// The canonical name of a gRPC code ("OK", "INVALID_ARGUMENT", ...).
std::string StatusCodeName(grpc::StatusCode code);

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_METRICS_H_
