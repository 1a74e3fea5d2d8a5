// PsClientOptions: how a worker's PsClient reaches the shards, and the one
// check of those options that ps-worker's flags, PsClient::Create and the
// Python extension's keyword arguments all go through, so a value is
// refused for the same reason wherever it comes from.
//
//   PsClientOptions options;
//   options.servers = {"127.0.0.1:7000"};
//   RETURN_IF_ERROR(ValidatePsClientOptions(options));
//   // ps-worker names its flags in the error:
//   RETURN_IF_ERROR(ValidatePsClientOptions(options, [](absl::string_view field) {
//     return absl::StrCat("--", field);
//   }));
//
// A plain struct; ValidatePsClientOptions is a pure function.
#ifndef SHARDTRAIN_CLIENT_PS_CLIENT_OPTIONS_H_
#define SHARDTRAIN_CLIENT_PS_CLIENT_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/channel_factory.h"
#include "common/credentials.h"
#include "common/partition.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::client {

// The largest gRPC message a client may be set to send or receive, in MiB
// (gRPC's limits are ints).
inline constexpr int kMaxMessageMb = 2047;

struct PsClientOptions {
  // Shard addresses in shard-index order ("host:port").
  std::vector<std::string> servers;
  uint32_t worker_index = 0;
  // The job's worker count, sent on Register: a shard started for another
  // count refuses (FAILED_PRECONDITION). 0 skips the check.
  uint32_t num_workers = 0;
  // Must match the servers' --max_partition_elements.
  int64_t max_partition_elements = common::kDefaultMaxPartitionElements;
  // Dtype of gradients and parameters on the wire.
  DType wire_dtype = DTYPE_F32;
  // Deadline of a Push/Register/Heartbeat/Status RPC.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Deadline of a Pull, which may wait for a step or the staleness bound.
  absl::Duration pull_timeout = absl::Seconds(300);
  // A call whose shard cannot be reached is retried for this long after
  // its first failure, then fails.
  absl::Duration reconnect_timeout = absl::Seconds(120);
  // Backoff between retries (full jitter, doubling up to the maximum).
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // HTTP/2 keepalive pings on idle and busy connections, so a dead shard or
  // a cut link is noticed within keepalive_time + keepalive_timeout. Zero
  // turns pings off. The shards must permit pings this often.
  absl::Duration keepalive_time = absl::Seconds(10);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  int max_message_bytes = 256 << 20;
  // TLS, mutual TLS and the auth token (common/credentials.h); all off by
  // default.
  common::ClientSecurity security;
  // TCP connections to each shard; a call's partitions on one shard are
  // split over them, so one large push keeps them all busy. 4: measured
  // 1.1-1.5x the MB/s of one connection for 4-64 MiB pushes and pulls at
  // the same CPU per MB (bench/results/channels_count_cpu.txt).
  int channels_per_shard = 4;
  // Send Push, Pull and PushPull to a shard's data port (server/data_port.h:
  // frames on TCP, no HTTP/2; in TLS with `security`'s settings when it has
  // a CA) when the shard names one (replicas > 1: the member a call is
  // routed to); false, or a shard without one: gRPC.
  bool use_data_port = true;
  // HTTP/2 and TCP settings of every connection (client/channel_factory.h).
  TransportTuning transport;
  // 0: send gradients dense. In (0, 1]: send the top ratio of each
  // partition's entries with error feedback (common/topk_compressor.h).
  double topk_ratio = 0;
  // Copies of every partition, on a chain of shards (1..3, at most the
  // number of shards). 1: no replication, no etcd.
  int replicas = 1;
  // Every step calls StartExchange for every registered tensor (ps-worker's
  // trainer does; a PyTorch script may exchange a subset). Async shards
  // that count a split push's calls are then told the step's calls to
  // them, and move this worker's clock with the step's last tensor instead
  // of its first, so that the staleness bound holds within a step too.
  bool exchanges_cover_every_tensor = false;
  // With replicas > 1: the etcd endpoints (host:port,...) holding the
  // chains, and the job's namespace there (/shardtrain/<job>/).
  std::string etcd_endpoints;
  // Null: plaintext to etcd; else TLS (app/etcd_flags.h).
  std::shared_ptr<grpc::ChannelCredentials> etcd_credentials;
  std::string job = "shardtrain";
  // With replicas > 1: how long a control RPC (Register, Heartbeat,
  // Status) retries one shard before skipping it as dead.
  absl::Duration member_timeout = absl::Seconds(5);
  // Tests only: makes connection `connection` to shard `shard` instead of a
  // TCP channel to servers[shard] (an in-process server's channel,
  // client/testing/fake_shard.h), so a PsClient runs without ports; the
  // security, keepalive, message-size and transport options above then do
  // not apply. Null: ChannelFactory's channels.
  std::function<std::shared_ptr<grpc::Channel>(int shard, int connection)> connect;
  // Tests only: interceptors for the channels to shard `shard`.
  std::function<std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>(int shard)>
      interceptors;
};

// What a PsClientOptions field is called where the options came from (a
// flag, a keyword argument), for the error; given the field's name.
using OptionName = absl::FunctionRef<std::string(absl::string_view field)>;

// OK, or INVALID_ARGUMENT naming the first option out of its range (by
// `name`; the field's own name by default): no servers, a worker index not
// below the worker count, an unknown wire dtype, a top-k ratio outside
// [0, 1], channels per shard outside [1, 64], a timeout that is not
// positive (the reconnect timeout and keepalive may be 0; the maximum
// backoff at least the initial one), partitions outside [1, 2^32]
// elements, a message limit outside 1..2047 MiB, replicas the shard count
// cannot hold (common/chain placement), replicas without etcd endpoints,
// or a job name etcd keys cannot carry.
absl::Status ValidatePsClientOptions(const PsClientOptions& options, OptionName name);
absl::Status ValidatePsClientOptions(const PsClientOptions& options);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_PS_CLIENT_OPTIONS_H_
