// Reconnecting soon, or at once, to a peer that came back.
//
// Every channel to a peer that may restart (a shard, a chain successor,
// etcd) reconnects with a short backoff:
//
//   grpc::ChannelArguments args;
//   common::SetQuickReconnect(args);  // 100 ms, doubling up to 1 s
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
#include <grpcpp/support/channel_arguments.h>

#include "absl/time/time.h"

namespace shardtrain::common {

// How long one DNS lookup of a peer's name may take (c-ares, gRPC's
// default resolver). A lookup whose query is lost is not sent again on a
// fresh socket until it ends: c-ares resends on the same one, 5 s per try,
// doubling per round over the nameservers, which came to 30 s per lookup
// in a container network whose DNS server was restarting as a peer
// container started or died. 6 s is one try at the first nameserver (the
// resolver's default 5 s) and time for the second to answer.
inline constexpr absl::Duration kDnsQueryTimeout = absl::Seconds(6);

// Sets gRPC's reconnect backoff on `args` to start at 100 ms (or
// `max_backoff` when that is shorter) and never exceed `max_backoff`:
// gRPC's default (1 s doubling to 120 s) would keep a peer that restarts
// on the same address unreachable for longer than it was away. Its name
// may be resolved again as often as every max(`max_backoff`, 1 s) (gRPC's
// default: 30 s), for a peer that comes back at a new address.
// `min_connect_timeout` (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, which gRPC uses
// as the least time one connection attempt is given; 0: the first backoff)
// must cover a handshake with a peer that is slow to answer: an attempt
// cut off sooner fails every time (a dropped SYN is sent again after 1 s).
// One name lookup is given kDnsQueryTimeout (gRPC's default: 120 s) before
// it fails and a new one starts after the resolver's backoff (1 s at
// first); the addresses the channel has meanwhile stay in use.
void SetQuickReconnect(grpc::ChannelArguments& args,
                       absl::Duration max_backoff = absl::Seconds(1),
                       absl::Duration min_connect_timeout = absl::ZeroDuration());

// When `channel` is in TRANSIENT_FAILURE: resets its reconnect backoff and
// starts a connection attempt now, and returns true. Otherwise false.
bool ReconnectIfBackingOff(grpc::Channel& channel);

}  // namespace shardtrain::common

#endif  // SHARDTRAIN_COMMON_RECONNECT_H_
