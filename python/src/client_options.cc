#include "python/src/client_options.h"

#include <limits>

#include <pybind11/pybind11.h>

#include "absl/strings/str_cat.h"
#include "client/ps_client_options.h"
#include "common/credentials.h"
#include "common/payload.h"

namespace shardtrain::python {
namespace py = pybind11;

namespace {

// A keyword argument as an integer of type T, or ValueError: only what the
// cast cannot carry; the ranges are ValidatePsClientOptions'.
template <typename T>
T Cast(const char* name, int64_t value) {
  if (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max()) {
    throw py::value_error(absl::StrCat(name, " must be in [", std::numeric_limits<T>::min(),
                                       ", ", std::numeric_limits<T>::max(), "], got ", value));
  }
  return static_cast<T>(value);
}

DType ParseDType(const std::string& name) {
  absl::StatusOr<DType> dtype = common::ParseDTypeName(name);
  if (!dtype.ok()) throw py::value_error(absl::StrCat("wire_dtype ", dtype.status().message()));
  return *dtype;
}

// The keyword argument that sets a PsClientOptions field, for errors.
std::string ArgumentOf(absl::string_view field) {
  if (field == "worker_index") return "worker";
  if (field == "keepalive_time" || field == "keepalive_timeout") return "keepalive";
  if (field == "max_message_bytes") return "max_message_mb";
  if (field == "initial_backoff" || field == "max_backoff" || field == "member_timeout") {
    return absl::StrCat("the client's ", field);  // no argument sets these
  }
  return std::string(field);
}

}  // namespace

client::PsClientOptions MakeClientOptions(const ClientArgs& args) {
  client::PsClientOptions options;
  options.servers = args.servers;
  options.num_workers = Cast<uint32_t>("num_workers", args.num_workers);
  options.worker_index = Cast<uint32_t>("worker", args.worker);
  options.wire_dtype = ParseDType(args.wire_dtype);
  options.topk_ratio = args.topk_ratio;
  options.security.ca_file = args.tls_ca;
  options.security.cert_file = args.tls_cert;
  options.security.key_file = args.tls_key;
  options.security.server_name = args.tls_server_name;
  options.security.token = args.token;
  options.security.token_file = args.token_file;
  options.rpc_timeout = absl::Seconds(args.rpc_timeout);  // NaN: infinite, refused below
  options.pull_timeout = absl::Seconds(args.pull_timeout);
  options.reconnect_timeout = absl::Seconds(args.reconnect_timeout);
  options.keepalive_time = absl::Seconds(args.keepalive);
  options.keepalive_timeout = options.keepalive_time;
  options.replicas = Cast<int32_t>("replicas", args.replicas);
  options.etcd_endpoints = args.etcd_endpoints;
  options.job = args.job;
  options.max_partition_elements = args.max_partition_elements;
  options.channels_per_shard = Cast<int32_t>("channels_per_shard", args.channels_per_shard);
  options.exchanges_cover_every_tensor = args.exchanges_cover_every_tensor;
  if (args.max_message_mb < 1 || args.max_message_mb > client::kMaxMessageMb) {
    throw py::value_error(absl::StrCat("max_message_mb must be in [1, ", client::kMaxMessageMb,
                                       "], got ", args.max_message_mb));
  }
  options.max_message_bytes = static_cast<int>(args.max_message_mb << 20);
  if (args.metrics_port < -1 || args.metrics_port > 65535) {
    throw py::value_error(
        absl::StrCat("metrics_port must be in [-1, 65535], got ", args.metrics_port));
  }
  if (const absl::Status valid = client::ValidatePsClientOptions(options, ArgumentOf);
      !valid.ok()) {
    throw py::value_error(std::string(valid.message()));
  }
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
  return options;
}

}  // namespace shardtrain::python
