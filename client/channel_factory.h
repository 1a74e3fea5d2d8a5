// The gRPC channels a client opens to the shards: one place that sets their
// arguments (message size, reconnect backoff, keepalive, HTTP/2 transport
// tuning) and credentials (TLS, mutual TLS, auth token; common/credentials.h),
// used by PsClient and psctl alike.
//
//   ChannelOptions options;
//   options.security = app::ClientSecurityFromFlags();
//   ASSIGN_OR_RETURN(ChannelFactory factory, ChannelFactory::Create(options));
//   std::shared_ptr<grpc::Channel> channel = factory.Make("10.0.0.5:7000");
//
// A factory is immutable after Create; thread-safe.
#ifndef SHARDTRAIN_CLIENT_CHANNEL_FACTORY_H_
#define SHARDTRAIN_CLIENT_CHANNEL_FACTORY_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/credentials.h"

namespace shardtrain::client {

// HTTP/2 and TCP settings of the data connections; 0 keeps gRPC's default.
// What each is worth on a given link is measured by bench/wire_bench
// (--write_buffer_kb etc.); see bench/results/channels_cpu.txt.
struct TransportTuning {
  // GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE: bytes gRPC queues per write.
  int write_buffer_bytes = 0;
  // GRPC_ARG_HTTP2_MAX_FRAME_SIZE: largest HTTP/2 frame this side accepts.
  int max_frame_bytes = 0;
  // GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES: initial flow-control window per
  // stream (BDP probing grows it from there unless turned off).
  int lookahead_bytes = 0;
  // GRPC_ARG_HTTP2_BDP_PROBE.
  bool bdp_probe = true;
  // GRPC_ARG_TCP_MIN/MAX_READ_CHUNK_SIZE: how much one read asks the socket
  // for; large reads cut the number of slices a large answer arrives in.
  int min_read_chunk_bytes = 0;
  int max_read_chunk_bytes = 0;
};

struct ChannelOptions {
  int max_message_bytes = 256 << 20;
  // HTTP/2 keepalive pings on idle and busy connections, so a dead shard or
  // a cut link is noticed within keepalive_time + keepalive_timeout. Zero
  // turns pings off. The shards must permit pings this often.
  absl::Duration keepalive_time = absl::Seconds(10);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  common::ClientSecurity security;
  TransportTuning transport;
};

class ChannelFactory {
 public:
  // INVALID_ARGUMENT for negative sizes or durations; the errors of
  // common::MakeChannelCredentials for the security settings.
  static absl::StatusOr<ChannelFactory> Create(const ChannelOptions& options);

  // A channel to `address`. Channels made with different `connection`s are
  // separate TCP connections even to the same address (each keeps its own
  // subchannel); the same `connection` may share one.
  std::shared_ptr<grpc::Channel> Make(
      const std::string& address, int connection = 0,
      std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
          interceptors = {}) const;

  const grpc::ChannelArguments& arguments() const { return args_; }

 private:
  ChannelFactory(grpc::ChannelArguments args,
                 std::shared_ptr<grpc::ChannelCredentials> credentials)
      : args_(std::move(args)), credentials_(std::move(credentials)) {}

  grpc::ChannelArguments args_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_CHANNEL_FACTORY_H_
