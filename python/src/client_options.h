// The keyword arguments of shardtrain.Client, and the PsClientOptions
// (client/ps_client.h) they make: the same settings as ps-worker's flags
// (worker/main.cc), TLS files and the token included.
//
//   ClientArgs args;
//   args.servers = {"127.0.0.1:5000"};
//   client::PsClientOptions options = MakeClientOptions(args);
#ifndef SHARDTRAIN_PYTHON_SRC_CLIENT_OPTIONS_H_
#define SHARDTRAIN_PYTHON_SRC_CLIENT_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/ps_client.h"

namespace shardtrain::python {

struct ClientArgs {
  std::vector<std::string> servers;  // shard addresses in shard order
  int64_t worker = 0;
  int64_t num_workers = 0;  // 0: not checked against the shards'
  bool sync = false;        // sync mode's restart handling (PsClient::set_sync_mode)
  std::string wire_dtype = "f32";  // f32, f16 or bf16
  double topk_ratio = 0;
  std::string tls_ca, tls_cert, tls_key, tls_server_name;  // ps-worker's --tls_* files
  std::string token;       // the auth token itself (needs TLS) ...
  std::string token_file;  // ... or ps-worker's --auth_token_file
  double rpc_timeout = 30;
  double pull_timeout = 300;
  double reconnect_timeout = 120;
  int64_t replicas = 1;
  std::string etcd_endpoints;
  std::string etcd_ca, etcd_cert, etcd_key;  // ps-worker's --etcd_* files
  std::string job = "shardtrain";
  int64_t metrics_port = -1;  // -1: no endpoint; 0: a free port
  int64_t max_partition_elements = common::kDefaultMaxPartitionElements;
  int64_t channels_per_shard = 4;
  int64_t max_message_mb = 256;
  double keepalive = 10;  // seconds; 0 turns keepalive pings off
  // PsClientOptions::exchanges_cover_every_tensor.
  bool exchanges_cover_every_tensor = false;
};

// ValueError for a setting out of range (client::ValidatePsClientOptions,
// naming the keyword argument) or unknown (wire dtype); the rest (files,
// TLS consistency) PsClient::Create checks.
client::PsClientOptions MakeClientOptions(const ClientArgs& args);

}  // namespace shardtrain::python

#endif  // SHARDTRAIN_PYTHON_SRC_CLIENT_OPTIONS_H_
