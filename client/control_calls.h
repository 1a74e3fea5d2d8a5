// ControlCalls: how a PsClient's control RPCs (Register, Heartbeat, Status)
// reach the shards, chosen once in PsClient::Create:
//  - DirectControl (client/direct_control.h), unreplicated shards: every
//    shard itself, and every one must answer;
//  - ChainControl (client/chain_control.h), replicated shards: the members
//    of the replica chains kept in etcd; a member that does not answer
//    within member_timeout is skipped with a warning.
// The data path (Push, Pull, PushPull) does not go through here: its calls
// are routed per call by ShardChannel (client/shard_channel.h).
#ifndef SHARDTRAIN_CLIENT_CONTROL_CALLS_H_
#define SHARDTRAIN_CLIENT_CONTROL_CALLS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::client {

class ControlCalls {
 public:
  virtual ~ControlCalls() = default;

  // Registers `request` (idempotent on a shard). (*responses)[s] is shard
  // s's answer; (*source)[g] the shard whose answer holds the versions of
  // replica group g (unreplicated: shard g itself). Both hold one entry per
  // shard on entry.
  virtual absl::Status Register(const RegisterRequest& request,
                                std::vector<RegisterResponse>* responses,
                                std::vector<int>* source) = 0;

  // Tells the shards `request`'s worker is alive (or done); returns the
  // membership one of them sees (unreplicated: shard 0). Retried for at
  // most `retry_for`.
  virtual absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request,
                                                      absl::Duration retry_for) = 0;

  // An async worker's clock, sent once a push split over several
  // connections is all applied: to `deferred` (the shards whose clock it
  // held back); replicated, to every member, wherever the groups' calls go.
  virtual absl::Status AdvanceClock(const HeartbeatRequest& request,
                                    const std::vector<int>& deferred) = 0;

  // Status of the shards, in shard order. Replicated: of those that
  // answered, the others' indices in *unreachable.
  virtual absl::StatusOr<std::vector<StatusResponse>> Status(
      std::vector<int>* unreachable) = 0;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_CONTROL_CALLS_H_
