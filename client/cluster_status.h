// QueryStatus, CheckpointAll: one control RPC (Status, Checkpoint) to every
// shard at once, each with its own deadline and no retries, each shard's
// answer or error kept apart: what an operator's tool (psctl) needs, where
// one slow or dead shard must cost one timeout and must not hide the others.
//
//   ASSIGN_OR_RETURN(ChannelFactory channels, ChannelFactory::Create(options));
//   std::vector<absl::StatusOr<StatusResponse>> statuses =
//       QueryStatus(channels, {"a:7000", "b:7000"}, StatusRequest(), absl::Seconds(10));
//
// Thread-safe.
#ifndef SHARDTRAIN_CLIENT_CLUSTER_STATUS_H_
#define SHARDTRAIN_CLIENT_CLUSTER_STATUS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/channel_factory.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::client {

// Status of each shard in `servers`, in the same order. An error keeps
// gRPC's code and message (e.g. UNAVAILABLE "failed to connect ...").
std::vector<absl::StatusOr<StatusResponse>> QueryStatus(
    const ChannelFactory& channels, const std::vector<std::string>& servers,
    const StatusRequest& request, absl::Duration timeout);

// Asks each shard in `servers` to write a checkpoint now; answers in order.
std::vector<absl::StatusOr<CheckpointResponse>> CheckpointAll(
    const ChannelFactory& channels, const std::vector<std::string>& servers,
    absl::Duration timeout);

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_CLUSTER_STATUS_H_
