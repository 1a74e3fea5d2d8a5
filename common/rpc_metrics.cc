#include "common/rpc_metrics.h"

#include "absl/status/status.h"
#include "common/grpc_status.h"

namespace shardtrain::common {

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,   0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,
          10.0,    30.0};
}

RpcMetrics::RpcMetrics(prometheus::Registry& registry, const std::string& side)
    : side_(side),
      server_(side == "server"),
      requests_(prometheus::BuildCounter()
                    .Name("shardtrain_rpc_requests_total")
                    .Help("RPCs finished, by method and status code")
                    .Register(registry)),
      received_bytes_(prometheus::BuildCounter()
                          .Name("shardtrain_rpc_received_bytes_total")
                          .Help("Serialized message bytes received, by method")
                          .Register(registry)),
      sent_bytes_(prometheus::BuildCounter()
                      .Name("shardtrain_rpc_sent_bytes_total")
                      .Help("Serialized message bytes sent, by method")
                      .Register(registry)),
      latency_(prometheus::BuildHistogram()
                   .Name("shardtrain_rpc_duration_seconds")
                   .Help("RPC latency from arrival to reply, by method")
                   .Register(registry)) {}

RpcMetrics::PerMethod& RpcMetrics::MethodMetrics(const std::string& method) {
  auto it = methods_.find(method);
  if (it != methods_.end()) return it->second;
  const prometheus::Labels labels{{"side", side_}, {"method", method}};
  PerMethod per;
  per.received_bytes = &received_bytes_.Add(labels);
  per.sent_bytes = &sent_bytes_.Add(labels);
  per.latency = &latency_.Add(labels, LatencyBuckets());
  return methods_.emplace(method, per).first->second;
}

void RpcMetrics::Record(const std::string& method, grpc::StatusCode code,
                        size_t request_bytes, size_t response_bytes,
                        double seconds) {
  const size_t received_bytes = server_ ? request_bytes : response_bytes;
  const size_t sent_bytes = server_ ? response_bytes : request_bytes;
  absl::MutexLock lock(&mu_);
  PerMethod& per = MethodMetrics(method);
  per.received_bytes->Increment(static_cast<double>(received_bytes));
  per.sent_bytes->Increment(static_cast<double>(sent_bytes));
  per.latency->Observe(seconds);
  auto key = std::make_pair(method, static_cast<int>(code));
  auto it = requests_by_code_.find(key);
  if (it == requests_by_code_.end()) {
    prometheus::Counter* counter = &requests_.Add(
        {{"side", side_}, {"method", method}, {"code", StatusCodeName(code)}});
    it = requests_by_code_.emplace(key, counter).first;
  }
  it->second->Increment();
}

std::string StatusCodeName(grpc::StatusCode code) {
  // gRPC and Abseil share the canonical codes and their names.
  return absl::StatusCodeToString(FromGrpcStatus(grpc::Status(code, "")).code());
}

}  // namespace shardtrain::common
