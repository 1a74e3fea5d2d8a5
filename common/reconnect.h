// Reconnecting at once to a peer that came back.
//
// A gRPC channel whose peer was down keeps retrying the connection with its
// reconnect backoff (up to GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1 s here), and
// a call without wait_for_ready fails at once meanwhile. When the caller
// knows the peer should be up again (a replica chain names it again), the
// wait is pure loss:
//
//   if (common::ReconnectIfBackingOff(*channel)) {
//     context.set_wait_for_ready(true);  // with a short deadline
//   }
#ifndef SHARDTRAIN_COMMON_RECONNECT_H_
#define SHARDTRAIN_COMMON_RECONNECT_H_

#include <grpcpp/channel.h>

namespace shardtrain::common {

// When `channel` is in TRANSIENT_FAILURE: resets its reconnect backoff and
// starts a connection attempt now, and returns true. Otherwise false.
bool ReconnectIfBackingOff(grpc::Channel& channel);

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_RECONNECT_H_
