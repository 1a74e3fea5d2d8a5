// RpcMetrics: per RPC method, request counts by status code, bytes in each
// direction and a latency histogram, for a server or a client.
//
//   RpcMetrics rpc(exposer->registry(), "server");
//   rpc.Record("Push", grpc::StatusCode::OK, request_bytes, response_bytes, seconds);
//
// Thread-safe.
#ifndef SHARDTRAIN_COMMON_RPC_METRICS_H_
#define SHARDTRAIN_COMMON_RPC_METRICS_H_

#include <map>
#include <string>
#include <utility>

#include <grpcpp/support/status.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardtrain::common {

// Latency buckets in seconds, from 50 us to 30 s.
prometheus::Histogram::BucketBoundaries LatencyBuckets();

class RpcMetrics {
 public:
  // `side` is "server" or "client"; it prefixes nothing but is a label, so
  // a process that is both can tell its two halves apart.
  RpcMetrics(prometheus::Registry& registry, const std::string& side);

  // One finished call of `method`: its request and response bytes (on
  // either side; a server counts the request as received and the response
  // as sent, a client the other way round) and its latency.
  void Record(const std::string& method, grpc::StatusCode code,
              size_t request_bytes, size_t response_bytes, double seconds);

 private:
  struct PerMethod {
    prometheus::Counter* received_bytes;
    prometheus::Counter* sent_bytes;
    prometheus::Histogram* latency;
  };
  PerMethod& MethodMetrics(const std::string& method)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string side_;
  const bool server_;  // side_ == "server"
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

#endif  // SHARDTRAIN_COMMON_RPC_METRICS_H_
