// ShardCalls: one control RPC (Register, Heartbeat, Status) sent to several
// shards at once, each through its own ShardChannel (client/
// shard_channel.h, which retries it), and waited for together.
//
//   ShardCalls calls(channels, rpc_timeout, record);
//   std::vector<HeartbeatResponse> responses(calls.num_shards());
//   RETURN_IF_ERROR(calls.CallAll("Heartbeat", absl::InfiniteDuration(),
//                                 calls.Heartbeat(request, responses)));
//
// The channels are not owned and must outlive this. Thread-safe.
#ifndef SHARDTRAIN_CLIENT_SHARD_CALLS_H_
#define SHARDTRAIN_CLIENT_SHARD_CALLS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/shard_channel.h"
#include "proto/shardtrain.grpc.pb.h"

namespace shardtrain::client {

class ShardCalls {
 public:
  // Starts the RPC on shard `shard` with `context`; `done` gets its status.
  using StartFn = std::function<void(int shard, grpc::ClientContext* context,
                                     uint64_t shard_incarnation,
                                     std::function<void(grpc::Status)> done)>;

  // `channels[s]` is shard s's; each attempt of a call gets `rpc_timeout`.
  ShardCalls(std::vector<ShardChannel*> channels, absl::Duration rpc_timeout,
             RpcRecorder record);

  int num_shards() const { return static_cast<int>(channels_.size()); }
  ShardChannel* channel(int shard) const { return channels_[shard]; }
  absl::Duration rpc_timeout() const { return rpc_timeout_; }

  // Runs `start` on every shard in `shards` at once, each attempt within
  // `attempt_timeout`, retried for at most `retry_for` (and the channel's
  // reconnect_timeout); waits for all. Each one's outcome, in order.
  std::vector<absl::Status> Call(const std::vector<int>& shards, const char* method,
                                 absl::Duration attempt_timeout, absl::Duration retry_for,
                                 const StartFn& start) const;
  // The same on every shard with rpc_timeout per attempt; the first error
  // (any other before a FAILED_PRECONDITION).
  absl::Status CallAll(const char* method, absl::Duration retry_for,
                       const StartFn& start) const;

  // StartFns of the control RPCs: shard s's answer goes to responses[s]
  // (Register and Heartbeat are recorded; Status, an operator's question,
  // is not). `request` and `responses` must outlive the calls.
  StartFn Register(const RegisterRequest& request,
                   std::vector<RegisterResponse>& responses) const;
  StartFn Heartbeat(const HeartbeatRequest& request,
                    std::vector<HeartbeatResponse>& responses) const;
  StartFn Status(const StatusRequest& request, std::vector<StatusResponse>& responses) const;

 private:
  // A callback-API method of the stub, e.g. &ParameterServer::Stub::async::Register.
  template <typename Request, typename Response>
  using AsyncRpc = void (ParameterServer::Stub::async::*)(grpc::ClientContext*, const Request*,
                                                          Response*,
                                                          std::function<void(grpc::Status)>);
  // The StartFn of `rpc`, recorded as `method`.
  template <typename Request, typename Response>
  StartFn Recorded(const char* method, AsyncRpc<Request, Response> rpc, const Request& request,
                   std::vector<Response>& responses) const;

  const std::vector<ShardChannel*> channels_;
  const absl::Duration rpc_timeout_;
  const RpcRecorder record_;
};

}  // namespace shardtrain::client

#endif  // SHARDTRAIN_CLIENT_SHARD_CALLS_H_
