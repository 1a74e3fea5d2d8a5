#include "client/shard_calls.h"

#include <type_traits>
#include <utility>

#include "absl/synchronization/blocking_counter.h"
#include "client/batch_call.h"

namespace shardtrain::client {

ShardCalls::ShardCalls(std::vector<ShardChannel*> channels, absl::Duration rpc_timeout,
                       RpcRecorder record)
    : channels_(std::move(channels)), rpc_timeout_(rpc_timeout), record_(std::move(record)) {}

std::vector<absl::Status> ShardCalls::Call(const std::vector<int>& shards, const char* method,
                                           absl::Duration attempt_timeout,
                                           absl::Duration retry_for,
                                           const StartFn& start) const {
  const int n = static_cast<int>(shards.size());
  std::vector<absl::Status> statuses(n);
  absl::BlockingCounter pending(n);
  for (int i = 0; i < n; ++i) {
    const int s = shards[i];
    ShardRpc rpc;
    rpc.method = method;
    rpc.attempt_timeout = attempt_timeout;
    rpc.reconnect_timeout = retry_for;
    rpc.start = [&start, s](const ShardAttempt& attempt,
                            std::function<void(grpc::Status)> done) {
      start(s, attempt.context, attempt.shard_incarnation, std::move(done));
    };
    channels_[s]->Call(std::move(rpc), [&statuses, &pending, i](absl::Status status) {
      statuses[i] = std::move(status);
      pending.DecrementCount();
    });
  }
  pending.Wait();
  return statuses;
}

absl::Status ShardCalls::CallAll(const char* method, absl::Duration retry_for,
                                 const StartFn& start) const {
  std::vector<int> shards(num_shards());
  for (int s = 0; s < num_shards(); ++s) shards[s] = s;
  absl::Status first;
  for (const absl::Status& status : Call(shards, method, rpc_timeout_, retry_for, start)) {
    KeepFirstError(&first, status);
  }
  return first;
}

template <typename Request, typename Response>
ShardCalls::StartFn ShardCalls::Recorded(const char* method, AsyncRpc<Request, Response> rpc,
                                         const Request& request,
                                         std::vector<Response>& responses) const {
  return [this, method, rpc, &request, &responses](int s, grpc::ClientContext* context,
                                                   uint64_t,
                                                   std::function<void(grpc::Status)> done) {
    const absl::Time start = absl::Now();
    responses[s].Clear();
    (channels_[s]->stub()->async()->*rpc)(
        context, &request, &responses[s],
        [this, method, &request, &responses, s, start,
         done = std::move(done)](grpc::Status status) {
          record_(method, status, request.ByteSizeLong(), responses[s].ByteSizeLong(), start);
          if constexpr (std::is_same_v<Response, RegisterResponse> ||
                        std::is_same_v<Response, HeartbeatResponse>) {
            // Where the shard takes the data path's frames now (it may
            // have restarted on another port).
            if (status.ok()) channels_[s]->set_data_port(static_cast<int>(responses[s].data_port()));
          }
          done(std::move(status));
        });
  };
}

ShardCalls::StartFn ShardCalls::Register(const RegisterRequest& request,
                                         std::vector<RegisterResponse>& responses) const {
  return Recorded("Register", &ParameterServer::Stub::async::Register, request, responses);
}

ShardCalls::StartFn ShardCalls::Heartbeat(const HeartbeatRequest& request,
                                          std::vector<HeartbeatResponse>& responses) const {
  return Recorded("Heartbeat", &ParameterServer::Stub::async::Heartbeat, request, responses);
}

ShardCalls::StartFn ShardCalls::Status(const StatusRequest& request,
                                       std::vector<StatusResponse>& responses) const {
  return [this, &request, &responses](int s, grpc::ClientContext* context, uint64_t,
                                      std::function<void(grpc::Status)> done) {
    responses[s].Clear();
    channels_[s]->stub()->async()->Status(context, &request, &responses[s], std::move(done));
  };
}

}  // namespace shardtrain::client
