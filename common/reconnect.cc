#include "common/reconnect.h"

namespace shardtrain::common {

bool ReconnectIfBackingOff(grpc::Channel& channel) {
  if (channel.GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_TRANSIENT_FAILURE) {
    return false;
  }
  grpc::experimental::ChannelResetConnectionBackoff(&channel);
  (void)channel.GetState(/*try_to_connect=*/true);
  return true;
}

}  // namespace shardtrain::common
