#include "client/direct_control.h"

#include "client/batch_call.h"
#include "common/status_macros.h"

namespace shardtrain::client {

absl::Status DirectControl::Register(const RegisterRequest& request,
                                     std::vector<RegisterResponse>* responses,
                                     std::vector<int>* source) {
  RETURN_IF_ERROR(
      calls_.CallAll("Register", absl::InfiniteDuration(), calls_.Register(request, *responses)));
  for (size_t s = 0; s < source->size(); ++s) (*source)[s] = static_cast<int>(s);
  return absl::OkStatus();
}

absl::StatusOr<HeartbeatResponse> DirectControl::Heartbeat(const HeartbeatRequest& request,
                                                           absl::Duration retry_for) {
  std::vector<HeartbeatResponse> responses(calls_.num_shards());
  RETURN_IF_ERROR(calls_.CallAll("Heartbeat", retry_for, calls_.Heartbeat(request, responses)));
  return responses[0];
}

absl::Status DirectControl::AdvanceClock(const HeartbeatRequest& request,
                                         const std::vector<int>& deferred) {
  std::vector<HeartbeatResponse> responses(calls_.num_shards());
  absl::Status first;
  for (const absl::Status& status :
       calls_.Call(deferred, "Heartbeat", calls_.rpc_timeout(), absl::InfiniteDuration(),
                   calls_.Heartbeat(request, responses))) {
    KeepFirstError(&first, status);
  }
  return first;
}

absl::StatusOr<std::vector<StatusResponse>> DirectControl::Status(
    std::vector<int>* unreachable) {
  if (unreachable != nullptr) unreachable->clear();
  StatusRequest request;
  std::vector<StatusResponse> responses(calls_.num_shards());
  RETURN_IF_ERROR(
      calls_.CallAll("Status", absl::InfiniteDuration(), calls_.Status(request, responses)));
  return responses;
}

}  // namespace shardtrain::client
