#include "client/channel_factory.h"

#include <algorithm>
#include <utility>

#include <grpcpp/create_channel.h>

#include "common/reconnect.h"
#include "common/status_macros.h"

namespace shardtrain::client {
namespace {

int Millis(absl::Duration d) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX));
}

// Names the connection, so that channels to one address made for different
// connections differ in their arguments and never share a subchannel.
constexpr char kConnectionArg[] = "shardtrain.connection";

}  // namespace

absl::StatusOr<ChannelFactory> ChannelFactory::Create(const ChannelOptions& options) {
  const TransportTuning& transport = options.transport;
  if (options.max_message_bytes <= 0 || options.keepalive_time < absl::ZeroDuration() ||
      options.keepalive_timeout < absl::ZeroDuration() || transport.write_buffer_bytes < 0 ||
      transport.max_frame_bytes < 0 || transport.lookahead_bytes < 0 ||
      transport.min_read_chunk_bytes < 0 || transport.max_read_chunk_bytes < 0) {
    return absl::InvalidArgumentError(
        "channel settings: the message size must be positive, keepalive and transport "
        "sizes non-negative");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // Reconnect quickly to a shard that comes back (gRPC's own backoff
  // between connection attempts).
  common::SetQuickReconnect(args);
  if (options.keepalive_time > absl::ZeroDuration()) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(options.keepalive_time));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(options.keepalive_timeout));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    // Keep pinging while a pull waits on the shard without data flowing.
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  if (transport.write_buffer_bytes > 0) {
    args.SetInt(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, transport.write_buffer_bytes);
  }
  if (transport.max_frame_bytes > 0) {
    args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, transport.max_frame_bytes);
  }
  if (transport.lookahead_bytes > 0) {
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, transport.lookahead_bytes);
  }
  if (!transport.bdp_probe) args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  if (transport.min_read_chunk_bytes > 0) {
    args.SetInt(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, transport.min_read_chunk_bytes);
  }
  if (transport.max_read_chunk_bytes > 0) {
    args.SetInt(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, transport.max_read_chunk_bytes);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   common::MakeChannelCredentials(options.security, &args));
  return ChannelFactory(std::move(args), std::move(credentials));
}

std::shared_ptr<grpc::Channel> ChannelFactory::Make(
    const std::string& address, int connection,
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
        interceptors) const {
  grpc::ChannelArguments args = args_;
  if (connection > 0) {
    args.SetInt(kConnectionArg, connection);
    // Its own subchannel pool as well: a global pool would hand the same
    // TCP connection to channels whose arguments matched.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  }
  if (interceptors.empty()) return grpc::CreateCustomChannel(address, credentials_, args);
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, credentials_, args, std::move(interceptors));
}

}  // namespace shardtrain::client
