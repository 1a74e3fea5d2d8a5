// DirectControl: the ControlCalls (client/control_calls.h) of unreplicated
// shards: every control RPC goes to every shard it concerns, retried by the
// shard's channel while it cannot be reached, and the first error wins.
//
// `calls` is not owned and must outlive this. Thread-safe.
#ifndef SHARDTRAIN_CLIENT_DIRECT_CONTROL_H_
#define SHARDTRAIN_CLIENT_DIRECT_CONTROL_H_

#include <vector>

#include "client/control_calls.h"
#include "client/shard_calls.h"

namespace shardtrain::client {

class DirectControl final : public ControlCalls {
 public:
  explicit DirectControl(const ShardCalls* calls) : calls_(*calls) {}

  absl::Status Register(const RegisterRequest& request,
                        std::vector<RegisterResponse>* responses,
                        std::vector<int>* source) override;
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request,
                                              absl::Duration retry_for) override;
  absl::Status AdvanceClock(const HeartbeatRequest& request,
                            const std::vector<int>& deferred) override;
  absl::StatusOr<std::vector<StatusResponse>> Status(std::vector<int>* unreachable) override;

 private:
  const ShardCalls& calls_;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_DIRECT_CONTROL_H_
