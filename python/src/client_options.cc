#include "python/src/client_options.h"

#include <cmath>
#include <limits>

#include <pybind11/pybind11.h>

#include "absl/strings/str_cat.h"
#include "common/credentials.h"
#include "common/payload.h"

namespace shardtrain::python {
namespace py = pybind11;

namespace {

absl::Duration Seconds(const char* name, double seconds, bool zero_ok) {
  if (!std::isfinite(seconds) || seconds < 0 || (!zero_ok && seconds == 0)) {
    throw py::value_error(absl::StrCat(name, " must be a finite number of seconds ",
                                       zero_ok ? ">= 0" : "> 0", ", got ", seconds));
  }
  return absl::Seconds(seconds);
}

int64_t InRange(const char* name, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    throw py::value_error(
        absl::StrCat(name, " must be in [", lo, ", ", hi, "], got ", value));
  }
  return value;
}

DType ParseDType(const std::string& name) {
  absl::StatusOr<DType> dtype = common::ParseDTypeName(name);
  if (!dtype.ok()) throw py::value_error(absl::StrCat("wire_dtype ", dtype.status().message()));
  return *dtype;
}

}  // namespace

client::PsClientOptions MakeClientOptions(const ClientArgs& args) {
  client::PsClientOptions options;
  if (args.servers.empty()) throw py::value_error("servers is empty: give the shard addresses");
  options.servers = args.servers;
  constexpr int64_t kMaxWorkers = std::numeric_limits<int32_t>::max();
  options.num_workers =
      static_cast<uint32_t>(InRange("num_workers", args.num_workers, 0, kMaxWorkers));
  options.worker_index = static_cast<uint32_t>(InRange(
      "worker", args.worker, 0, args.num_workers > 0 ? args.num_workers - 1 : kMaxWorkers));
  options.wire_dtype = ParseDType(args.wire_dtype);
  if (!(args.topk_ratio >= 0 && args.topk_ratio <= 1)) {
    throw py::value_error(
        absl::StrCat("topk_ratio must be 0 (dense) or in (0, 1], got ", args.topk_ratio));
  }
  options.topk_ratio = args.topk_ratio;
  options.security.ca_file = args.tls_ca;
  options.security.cert_file = args.tls_cert;
  options.security.key_file = args.tls_key;
  options.security.server_name = args.tls_server_name;
  options.security.token = args.token;
  options.security.token_file = args.token_file;
  options.rpc_timeout = Seconds("rpc_timeout", args.rpc_timeout, false);
  options.pull_timeout = Seconds("pull_timeout", args.pull_timeout, false);
  options.reconnect_timeout = Seconds("reconnect_timeout", args.reconnect_timeout, true);
  options.keepalive_time = Seconds("keepalive", args.keepalive, true);
  options.keepalive_timeout = options.keepalive_time;
  options.replicas = static_cast<int>(InRange("replicas", args.replicas, 1, 3));
  options.etcd_endpoints = args.etcd_endpoints;
  common::ClientSecurity etcd;
  etcd.ca_file = args.etcd_ca;
  etcd.cert_file = args.etcd_cert;
  etcd.key_file = args.etcd_key;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> etcd_credentials =
      common::MakeEtcdCredentials(etcd);
  if (!etcd_credentials.ok()) {
    throw py::value_error(std::string(etcd_credentials.status().message()));
  }
  options.etcd_credentials = *std::move(etcd_credentials);
  options.job = args.job;
  options.max_partition_elements =
      InRange("max_partition_elements", args.max_partition_elements, 1, int64_t{1} << 32);
  options.channels_per_shard =
      static_cast<int>(InRange("channels_per_shard", args.channels_per_shard, 1, 64));
  options.max_message_bytes =
      static_cast<int>(InRange("max_message_mb", args.max_message_mb, 1, 2047) << 20);
  InRange("metrics_port", args.metrics_port, -1, 65535);
  return options;
}

}  // namespace shardtrain::python
