#include "common/reconnect.h"

#include <algorithm>

namespace shardtrain::common {

void SetQuickReconnect(grpc::ChannelArguments& args, absl::Duration max_backoff,
                       absl::Duration min_connect_timeout) {
  const int max_ms = static_cast<int>(absl::ToInt64Milliseconds(max_backoff));
  const int first_ms = std::min(100, max_ms);
  const int connect_ms = static_cast<int>(absl::ToInt64Milliseconds(min_connect_timeout));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, first_ms);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(first_ms, connect_ms));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_ms);
  // A peer that comes back under its name at another address (a container
  // or pod started again) is looked up again within max_backoff of the
  // connection's failure (1 s at least), not after gRPC's 30 s between
  // resolutions.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, std::max(max_ms, 1000));
  args.SetInt(GRPC_ARG_DNS_ARES_QUERY_TIMEOUT_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kDnsQueryTimeout)));
}

bool ReconnectIfBackingOff(grpc::Channel& channel) {
  if (channel.GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_TRANSIENT_FAILURE) {
    return false;
  }
  grpc::experimental::ChannelResetConnectionBackoff(&channel);
  (void)channel.GetState(/*try_to_connect=*/true);
  return true;
}

}  // namespace shardtrain::common
